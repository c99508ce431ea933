//! Code: write a Python program that reads stdin and prints the answer.
//!
//! * Instance: the problem statement, public tests (shown to the agents) and hidden
//!   tests (the first `max_hidden_tests` score a program), each a stdin/stdout pair.
//! * Action: the program in the reply's last ```python block (or last ``` block).
//! * Function tasks (HumanEval): when the instance names an `entry_point`, the agents
//!   write only that function and the harness around it does the input and output: it
//!   reads the test's argument tuple before the reply's code runs, hides what that code
//!   prints, and prints `repr` of the call. Small models asked to end a program with the
//!   three driver lines copied only the lines, or left out `import ast` (results/code/README.md).
//! * Reward: the fraction of hidden tests passed, each run in the sandbox with the
//!   configured timeout; success when all pass. Outputs are compared after whitespace
//!   normalisation (split on any whitespace, joined by one space). The episode's end is
//!   the workflow's call.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::hosted::{HostSettings, Judge, PythonReward};
use super::{Env, Error, Step};
use crate::sandbox::{Program, Sandbox};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CodeConfig {
    /// Wall-clock limit of one test run, in seconds.
    pub test_timeout_seconds: f64,
    /// Hidden tests used for the reward per problem (the first N).
    pub max_hidden_tests: u32,
    /// Scores the coder's programs with a Python function instead of the hidden tests
    /// (docs/environments.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward: Option<PythonReward>,
    /// How the reward function's host runs.
    pub host: HostSettings,
}

impl Default for CodeConfig {
    fn default() -> Self {
        CodeConfig { test_timeout_seconds: 30.0, max_hidden_tests: 4, reward: None, host: HostSettings::default() }
    }
}

/// One stdin/stdout test.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub input: String,
    pub output: String,
}

/// A code task as stored in the `tasks` table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub problem: String,
    #[serde(default)]
    pub public_tests: Vec<TestCase>,
    pub tests: Vec<TestCase>,
    /// A reference program, when the dataset has one; never shown to the agents (it
    /// scores the tester's tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solution: Option<String>,
    /// The function a function task asks for; programs then run inside [`Code::runnable`]'s
    /// harness. None: a whole program that reads stdin and prints the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_point: Option<String>,
}

/// How one test went.
#[derive(Debug, Clone, PartialEq)]
pub struct TestResult {
    pub passed: bool,
    /// What the program printed (or its error line).
    pub got: String,
}

/// Whitespace-normalised output.
pub fn normalise_output(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The program of a reply: its last ```python block, else its last ``` block.
pub fn extract_program(text: &str) -> Option<String> {
    let blocks: Vec<(&str, &str)> = text
        .split("```")
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, block)| {
            let (first, rest) = block.split_once('\n').unwrap_or((block, ""));
            (first.trim(), rest)
        })
        .collect();
    let python =
        blocks.iter().rev().find(|(tag, _)| tag.eq_ignore_ascii_case("python") || tag.eq_ignore_ascii_case("py"));
    let chosen = python.or_else(|| blocks.iter().rev().find(|(tag, _)| tag.is_empty()))?;
    let code = chosen.1.trim_end();
    (!code.trim().is_empty()).then(|| code.to_string())
}

