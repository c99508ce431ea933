//! Main + helper (code, function tasks): CoMLRL's split of HumanEval. Both agents answer
//! the same step at once, each from its own prompt: the main agent writes the task's
//! function, told that it may call `aux`, and the helper writes `aux`. Their functions
//! are joined into one program (the problem's imports, then each agent's function),
//! which the hidden tests score; both earn its pass rate as the team reward, and an agent
//! whose reply holds no function of its name loses [`NO_ANSWER`] on its own. Later turns
//! show both agents the joint program and how it did. The single_agent evaluation mode
//! has the main agent's policy solve the task alone.

use crate::envs::AnyEnv;
use crate::envs::code::{Code, extract_program};
use crate::sandbox::Sandbox;

use super::{Agent, NO_ANSWER, TurnOutcome, env_step, prompts};

/// The helper function's name, as CoMLRL poses it.
pub const HELPER_FUNCTION: &str = "aux";

#[derive(Debug, Clone, Default)]
pub(super) struct CodeCollab {
    /// The latest joint program and how the hidden tests took it.
    last: Option<(String, String)>,
}

impl CodeCollab {
    pub(super) fn prompt(&self, env: &AnyEnv, agent: Agent, history: &[String]) -> String {
        let last = self.last.as_ref().map(|(program, report)| (program.as_str(), report.as_str()));
        match agent {
            Agent::HELPER => prompts::helper(env, last, history),
            _ => prompts::main_function(env, last, history),
        }
    }

    /// Judges the helper's and the main agent's replies together: one outcome each, in
    /// the replies' order. The episode ends once the joint program passes every test.
    pub(super) fn step(&mut self, env: &mut AnyEnv, replies: &[(Agent, &str)], sandbox: &Sandbox) -> Vec<TurnOutcome> {
        let (entry, imports) = match &*env {
            AnyEnv::Code(code) => (code.entry_point().unwrap_or_default().to_string(), imports(code)),
            _ => (String::new(), Vec::new()),
        };
        let name_of = |agent: Agent| if agent == Agent::HELPER { HELPER_FUNCTION } else { entry.as_str() };
        let functions: Vec<Option<String>> = replies
            .iter()
            .map(|&(agent, reply)| extract_program(reply).and_then(|program| function_named(&program, name_of(agent))))
            .collect();
        let program = imports.into_iter().chain(functions.iter().flatten().cloned()).collect::<Vec<_>>().join("\n\n");
        let judged = env_step(env, Agent::MAIN, &format!("```python\n{program}\n```"), sandbox);
        self.last = Some((program, judged.feedback.clone().unwrap_or_default()));
        let done = env.success();
        replies
            .iter()
            .zip(functions)
            .map(|(&(agent, _), function)| {
                let mut outcome = TurnOutcome { agent, local_reward: 0.0, done, ..judged.clone() };
                match function {
                    Some(function) => {
                        outcome.action = Some(serde_json::to_string(&function).expect("a string serialises"))
                    }
                    None => {
                        outcome.action = None;
                        outcome.parse_error = Some(format!("no function {} in a ```python block", name_of(agent)));
                        outcome.local_reward = NO_ANSWER;
                    }
                }
                outcome
            })
            .collect()
    }
}

/// The problem's import lines, which the joint program needs (`from typing import List`).
fn imports(code: &Code) -> Vec<String> {
    let problem = &code.instance().problem;
    problem.lines().filter(|line| line.starts_with("import ") || line.starts_with("from ")).map(str::to_owned).collect()
}

/// The top-level `def name(` block of `program`: its line, and every following line
/// that is blank or indented. Other functions, and a redefinition of the other agent's,
/// are left out.
fn function_named(program: &str, name: &str) -> Option<String> {
    let header = format!("def {name}(");
    let mut lines = program.lines().skip_while(|line| !line.starts_with(&header));
    let first = lines.next()?;
    let body = lines.take_while(|line| line.trim().is_empty() || line.starts_with([' ', '\t']));
    let block: Vec<&str> = std::iter::once(first).chain(body).collect();
    Some(block.join("\n").trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_its_block_and_nothing_around_it() {
        let program =
            "import math\n\ndef aux(x):\n    y = x\n\n    return y * 2\n\ndef f(x):\n    return aux(x)\nprint(1)";
        assert_eq!(function_named(program, "aux").unwrap(), "def aux(x):\n    y = x\n\n    return y * 2");
        assert_eq!(function_named(program, "f").unwrap(), "def f(x):\n    return aux(x)");
        assert_eq!(function_named(program, "g"), None);
        assert_eq!(function_named("def auxiliary(x):\n    pass", "aux"), None, "another name that starts alike");
    }
}
