//! Stepping the episodes an environment host keeps: made, forked, stepped and dropped in
//! batches, one request each per step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::envs::hosted::{HostSession, Hosted, Stepped, Turn};
use crate::workflows::{Agent, TurnOutcome, shorten};

use super::steps::{Outcomes, SampledStep, Stepping, Track, Turns};
use super::{Error, Finished, Setup};

/// A hosted environment's task.
#[derive(Debug, Clone)]
pub struct HostedGame {
    pub task_id: String,
    pub hosted: Hosted,
}

/// One hosted episode: the host's, in the order the host says, each agent's turn its own
/// count of moves.
#[derive(Debug, Clone)]
pub(super) struct HostedEpisode {
    hosted: Hosted,
    moves: BTreeMap<Agent, u32>,
    max_turns: u32,
    done: bool,
}

impl HostedEpisode {
    fn new(hosted: Hosted, max_turns: u32) -> HostedEpisode {
        HostedEpisode { hosted, moves: BTreeMap::new(), max_turns: max_turns.max(1), done: false }
    }

    /// The episode made under `id`, at `turn`.
    fn made(&mut self, id: String, turn: &Turn) -> Result<(), String> {
        self.hosted.made(id, turn)?;
        self.done = self.hosted.done();
        Ok(())
    }

