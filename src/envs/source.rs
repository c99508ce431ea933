//! Where a run's tasks and episodes come from: the one question prepare-data, play and
//! config validation ask of an environment, answered once, here, as a closed type each
//! of them matches on.
//!
//! ```text
//!  source        tasks from                 episodes stepped by    answers scored by
//!  Generated     the run seed (petting)     petting's workflows    the environment
//!  Dataset       data.train_file/test_file  petting's workflows    the environment, or env.reward's host
//!  ReasoningGym  the host, from the seed    petting's math         the host
//!  Hosted        the host, from the seed    the host               the host
//!  AgentProgram  data.train_file/test_file  the user's program     the program
//! ```

use super::hosted::{HostSettings, HostedConfig, PythonReward, ReasoningGymConfig};
use super::plan_path::PlanPathDemonstrations;
use super::{
    AgentProgramConfig, CodeConfig, EnvConfig, MathConfig, PlanPath, PlanPathConfig, Sokoban, SokobanConfig, Sudoku,
    SudokuConfig, TicTacToe,
};

/// Where an environment's tasks and episodes come from ([`EnvConfig::source`]).
#[derive(Debug, Clone, Copy)]
pub enum EnvSource<'a> {
    /// Tasks generated from the run seed; the generator's solver also writes the warm
    /// start's demonstrations.
    Generated(Generator<'a>),
    /// Tasks read from the data files; a Python reward function's host scores the
    /// answers where `env.reward` names one.
    Dataset { kind: DatasetKind<'a>, scorer: Option<HostedConfig<'a>> },
    /// Tasks a reasoning-gym host makes from the run seed and whose every answer it
    /// scores; the episodes are petting's own math episodes.
    ReasoningGym(&'a ReasoningGymConfig),
    /// Tasks and episodes an environment host keeps: it says whose turn it is, what each
    /// agent sees and what each reply earned (TextArena, a user's environment).
    Hosted(HostedConfig<'a>),
    /// Tasks read from the data files, each episode played by the user's agent program.
    AgentProgram(&'a AgentProgramConfig),
}

/// An environment petting generates.
#[derive(Debug, Clone, Copy)]
pub enum Generator<'a> {
    PlanPath(&'a PlanPathConfig),
    Sudoku(&'a SudokuConfig),
    Sokoban(&'a SokobanConfig),
    TicTacToe,
}

/// A freshly generated environment.
#[derive(Debug, Clone)]
pub enum Generated {
    PlanPath(PlanPath),
    Sudoku(Sudoku),
    Sokoban(Sokoban),
    TicTacToe(TicTacToe),
}

/// The environments whose tasks are rows of dataset files, stepped by petting.
#[derive(Debug, Clone, Copy)]
pub enum DatasetKind<'a> {
    Math(&'a MathConfig),
    Code(&'a CodeConfig),
}

impl EnvConfig {
    /// Where this environment's tasks and episodes come from.
    pub fn source(&self) -> EnvSource<'_> {
        match self {
            EnvConfig::PlanPath(c) => EnvSource::Generated(Generator::PlanPath(c)),
            EnvConfig::Sudoku(c) => EnvSource::Generated(Generator::Sudoku(c)),
            EnvConfig::Sokoban(c) => EnvSource::Generated(Generator::Sokoban(c)),
            EnvConfig::TicTacToe(_) => EnvSource::Generated(Generator::TicTacToe),
            EnvConfig::Math(c) => EnvSource::Dataset { kind: DatasetKind::Math(c), scorer: scored(&c.reward, &c.host) },
            EnvConfig::Code(c) => EnvSource::Dataset { kind: DatasetKind::Code(c), scorer: scored(&c.reward, &c.host) },
            EnvConfig::ReasoningGym(c) => EnvSource::ReasoningGym(c),
            EnvConfig::TextArena(c) => EnvSource::Hosted(HostedConfig::TextArena(c)),
            EnvConfig::External(c) => EnvSource::Hosted(HostedConfig::External(c)),
            EnvConfig::AgentProgram(c) => EnvSource::AgentProgram(c),
        }
    }
}

/// The host of a dataset's reward function, if the run names one.
fn scored<'a>(reward: &'a Option<PythonReward>, host: &'a HostSettings) -> Option<HostedConfig<'a>> {
    reward.as_ref().map(|reward| HostedConfig::Rewards { reward, host })
}

impl EnvSource<'_> {
    /// Whether the tasks are rows of `data.train_file` and `data.test_file`.
    pub fn reads_files(&self) -> bool {
        matches!(self, EnvSource::Dataset { .. } | EnvSource::AgentProgram(_))
    }

    /// Whether a host makes the tasks (so that no prompt exists before the run plays).
    pub fn host_makes_tasks(&self) -> bool {
        matches!(self, EnvSource::ReasoningGym(_) | EnvSource::Hosted(_))
    }
}

impl Generator<'_> {
    /// The environment `seed` generates.
    pub fn generate(&self, seed: u64) -> Generated {
        match self {
            Generator::PlanPath(c) => Generated::PlanPath(PlanPath::generate(c, seed)),
            Generator::Sudoku(c) => Generated::Sudoku(Sudoku::generate(c, seed)),
            Generator::Sokoban(c) => Generated::Sokoban(Sokoban::generate(c, seed)),
            Generator::TicTacToe => Generated::TicTacToe(TicTacToe::generate(seed)),
        }
    }

    /// How the warm start's demonstrations choose tools (Plan-Path's are configurable).
    pub fn demonstrations(&self) -> PlanPathDemonstrations {
        match self {
            Generator::PlanPath(c) => c.demonstrations.clone(),
            Generator::Sudoku(_) | Generator::Sokoban(_) | Generator::TicTacToe => PlanPathDemonstrations::default(),
        }
    }
}
