//! Environments: text in, text out, deterministic from a seed.
//!
//! Every environment implements [`Env`]: the rules and current state as text, a parser
//! from an agent's reply to a typed action, `step` with the local reward, the team
//! reward, and a solver used for verification and demonstrations. States are plain
//! values: `clone()` gives an independent branch for tree sampling (stepping one clone
//! never moves another), and they are `Send` so branches step on worker threads.
//!
//! [`AnyEnv`] is the closed set the workflows and stages hold; it is built from a row of
//! the `tasks` table ([`AnyEnv::from_instance`]).

pub mod agent_program;
pub mod code;
pub mod dataset;
pub mod hosted;
pub mod math;
pub mod moves;
pub mod plan_path;
pub mod sokoban;
pub mod source;
pub mod sudoku;
pub mod tic_tac_toe;
pub mod user_files;

use serde::{Deserialize, Serialize};

use crate::sandbox::Sandbox;
use crate::validate::{Invalid, check};

pub use agent_program::AgentProgramConfig;
pub use code::{Code, CodeConfig};
pub use hosted::{ExternalConfig, HostedConfig, PythonReward, ReasoningGymConfig, TextArenaConfig};
pub use math::{Math, MathConfig};
pub use plan_path::{PlanPath, PlanPathConfig};
pub use sokoban::{Sokoban, SokobanConfig};
pub use source::{DatasetKind, EnvSource, Generated, Generator};
pub use sudoku::{Sudoku, SudokuConfig};
pub use tic_tac_toe::{TicTacToe, TicTacToeConfig};

/// The environment, chosen by `name`, with its own parameters beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum EnvConfig {
    /// Plan-Path: a shortest path on a grid with walls, generated.
    PlanPath(PlanPathConfig),
    /// Sudoku puzzles, generated.
    Sudoku(SudokuConfig),
    /// Sokoban puzzles, generated.
    Sokoban(SokobanConfig),
    /// Tic-tac-toe between two players.
    TicTacToe(TicTacToeConfig),
    /// Math problems from dataset files, answers checked against the file's.
    Math(MathConfig),
    /// Programming problems from dataset files, programs run against hidden tests.
    Code(CodeConfig),
    /// A TextArena game, hosted.
    #[serde(rename = "textarena")]
    TextArena(TextArenaConfig),
    /// A user's own environment, hosted.
    External(ExternalConfig),
    /// A reasoning-gym dataset: math tasks its host makes and scores.
    ReasoningGym(ReasoningGymConfig),
    /// A user's agent program plays each episode, calling petting's endpoint.
    AgentProgram(AgentProgramConfig),
}

impl EnvConfig {
    pub fn name(&self) -> &'static str {
        match self {
            EnvConfig::PlanPath(_) => "plan_path",
            EnvConfig::Sudoku(_) => "sudoku",
            EnvConfig::Sokoban(_) => "sokoban",
            EnvConfig::TicTacToe(_) => "tic_tac_toe",
            EnvConfig::Math(_) => "math",
            EnvConfig::Code(_) => "code",
            EnvConfig::TextArena(_) => "textarena",
            EnvConfig::External(_) => "external",
            EnvConfig::ReasoningGym(_) => "reasoning_gym",
            EnvConfig::AgentProgram(_) => "agent_program",
        }
    }

    /// Checks the parameters (the keys under `env`).
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            EnvConfig::PlanPath(p) => p.validate(),
            EnvConfig::Sudoku(s) => s.validate(),
            EnvConfig::Sokoban(s) => {
                check(s.size >= 4, "env.size", "must be at least 4 (walls included)")?;
                check(s.boxes >= 1, "env.boxes", "must be at least 1")
            }
            EnvConfig::Math(m) => {
                check(m.tolerance >= 0.0, "env.tolerance", "must not be negative")?;
                check(
                    m.tool_timeout_seconds > 0.0 && m.tool_timeout_seconds.is_finite(),
                    "env.tool_timeout_seconds",
                    "must be a positive number of seconds",
                )?;
                if let Some(reward) = &m.reward {
                    reward.validate()?;
                }
                m.host.validate()
            }
            EnvConfig::Code(c) => {
                check(c.test_timeout_seconds > 0.0, "env.test_timeout_seconds", "must be positive")?;
                if let Some(reward) = &c.reward {
                    reward.validate()?;
                }
                c.host.validate()
            }
            EnvConfig::TicTacToe(_) => Ok(()),
            EnvConfig::TextArena(c) => c.validate(),
            EnvConfig::External(c) => c.validate(),
            EnvConfig::ReasoningGym(c) => c.validate(),
            EnvConfig::AgentProgram(c) => c.validate(),
        }
    }
}

/// A problem with an instance or a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{env} instance is not valid JSON of its kind: {reason}")]
    Instance { env: &'static str, reason: String },

    #[error("{file}: {reason}")]
    Dataset { file: String, reason: String },

    #[error("{file}: row {row}: {reason}")]
    DatasetRow { file: String, row: usize, reason: String },
}

/// What one action did.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The acting agent's reward for this action.
    pub reward: f64,
    /// The episode is over.
    pub done: bool,
    /// The task is solved.
    pub success: bool,
    /// What happened, in words, for the agents' next prompts.
    pub feedback: String,
}

/// One environment.
pub trait Env: Clone + Send + Sync + std::fmt::Debug {
    /// A parsed reply.
    type Action: Clone + Send + Serialize + std::fmt::Debug;

