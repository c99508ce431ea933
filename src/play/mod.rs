//! Playing episodes in batches: the episode logic under `rollout` and `evaluate`.
//!
//! ```text
//!  per step: every unfinished episode's next prompt ──► Responder (one batch per policy)
//!            replies ──► tool programs, deduplicated, run in parallel in the sandbox
//!                    ──► each branch steps its own clone of the episode
//!  tree:        K branches per (task, agent, turn); the best (α·r_team + r_local, ties to
//!               the lowest branch) is copied back to all K, so the K share one prompt
//!  independent: K episodes per task, each continued by its own single reply
//! ```
//!
//! Playing is synchronous and knows nothing of stores: a [`Responder`] answers prompts
//! (a sampling engine, `crate::engine`, or fixed replies in tests) and [`Candidate`]s come
//! back in a fixed order, so the rows are the same however the work is spread over
//! threads. Rollout and evaluate both play through it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::engine::{Prompt, Reply, Responder};
use crate::envs::hosted::{Hosted, Session};
use crate::envs::{AnyEnv, EnvConfig};
use crate::limits::Limits;
use crate::progress::Progress;
use crate::rng::{stream, text_key};
use crate::sandbox::{Program, RunOutput, Sandbox};
use crate::tables::TaskRow;
use crate::workflows::{Agent, Episode, TurnOutcome, WorkflowKind, run_program};

mod hosted;
pub mod programs;
mod settings;
pub use settings::{OverlongPrompt, RolloutMode, Selection};

use hosted::{credit, hosted_id, hosted_session, judge_answers, judged, make_hosted, step_hosted};

/// One episode to play: a task's environment, and the key its random streams use.
#[derive(Debug, Clone)]
pub struct Game {
    pub task_id: String,
    pub env: AnyEnv,
}

/// What a stage plays: environments' episodes, or a user's agent program on each task.
#[derive(Debug, Clone)]
pub enum Games {
    Envs(Vec<Game>),
    Programs(programs::Programs),
}

