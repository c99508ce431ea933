//! Tool agent + planner (Plan-Path, Sudoku, Sokoban): the tool agent's printed answer is
//! simulated on a copy of the state, whose reward is the tool agent's (the real state
//! does not move); the planner sees the tool's report and acts on the real state, and may
//! adopt the tool's answer with `#### tool`.

use crate::envs::AnyEnv;
use crate::sandbox::{RunOutput, Sandbox};

use super::tool::{self, ToolMemory};
use super::{Agent, NO_ANSWER, TurnOutcome, env_step, prompts};

/// A planner's answer that adopts the tool agent's answer as it stands (`#### tool`):
/// trusting the tool is one decision, not a copy the model must get right move by move.
pub const ADOPT_TOOL_ANSWER: &str = "tool";

#[derive(Debug, Clone, Default)]
pub(super) struct ToolPlanner {
    pub(super) tool: ToolMemory,
    /// Each agent acts alone: the planner gets neither the tool agent's report nor its answer.
    pub(super) alone: bool,
}

impl ToolPlanner {
    pub(super) fn prompt(&self, env: &AnyEnv, agent: Agent, history: &[String]) -> String {
        match agent {
            Agent::TOOL => prompts::tool_agent(env, history),
            _ => prompts::planner(env, self.tool.report.as_deref(), history),
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
        if agent != Agent::TOOL {
            return self.planner_step(env, agent, reply, sandbox);
        }
        let outcome = self.tool_step(env, reply, run, sandbox);
        if self.alone {
            self.tool.report = None;
            self.tool.answer = None;
        }
        outcome
    }

    /// Scores the tool's printed answer on a copy: the real state does not move.
    fn tool_step(&mut self, env: &AnyEnv, reply: &str, run: Option<RunOutput>, sandbox: &Sandbox) -> TurnOutcome {
        let (mut outcome, run) = match tool::read(&mut self.tool, reply, run) {
            Ok(read) => read,
            Err(outcome) => return outcome,
        };
        let mut copy = env.clone();
        let acted = copy.act(&run.stdout, sandbox);
        match (acted.action, acted.step) {
            (Ok(action), Some(step)) => {
                outcome.action = Some(action);
                outcome.local_reward = step.reward;
                self.tool.solved = copy.success();
                self.tool.answer = Some(run.stdout.trim().to_string());
            }
            (Err(error), _) => {
                outcome.parse_error = Some(format!("the program's output holds no answer: {error}"));
                outcome.local_reward = NO_ANSWER;
            }
            (Ok(_), None) => unreachable!("a parsed action is always stepped"),
        }
        outcome
    }

    /// Acts on the real state, with `#### tool` standing for the tool agent's answer.
    fn planner_step(&mut self, env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let adopts = reply.rsplit_once("####").is_some_and(|(_, answer)| answer.trim() == ADOPT_TOOL_ANSWER);
        let reply = match &self.tool.answer {
            Some(tool) if adopts => format!("#### {tool}"),
            _ => reply.to_string(),
        };
        let outcome = env_step(env, agent, &reply, sandbox);
        self.tool.report = None;
        outcome
    }
}
