//! Math: a problem with a reference answer.
//!
//! **Extraction** ([`extract_answer`]), first match wins:
//! 1. the last `\boxed{…}` (or `\fbox{…}`), nested braces included;
//! 2. the text after the last `####` on its line;
//! 3. the rest of the last line containing "final answer" or "answer:" (any case),
//!    after "is" / ":" and without a trailing period.
//!
//! A tool program's output is read by [`extract_output_answer`]: the same, falling
//! back to its last non-empty line.
//!
//! **Equality** ([`answers_match`]): both sides are normalised (spaces, `$`, `\left`,
//! `\right`, `\!`, `\,`, `^\circ`, `\%`, `\text{…}` units after a number, `\dfrac`/`\tfrac`,
//! thousands separators such as `1,000`, a leading `x =`), then evaluated as numbers
//! when they are arithmetic: integers, decimals, fractions `a/b` and `\frac{a}{b}`,
//! `+ - * / ^`, `\cdot`, `\times`, parentheses and braces, `sqrt(x)`, `\sqrt{x}`,
//! `\sqrt[n]{x}`, `pi`/`\pi`, and implicit products such as `2\sqrt{3}` or `3\pi`.
//! Two numbers match within the relative tolerance (absolute near zero). Anything
//! else (tuples, sets, intervals, matrices, symbolic expressions with variables,
//! text) matches only if the normalised strings are equal, case-insensitively.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::hosted::{HostSettings, Judge, PythonReward};
use super::{Env, Error, Step, after_marker};
use crate::sandbox::Sandbox;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MathConfig {
    /// Relative tolerance for numeric equality of answers.
    pub tolerance: f64,
    /// Wall-clock limit of the tool agent's program, in seconds.
    pub tool_timeout_seconds: f64,
    /// Scores answers with a Python function instead of comparing them with the
    /// dataset's reference (docs/environments.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward: Option<PythonReward>,
    /// How the reward function's host runs.
    pub host: HostSettings,
}

impl Default for MathConfig {
    fn default() -> Self {
        MathConfig {
            tolerance: 1e-6,
            tool_timeout_seconds: DEFAULT_TOOL_TIMEOUT_SECONDS,
            reward: None,
            host: HostSettings::default(),
        }
    }
}

/// The tool program's limit where the run file sets none (`env.tool_timeout_seconds`;
/// reasoning-gym tasks have no such key and always get it).
pub const DEFAULT_TOOL_TIMEOUT_SECONDS: f64 = 20.0;

/// A math task as stored in the `tasks` table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub problem: String,
    pub answer: String,
    /// The task row an outside scorer reads (a reasoning-gym entry), as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
}

/// One math episode: the problem and whether the latest answer was right.
#[derive(Debug, Clone)]
pub struct Math {
    instance: Arc<Instance>,
    tolerance: f64,
    /// Wall-clock limit of a tool agent's program on this task.
    tool_timeout: Duration,
    correct: bool,
    /// Scores the answers instead of [`answers_match`] against the reference.
    judge: Option<Arc<Judge>>,
}

