//! The stepping loop: every live episode's next prompt sampled in one batch per policy,
//! each reply stepped on its own copy of its episode, the best copy continued. How the
//! replies move the episodes ([`Stepping`]: petting's workflows, or an environment host)
//! is chosen once, before the loop.

use std::time::{Duration, Instant};

use crate::engine::{Prompt, Reply, Responder};
use crate::progress::Progress;
use crate::rng::{stream, text_key};
use crate::workflows::{Agent, TurnOutcome};

use super::{Branching, Candidate, Error, Finished, OverlongPrompt, Played, Selection, Setup};

/// What the loop reads of an episode, whoever steps it.
pub(super) trait Turns: Clone {
    /// The agents that act in the next step, each answering its own prompt: one, unless
    /// the workflow has several answer at once; none once the episode is over.
    fn acting(&self) -> Vec<Agent>;
    /// The turn the next step is part of, from 0.
    fn turn(&self) -> u32;
    /// What `agent`, one of [`acting`](Turns::acting), is asked in the next step.
    fn prompt(&self, agent: Agent) -> String;
    fn is_done(&self) -> bool;
    /// How it ended: a [`Finished`] without its place and tokens.
    fn ended(&self, task_index: usize, episode: u32, tokens: u64) -> Finished;
}

/// How a step's replies move the episodes.
pub(super) trait Stepping {
    type Episode: Turns;

    /// Plays the turns no model samples (the solver's opponent) before each step.
    fn play_scripted(&self, _tracks: &mut [Track<Self::Episode>]) {}

    /// Steps one copy of its track's episode per joint reply ([`SampledStep::joint`]).
    fn step(
        &self,
        tracks: &[Track<Self::Episode>],
        live: &[usize],
        step: &SampledStep,
    ) -> Result<Outcomes<Self::Episode>, Error>;

    /// Episodes nothing continues any more (a host forgets them).
    fn retire(&self, _episodes: &[&Self::Episode]) -> Result<(), Error> {
        Ok(())
    }
}

/// What one step's replies did.
pub(super) struct Outcomes<E> {
    /// Each joint reply's copy of its episode and the outcome of each of its replies (in
    /// acting order): `branches` per live track, in order.
    pub branches: Vec<(E, Vec<TurnOutcome>)>,
    /// Wall time spent running tool programs.
    pub sandbox_time: Duration,
}

/// The live episodes of one task (one in tree mode, K in independent mode).
pub(super) struct Track<E> {
    pub task_index: usize,
    pub episode_index: u32,
    pub episode: E,
    next_node: u32,
    parent: Option<u32>,
    tokens: u64,
}

impl<E> Track<E> {
    pub fn new(task_index: usize, episode_index: u32, episode: E) -> Track<E> {
        Track { task_index, episode_index, episode, next_node: 0, parent: None, tokens: 0 }
    }
}

/// The replies of one step. Each live track gets `branches` joint replies, one reply
/// per acting agent each, in (track, branch, agent) order.
pub(super) struct SampledStep {
    pub replies: Vec<(u64, Reply)>,
    /// Each live track's acting agents.
    acting: Vec<Vec<Acting>>,
    branches: usize,
}

/// An agent acting in a step: its policy and the prompt it answered.
struct Acting {
    agent: Agent,
    policy: String,
    message: String,
}

impl SampledStep {
    /// Live track `slot`'s joint reply `branch`: one reply per acting agent, in order.
    pub fn joint(&self, slot: usize, branch: usize) -> &[(u64, Reply)] {
        let start: usize = self.acting[..slot].iter().map(|a| a.len() * self.branches).sum();
        let n = self.acting[slot].len();
        &self.replies[start + branch * n..start + (branch + 1) * n]
    }

    /// The agents acting on live track `slot`, in order.
    pub fn agents(&self, slot: usize) -> Vec<Agent> {
        self.acting[slot].iter().map(|a| a.agent).collect()
    }

    pub fn branches(&self) -> usize {
        self.branches
    }
}

