//! Tool agent + reasoner (math): the tool agent's program prints an answer, the reasoner
//! answers in `\boxed{}` having seen the tool's report; each earns 1 for a right answer,
//! and the episode ends when the two answers agree.

use crate::envs::AnyEnv;
use crate::envs::math::{Math, extract_output_answer};
use crate::sandbox::{RunOutput, Sandbox};

use super::tool::{self, ToolMemory};
use super::{Agent, NO_ANSWER, TurnOutcome, env_step, prompts};

#[derive(Debug, Clone, Default)]
pub(super) struct ToolReasoner {
    pub(super) tool: ToolMemory,
    reasoner_answer: Option<String>,
}

fn math(env: &AnyEnv) -> &Math {
    match env {
        AnyEnv::Math(math) => math,
        other => unreachable!("tool_reasoner plays math, not {} (Episode::new checks)", other.name()),
    }
}

impl ToolReasoner {
    pub(super) fn prompt(&self, env: &AnyEnv, agent: Agent, history: &[String]) -> String {
        match agent {
            Agent::TOOL => prompts::tool_agent(env, history),
            _ => prompts::reasoner(env, self.tool.report.as_deref(), history),
        }
    }

    pub(super) fn step(
        &mut self,
        env: &mut AnyEnv,
        agent: Agent,
        reply: &str,
        run: Option<RunOutput>,
        sandbox: &Sandbox,
    ) -> TurnOutcome {
        match agent {
            Agent::TOOL => self.tool_step(math(env), reply, run),
            _ => self.reasoner_step(env, agent, reply, sandbox),
        }
    }

    fn tool_step(&mut self, math: &Math, reply: &str, run: Option<RunOutput>) -> TurnOutcome {
        let (mut outcome, run) = match tool::read(&mut self.tool, reply, run) {
            Ok(read) => read,
            Err(outcome) => return outcome,
        };
        let answer = if run.ok() { extract_output_answer(&run.stdout) } else { None };
        self.tool.solved = answer.as_ref().is_some_and(|a| math.is_correct(a));
        outcome.local_reward = match &answer {
            Some(_) if self.tool.solved => 1.0,
            Some(_) => 0.0,
            None => NO_ANSWER,
        };
        outcome.action = answer.as_ref().map(|a| serde_json::to_string(a).expect("strings serialise"));
        if answer.is_none() {
            outcome.parse_error = Some("the program printed no answer".into());
        }
        self.tool.answer = answer;
        outcome.done = self.answers_agree(math);
        outcome
    }

    fn reasoner_step(&mut self, env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = env_step(env, agent, reply, sandbox);
        self.reasoner_answer = outcome.action.as_ref().and_then(|a| serde_json::from_str(a).ok());
        outcome.done |= self.answers_agree(math(env));
        self.tool.report = None;
        outcome
    }

    fn answers_agree(&self, math: &Math) -> bool {
        match (&self.tool.answer, &self.reasoner_answer) {
            (Some(a), Some(b)) => math.same_answer(a, b),
            _ => false,
        }
    }
}