/// The content of the last `\boxed{…}`, braces balanced.
fn last_boxed(text: &str) -> Option<String> {
    let start = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    let rest = &text[start..];
    let open = rest.find('{')?;
    let mut depth = 0;
    for (i, ch) in rest[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(rest[open + 1..open + i].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// The answer an agent gave (see the module doc), or None.
pub fn extract_answer(text: &str) -> Option<String> {
    if let Some(boxed) = last_boxed(text) {
        return Some(boxed.trim().to_string());
    }
    if let Some(after) = after_marker(text) {
        let line = after.lines().next().unwrap_or("").trim();
        return (!line.is_empty()).then(|| line.to_string());
    }
    for line in text.lines().rev() {
        let lower = line.to_lowercase();
        let at = lower
            .rfind("final answer")
            .map(|i| i + "final answer".len())
            .or_else(|| lower.rfind("answer:").map(|i| i + 6));
        if let Some(at) = at {
            let mut rest = line[at..].trim_start_matches([':', ' ', '*']).trim();
            rest = rest.strip_prefix("is").map_or(rest, str::trim);
            rest = rest.trim_start_matches(':').trim().trim_end_matches('.').trim_matches('*').trim();
            if !rest.is_empty() {
                return Some(rest.to_string());
            }
        }
    }
    None
}

/// The answer a tool program printed: as [`extract_answer`], else its last line.
pub fn extract_output_answer(stdout: &str) -> Option<String> {
    extract_answer(stdout).or_else(|| stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()).map(String::from))
}

/// Removes formatting that never changes an answer's value.
pub fn normalise(answer: &str) -> String {
    let mut s = answer.trim().to_string();
    for (from, to) in [
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\%", ""),
        ("%", ""),
        ("$", ""),
        ("\\$", ""),
    ] {
        s = s.replace(from, to);
    }
    // Units written as \text{…} or \mbox{…} after a value.
    for command in ["\\text{", "\\mbox{", "\\mathrm{"] {
        while let Some(i) = s.find(command) {
            let Some(close) = s[i..].find('}') else { break };
            let inner = s[i + command.len()..i + close].to_string();
            let keep = if i == 0 { inner } else { String::new() };
            s.replace_range(i..i + close + 1, &keep);
        }
    }
    let mut s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    s = s.trim_end_matches('.').to_string();
    // "x = 5" → "5" (a single variable on the left).
    if let Some((left, right)) = s.split_once('=')
        && left.len() <= 2
        && left.chars().all(|c| c.is_ascii_alphabetic())
    {
        s = right.to_string();
    }
    if is_thousands(&s) {
        s = s.replace(',', "");
    }
    s
}

fn is_thousands(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let groups: Vec<&str> = digits.split(',').collect();
    groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
}

/// Rewrites LaTeX arithmetic into plain syntax: `\frac{a}{b}` → `((a)/(b))`, `\sqrt{x}`
/// → `sqrt(x)`, `\sqrt[n]{x}` → `((x)^(1/(n)))`, braces → parentheses.
fn delatex(s: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    // The group starting at chars[i] == '{' (or a single character), and the index after it.
    fn group(chars: &[char], i: usize) -> (String, usize) {
        if chars.get(i) != Some(&'{') {
            return (chars.get(i).map(|c| c.to_string()).unwrap_or_default(), i + 1);
        }
        let mut depth = 0;
        for (j, &c) in chars.iter().enumerate().skip(i) {
            if c == '{' {
                depth += 1;
            } else if c == '}' {
                depth -= 1;
                if depth == 0 {
                    return (chars[i + 1..j].iter().collect(), j + 1);
                }
            }
        }
        (chars[i + 1..].iter().collect(), chars.len())
    }
    while i < chars.len() {
        let rest: String = chars[i..].iter().take(6).collect();
        if rest.starts_with("\\frac") {
            let (a, j) = group(&chars, i + 5);
            let (b, k) = group(&chars, j);
            out.push_str(&format!("(({})/({}))", delatex(&a), delatex(&b)));
            i = k;
        } else if rest.starts_with("\\sqrt") {
            let mut j = i + 5;
            let mut degree = None;
            if chars.get(j) == Some(&'[')
                && let Some(close) = chars[j..].iter().position(|&c| c == ']')
            {
                degree = Some(chars[j + 1..j + close].iter().collect::<String>());
                j += close + 1;
            }
            let (x, k) = group(&chars, j);
            match degree {
                Some(n) => out.push_str(&format!("(({})^(1/({})))", delatex(&x), delatex(&n))),
                None => out.push_str(&format!("sqrt({})", delatex(&x))),
            }
            i = k;
        } else if rest.starts_with("\\cdot") {
            out.push('*');
            i += 5;
        } else if rest.starts_with("\\times") {
            out.push('*');
            i += 6;
        } else if rest.starts_with("\\pi") {
            out.push_str("pi");
            i += 3;
        } else {
            out.push(match chars[i] {
                '{' => '(',
                '}' => ')',
                c => c,
            });
            i += 1;
        }
    }
    out
}

/// Evaluates a normalised answer as a number, if it is plain arithmetic.
pub fn evaluate(answer: &str) -> Option<f64> {
    let text = delatex(answer).to_lowercase();
    let mut parser = Parser { chars: text.chars().collect(), at: 0 };
    let value = parser.expression()?;
    (parser.at == parser.chars.len() && value.is_finite()).then_some(value)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, word: &str) -> bool {
        let end = self.at + word.len();
        if end <= self.chars.len() && self.chars[self.at..end].iter().copied().eq(word.chars()) {
            self.at = end;
            true
        } else {
            false
        }
    }

    fn expression(&mut self) -> Option<f64> {
        let mut value = self.term()?;
        loop {
            if self.eat("+") {
                value += self.term()?;
            } else if self.eat("-") {
                value -= self.term()?;
            } else {
                return Some(value);
            }
        }
    }

    fn term(&mut self) -> Option<f64> {
        let mut value = self.unary()?;
        loop {
            if self.eat("*") {
                value *= self.unary()?;
            } else if self.eat("/") {
                value /= self.unary()?;
            } else if self.starts_atom() {
                value *= self.power()?;
            } else {
                return Some(value);
            }
        }
    }

    fn starts_atom(&self) -> bool {
        matches!(self.peek(), Some(c) if c.is_ascii_digit() || c == '.' || c == '(')
            || self.chars[self.at..].starts_with(&['p', 'i'])
            || self.chars[self.at..].starts_with(&['s', 'q', 'r', 't'])
    }

    fn unary(&mut self) -> Option<f64> {
        if self.eat("-") {
            return Some(-self.unary()?);
        }
        if self.eat("+") {
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> Option<f64> {
        let base = self.atom()?;
        if self.eat("^") || self.eat("**") {
            let exponent = self.unary()?;
            return Some(base.powf(exponent));
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<f64> {
        if self.eat("(") {
            let value = self.expression()?;
            return self.eat(")").then_some(value);
        }
        if self.eat("pi") {
            return Some(std::f64::consts::PI);
        }
        if self.eat("sqrt") {
            return Some(self.atom()?.sqrt());
        }
        let start = self.at;
        while matches!(self.peek(), Some(c) if c.is_ascii_digit() || c == '.') {
            self.at += 1;
        }
        let number: String = self.chars[start..self.at].iter().collect();
        number.parse().ok()
    }
}

/// Whether two answers are the same (see the module doc).
pub fn answers_match(given: &str, reference: &str, tolerance: f64) -> bool {
    let (a, b) = (normalise(given), normalise(reference));
    if a.is_empty() || b.is_empty() {
        return false;
    }
    if let (Some(x), Some(y)) = (evaluate(&a), evaluate(&b)) {
        let scale = x.abs().max(y.abs()).max(1.0);
        return (x - y).abs() <= tolerance.max(1e-12) * scale;
    }
    a.to_lowercase() == b.to_lowercase()
}

impl Math {
    pub fn new(config: &MathConfig, instance: Instance) -> Math {
        Math {
            instance: Arc::new(instance),
            tolerance: config.tolerance,
            tool_timeout: Duration::from_secs_f64(config.tool_timeout_seconds),
            correct: false,
            judge: None,
        }
    }

    /// A task whose answers `judge` scores.
    pub fn judged(tolerance: f64, tool_timeout: Duration, instance: Instance, judge: Judge) -> Math {
        Math { instance: Arc::new(instance), tolerance, tool_timeout, correct: false, judge: Some(Arc::new(judge)) }
    }

    pub fn judge(&self) -> Option<&Arc<Judge>> {
        self.judge.as_ref()
    }

    pub fn from_instance(config: &MathConfig, json: &str) -> Result<Math, Error> {
        let instance: Instance =
            serde_json::from_str(json).map_err(|e| Error::Instance { env: "math", reason: e.to_string() })?;
        Ok(Math::new(config, instance))
    }

    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// Wall-clock limit of a tool agent's program on this task.
    pub fn tool_timeout(&self) -> Duration {
        self.tool_timeout
    }

    /// Whether an answer is right.
    pub fn is_correct(&self, answer: &str) -> bool {
        match &self.judge {
            Some(judge) => judge.score(answer) >= 1.0,
            None => answers_match(answer, &self.instance.answer, self.tolerance),
        }
    }

    pub fn same_answer(&self, a: &str, b: &str) -> bool {
        answers_match(a, b, self.tolerance)
    }
}

impl Env for Math {
    /// The extracted answer.
    type Action = String;

    fn rules(&self) -> String {
        // The answer format is each role's own (a program prints it, a reasoner boxes it).
        format!("Solve the math problem.\n\nProblem: {}", self.instance.problem)
    }

    fn observation(&self) -> String {
        String::new()
    }

    fn parse(&self, text: &str) -> Result<String, String> {
        extract_answer(text).ok_or_else(|| "no final answer found; put it in \\boxed{}".to_string())
    }

    /// 1 for a right answer, 0 otherwise. The episode's end is the workflow's call.
    fn step(&mut self, answer: &String, _sandbox: &Sandbox) -> Step {
        self.correct = self.is_correct(answer);
        let feedback = format!("Answer: {answer}");
        Step { reward: if self.correct { 1.0 } else { 0.0 }, done: false, success: self.correct, feedback }
    }

    fn done(&self) -> bool {
        false
    }

    /// The latest answer was right.
    fn success(&self) -> bool {
        self.correct
    }

    fn solve(&self) -> Option<String> {
        Some(self.instance.answer.clone())
    }

    fn format_action(&self, answer: &String) -> String {
        format!("\\boxed{{{answer}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_extracted_in_the_documented_order() {
        assert_eq!(extract_answer("so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}}").unwrap(), "x^{2}");
        assert_eq!(extract_answer("work\n#### 72\n").unwrap(), "72");
        assert_eq!(extract_answer("The final answer is 3/4.").unwrap(), "3/4");
        assert_eq!(extract_answer("**Final Answer:** 12").unwrap(), "12");
        assert_eq!(extract_answer("Answer: $5$").unwrap(), "$5$");
        assert_eq!(extract_answer("I am not sure"), None);
        assert_eq!(extract_output_answer("step 1\n42\n\n").unwrap(), "42");
    }

    #[test]
    fn equal_values_in_different_forms_match() {
        let same = |a: &str, b: &str| answers_match(a, b, 1e-6);
        assert!(same("\\frac{1}{2}", "0.5"));
        assert!(same("\\dfrac{3}{4}", "3/4"));
        assert!(same("1,000", "1000"));
        assert!(same("$12$", "12.0"));
        assert!(same("2\\sqrt{3}", "sqrt(12)"));
        assert!(same("\\sqrt[3]{27}", "3"));
        assert!(same("3\\pi", "9.42477796077"));
        assert!(same("x = -4", "-4"));
        assert!(same("50\\%", "50"));
        assert!(same("10\\text{ cm}", "10"));
        assert!(same("2^{10}", "1024"));
        assert!(same("\\left(\\frac{2}{3}\\right)", "0.666666667"));
        assert!(same("(1, 2)", "(1,2)"));
        assert!(same("\\text{Monday}", "monday"));
    }

    #[test]
    fn different_answers_do_not_match() {
        let same = |a: &str, b: &str| answers_match(a, b, 1e-6);
        assert!(!same("0.5", "0.51"));
        assert!(!same("1/3", "0.33"));
        assert!(!same("(1, 2)", "(2, 1)"));
        assert!(!same("", "0"));
        assert!(!same("x+1", "x+2"));
        assert!(!same("1,2", "12"), "a list is not a thousands number");
    }

    #[test]
    fn the_env_scores_the_latest_answer() {
        let sb = Sandbox::new(crate::sandbox::SandboxConfig::default()).unwrap();
        let instance = r#"{"problem": "What is 1/4 + 1/4?", "answer": "\\frac{1}{2}"}"#;
        let mut env = Math::from_instance(&MathConfig::default(), instance).unwrap();
        let answer = env.parse("1/4 + 1/4 = \\boxed{0.5}").unwrap();
        assert_eq!(env.step(&answer, &sb).reward, 1.0);
        assert!(env.success());
        let wrong = env.parse("#### 2").unwrap();
        let step = env.step(&wrong, &sb);
        assert_eq!((step.reward, step.success), (0.0, false));
        assert!(env.parse("no idea").is_err());
    }
}