/// Plays every track to its end, reporting finished episodes and sampled tokens to
/// `progress` as they come. `task_ids` key each task's random streams.
pub(super) fn play<S: Stepping>(
    stepping: S,
    mut tracks: Vec<Track<S::Episode>>,
    task_ids: &[&str],
    setup: &Setup,
    responder: &mut dyn Responder,
    progress: &dyn Progress,
) -> Result<Played, Error> {
    let task_keys: Vec<u64> = task_ids.iter().map(|id| text_key(id)).collect();
    let mut candidates = Vec::new();
    let (mut model, mut sandboxed) = (Duration::ZERO, Duration::ZERO);
    let mut skipped: Vec<usize> = Vec::new();
    let mut shares = EpisodeShares::new(tracks.len(), setup.most_steps());
    loop {
        stepping.play_scripted(&mut tracks);
        if setup.overlong_prompt == OverlongPrompt::Skip {
            let newly = overlong_tasks(setup, &tracks, &skipped, responder)?;
            let left_out = (0..tracks.len()).filter(|&t| newly.contains(&tracks[t].task_index));
            progress.advance(left_out.map(|t| shares.take_rest(t)).sum(), 0);
            skipped.extend(newly);
        }
        let live: Vec<usize> = (0..tracks.len())
            .filter(|&i| !tracks[i].episode.is_done() && !skipped.contains(&tracks[i].task_index))
            .collect();
        if live.is_empty() {
            break;
        }
        // Each reply moves the bar by its share of its track's step, token by token.
        let step_share: Vec<f64> = live.iter().map(|&t| shares.take_step(t)).collect();
        let mut answered = |slot: usize, part: f64, tokens: u64| progress.advance(part * step_share[slot], tokens);
        let started = Instant::now();
        let step = sample_step(&task_keys, setup, &tracks, &live, responder, &mut answered)?;
        model += started.elapsed();
        let stepped = stepping.step(&tracks, &live, &step)?;
        sandboxed += stepped.sandbox_time;
        let retired = continue_best(setup, &mut tracks, &live, step, stepped.branches, &mut candidates);
        stepping.retire(&retired.iter().collect::<Vec<_>>())?;
        let ended = live.iter().filter(|&&t| tracks[t].episode.is_done());
        progress.advance(ended.map(|&t| shares.take_rest(t)).sum(), 0);
    }
    stepping.retire(&tracks.iter().map(|t| &t.episode).collect::<Vec<_>>())?;
    skipped.sort_unstable();
    candidates.retain(|c: &Candidate| !skipped.contains(&c.task_index));
    let finished = tracks
        .iter()
        .filter(|t| !skipped.contains(&t.task_index))
        .map(|t| t.episode.ended(t.task_index, t.episode_index, t.tokens))
        .collect();
    Ok(Played {
        candidates,
        finished,
        model_seconds: model.as_secs_f64(),
        sandbox_seconds: sandboxed.as_secs_f64(),
        skipped,
    })
}