/// Runs `program` on every test, concurrently (the sandbox bounds how many at once).
pub fn run_tests(sandbox: &Sandbox, program: &str, tests: &[TestCase], timeout: Duration) -> Vec<TestResult> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = tests
            .iter()
            .map(|test| {
                scope.spawn(move || {
                    let run = Program::new(program).with_stdin(test.input.clone()).with_timeout(timeout);
                    match sandbox.run(&run) {
                        Ok(out) if out.ok() => TestResult {
                            passed: normalise_output(&out.stdout) == normalise_output(&test.output),
                            got: out.stdout,
                        },
                        Ok(out) => TestResult { passed: false, got: format!("error: {}", out.error_line()) },
                        Err(e) => TestResult { passed: false, got: format!("error: {e}") },
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a test thread does not panic")).collect()
    })
}

/// One code episode.
#[derive(Debug, Clone)]
pub struct Code {
    instance: std::sync::Arc<Instance>,
    max_hidden_tests: usize,
    timeout: Duration,
    pass_rate: f64,
    /// Scores the programs instead of the hidden tests.
    judge: Option<Arc<Judge>>,
}

impl Code {
    pub fn new(config: &CodeConfig, instance: Instance) -> Code {
        Code {
            instance: Arc::new(instance),
            max_hidden_tests: config.max_hidden_tests as usize,
            timeout: Duration::from_secs_f64(config.test_timeout_seconds),
            pass_rate: 0.0,
            judge: None,
        }
    }

    /// A task whose programs `judge` scores (a Python reward function).
    pub fn judged(config: &CodeConfig, instance: Instance, judge: Judge) -> Code {
        Code { judge: Some(Arc::new(judge)), ..Code::new(config, instance) }
    }

    pub fn judge(&self) -> Option<&Arc<Judge>> {
        self.judge.as_ref()
    }

    pub fn from_instance(config: &CodeConfig, json: &str) -> Result<Code, Error> {
        let instance: Instance =
            serde_json::from_str(json).map_err(|e| Error::Instance { env: "code", reason: e.to_string() })?;
        if instance.tests.is_empty() {
            return Err(Error::Instance { env: "code", reason: "a code task needs at least one hidden test".into() });
        }
        Ok(Code::new(config, instance))
    }

    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// What runs for a program (a reply's, the tester's judge, the reference solution):
    /// the program itself, or for a function task the program inside a harness that
    /// takes the test's one line of arguments first (so the program finds stdin empty),
    /// discards what the program prints, and prints only `repr` of the call.
    pub fn runnable(&self, program: &str) -> String {
        let Some(entry) = &self.instance.entry_point else { return program.to_string() };
        format!(
            "import ast as _ast, io as _io, sys as _sys\n\
             _args = _ast.literal_eval(_sys.stdin.readline())\n\
             _sys.stdin = _io.StringIO('')\n\
             _out, _sys.stdout = _sys.stdout, _io.StringIO()\n\
             {program}\n\
             _result = {entry}(*_args)\n\
             _sys.stdout = _out\n\
             print(repr(_result))\n"
        )
    }

    /// True for a function task (the agents write the function, not a whole program).
    pub fn is_function_task(&self) -> bool {
        self.instance.entry_point.is_some()
    }

    /// The function a function task asks for.
    pub fn entry_point(&self) -> Option<&str> {
        self.instance.entry_point.as_deref()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The hidden tests that score a program.
    pub fn scoring_tests(&self) -> &[TestCase] {
        let n = self.instance.tests.len().min(self.max_hidden_tests.max(1));
        &self.instance.tests[..n]
    }

    pub fn pass_rate(&self) -> f64 {
        self.pass_rate
    }
}

impl Env for Code {
    /// The program's source.
    type Action = String;

    fn rules(&self) -> String {
        let task = match &self.instance.entry_point {
            Some(entry) => format!(
                "Write the Python 3 function {entry}. Do not read input or print: each test calls {entry} with the \
                 arguments of its input line (a Python tuple) and compares repr() of what it returns with the \
                 expected output."
            ),
            None => "Write a Python 3 program that reads the input from standard input and prints the answer to \
                     standard output."
                .to_string(),
        };
        let mut text = format!("{task}\n\nProblem:\n{}", self.instance.problem.trim_end());
        for test in &self.instance.public_tests {
            text.push_str(&format!(
                "\n\nExample input:\n{}\nExample output:\n{}",
                test.input.trim_end(),
                test.output.trim_end()
            ));
        }
        text
    }

    fn observation(&self) -> String {
        String::new()
    }

    fn parse(&self, text: &str) -> Result<String, String> {
        extract_program(text).ok_or_else(|| "no program found; put it in a ```python block".to_string())
    }

    fn step(&mut self, program: &String, sandbox: &Sandbox) -> Step {
        if let Some(judge) = &self.judge {
            let score = judge.score(program);
            self.pass_rate = score.clamp(0.0, 1.0);
            let feedback = format!("The reward function scored the program {score}.");
            return Step { reward: score, done: false, success: score >= 1.0, feedback };
        }
        let results = run_tests(sandbox, &self.runnable(program), self.scoring_tests(), self.timeout);
        let passed = results.iter().filter(|r| r.passed).count();
        self.pass_rate = passed as f64 / results.len() as f64;
        let success = passed == results.len();
        let feedback = format!("Passed {passed} of {} hidden tests.", results.len());
        Step { reward: self.pass_rate, done: false, success, feedback }
    }

    fn done(&self) -> bool {
        false
    }

    fn success(&self) -> bool {
        self.pass_rate == 1.0
    }

    /// The latest program's pass rate on the hidden tests.
    fn team_reward(&self) -> f64 {
        self.pass_rate
    }

    fn solve(&self) -> Option<String> {
        self.instance.solution.clone()
    }

    fn format_action(&self, program: &String) -> String {
        format!("```python\n{program}\n```")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxConfig;

    fn task() -> Code {
        let instance = Instance {
            problem: "Print the sum of two integers.".into(),
            public_tests: vec![TestCase { input: "1 2\n".into(), output: "3\n".into() }],
            tests: vec![
                TestCase { input: "1 2\n".into(), output: "3\n".into() },
                TestCase { input: "-5 5\n".into(), output: "0".into() },
                TestCase { input: "10 20\n".into(), output: " 30 \n\n".into() },
            ],
            solution: None,
            entry_point: None,
        };
        Code::new(&CodeConfig { test_timeout_seconds: 5.0, ..CodeConfig::default() }, instance)
    }

    #[test]
    fn a_function_task_runs_the_function_inside_the_harness() {
        let sb = Sandbox::new(SandboxConfig::default()).unwrap();
        let test = |i: &str, o: &str| TestCase { input: i.into(), output: o.into() };
        let instance = Instance {
            problem: "def add(a, b): ...".into(),
            public_tests: vec![test("(1, 2)\n", "3\n")],
            tests: vec![test("(1, 2)\n", "3\n"), test("('a', 'b')\n", "'ab'\n")],
            solution: None,
            entry_point: Some("add".into()),
        };
        let mut env = Code::new(&CodeConfig { test_timeout_seconds: 5.0, ..CodeConfig::default() }, instance);
        assert!(env.rules().contains("Write the Python 3 function add."));
        // The function alone; and with the reply's own driver lines and example prints,
        // which the harness hides (the reply's input() finds stdin empty: EOFError).
        let alone = "def add(a, b):\n    return a + b";
        assert_eq!(env.step(&alone.to_string(), &sb).reward, 1.0);
        let chatty = format!("{alone}\n\nprint(add(2, 2))\ntry:\n    print(add(*input()))\nexcept EOFError:\n    pass");
        assert_eq!(env.step(&chatty, &sb).reward, 1.0);
        let wrong = "def add(a, b):\n    print('debug')\n    return a";
        let step = env.step(&wrong.to_string(), &sb);
        assert_eq!((step.reward, step.success), (0.0, false));
        assert_eq!(env.step(&"print(3)".to_string(), &sb).reward, 0.0, "no function: NameError");
    }

    #[test]
    fn programs_are_taken_from_the_last_python_block() {
        let reply = "Idea.\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\n```text\nout\n```";
        assert_eq!(extract_program(reply).unwrap(), "print(2)");
        assert_eq!(extract_program("```\nprint(3)\n```").unwrap(), "print(3)");
        assert_eq!(extract_program("no code"), None);
        assert_eq!(extract_program("```python\n\n```"), None);
    }

    #[test]
    fn the_pass_rate_of_the_hidden_tests_is_the_reward() {
        let sb = Sandbox::new(SandboxConfig::default()).unwrap();
        let mut env = task();
        let right = env.parse("```python\na, b = map(int, input().split())\nprint(a + b)\n```").unwrap();
        let step = env.step(&right, &sb);
        assert_eq!((step.reward, step.success), (1.0, true));
        assert_eq!(step.feedback, "Passed 3 of 3 hidden tests.");
        // Right only when the sum is positive; a crash and a timeout both fail.
        let partial = "a, b = map(int, input().split())\nprint(abs(a + b) if a > 0 else 1)".to_string();
        let step = env.step(&partial, &sb);
        assert!((step.reward - 2.0 / 3.0).abs() < 1e-12 && !step.success, "{step:?}");
        let results = run_tests(
            &sb,
            "import time\nx = input()\nif x == '1 2':\n    time.sleep(30)\nprint(1 / 0)",
            env.scoring_tests(),
            Duration::from_secs(1),
        );
        assert_eq!(results[0].got, "error: timeout");
        assert_eq!(results[1].got, "error: ZeroDivisionError: division by zero");
    }

    #[test]
    fn only_the_first_max_hidden_tests_score() {
        let mut env = task();
        env.max_hidden_tests = 2;
        assert_eq!(env.scoring_tests().len(), 2);
        assert!(env.rules().contains("Example input:\n1 2\nExample output:\n3"));
    }
}