    /// Applies the step the host took for the acting agents' `replies`, under the id `id`
    /// (the fork of this episode they were applied to): an outcome per reply, in order.
    fn stepped(
        &mut self,
        id: String,
        replies: &[(Agent, String)],
        stepped: &Stepped,
    ) -> Result<Vec<TurnOutcome>, String> {
        let asked: Vec<Agent> = replies.iter().map(|(agent, _)| *agent).collect();
        if self.done || asked != self.acting() {
            return Err(format!("replies of {asked:?} to a step that asked {:?}", self.acting()));
        }
        let turns: Vec<u32> = asked.iter().map(|agent| self.moves_of(*agent)).collect();
        self.hosted.stepped(id, &asked, stepped)?;
        for agent in &asked {
            *self.moves.entry(*agent).or_insert(0) += 1;
        }
        // Out of moves: an agent asked next has made max_turns already.
        self.done =
            self.hosted.done() || self.hosted.acting().iter().any(|next| self.moves_of(*next) >= self.max_turns);
        let mut outcomes = Vec::with_capacity(replies.len());
        for (i, ((agent, reply), turn)) in replies.iter().zip(turns).enumerate() {
            let mut outcome = self.outcome(*agent, reply, turn, stepped);
            // Rewards of agents that did not act this step are credited once, with the first reply.
            if i == 0 {
                outcome.credited = credited(&asked, stepped)?;
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    fn outcome(&self, agent: Agent, reply: &str, turn: u32, stepped: &Stepped) -> TurnOutcome {
        let mut outcome = TurnOutcome::blank(agent);
        outcome.turn = turn;
        outcome.local_reward = stepped.rewards.get(agent.as_str()).copied().unwrap_or(0.0);
        if stepped.invalid.of(agent.as_str()) {
            outcome.parse_error =
                Some(if stepped.feedback.is_empty() { "invalid move".into() } else { stepped.feedback.clone() });
        } else {
            outcome.action = Some(serde_json::to_string(&shorten(reply.trim(), 200)).expect("a string serialises"));
        }
        outcome.feedback = (!stepped.feedback.is_empty()).then(|| stepped.feedback.clone());
        outcome.done = self.done;
        outcome.team_reward = stepped.team_reward;
        outcome.success = stepped.success;
        outcome
    }

    fn moves_of(&self, agent: Agent) -> u32 {
        self.moves.get(&agent).copied().unwrap_or(0)
    }
}

/// The step's rewards for agents that were not asked to act in it.
fn credited(asked: &[Agent], stepped: &Stepped) -> Result<Vec<(Agent, f64)>, String> {
    stepped
        .rewards
        .iter()
        .filter(|(name, _)| !asked.iter().any(|a| a.as_str() == name.as_str()))
        .map(|(name, &reward)| Ok((Agent::named(name)?, reward)))
        .collect()
}

impl Turns for HostedEpisode {
    fn acting(&self) -> Vec<Agent> {
        if self.done { Vec::new() } else { self.hosted.acting() }
    }

    /// How many moves the first agent to act has made; once over, the most an agent made.
    fn turn(&self) -> u32 {
        match self.acting().first() {
            Some(agent) => self.moves_of(*agent),
            None => self.moves.values().copied().max().unwrap_or(0),
        }
    }

    fn prompt(&self, agent: Agent) -> String {
        self.hosted.prompt(agent, self.moves_of(agent))
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn ended(&self, task_index: usize, episode: u32, tokens: u64) -> Finished {
        Finished {
            task_index,
            episode,
            success: self.hosted.success(),
            tool_success: false,
            team_reward: self.hosted.team_reward(),
            turns: self.turn(),
            tokens,
            failure: None,
        }
    }
}

/// Steps the episodes `session`'s host keeps.
pub(super) struct InHost<'a> {
    pub session: &'a Arc<HostSession>,
}

/// Every game's episodes (one per task in tree mode, K in independent mode), made in the
/// host in one request.
pub(super) fn tracks(
    session: &HostSession,
    games: &[HostedGame],
    setup: &Setup,
) -> Result<Vec<Track<HostedEpisode>>, Error> {
    let mut tracks = Vec::new();
    for (task_index, game) in games.iter().enumerate() {
        for episode_index in 0..setup.episodes_per_task() {
            let episode = HostedEpisode::new(game.hosted.clone(), setup.max_turns);
            tracks.push(Track::new(task_index, episode_index, episode));
        }
    }
    let items: Vec<_> = tracks.iter().map(|t| t.episode.hosted.make_item(session.new_id())).collect();
    let turns = session.host.make(&items)?;
    for (track, ((id, _, _), turn)) in tracks.iter_mut().zip(items.into_iter().zip(turns)) {
        track.episode.made(id.clone(), &turn).map_err(|reason| Error::Hosted { episode: id, reason })?;
    }
    Ok(tracks)
}

impl Stepping for InHost<'_> {
    type Episode = HostedEpisode;

    /// In tree mode the K branches of an episode are K forks of it, in independent mode
    /// each episode steps itself: one fork and one step request for the whole step, each
    /// item carrying the replies of every agent the step asked.
    fn step(
        &self,
        tracks: &[Track<HostedEpisode>],
        live: &[usize],
        step: &SampledStep,
    ) -> Result<Outcomes<HostedEpisode>, Error> {
        let branches = step.branches();
        let mut forks = Vec::new();
        let mut items = Vec::with_capacity(live.len() * branches);
        for (slot, &t) in live.iter().enumerate() {
            let source = tracks[t].episode.hosted.id().to_string();
            let agents = step.agents(slot);
            for b in 0..branches {
                let replies = agents.iter().zip(step.joint(slot, b)).map(|(a, (_, r))| (*a, r.text.clone())).collect();
                let id = if branches == 1 { source.clone() } else { self.session.new_id() };
                if branches > 1 {
                    forks.push((source.clone(), id.clone()));
                }
                items.push((id, replies));
            }
        }
        self.session.host.fork(&forks)?;
        let results = self.session.host.step(&items)?;
        let stepped = results
            .iter()
            .zip(items)
            .enumerate()
            .map(|(i, (stepped, (id, replies)))| {
                let mut episode = tracks[live[i / branches]].episode.clone();
                let outcomes = episode
                    .stepped(id.clone(), &replies, stepped)
                    .map_err(|reason| Error::Hosted { episode: id, reason })?;
                Ok((episode, outcomes))
            })
            .collect::<Result<_, Error>>()?;
        Ok(Outcomes { branches: stepped, sandbox_time: Duration::ZERO })
    }

    fn retire(&self, episodes: &[&HostedEpisode]) -> Result<(), Error> {
        let ids: Vec<String> = episodes.iter().map(|e| e.hosted.id().to_string()).collect();
        self.session.host.drop_episodes(&ids)?;
        Ok(())
    }
}