/// Records every reply of the step as a candidate and continues each track with its
/// best joint reply. Returns the episodes the step left behind: where the branches were
/// copies, the episode they were copied from and every branch but the best.
fn continue_best<E: Turns>(
    setup: &Setup,
    tracks: &mut [Track<E>],
    live: &[usize],
    step: SampledStep,
    stepped: Vec<(E, Vec<TurnOutcome>)>,
    candidates: &mut Vec<Candidate>,
) -> Vec<E> {
    let branches = step.branches;
    let mut retired = Vec::new();
    let mut replies = step.replies.into_iter();
    let mut stepped = stepped.into_iter();
    for (slot, &t) in live.iter().enumerate() {
        let track = &mut tracks[t];
        let acting = &step.acting[slot];
        let outcomes: Vec<(E, Vec<TurnOutcome>)> = stepped.by_ref().take(branches).collect();
        let best = select(setup.branching, outcomes.iter().map(|(_, o)| o.as_slice()));
        let node_base = track.next_node;
        let mut node = node_base;
        for (b, (_, joint)) in outcomes.iter().enumerate() {
            for (acted, outcome) in acting.iter().zip(joint) {
                let (seed, reply) = replies.next().expect("a reply per acting agent and branch");
                track.tokens += reply.tokens.len() as u64;
                candidates.push(Candidate {
                    task_index: track.task_index,
                    episode: track.episode_index,
                    // Each agent's own turn: a hosted agent's is its own count of moves.
                    turn: outcome.turn,
                    agent: acted.agent,
                    policy: acted.policy.clone(),
                    branch: b as u32,
                    node_id: node,
                    parent_id: track.parent,
                    selected: b == best,
                    seed,
                    message: acted.message.clone(),
                    reply,
                    outcome: outcome.clone(),
                });
                node += 1;
            }
        }
        track.next_node = node;
        // The next step continues from the best joint reply's first node.
        track.parent = Some(node_base + (best * acting.len()) as u32);
        for outcome in &outcomes[best].1 {
            credit(candidates, track, &outcome.credited);
        }
        retired.extend(continue_with(track, outcomes.into_iter().map(|(episode, _)| episode), best));
    }
    retired
}

/// Continues `track` with its `best` branch's episode; returns the others, and the one it
/// replaced where the branches were copies of it.
fn continue_with<E>(track: &mut Track<E>, branches: impl ExactSizeIterator<Item = E>, best: usize) -> Vec<E> {
    let copies = branches.len() > 1;
    let mut retired = Vec::new();
    for (b, episode) in branches.enumerate() {
        if b == best {
            let left = std::mem::replace(&mut track.episode, episode);
            if copies {
                retired.push(left);
            }
        } else {
            retired.push(episode);
        }
    }
    retired
}

/// Adds rewards a step credited to other agents (a game's final result) to each one's
/// latest turn on this track's trajectory.
fn credit<E>(candidates: &mut [Candidate], track: &Track<E>, credited: &[(Agent, f64)]) {
    for &(agent, reward) in credited {
        let latest = candidates.iter_mut().rev().find(|c| {
            c.task_index == track.task_index && c.episode == track.episode_index && c.agent == agent && c.selected
        });
        if let Some(candidate) = latest {
            candidate.outcome.local_reward += reward;
        }
    }
}

/// The tasks, not yet skipped, one of whose live episodes would next send a prompt
/// longer than the limit: the whole task goes, so that no group is left half sampled.
fn overlong_tasks<E: Turns>(
    setup: &Setup,
    tracks: &[Track<E>],
    skipped: &[usize],
    responder: &mut dyn Responder,
) -> Result<Vec<usize>, Error> {
    let mut found: Vec<usize> = Vec::new();
    for track in tracks {
        let task = track.task_index;
        if track.episode.is_done() || skipped.contains(&task) || found.contains(&task) {
            continue;
        }
        for agent in track.episode.acting() {
            let policy = setup.policy_of(task, agent)?;
            if !responder.fits(policy, &track.episode.prompt(agent))? {
                found.push(task);
                break;
            }
        }
    }
    Ok(found)
}

