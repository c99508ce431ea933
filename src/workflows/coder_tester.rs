//! Coder + tester (code): the coder writes the program, the tester writes test cases
//! (Input/Output blocks, or for a function task `assert` lines).
//! The coder earns the pass rate of the hidden tests; the tester earns the share of its
//! tests the reference program passes (when the task has one; otherwise the share the
//! coder's program passes). Done when the coder's program passes all the tester's tests.

use crate::envs::AnyEnv;
use crate::envs::code::{Code, TestCase, TestResult, extract_program, run_tests};
use crate::sandbox::{Program, Sandbox};

use super::{Agent, NO_ANSWER, TurnOutcome, env_step, prompts, shorten};

#[derive(Debug, Clone, Default)]
pub(super) struct CoderTester {
    /// The coder's latest program.
    code: Option<String>,
    /// The tester's latest tests.
    tests: Vec<TestCase>,
    /// How the coder's latest program did on them.
    test_report: Option<String>,
}

impl CoderTester {
    pub(super) fn prompt(&self, env: &AnyEnv, agent: Agent, history: &[String]) -> String {
        match agent {
            Agent::CODER => prompts::coder(env, self.code.as_deref(), self.test_report.as_deref(), history),
            _ => prompts::tester(env, self.code.as_deref(), history),
        }
    }

    pub(super) fn step(&mut self, env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        match agent {
            Agent::CODER => self.coder_step(env, agent, reply, sandbox),
            _ => self.tester_step(env, agent, reply, sandbox),
        }
    }

    fn coder_step(&mut self, env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = env_step(env, agent, reply, sandbox);
        if let Some(code) = extract_program(reply) {
            self.code = Some(code);
            outcome.done |= self.coder_passes_tests(env, sandbox);
        }
        outcome
    }

    /// Runs the coder's latest program on the tester's latest tests; true when it
    /// passes them all (and there is at least one).
    fn coder_passes_tests(&mut self, env: &AnyEnv, sandbox: &Sandbox) -> bool {
        let (Some(code), AnyEnv::Code(env)) = (&self.code, env) else { return false };
        if self.tests.is_empty() {
            return false;
        }
        let results = run_tests(sandbox, &env.runnable(code), &self.tests, env.timeout());
        self.test_report = Some(test_report(&self.tests, &results));
        results.iter().all(|r| r.passed)
    }

    fn tester_step(&mut self, env: &AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = TurnOutcome::blank(agent);
        let AnyEnv::Code(code_env) = env else { unreachable!("coder_tester plays code (Episode::new checks)") };
        let (tests, format) = match code_env.entry_point() {
            Some(entry) => (asserted_tests(code_env, entry, reply, sandbox), "assert lines"),
            None => (parse_tests(reply), "**Test Input:** and **Test Output:** blocks"),
        };
        if tests.is_empty() {
            outcome.parse_error = Some(format!("no test found; write {format}"));
            outcome.local_reward = NO_ANSWER;
            return outcome;
        }
        outcome.action = Some(serde_json::to_string(&tests).expect("tests serialise"));
        // A function task's tests as the tester wrote them, not as the harness's JSON:
        // a tester shown JSON wrote fewer asserts on its next turn (results/code/README.md).
        outcome.shown = code_env.entry_point().map(|entry| assert_lines(entry, &tests));
        let judge = code_env.instance().solution.clone().or_else(|| self.code.clone());
        if let Some(program) = judge {
            let results = run_tests(sandbox, &code_env.runnable(&program), &tests, code_env.timeout());
            outcome.local_reward = results.iter().filter(|r| r.passed).count() as f64 / tests.len() as f64;
        }
        self.tests = tests;
        outcome.done = self.coder_passes_tests(env, sandbox);
        outcome.feedback = self.test_report.clone();
        outcome
    }
}