/// Games ready to be played: agent programs already running (see [`Games::start`]).
pub enum Started<'a> {
    Envs(&'a [Game]),
    Programs(programs::Started<'a>),
}

impl Games {
    /// Starts what can start before the policies are loaded: an agent program's processes
    /// (an interpreter and a framework take a second or more to import).
    pub fn start(&self, setup: &Setup) -> Result<Started<'_>, Error> {
        match self {
            Games::Envs(games) => Ok(Started::Envs(games)),
            Games::Programs(programs) => Ok(Started::Programs(programs::start(programs, setup)?)),
        }
    }

    /// Tasks played.
    pub fn len(&self) -> usize {
        match self {
            Games::Envs(games) => games.len(),
            Games::Programs(programs) => programs.tasks.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The games of `tasks` rows in `env`, played by `team`. A hosted environment's host is
/// started here, and lives as long as the games.
pub fn games(env: &EnvConfig, team: &[Agent], limits: &Limits, tasks: &[TaskRow]) -> Result<Games, Error> {
    let game = |t: &TaskRow, env| Game { task_id: t.task_id.clone(), env };
    if let Some(program) = env.agent_program() {
        let tasks = tasks.iter().map(|t| (t.task_id.clone(), t.instance.clone())).collect();
        return Ok(Games::Programs(programs::Programs {
            config: program.clone(),
            tasks,
            team: team.to_vec(),
            limits: limits.clone(),
        }));
    }
    if let Some(scorer) = env.scorer() {
        let session = Session::start(scorer, team, limits.host_message_bytes)?;
        let games = tasks.iter().map(|t| Ok(game(t, judged(env, &session, &t.instance)?)));
        return games.collect::<Result<_, Error>>().map(Games::Envs);
    }
    let games: Result<Vec<Game>, Error> = match env.hosted() {
        Some(hosted) => {
            let session = Session::start(hosted, team, limits.host_message_bytes)?;
            tasks.iter().map(|t| Ok(game(t, AnyEnv::Hosted(Hosted::new(&session, &t.instance, t.seed)?)))).collect()
        }
        None => tasks.iter().map(|t| Ok(game(t, AnyEnv::from_instance(env, &t.instance)?))).collect(),
    };
    games.map(Games::Envs)
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

/// The live episodes of one task (one in tree mode, K in independent mode).
struct Track {
    task_index: usize,
    episode_index: u32,
    episode: Episode,
    next_node: u32,
    parent: Option<u32>,
    tokens: u64,
}

impl Setup {
    /// Episodes played per task: one tree, or K independent ones.
    pub fn episodes_per_task(&self) -> u32 {
        match self.branching {
            Branching::Tree { .. } => 1,
            Branching::Independent { episodes } => episodes,
        }
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
        Started::Envs(games) => play_envs(games, setup, responder, sandbox, progress),
        Started::Programs(programs) => programs::play(programs, setup, responder, progress),
    }
}

/// Plays environments' episodes, step by step: every live episode's next prompt in one
/// batch per policy.
fn play_envs(
    games: &[Game],
    setup: &Setup,
    responder: &mut dyn Responder,
    sandbox: &Sandbox,
    progress: &dyn Progress,
) -> Result<Played, Error> {
    let mut tracks = Vec::new();
    for (task_index, game) in games.iter().enumerate() {
        for episode_index in 0..setup.episodes_per_task() {
            let mut episode = Episode::new(setup.workflow, game.env.clone(), setup.max_turns)?;
            if setup.alone {
                episode = episode.alone()?;
            }
            tracks.push(Track { task_index, episode_index, episode, next_node: 0, parent: None, tokens: 0 });
        }
    }
    let hosted = hosted_session(games);
    if let Some(session) = &hosted {
        make_hosted(session, &mut tracks)?;
    }
    let branches = setup.branches();
    let mut candidates = Vec::new();
    let (mut model, mut sandboxed) = (Duration::ZERO, Duration::ZERO);
    let mut skipped: Vec<usize> = Vec::new();
    loop {
        if let Some(opponent) = setup.opponent {
            for track in &mut tracks {
                play_opponent(&mut track.episode, opponent, sandbox);
            }
        }
        if setup.overlong_prompt == OverlongPrompt::Skip {
            skipped.extend(overlong_tasks(setup, &tracks, &skipped, responder)?);
        }
        let live: Vec<usize> = (0..tracks.len())
            .filter(|&i| !tracks[i].episode.is_done() && !skipped.contains(&tracks[i].task_index))
            .collect();
        if live.is_empty() {
            break;
        }
        let started = Instant::now();
        let step = sample_step(games, setup, &tracks, &live, branches, responder)?;
        model += started.elapsed();
        let (stepped, sandbox_time) = match &hosted {
            Some(session) => (step_hosted(session, &tracks, &live, &step)?, Duration::ZERO),
            None => step_branches(&tracks, &live, &step, sandbox)?,
        };
        sandboxed += sandbox_time;
        let mut finished_ids: Vec<String> = Vec::new();
        let tokens: usize = step.replies.iter().map(|(_, r)| r.tokens.len()).sum();
        for (slot, &t) in live.iter().enumerate() {
            let track = &mut tracks[t];
            let first = slot * branches as usize;
            let outcomes = &stepped[first..first + branches as usize];
            let best = select(setup.branching, outcomes.iter().map(|(_, o)| o));
            let turn = track.episode.turn();
            let agent = track.episode.next_agent().expect("live");
            let node_base = track.next_node;
            for (b, (_, outcome)) in outcomes.iter().enumerate() {
                let (seed, reply) = step.replies[first + b].clone();
                track.tokens += reply.tokens.len() as u64;
                candidates.push(Candidate {
                    task_index: track.task_index,
                    episode: track.episode_index,
                    turn,
                    agent,
                    policy: step.policy_of[slot].clone(),
                    branch: b as u32,
                    node_id: node_base + b as u32,
                    parent_id: track.parent,
                    selected: b == best,
                    seed,
                    message: step.messages[slot].clone(),
                    reply,
                    outcome: outcome.clone(),
                });
            }
            track.next_node += branches;
            track.parent = Some(node_base + best as u32);
            if hosted.is_some() && branches > 1 {
                // The branches were forks: the one that continues is the episode now.
                finished_ids.push(hosted_id(&track.episode));
                let others = outcomes.iter().enumerate().filter(|&(b, _)| b != best);
                finished_ids.extend(others.map(|(_, (episode, _))| hosted_id(episode)));
            }
            credit(&mut candidates, track, &outcomes[best].1.credited);
            track.episode = stepped[first + best].0.clone();
        }
        if let Some(session) = &hosted {
            session.host.drop_episodes(&finished_ids)?;
        }
        let ended = live.iter().filter(|&&t| tracks[t].episode.is_done()).count();
        progress.advance(ended as u64, tokens as u64);
    }
    if let Some(session) = &hosted {
        session.host.drop_episodes(&tracks.iter().map(|t| hosted_id(&t.episode)).collect::<Vec<_>>())?;
    }
    skipped.sort_unstable();
    candidates.retain(|c: &Candidate| !skipped.contains(&c.task_index));
    let finished = tracks
        .iter()
        .filter(|t| !skipped.contains(&t.task_index))
        .map(|t| Finished {
            task_index: t.task_index,
            episode: t.episode_index,
            success: t.episode.success(),
            tool_success: t.episode.tool_success(),
            team_reward: t.episode.env().team_reward(),
            turns: t.episode.turn(),
            tokens: t.tokens,
            failure: None,
        })
        .collect();
    Ok(Played {
        candidates,
        finished,
        model_seconds: model.as_secs_f64(),
        sandbox_seconds: sandboxed.as_secs_f64(),
        skipped,
    })
}

/// The tasks, not yet skipped, one of whose live episodes would next send a prompt
/// longer than the limit: the whole task goes, so that no group is left half sampled.
fn overlong_tasks(
    setup: &Setup,
    tracks: &[Track],
    skipped: &[usize],
    responder: &mut dyn Responder,
) -> Result<Vec<usize>, Error> {
    let mut found: Vec<usize> = Vec::new();
    for track in tracks {
        let task = track.task_index;
        if track.episode.is_done() || skipped.contains(&task) || found.contains(&task) {
            continue;
        }
        let agent = track.episode.next_agent().expect("live");
        let policy = setup.policies.get(&agent).ok_or(Error::NoPolicy { agent })?;
        if !responder.fits(policy, &track.episode.prompt())? {
            found.push(task);
        }
    }
    Ok(found)
}

/// Plays the solver's moves for `opponent` until another agent is to act or the episode
/// ends.
fn play_opponent(episode: &mut Episode, opponent: Agent, sandbox: &Sandbox) {
    while !episode.is_done() && episode.next_agent() == Some(opponent) {
        let Some(reply) = episode.oracle_reply() else { break };
        episode.step(&reply, sandbox);
    }
}

/// The replies of one step: `branches` per live track, in track order.
struct SampledStep {
    replies: Vec<(u64, Reply)>,
    policy_of: Vec<String>,
    /// The prompt of each live track.
    messages: Vec<String>,
}

fn sample_step(
    games: &[Game],
    setup: &Setup,
    tracks: &[Track],
    live: &[usize],
    branches: u32,
    responder: &mut dyn Responder,
) -> Result<SampledStep, Error> {
    // (policy, prompt) per reply slot, then one responder call per policy.
    let mut wanted: Vec<(String, Prompt)> = Vec::new();
    let mut policy_of = Vec::new();
    let mut messages = Vec::new();
    for &t in live {
        let track = &tracks[t];
        let agent = track.episode.next_agent().expect("live");
        let policy = setup.policies.get(&agent).ok_or(Error::NoPolicy { agent })?;
        // A hosted environment's agents are named at run time: their names key the seeds.
        let role_index = match setup.workflow.agents().iter().position(|r| *r == agent) {
            Some(index) => index as u64,
            None => text_key(agent.as_str()),
        };
        let text = track.episode.prompt();
        let task = text_key(&games[track.task_index].task_id);
        for b in 0..branches {
            let mut keys = setup.seed_keys.clone();
            keys.extend([task, track.episode_index as u64, track.episode.turn() as u64, role_index, b as u64]);
            wanted.push((policy.clone(), Prompt::message(text.clone(), stream(&keys))));
        }
        policy_of.push(policy.clone());
        messages.push(text);
    }
    let mut replies: Vec<Option<(u64, Reply)>> = vec![None; wanted.len()];
    let mut by_policy: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, (policy, _)) in wanted.iter().enumerate() {
        match by_policy.iter_mut().find(|(p, _)| *p == policy.as_str()) {
            Some((_, slots)) => slots.push(i),
            None => by_policy.push((policy.as_str(), vec![i])),
        }
    }
    for (policy, slots) in by_policy {
        let prompts: Vec<Prompt> = slots.iter().map(|&i| wanted[i].1.clone()).collect();
        let answered = responder.respond(policy, &prompts)?;
        if answered.len() != prompts.len() {
            return Err(Error::ReplyCount { asked: prompts.len(), got: answered.len() });
        }
        for (&i, reply) in slots.iter().zip(answered) {
            replies[i] = Some((wanted[i].1.seed, reply));
        }
    }
    Ok(SampledStep {
        replies: replies.into_iter().map(|r| r.expect("every slot answered")).collect(),
        policy_of,
        messages,
    })
}

/// Steps one clone of its track's episode per reply. Tool programs are run first, each
/// distinct program once (the K branches of a step often write the same one), in
/// parallel; the wall time they took comes back with the outcomes.
fn step_branches(
    tracks: &[Track],
    live: &[usize],
    step: &SampledStep,
    sandbox: &Sandbox,
) -> Result<(Vec<(Episode, TurnOutcome)>, Duration), Error> {
    let branches = step.replies.len() / live.len();
    let live: Vec<&Track> = live.iter().map(|&t| &tracks[t]).collect();
    let programs: Vec<Option<Program>> = step
        .replies
        .iter()
        .enumerate()
        .map(|(i, (_, reply))| live[i / branches].episode.tool_program(&reply.text))
        .collect();
    let mut distinct: Vec<&Program> = Vec::new();
    for program in programs.iter().flatten() {
        if !distinct.iter().any(|p| same_program(p, program)) {
            distinct.push(program);
        }
    }
    let started = Instant::now();
    let outputs = run_all(&distinct, sandbox);
    let sandbox_time = started.elapsed();
    let output_of = |program: &Program| {
        let i = distinct.iter().position(|p| same_program(p, program)).expect("distinct");
        outputs[i].clone()
    };
    let jobs: Vec<(usize, Option<RunOutput>)> =
        programs.iter().enumerate().map(|(i, p)| (i, p.as_ref().map(output_of))).collect();
    judge_answers(&live, branches, step, &jobs)?;
    let stepped = parallel_map(jobs, |(i, run)| {
        let mut episode = live[i / branches].episode.clone();
        let outcome = episode.step_with(&step.replies[i].1.text, run, sandbox);
        (episode, outcome)
    });
    Ok((stepped, sandbox_time))
}

fn same_program(a: &Program, b: &Program) -> bool {
    a.code == b.code && a.stdin == b.stdin && a.files == b.files
}

fn run_all(programs: &[&Program], sandbox: &Sandbox) -> Vec<RunOutput> {
    parallel_map(programs.to_vec(), |program| run_program(program, sandbox))
}

/// Maps `f` over `items` on a few threads; results keep the items' order.
fn parallel_map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 16).min(items.len().max(1));
    let queue = Mutex::new(items.into_iter().enumerate());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let Some((i, item)) = queue.lock().expect("queue").next() else { break };
                    let r = f(item);
                    results.lock().expect("results").push((i, r));
                }
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// The branch that continues the trajectory.
fn select<'a>(branching: Branching, outcomes: impl Iterator<Item = &'a TurnOutcome>) -> usize {
    match branching {
        Branching::Independent { .. } | Branching::Tree { select: Selection::First, .. } => 0,
        Branching::Tree { select: Selection::BestReward, alpha, .. } => {
            let mut best = (0, f64::NEG_INFINITY);
            for (b, o) in outcomes.enumerate() {
                let r = crate::algo::mixed_reward(alpha, o.team_reward, o.local_reward);
                if r > best.1 {
                    best = (b, r);
                }
            }
            best.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::plan_path::PlanPathConfig;
    use crate::envs::{PlanPath, TicTacToe};
    use crate::progress::Quiet;
    use crate::sandbox::SandboxConfig;

    /// Tool agents cycle through greedy, bfs and no program by branch; planners copy the
    /// tool's printed output.
    struct Scripted;

    impl Responder for Scripted {
        fn respond(&mut self, _policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
            let tool =
                ["```python\nprint(greedy(grid, S, G))\n```", "```python\nprint(bfs(grid, S, G))\n```", "no idea"];
            Ok(prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let text = if p.text.starts_with("You are the tool agent") {
                        tool[i % 3].to_string()
                    } else {
                        let output = p.text.split("Its output:\n").nth(1).and_then(|o| o.lines().next()).unwrap_or("");
                        format!("#### {output}")
                    };
                    Reply {
                        prompt_text: p.text.clone(),
                        prompt_tokens: vec![1, 2],
                        tokens: vec![3; text.len()],
                        logprobs: vec![-0.5; text.len()],
                        text,
                        finish_reason: "eos".into(),
                        seconds: 0.0,
                        engine: crate::engine::EngineKind::Tch,
                        engine_model: "scripted".into(),
                    }
                })
                .collect())
        }
    }

    /// [`Scripted`], except that the `too_long`-th prompt checked does not fit.
    struct WithALongPrompt {
        checked: usize,
        too_long: usize,
    }

    impl Responder for WithALongPrompt {
        fn respond(&mut self, policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
            Scripted.respond(policy, prompts)
        }

        fn fits(&mut self, _policy: &str, _text: &str) -> Result<bool, crate::engine::Error> {
            self.checked += 1;
            Ok(self.checked != self.too_long)
        }
    }

    #[test]
    fn a_task_with_an_overlong_prompt_is_skipped_whole_or_not_checked_at_all() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let skip = Setup { overlong_prompt: OverlongPrompt::Skip, ..setup(RolloutMode::Tree) };
        // Checked in track order: the second prompt of the first step is task 1's.
        let mut responder = WithALongPrompt { checked: 0, too_long: 2 };
        let played = play(Started::Envs(&games()), &skip, &mut responder, &sandbox, &Quiet).unwrap();
        assert_eq!(played.skipped, [1]);
        assert!(played.candidates.iter().all(|c| c.task_index == 0) && !played.candidates.is_empty());
        assert_eq!(played.finished.iter().map(|f| f.task_index).collect::<Vec<_>>(), [0]);
        // Skipped at its planner's turn (the third check), task 0 loses its tool rows too.
        let mut responder = WithALongPrompt { checked: 0, too_long: 3 };
        let played = play(Started::Envs(&games()), &skip, &mut responder, &sandbox, &Quiet).unwrap();
        assert_eq!(played.skipped, [0]);
        assert!(played.candidates.iter().all(|c| c.task_index == 1), "{:?}", played.candidates.len());
        // With overlong_prompt: error the responder itself refuses; nothing is checked.
        let mut responder = WithALongPrompt { checked: 0, too_long: 1 };
        let played =
            play(Started::Envs(&games()), &setup(RolloutMode::Tree), &mut responder, &sandbox, &Quiet).unwrap();
        assert_eq!((responder.checked, played.skipped.len(), played.finished.len()), (0, 0, 2));
    }

    fn games() -> Vec<Game> {
        let config = PlanPathConfig::default();
        (0..2)
            .map(|i| Game { task_id: format!("t{i}"), env: AnyEnv::PlanPath(PlanPath::generate(&config, 40 + i)) })
            .collect()
    }

    fn setup(mode: RolloutMode) -> Setup {
        Setup {
            workflow: WorkflowKind::ToolPlanner,
            max_turns: 1,
            alone: false,
            opponent: None,
            policies: HashMap::from([(Agent::TOOL, "shared".into()), (Agent::PLANNER, "shared".into())]),
            branching: Branching::new(mode, 3, Selection::BestReward, 1.0),
            seed_keys: vec![7, 0],
            overlong_prompt: OverlongPrompt::Error,
        }
    }

    fn mixed(c: &Candidate) -> f64 {
        c.outcome.team_reward + c.outcome.local_reward
    }

    #[test]
    fn tree_sampling_branches_k_ways_and_continues_the_best() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let Played { candidates, finished, .. } =
            play(Started::Envs(&games()), &setup(RolloutMode::Tree), &mut Scripted, &sandbox, &Quiet).unwrap();
        assert_eq!(candidates.len(), 2 * (3 + 3));
        for group in candidates.chunks(3) {
            assert!(
                group.iter().all(|c| c.reply.prompt_text == group[0].reply.prompt_text && c.agent == group[0].agent)
            );
            assert_eq!(group.iter().map(|c| c.branch).collect::<Vec<_>>(), [0, 1, 2]);
            let selected: Vec<&Candidate> = group.iter().filter(|c| c.selected).collect();
            assert_eq!(selected.len(), 1);
            let best = group.iter().map(mixed).fold(f64::NEG_INFINITY, f64::max);
            let first_best = group.iter().find(|c| mixed(c) == best).unwrap();
            assert_eq!(selected[0].branch, first_best.branch, "ties go to the lowest branch");
        }
        // Step order: both tool groups, then both planner groups.
        let (tools, planners) = candidates.split_at(6);
        assert!(tools.iter().all(|c| c.agent == Agent::TOOL && c.parent_id.is_none()));
        for task in 0..2 {
            let chosen = tools.iter().find(|c| c.task_index == task && c.selected).unwrap();
            assert_eq!(chosen.branch, 1, "bfs beats greedy and no program on these grids");
            let children: Vec<&Candidate> = planners.iter().filter(|c| c.task_index == task).collect();
            assert!(children.iter().all(|c| c.parent_id == Some(chosen.node_id) && c.node_id >= 3));
            assert!(children.iter().all(|c| c.reply.prompt_text.contains("print(bfs(grid, S, G))")));
        }
        assert!(finished.iter().all(|f| f.success && f.turns == 1), "{finished:?}");
        let again = play(Started::Envs(&games()), &setup(RolloutMode::Tree), &mut Scripted, &sandbox, &Quiet).unwrap();
        assert_eq!(again.candidates, candidates);
    }

    /// Sums what it is told.
    #[derive(Default)]
    struct Tally(Mutex<(u64, u64, u32)>);

    impl Progress for Tally {
        fn start(&self, _label: &str, _total: u64, _unit: &'static str) {}
        fn advance(&self, units: u64, tokens: u64) {
            let mut t = self.0.lock().unwrap();
            *t = (t.0 + units, t.1 + tokens, t.2 + 1);
        }
        fn finish(&self) {}
    }

    #[test]
    fn progress_counts_every_episode_and_sampled_token_once_per_step() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let tally = Tally::default();
        let played =
            play(Started::Envs(&games()), &setup(RolloutMode::Independent), &mut Scripted, &sandbox, &tally).unwrap();
        let (episodes, tokens, steps) = *tally.0.lock().unwrap();
        assert_eq!(episodes, played.finished.len() as u64);
        assert_eq!(tokens, played.candidates.iter().map(|c| c.reply.tokens.len() as u64).sum::<u64>());
        assert_eq!(steps, 2, "a tool step, then a planner step");
        assert!(played.sandbox_seconds > 0.0, "the tool programs ran in the sandbox");
    }

    #[test]
    fn alone_the_tool_agent_keeps_its_success_and_the_planner_has_nothing_to_copy() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let together = setup(RolloutMode::Independent);
        let apart = Setup { alone: true, ..together.clone() };
        let team = play(Started::Envs(&games()), &together, &mut Scripted, &sandbox, &Quiet).unwrap().finished;
        let alone = play(Started::Envs(&games()), &apart, &mut Scripted, &sandbox, &Quiet).unwrap().finished;
        let successes = |f: &[Finished], tool: bool| -> Vec<bool> {
            f.iter().map(|f| if tool { f.tool_success } else { f.success }).collect()
        };
        assert!(successes(&team, false).contains(&true), "{team:?}");
        assert_eq!(successes(&team, true), successes(&team, false), "the planner copies the tool's answer");
        assert_eq!(successes(&alone, true), successes(&team, true), "the same tool replies");
        assert!(!successes(&alone, false).contains(&true), "{alone:?}");
    }

    /// Players always take the first cell the prompt lists as empty.
    struct FirstEmptyCell;

    impl Responder for FirstEmptyCell {
        fn respond(&mut self, _policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
            let mut replies = Scripted.respond("", prompts)?;
            for (reply, prompt) in replies.iter_mut().zip(prompts) {
                let listed = prompt.text.lines().rev().find_map(|l| l.strip_prefix("Empty cells: ")).unwrap();
                reply.text = format!("#### {}", listed.split_whitespace().next().unwrap());
            }
            Ok(replies)
        }
    }

    #[test]
    fn the_minimax_opponent_plays_o_unsampled_and_denies_the_win_self_play_gives_x() {
        let empty = AnyEnv::TicTacToe(TicTacToe::from_instance(r#"{"board": ["...", "...", "..."]}"#).unwrap());
        let games = vec![Game { task_id: "empty".into(), env: empty }];
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let self_play = Setup {
            workflow: WorkflowKind::TwoPlayers,
            max_turns: 5,
            alone: false,
            opponent: None,
            policies: HashMap::from([(Agent::PLAYER_X, "shared".into()), (Agent::PLAYER_O, "shared".into())]),
            branching: Branching::Independent { episodes: 1 },
            seed_keys: vec![1],
            overlong_prompt: OverlongPrompt::Error,
        };
        let played = play(Started::Envs(&games), &self_play, &mut FirstEmptyCell, &sandbox, &Quiet).unwrap();
        assert!(played.finished[0].success, "first-free-cell O lets X complete the diagonal");

        let policies = HashMap::from([(Agent::PLAYER_X, "shared".into())]);
        let minimax = Setup { opponent: Some(Agent::PLAYER_O), policies, ..self_play };
        let played = play(Started::Envs(&games), &minimax, &mut FirstEmptyCell, &sandbox, &Quiet).unwrap();
        assert!(!played.finished[0].success, "{:?}", played.finished);
        assert!(played.candidates.iter().all(|c| c.agent == Agent::PLAYER_X));
        assert!(played.candidates.len() >= 2, "X moved more than once: O answered in between");
    }

    #[test]
    fn independent_mode_plays_k_separate_episodes() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let Played { candidates, finished, .. } =
            play(Started::Envs(&games()), &setup(RolloutMode::Independent), &mut Scripted, &sandbox, &Quiet).unwrap();
        assert_eq!(finished.len(), 2 * 3);
        assert_eq!(candidates.len(), 2 * 3 * 2);
        assert!(candidates.iter().all(|c| c.selected && c.branch == 0));
        let seeds: std::collections::HashSet<u64> = candidates.iter().map(|c| c.seed).collect();
        assert_eq!(seeds.len(), candidates.len(), "every reply has its own stream");
        // Episode e of each task got the e-th tool reply of its batch.
        let bfs = finished.iter().filter(|f| f.success).count();
        assert!(bfs >= 2, "{finished:?}");
    }
}