/// Samples `branches` joint replies per live track (one reply per acting agent each),
/// one responder call per policy; `answered` hears of each live track's replies as the
/// part of its step they make.
fn sample_step<E: Turns>(
    task_keys: &[u64],
    setup: &Setup,
    tracks: &[Track<E>],
    live: &[usize],
    responder: &mut dyn Responder,
    answered: &mut dyn FnMut(usize, f64, u64),
) -> Result<SampledStep, Error> {
    let branches = setup.branches() as usize;
    // (policy, prompt) per reply, then one responder call per policy.
    let mut wanted: Vec<(String, Prompt)> = Vec::new();
    let mut slot_of = Vec::new();
    let mut acting = Vec::with_capacity(live.len());
    for (slot, &t) in live.iter().enumerate() {
        let track = &tracks[t];
        let mut agents = Vec::new();
        for agent in track.episode.acting() {
            let policy = setup.policy_of(track.task_index, agent)?;
            agents.push(Acting { agent, policy: policy.clone(), message: track.episode.prompt(agent) });
        }
        let place = [task_keys[track.task_index], track.episode_index as u64, track.episode.turn() as u64];
        let agent_keys: Vec<Vec<u64>> = agents
            .iter()
            .map(|acted| {
                // A hosted environment's agents are named at run time: their names key the seeds.
                let role_index = match setup.workflow.agents().iter().position(|r| *r == acted.agent) {
                    Some(index) => index as u64,
                    None => text_key(acted.agent.as_str()),
                };
                setup.seed_keys.iter().copied().chain(place).chain([role_index]).collect()
            })
            .collect();
        for b in 0..branches {
            for (acted, keys) in agents.iter().zip(&agent_keys) {
                let keys: Vec<u64> = keys.iter().copied().chain([b as u64]).collect();
                wanted.push((acted.policy.clone(), Prompt::message(acted.message.clone(), stream(&keys))));
                slot_of.push(slot);
            }
        }
        acting.push(agents);
    }
    let per_step: Vec<f64> = acting.iter().map(|a| (a.len() * branches) as f64).collect();
    let mut answered = |i: usize, part: f64, tokens: u64| answered(slot_of[i], part / per_step[slot_of[i]], tokens);
    Ok(SampledStep { replies: respond(wanted, responder, &mut answered)?, acting, branches })
}

/// Every wanted prompt's reply, in order, with one responder call per policy; `answered`
/// hears how each (by its index in `wanted`) comes along ([`Responder::respond_watched`]).
fn respond(
    wanted: Vec<(String, Prompt)>,
    responder: &mut dyn Responder,
    answered: &mut dyn FnMut(usize, f64, u64),
) -> Result<Vec<(u64, Reply)>, Error> {
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
        let got =
            responder.respond_watched(policy, &prompts, &mut |k, part, tokens| answered(slots[k], part, tokens))?;
        if got.len() != prompts.len() {
            return Err(Error::ReplyCount { asked: prompts.len(), got: got.len() });
        }
        for (&i, reply) in slots.iter().zip(got) {
            replies[i] = Some((wanted[i].1.seed, reply));
        }
    }
    Ok(replies.into_iter().map(|r| r.expect("every slot answered")).collect())
}

/// The progress an episode is worth: one unit, spread evenly over the most steps it can
/// take, the rest counted when it ends (early, or left out as too long).
pub(super) struct EpisodeShares {
    left: Vec<f64>,
    steps_left: Vec<u32>,
}

impl EpisodeShares {
    pub(super) fn new(tracks: usize, most_steps: u32) -> EpisodeShares {
        EpisodeShares { left: vec![1.0; tracks], steps_left: vec![most_steps.max(1); tracks] }
    }

    /// What track `t`'s next step is worth.
    pub(super) fn take_step(&mut self, t: usize) -> f64 {
        let share = self.left[t] / f64::from(self.steps_left[t].max(1));
        self.left[t] -= share;
        self.steps_left[t] = self.steps_left[t].saturating_sub(1);
        share
    }

    /// What is left of track `t`, which ended.
    pub(super) fn take_rest(&mut self, t: usize) -> f64 {
        std::mem::take(&mut self.left[t])
    }
}

/// The branch whose joint reply continues the trajectory: the first, or the one whose
/// replies' mixed rewards sum highest.
fn select<'a>(branching: Branching, joints: impl Iterator<Item = &'a [TurnOutcome]>) -> usize {
    match branching {
        Branching::Independent { .. } | Branching::Tree { select: Selection::First, .. } => 0,
        Branching::Tree { select: Selection::BestReward, alpha, .. } => {
            let mut best = (0, f64::NEG_INFINITY);
            for (b, joint) in joints.enumerate() {
                let r: f64 =
                    joint.iter().map(|o| crate::algo::mixed_reward(alpha, o.team_reward, o.local_reward)).sum();
                if r > best.1 {
                    best = (b, r);
                }
            }
            best.0
        }
    }
}
