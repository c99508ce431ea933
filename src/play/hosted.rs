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

    /// Applies the step the host took for the next agent's reply, under the id `id` (the
    /// fork of this episode the reply was applied to).
    fn stepped(&mut self, id: String, reply: &str, stepped: &Stepped) -> Result<TurnOutcome, String> {
        let agent = self.next_agent().ok_or("a step of a finished episode")?;
        let turn = self.turn();
        self.hosted.stepped(id, stepped)?;
        *self.moves.entry(agent).or_insert(0) += 1;
        let mut outcome = TurnOutcome::blank(agent);
        outcome.turn = turn;
        outcome.local_reward = stepped.rewards.get(agent.as_str()).copied().unwrap_or(0.0);
        if stepped.invalid {
            outcome.parse_error =
                Some(if stepped.feedback.is_empty() { "invalid move".into() } else { stepped.feedback.clone() });
        } else {
            outcome.action = Some(serde_json::to_string(&shorten(reply.trim(), 200)).expect("a string serialises"));
        }
        outcome.feedback = (!stepped.feedback.is_empty()).then(|| stepped.feedback.clone());
        outcome.credited = stepped
            .rewards
            .iter()
            .filter(|(name, _)| name.as_str() != agent.as_str())
            .map(|(name, &reward)| Ok((Agent::named(name)?, reward)))
            .collect::<Result<_, String>>()?;
        // Out of moves: the next agent has made max_turns already.
        let next_moves = self.hosted.next_agent().map_or(0, |next| self.moves.get(&next).copied().unwrap_or(0));
        self.done = self.hosted.done() || next_moves >= self.max_turns;
        outcome.done = self.done;
        outcome.team_reward = stepped.team_reward;
        outcome.success = stepped.success;
        Ok(outcome)
    }
}

impl HostedEpisode {
    fn next_agent(&self) -> Option<Agent> {
        if self.done { None } else { self.hosted.next_agent() }
    }
}

impl Turns for HostedEpisode {
    fn acting(&self) -> Vec<Agent> {
        self.next_agent().into_iter().collect()
    }

    /// How many moves the next agent has made; once over, the most an agent made.
    fn turn(&self) -> u32 {
        match self.next_agent() {
            Some(agent) => self.moves.get(&agent).copied().unwrap_or(0),
            None => self.moves.values().copied().max().unwrap_or(0),
        }
    }

    fn prompt(&self, _agent: Agent) -> String {
        self.hosted.prompt(self.turn())
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
    /// each episode steps itself: one fork and one step request for the whole step. A
    /// host names one agent per step, so each joint reply is one reply.
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
            for b in 0..branches {
                let (_, reply) = &step.joint(slot, b)[0];
                let id = if branches == 1 { source.clone() } else { self.session.new_id() };
                if branches > 1 {
                    forks.push((source.clone(), id.clone()));
                }
                items.push((id, reply.text.clone()));
            }
        }
        self.session.host.fork(&forks)?;
        let results = self.session.host.step(&items)?;
        let stepped = results
            .iter()
            .zip(items)
            .enumerate()
            .map(|(i, (stepped, (id, reply)))| {
                let mut episode = tracks[live[i / branches]].episode.clone();
                let outcome = episode
                    .stepped(id.clone(), &reply, stepped)
                    .map_err(|reason| Error::Hosted { episode: id, reason })?;
                Ok((episode, vec![outcome]))
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