    /// The task and the answer format, as shown to every agent.
    fn rules(&self) -> String;
    /// The current state as text.
    fn observation(&self) -> String;
    /// Reads an action from an agent's reply; the error says what was wrong.
    fn parse(&self, text: &str) -> Result<Self::Action, String>;
    /// Applies an action. Only [`Code`] uses the sandbox (to run the hidden tests).
    fn step(&mut self, action: &Self::Action, sandbox: &Sandbox) -> Step;
    /// The episode is over (solved, or out of moves).
    fn done(&self) -> bool;
    /// The task is solved.
    fn success(&self) -> bool;
    /// The reward every agent of the team shares: 1 once the task is solved, else 0.
    fn team_reward(&self) -> f64 {
        if self.success() { 1.0 } else { 0.0 }
    }
    /// A correct action from the current state (the oracle), if there is one.
    fn solve(&self) -> Option<Self::Action>;
    /// An action as an agent should write it in its final answer.
    fn format_action(&self, action: &Self::Action) -> String;
}

/// The environments, as one closed type the workflows hold.
#[derive(Debug, Clone)]
pub enum AnyEnv {
    PlanPath(PlanPath),
    Sudoku(Sudoku),
    Sokoban(Sokoban),
    TicTacToe(TicTacToe),
    Math(Math),
    Code(Code),
}

/// An action as JSON, or why the reply did not parse, plus the step it caused.
#[derive(Debug, Clone, PartialEq)]
pub struct Acted {
    pub action: Result<String, String>,
    pub step: Option<Step>,
}

fn act<E: Env>(env: &mut E, text: &str, sandbox: &Sandbox) -> Acted {
    match env.parse(text) {
        Ok(action) => {
            let json = serde_json::to_string(&action).expect("actions serialise");
            let step = env.step(&action, sandbox);
            Acted { action: Ok(json), step: Some(step) }
        }
        Err(reason) => Acted { action: Err(reason), step: None },
    }
}

/// `$body` for each environment.
macro_rules! each_env {
    ($value:expr, $env:ident => $body:expr) => {
        match $value {
            AnyEnv::PlanPath($env) => $body,
            AnyEnv::Sudoku($env) => $body,
            AnyEnv::Sokoban($env) => $body,
            AnyEnv::TicTacToe($env) => $body,
            AnyEnv::Math($env) => $body,
            AnyEnv::Code($env) => $body,
        }
    };
}

impl AnyEnv {
    /// The environment of a `tasks` row: `instance` is its JSON column.
    pub fn from_instance(config: &EnvConfig, instance: &str) -> Result<AnyEnv, Error> {
        Ok(match config {
            EnvConfig::PlanPath(c) => AnyEnv::PlanPath(PlanPath::from_instance(c, instance)?),
            EnvConfig::Sudoku(_) => AnyEnv::Sudoku(Sudoku::from_instance(instance)?),
            EnvConfig::Sokoban(c) => AnyEnv::Sokoban(Sokoban::from_instance(c, instance)?),
            EnvConfig::TicTacToe(_) => AnyEnv::TicTacToe(TicTacToe::from_instance(instance)?),
            EnvConfig::Math(c) => AnyEnv::Math(Math::from_instance(c, instance)?),
            EnvConfig::Code(c) => AnyEnv::Code(Code::from_instance(c, instance)?),
            EnvConfig::TextArena(_) | EnvConfig::External(_) | EnvConfig::ReasoningGym(_) => {
                return Err(Error::Instance {
                    env: config.name(),
                    reason: "a hosted environment's episodes are made by its host (play::games)".into(),
                });
            }
            EnvConfig::AgentProgram(_) => {
                return Err(Error::Instance {
                    env: config.name(),
                    reason: "an agent program's episodes are its own (play::programs)".into(),
                });
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            AnyEnv::PlanPath(_) => "plan_path",
            AnyEnv::Sudoku(_) => "sudoku",
            AnyEnv::Sokoban(_) => "sokoban",
            AnyEnv::TicTacToe(_) => "tic_tac_toe",
            AnyEnv::Math(_) => "math",
            AnyEnv::Code(_) => "code",
        }
    }

    pub fn rules(&self) -> String {
        each_env!(self, e => e.rules())
    }

    pub fn observation(&self) -> String {
        each_env!(self, e => e.observation())
    }

    /// Parses a reply and, if it parsed, steps.
    pub fn act(&mut self, text: &str, sandbox: &Sandbox) -> Acted {
        each_env!(self, e => act(e, text, sandbox))
    }

    pub fn done(&self) -> bool {
        each_env!(self, e => e.done())
    }

    pub fn success(&self) -> bool {
        each_env!(self, e => e.success())
    }

    pub fn team_reward(&self) -> f64 {
        each_env!(self, e => e.team_reward())
    }

    /// The oracle's answer from the current state, written as an agent would.
    pub fn solution_text(&self) -> Option<String> {
        each_env!(self, e => e.solve().map(|a| e.format_action(&a)))
    }
}

/// Text of a reply after the last `####` marker (the final-answer line of the
/// prompts), or None when there is no marker.
pub fn after_marker(text: &str) -> Option<&str> {
    text.rfind("####").map(|i| text[i + 4..].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_follows_the_last_marker() {
        assert_eq!(after_marker("think #### no\n#### RRD \n"), Some("RRD"));
        assert_eq!(after_marker("no marker"), None);
    }
}