/// Test cases of a tester's reply: `**Test Input:**` and `**Test Output:**` fenced
/// blocks, paired in order (up to the shorter list).
pub fn parse_tests(reply: &str) -> Vec<TestCase> {
    let blocks_after = |label: &str| -> Vec<String> {
        reply
            .match_indices(label)
            .filter_map(|(i, _)| {
                let rest = &reply[i + label.len()..];
                let open = rest.find("```")?;
                let body = &rest[open + 3..];
                let body = body.split_once('\n').map_or("", |(_, b)| b);
                let close = body.find("```")?;
                Some(body[..close].to_string())
            })
            .collect()
    };
    let inputs = blocks_after("**Test Input:**");
    let outputs = blocks_after("**Test Output:**");
    inputs.into_iter().zip(outputs).map(|(input, output)| TestCase { input, output }).collect()
}

/// Test cases of a function task's tester reply: its `assert entry(args) == expected`
/// lines, with the argument tuple and the expected value rewritten as Python's `repr`
/// (the harness's input line and output), so that `"a"` and `'a'`, or `[1,2]` and
/// `[1, 2]`, are the same test. Asserts whose values are not Python literals are skipped.
fn asserted_tests(env: &Code, entry: &str, reply: &str, sandbox: &Sandbox) -> Vec<TestCase> {
    let asserts: Vec<(String, String)> = reply.lines().filter_map(|line| split_assert(line, entry)).collect();
    if asserts.is_empty() {
        return Vec::new();
    }
    let literals: String = asserts.iter().map(|(args, expected)| format!("{args}\n{expected}\n")).collect();
    let program = Program::new(LITERAL_REPRS).with_stdin(literals).with_timeout(env.timeout());
    let Ok(out) = sandbox.run(&program) else { return Vec::new() };
    let reprs: Vec<&str> = out.stdout.lines().collect();
    if !out.ok() || reprs.len() != 2 * asserts.len() {
        return Vec::new();
    }
    reprs
        .chunks(2)
        .filter(|pair| !pair.contains(&NOT_A_LITERAL))
        .map(|pair| TestCase { input: format!("{}\n", pair[0]), output: format!("{}\n", pair[1]) })
        .collect()
}

/// Tests as `assert entry(args) == expected` lines, joined by `; `: the inverse of
/// [`asserted_tests`], whose argument tuples read as a call's arguments (`(1,)` too).
fn assert_lines(entry: &str, tests: &[TestCase]) -> String {
    let line = |t: &TestCase| format!("assert {entry}{} == {}", t.input.trim(), t.output.trim());
    tests.iter().map(line).collect::<Vec<_>>().join("; ")
}

const NOT_A_LITERAL: &str = "?";

/// Prints `repr` of each stdin line read as a Python literal, `?` for a line that is not one.
const LITERAL_REPRS: &str = r#"import ast, sys
for line in sys.stdin:
    try:
        print(repr(ast.literal_eval(line.strip())))
    except Exception:
        print('?')
"#;

/// One `assert entry(args) == expected` line as (the argument tuple, the expected value),
/// in Python source. `assert entry(args)` expects True and `assert not entry(args)` False;
/// a trailing comment or assertion message is dropped. A list marker before the assert
/// (`1.`, `-`) is skipped, and unittest's `self.assertEqual(entry(args), expected)`,
/// `assertTrue` and `assertFalse` are read too: testers write both.
fn split_assert(line: &str, entry: &str) -> Option<(String, String)> {
    let line = without_list_marker(line.trim());
    if let Some(rest) = line.strip_prefix("self.assert") {
        return split_unittest_assert(rest, entry);
    }
    let rest = line.strip_prefix("assert ")?.trim_start();
    let (negated, rest) = match rest.strip_prefix("not ") {
        Some(rest) => (true, rest.trim_start()),
        None => (false, rest),
    };
    let (args, tail) = split_call(rest, entry)?;
    let tail = tail[..top_level_index(tail, &['#', ',']).unwrap_or(tail.len())].trim();
    let expected = match (tail, negated) {
        ("", false) => "True",
        ("", true) => "False",
        (_, true) => return None,
        (tail, false) => tail.strip_prefix("==")?.trim(),
    };
    Some((args, expected.to_string()))
}

