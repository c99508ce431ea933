//! Stepping petting's own environments: each reply steps its own clone of its episode,
//! on worker threads, after the step's tool programs ran in the sandbox.

use std::sync::Mutex;
use std::time::Instant;

use crate::sandbox::{Program, RunOutput, Sandbox};
use crate::workflows::{Agent, Episode, run_program};

use super::judged::judge_answers;
use super::steps::{Outcomes, SampledStep, Stepping, Track, Turns};
use super::{Error, Finished, Game, Setup};

/// Steps episodes of [`Game`]s with the workflows, `opponent` played by the solver.
pub(super) struct Local<'a> {
    pub sandbox: &'a Sandbox,
    pub opponent: Option<Agent>,
}

/// The episodes to play: one per task in tree mode, K in independent mode.
pub(super) fn tracks(games: &[Game], setup: &Setup) -> Result<Vec<Track<Episode>>, Error> {
    let mut tracks = Vec::new();
    for (task_index, game) in games.iter().enumerate() {
        for episode_index in 0..setup.episodes_per_task() {
            let mut episode = Episode::new(setup.workflow, game.env.clone(), setup.max_turns)?;
            if setup.alone {
                episode = episode.alone()?;
            }
            tracks.push(Track::new(task_index, episode_index, episode));
        }
    }
    Ok(tracks)
}

impl Turns for Episode {
    fn acting(&self) -> Vec<Agent> {
        Episode::acting(self)
    }

    fn turn(&self) -> u32 {
        Episode::turn(self)
    }

    fn prompt(&self, agent: Agent) -> String {
        Episode::prompt_of(self, agent)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn ended(&self, task_index: usize, episode: u32, tokens: u64) -> Finished {
        Finished {
            task_index,
            episode,
            success: self.success(),
            tool_success: self.tool_success(),
            team_reward: self.env().team_reward(),
            turns: self.turn(),
            tokens,
            failure: None,
        }
    }
}

impl Stepping for Local<'_> {
    type Episode = Episode;

    fn play_scripted(&self, tracks: &mut [Track<Episode>]) {
        let Some(opponent) = self.opponent else { return };
        for track in tracks {
            let episode = &mut track.episode;
            while !episode.is_done() && episode.next_agent() == Some(opponent) {
                let Some(reply) = episode.oracle_reply() else { break };
                episode.step(&reply, self.sandbox);
            }
        }
    }

    /// Tool programs are run first, each distinct program once (the K branches of a
    /// step often write the same one), in parallel. A joint reply of several agents is
    /// judged together ([`Episode::step_joint`]).
    fn step(&self, tracks: &[Track<Episode>], live: &[usize], step: &SampledStep) -> Result<Outcomes<Episode>, Error> {
        let joints: Vec<(&Episode, Vec<(Agent, &str)>)> = (0..live.len())
            .flat_map(|slot| (0..step.branches()).map(move |b| (slot, b)))
            .map(|(slot, b)| {
                let texts = step.joint(slot, b).iter().map(|(_, reply)| reply.text.as_str());
                (&tracks[live[slot]].episode, step.agents(slot).into_iter().zip(texts).collect())
            })
            .collect();
        let programs: Vec<Option<Program>> = joints
            .iter()
            .map(|(episode, joint)| match joint.as_slice() {
                [(_, reply)] => episode.tool_program(reply),
                _ => None,
            })
            .collect();
        let started = Instant::now();
        let runs = run_distinct(&programs, self.sandbox);
        let sandbox_time = started.elapsed();
        let jobs: Vec<(usize, Option<RunOutput>)> = runs.into_iter().enumerate().collect();
        judge_answers(&joints, &jobs)?;
        let stepped = parallel_map(jobs, |(i, run)| {
            let (episode, joint) = &joints[i];
            let mut episode = (*episode).clone();
            let outcomes = match joint.as_slice() {
                [(_, reply)] => vec![episode.step_with(reply, run, self.sandbox)],
                _ => episode.step_joint(joint, self.sandbox),
            };
            (episode, outcomes)
        });
        Ok(Outcomes { branches: stepped, sandbox_time })
    }
}

/// Each program's output, running each distinct program once, in parallel.
fn run_distinct(programs: &[Option<Program>], sandbox: &Sandbox) -> Vec<Option<RunOutput>> {
    let mut distinct: Vec<&Program> = Vec::new();
    for program in programs.iter().flatten() {
        if !distinct.iter().any(|p| same_program(p, program)) {
            distinct.push(program);
        }
    }
    let outputs = parallel_map(distinct.clone(), |program| run_program(program, sandbox));
    let output_of = |program: &Program| {
        let i = distinct.iter().position(|p| same_program(p, program)).expect("distinct");
        outputs[i].clone()
    };
    programs.iter().map(|p| p.as_ref().map(output_of)).collect()
}

fn same_program(a: &Program, b: &Program) -> bool {
    a.code == b.code && a.stdin == b.stdin && a.files == b.files
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
