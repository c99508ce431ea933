//! Coder + tester (code): the coder writes the program, the tester writes test cases.
//! The coder earns the pass rate of the hidden tests; the tester earns the share of its
//! tests the reference program passes (when the task has one; otherwise the share the
//! coder's program passes). Done when the coder's program passes all the tester's tests.

use crate::envs::AnyEnv;
use crate::envs::code::{TestCase, TestResult, extract_program, run_tests};
use crate::sandbox::Sandbox;

use super::{NO_ANSWER, Role, TurnOutcome, env_step, prompts, shorten};

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
    pub(super) fn prompt(&self, env: &AnyEnv, agent: Role, history: &[String]) -> String {
        match agent {
            Role::Coder => prompts::coder(env, self.code.as_deref(), self.test_report.as_deref(), history),
            _ => prompts::tester(env, self.code.as_deref(), history),
        }
    }

    pub(super) fn step(&mut self, env: &mut AnyEnv, agent: Role, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        match agent {
            Role::Coder => self.coder_step(env, agent, reply, sandbox),
            _ => self.tester_step(env, agent, reply, sandbox),
        }
    }

    fn coder_step(&mut self, env: &mut AnyEnv, agent: Role, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
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

    fn tester_step(&mut self, env: &AnyEnv, agent: Role, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = TurnOutcome::blank(agent);
        let tests = parse_tests(reply);
        if tests.is_empty() {
            outcome.parse_error = Some("no test found; write **Test Input:** and **Test Output:** blocks".into());
            outcome.local_reward = NO_ANSWER;
            return outcome;
        }
        outcome.action = Some(serde_json::to_string(&tests).expect("tests serialise"));
        let AnyEnv::Code(code_env) = env else { unreachable!("coder_tester plays code (Episode::new checks)") };
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