/// `Equal(entry(args), expected)`, `True(entry(args))` or `False(entry(args))`, the rest
/// of a `self.assert…` line.
fn split_unittest_assert(rest: &str, entry: &str) -> Option<(String, String)> {
    let (method, rest) = rest.split_once('(')?;
    let (args, tail) = split_call(rest.trim_start(), entry)?;
    let tail = tail.trim_start();
    let expected = match method {
        "True" => "True",
        "False" => "False",
        "Equal" | "Equals" => {
            let tail = tail.strip_prefix(',')?;
            tail[..top_level_index(tail, &[',', ')'])?].trim()
        }
        _ => return None,
    };
    Some((args, expected.to_string()))
}

/// `entry(args)` at the start of `text` as (the argument tuple in Python source, the text
/// after the call).
fn split_call<'a>(text: &'a str, entry: &str) -> Option<(String, &'a str)> {
    let rest = text.strip_prefix(entry)?.trim_start().strip_prefix('(')?;
    let close = top_level_index(rest, &[')'])?;
    let args = rest[..close].trim().trim_end_matches(',').trim_end();
    let args = if args.is_empty() { "()".to_string() } else { format!("({args},)") };
    Some((args, &rest[close + 1..]))
}

/// The line without a leading `1.`, `1)`, `-` or `*` list marker.
fn without_list_marker(line: &str) -> &str {
    let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let marker = if digits > 0 { line[digits..].strip_prefix(['.', ')']) } else { line.strip_prefix(['-', '*']) };
    marker.map_or(line, str::trim_start)
}

/// Byte index of the first of `targets` in one line of Python that is outside string
/// literals and brackets; a closing bracket that closes nothing counts as outside.
fn top_level_index(text: &str, targets: &[char]) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        if depth == 0 && targets.contains(&c) {
            return Some(i);
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.checked_sub(1)?,
            _ => {}
        }
    }
    None
}

fn test_report(tests: &[TestCase], results: &[TestResult]) -> String {
    let lines: Vec<String> = tests
        .iter()
        .zip(results)
        .map(|(t, r)| {
            let verdict = if r.passed { "passed" } else { "FAILED" };
            format!(
                "- input {:?}: expected {:?}, got {:?}: {verdict}",
                shorten(t.input.trim_end(), 80),
                shorten(t.output.trim_end(), 80),
                shorten(r.got.trim_end(), 80)
            )
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assert_line_splits_into_the_argument_tuple_and_the_expected_value() {
        let split = |line| split_assert(line, "add");
        let pair = |a: &str, e: &str| Some((a.to_string(), e.to_string()));
        assert_eq!(split("assert add(1, 2) == 3"), pair("(1, 2,)", "3"));
        assert_eq!(
            split("    assert add([1, (2, 3)], 'a)b#') == [1,2]  # a comment, with a comma"),
            pair("([1, (2, 3)], 'a)b#',)", "[1,2]")
        );
        assert_eq!(split("assert add(\"x\\\"y\",) == 3, \"a message\""), pair("(\"x\\\"y\",)", "3"));
        assert_eq!(split("assert add()==0"), pair("()", "0"));
        assert_eq!(split("assert add(1)"), pair("(1,)", "True"));
        assert_eq!(split("assert not add(0)"), pair("(0,)", "False"));
        assert_eq!(split("2. assert add(1, 2) == 3"), pair("(1, 2,)", "3"));
        assert_eq!(split("- assert add(1)"), pair("(1,)", "True"));
        assert_eq!(split("self.assertEqual(add(1, [2, 3]), (4, 5))"), pair("(1, [2, 3],)", "(4, 5)"));
        assert_eq!(split("  self.assertEqual(add('a,b'), 'c', msg='why')"), pair("('a,b',)", "'c'"));
        assert_eq!(split("self.assertTrue(add(1))"), pair("(1,)", "True"));
        assert_eq!(split("self.assertFalse(add())"), pair("()", "False"));
        for other in [
            "assert adder(1) == 2",
            "print(add(1, 2))",
            "assert add(1, 2) != 3",
            "assert not add(1) == 2",
            "self.assertIn(add(1), [2])",
            "self.assertEqual(3, add(1, 2))",
            "12 assert add(1) == 2",
        ] {
            assert_eq!(split(other), None, "{other}");
        }
    }
}
