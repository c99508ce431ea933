//! Playing episodes in batches: the episode logic under `rollout` and `evaluate`.
//!
//! ```text
//!  per step: every unfinished episode's next prompt ──► Responder (one batch per policy)
//!            replies ──► local: tool programs, deduplicated, run in parallel in the
//!                               sandbox, then each branch steps its own clone
//!                        hosted: the host forks each episode per branch and steps them
//!  tree:        K branches per (task, agent, turn); the best (α·r_team + r_local, ties to
//!               the lowest branch) is copied back to all K, so the K share one prompt
//!  independent: K episodes per task, each continued by its own single reply
//! ```
//!
//! Playing is synchronous and knows nothing of stores: a [`Responder`] answers prompts
//! (a sampling engine, `crate::engine`, or fixed replies in tests) and [`Candidate`]s come
//! back in a fixed order, so the rows are the same however the work is spread over
//! threads. Rollout and evaluate both play through it. Where the episodes are stepped
//! (`local`, `hosted`) is chosen once from the games, before the loop (`steps`); a
//! user's agent program plays its own episodes (`programs`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::{Reply, Responder};
use crate::envs::hosted::{HostSession, Hosted};
use crate::envs::{AnyEnv, EnvConfig, EnvSource, HostedConfig};
use crate::limits::Limits;
use crate::progress::Progress;
use crate::sandbox::Sandbox;
use crate::tables::TaskRow;
use crate::workflows::{Agent, TurnOutcome, WorkflowKind};

mod hosted;
mod judged;
mod local;
pub mod programs;
mod settings;
mod steps;
pub use hosted::HostedGame;
pub use settings::{OverlongPrompt, RolloutMode, Selection};

/// One episode to play: a task's environment, and the key its random streams use.
#[derive(Debug, Clone)]
pub struct Game {
    pub task_id: String,
    pub env: AnyEnv,
}

/// What a stage plays: petting's own environments' episodes, the episodes an
/// environment host keeps, or a user's agent program on each task.
#[derive(Debug, Clone)]
pub enum Games {
    Local(Vec<Game>),
    Hosted { session: Arc<HostSession>, games: Vec<HostedGame> },
    Programs(programs::Programs),
}

/// Games ready to be played: agent programs already running (see [`Games::start`]).
pub enum Started<'a> {
    Local(&'a [Game]),
    Hosted(&'a Arc<HostSession>, &'a [HostedGame]),
    Programs(programs::Running<'a>),
}

impl Games {
    /// Starts what can start before the policies are loaded: an agent program's processes
    /// (an interpreter and a framework take a second or more to import).
    pub fn start(&self, setup: &Setup) -> Result<Started<'_>, Error> {
        match self {
            Games::Local(games) => Ok(Started::Local(games)),
            Games::Hosted { session, games } => Ok(Started::Hosted(session, games)),
            Games::Programs(programs) => Ok(Started::Programs(programs::start(programs, setup)?)),
        }
    }

    /// Tasks played.
    pub fn len(&self) -> usize {
        match self {
            Games::Local(games) => games.len(),
            Games::Hosted { games, .. } => games.len(),
            Games::Programs(programs) => programs.tasks.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The games of `tasks` rows in `env`, played by `team`. A host that keeps the episodes
/// or scores the answers is started here, and lives as long as the games.
pub fn games(env: &EnvConfig, team: &[Agent], limits: &Limits, tasks: &[TaskRow]) -> Result<Games, Error> {
    let start = |host| HostSession::start(host, team, limits.host_message_bytes);
    let local = |make: &dyn Fn(&str) -> Result<AnyEnv, Error>| {
        let game = |t: &TaskRow| Ok(Game { task_id: t.task_id.clone(), env: make(&t.instance)? });
        tasks.iter().map(game).collect::<Result<_, Error>>().map(Games::Local)
    };
    match env.source() {
        EnvSource::Generated(_) | EnvSource::Dataset { scorer: None, .. } => {
            local(&|instance| Ok(AnyEnv::from_instance(env, instance)?))
        }
        EnvSource::Dataset { kind, scorer: Some(scorer) } => {
            let session = start(scorer)?;
            local(&|instance| judged::judged_row(kind, &session, instance))
        }
        EnvSource::ReasoningGym(gym) => {
            let session = start(HostedConfig::ReasoningGym(gym))?;
            local(&|instance| judged::judged_entry(gym, &session, instance))
        }
        EnvSource::Hosted(host) => {
            let session = start(host)?;
            let game = |t: &TaskRow| {
                Ok(HostedGame { task_id: t.task_id.clone(), hosted: Hosted::new(&session, &t.instance, t.seed)? })
            };
            let games = tasks.iter().map(game).collect::<Result<_, Error>>()?;
            Ok(Games::Hosted { session, games })
        }
        EnvSource::AgentProgram(program) => Ok(Games::Programs(programs::Programs {
            config: program.clone(),
            tasks: tasks.iter().map(|t| (t.task_id.clone(), t.instance.clone())).collect(),
            team: team.to_vec(),
            limits: limits.clone(),
        })),
    }
}

/// How many candidates each step samples, and which continues.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Branching {
    /// AT-GRPO's tree: one episode per task, `branches` candidates per (task, agent,
    /// turn), of which `select` continues (with `alpha` weighting the team reward).
    Tree { branches: u32, select: Selection, alpha: f64 },
    /// `episodes` separate episodes per task, each continued by its own single reply.
    Independent { episodes: u32 },
}

impl Branching {
    /// `rollout.mode`, its group size `k` (`rollout.branches` or `episodes_per_task`) and
    /// `rollout.select` as one value.
    pub fn new(mode: RolloutMode, k: u32, select: Selection, alpha: f64) -> Branching {
        match mode {
            RolloutMode::Tree => Branching::Tree { branches: k.max(1), select, alpha },
            RolloutMode::Independent => Branching::Independent { episodes: k.max(1) },
        }
    }
}

/// What is played: the workflow, who plays each role, and how candidates branch.
#[derive(Debug, Clone)]
pub struct Setup {
    pub workflow: WorkflowKind,
    pub max_turns: u32,
    /// Each agent acts alone (see [`Episode::alone`]).
    pub alone: bool,
    /// A role the environment's solver plays (tic-tac-toe's minimax opponent at
    /// evaluation): its turns take the solver's move and are never sampled.
    pub opponent: Option<Agent>,
    /// role -> policy
    pub policies: HashMap<Agent, String>,
    /// (task index, role) -> the loaded member that plays the role in that task instead:
    /// a league's past version (`policies::past_member`).
    pub league: HashMap<(usize, Agent), String>,
    pub branching: Branching,
    /// Keys every seed of this run and stage starts with (run seed, iteration, stage key, …).
    pub seed_keys: Vec<u64>,
    /// What a prompt over the responder's limit does to its task.
    pub overlong_prompt: OverlongPrompt,
}

/// One sampled reply and what it did: a future `turns` row.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub task_index: usize,
    pub episode: u32,
    pub turn: u32,
    pub agent: Agent,
    pub policy: String,
    pub branch: u32,
    pub node_id: u32,
    pub parent_id: Option<u32>,
    pub selected: bool,
    pub seed: u64,
    /// The prompt as the workflow wrote it (the reply has it as the model saw it).
    pub message: String,
    pub reply: Reply,
    pub outcome: TurnOutcome,
}

/// Everything a [`play`] produced, and where its time went.
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    /// In (step, task, episode, branch) order.
    pub candidates: Vec<Candidate>,
    pub finished: Vec<Finished>,
    /// Wall time spent waiting for the responder (the model).
    pub model_seconds: f64,
    /// Wall time spent running tool programs.
    pub sandbox_seconds: f64,
    /// Tasks left out because a prompt was too long, by index, ascending.
    pub skipped: Vec<usize>,
}

/// How one episode ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub task_index: usize,
    pub episode: u32,
    pub success: bool,
    /// The tool agent's latest answer solved the task on its own (see [`Episode::tool_success`]).
    pub tool_success: bool,
    pub team_reward: f64,
    pub turns: u32,
    pub tokens: u64,
    /// Why the episode failed (an agent program that crashed, hung, or gave no verdict);
    /// None when it ended as its environment or program says.
    pub failure: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Workflow(#[from] crate::workflows::Error),
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    #[error("no policy is mapped to the {agent} agent (agents: in the config)")]
    NoPolicy { agent: Agent },
    #[error("the responder returned {got} replies for {asked} prompts")]
    ReplyCount { asked: usize, got: usize },
    #[error(transparent)]
    Env(#[from] crate::envs::Error),
    #[error(transparent)]
    Host(#[from] crate::envs::hosted::host::Error),
    #[error("the environment host answered episode {episode} with {reason}")]
    Hosted { episode: String, reason: String },
    #[error("cannot start the endpoint agent programs call: {0}")]
    Endpoint(std::io::Error),
    #[error("cannot write the task files agent programs read (PETTING_TASK_FILE): {0}")]
    TaskFiles(std::io::Error),
    #[error("every one of the {episodes} episodes of the agent program failed; the first, of task {task_id}: {reason}")]
    ProgramsFailed { episodes: usize, task_id: String, reason: String },
}

impl Setup {
    /// The loaded member that plays `agent` in task `task`.
    fn policy_of(&self, task: usize, agent: Agent) -> Result<&String, Error> {
        self.league.get(&(task, agent)).or_else(|| self.policies.get(&agent)).ok_or(Error::NoPolicy { agent })
    }

    /// Episodes played per task: one tree, or K independent ones.
    pub fn episodes_per_task(&self) -> u32 {
        match self.branching {
            Branching::Tree { .. } => 1,
            Branching::Independent { episodes } => episodes,
        }
    }

    /// The most steps an episode can take (a hosted environment's agents are not known
    /// before it starts: each turn counted as one step).
    fn most_steps(&self) -> u32 {
        self.max_turns.saturating_mul(self.workflow.steps_per_turn())
    }

    /// Candidates sampled per live episode and step.
    fn branches(&self) -> u32 {
        match self.branching {
            Branching::Tree { branches, .. } => branches,
            Branching::Independent { .. } => 1,
        }
    }
}

/// Plays every game to the end, reporting finished episodes and sampled tokens to
/// `progress` as they come.
pub fn play(
    started: Started,
    setup: &Setup,
    responder: &mut dyn Responder,
    sandbox: &Sandbox,
    progress: &dyn Progress,
) -> Result<Played, Error> {
    match started {
        Started::Local(games) => {
            let tracks = local::tracks(games, setup)?;
            let stepping = local::Local { sandbox, opponent: setup.opponent };
            let ids: Vec<&str> = games.iter().map(|g| g.task_id.as_str()).collect();
            steps::play(stepping, tracks, &ids, setup, responder, progress)
        }
        Started::Hosted(session, games) => {
            let tracks = hosted::tracks(session, games, setup)?;
            let ids: Vec<&str> = games.iter().map(|g| g.task_id.as_str()).collect();
            steps::play(hosted::InHost { session }, tracks, &ids, setup, responder, progress)
        }
        Started::Programs(programs) => programs::play(programs, setup, responder, progress),
    }
}

#[cfg(test)]
mod tests;
