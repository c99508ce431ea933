//! Playing the environments whose episodes or answers an environment host keeps:
//! hosted episodes made, forked, stepped and dropped in batches, and math answers scored
//! by the host (a reasoning-gym dataset's scorer, a Python reward function).

use std::sync::Arc;
use std::time::Duration;

use crate::envs::code::{self, Code};
use crate::envs::hosted;
use crate::envs::hosted::Judge;
use crate::envs::math::{self, Math, extract_answer, extract_output_answer};
use crate::envs::{AnyEnv, Env, EnvConfig};
use crate::sandbox::RunOutput;
use crate::workflows::{Agent, Episode, TurnOutcome};

use super::{Candidate, Error, Game, SampledStep, Track};

/// A task whose answers its host scores: a reasoning-gym entry (the scorer reads the
/// whole entry), or a math or code dataset row (the reward function reads the row).
pub(super) fn judged(env: &EnvConfig, session: &Arc<hosted::Session>, instance: &str) -> Result<AnyEnv, Error> {
    let bad = |reason: String| crate::envs::Error::Instance { env: env.name(), reason };
    let row = |text: &str| serde_json::from_str(text).map_err(|e| bad(e.to_string()));
    let judge = |text: &str| Ok::<_, Error>(Judge::new(Arc::clone(session), row(text)?));
    Ok(match env {
        EnvConfig::ReasoningGym(gym) => {
            let parsed: math::Instance = serde_json::from_str(instance).map_err(|e| bad(e.to_string()))?;
            let entry = parsed.entry.clone().ok_or_else(|| bad("the task has no entry to score against".into()))?;
            let tool_timeout = Duration::from_secs_f64(math::DEFAULT_TOOL_TIMEOUT_SECONDS);
            AnyEnv::Math(Math::judged(gym.tolerance, tool_timeout, parsed, judge(&entry)?))
        }
        EnvConfig::Math(config) => {
            let parsed: math::Instance = serde_json::from_str(instance).map_err(|e| bad(e.to_string()))?;
            let tool_timeout = Duration::from_secs_f64(config.tool_timeout_seconds);
            AnyEnv::Math(Math::judged(config.tolerance, tool_timeout, parsed, judge(instance)?))
        }
        EnvConfig::Code(config) => {
            let parsed: code::Instance = serde_json::from_str(instance).map_err(|e| bad(e.to_string()))?;
            AnyEnv::Code(Code::judged(config, parsed, judge(instance)?))
        }
        other => unreachable!("{} is not scored by a host", other.name()),
    })
}

/// The host session of hosted games (they all share one), if they are hosted.
pub(super) fn hosted_session(games: &[Game]) -> Option<Arc<hosted::Session>> {
    games.iter().find_map(|g| match &g.env {
        AnyEnv::Hosted(h) => Some(Arc::clone(h.session())),
        _ => None,
    })
}

pub(super) fn hosted_id(episode: &Episode) -> String {
    match episode.env() {
        AnyEnv::Hosted(h) => h.id().to_string(),
        _ => unreachable!("a hosted game's episodes are hosted"),
    }
}

/// Makes every track's episode in the host, in one request.
pub(super) fn make_hosted(session: &hosted::Session, tracks: &mut [Track]) -> Result<(), Error> {
    let items: Vec<_> = tracks
        .iter()
        .map(|t| match t.episode.env() {
            AnyEnv::Hosted(h) => h.make_item(session.new_id()),
            _ => unreachable!("a hosted game's episodes are hosted"),
        })
        .collect();
    let turns = session.host.make(&items)?;
    for (track, ((id, _, _), turn)) in tracks.iter_mut().zip(items.into_iter().zip(turns)) {
        track.episode.made(id.clone(), &turn).map_err(|reason| Error::Hosted { episode: id, reason })?;
    }
    Ok(())
}

/// Steps each reply's own copy of its track's episode in the host: in tree mode the K
/// branches of an episode are K forks of it, in independent mode each episode steps
/// itself. One fork and one step request for the whole step.
pub(super) fn step_hosted(
    session: &hosted::Session,
    tracks: &[Track],
    live: &[usize],
    step: &SampledStep,
) -> Result<Vec<(Episode, TurnOutcome)>, Error> {
    let branches = step.replies.len() / live.len();
    let mut forks = Vec::new();
    let mut items = Vec::with_capacity(step.replies.len());
    for (i, (_, reply)) in step.replies.iter().enumerate() {
        let source = hosted_id(&tracks[live[i / branches]].episode);
        let id = if branches == 1 { source.clone() } else { session.new_id() };
        if branches > 1 {
            forks.push((source, id.clone()));
        }
        items.push((id, reply.text.clone()));
    }
    session.host.fork(&forks)?;
    let results = session.host.step(&items)?;
    results
        .iter()
        .zip(items)
        .enumerate()
        .map(|(i, (stepped, (id, reply)))| {
            let mut episode = tracks[live[i / branches]].episode.clone();
            let outcome = episode
                .step_hosted(id.clone(), &reply, stepped)
                .map_err(|reason| Error::Hosted { episode: id, reason })?;
            Ok((episode, outcome))
        })
        .collect()
}

/// Adds rewards a step credited to other agents (a game's final result) to each one's
/// latest turn on this track's trajectory.
pub(super) fn credit(candidates: &mut [Candidate], track: &Track, credited: &[(Agent, f64)]) {
    for &(agent, reward) in credited {
        let latest = candidates.iter_mut().rev().find(|c| {
            c.task_index == track.task_index && c.episode == track.episode_index && c.agent == agent && c.selected
        });
        if let Some(candidate) = latest {
            candidate.outcome.local_reward += reward;
        }
    }
}

/// Has the host score, in one request, every answer of this step that a judged task
/// will read: each reply's and each tool program's output's answer (math), each
/// reply's program (code).
pub(super) fn judge_answers(
    live: &[&Track],
    branches: usize,
    step: &SampledStep,
    runs: &[(usize, Option<RunOutput>)],
) -> Result<(), Error> {
    // (judge, the text scored, its answer), each answer of a task once.
    let mut wanted: Vec<(Arc<Judge>, String, String)> = Vec::new();
    for (i, run) in runs {
        let reply = &step.replies[*i].1.text;
        let (judge, answers) = match live[i / branches].episode.env() {
            AnyEnv::Math(math) if math.judge().is_some() => {
                let from_reply = extract_answer(reply).map(|answer| (reply.clone(), answer));
                let ran = run.as_ref().filter(|r| r.ok());
                let from_program =
                    ran.and_then(|r| extract_output_answer(&r.stdout).map(|answer| (r.stdout.clone(), answer)));
                (math.judge(), from_reply.into_iter().chain(from_program).collect::<Vec<_>>())
            }
            // The coder's program, as the environment reads it from the reply.
            AnyEnv::Code(code) if code.judge().is_some() => {
                (code.judge(), code.parse(reply).ok().map(|program| (reply.clone(), program)).into_iter().collect())
            }
            _ => continue,
        };
        let judge = judge.expect("matched on it");
        for (text, answer) in answers {
            let asked = wanted.iter().any(|(j, _, a)| Arc::ptr_eq(j, judge) && *a == answer);
            if !judge.has(&answer) && !asked {
                wanted.push((Arc::clone(judge), text, answer));
            }
        }
    }
    let Some((first, ..)) = wanted.first() else { return Ok(()) };
    let session = Arc::clone(&first.session);
    let items: Vec<_> =
        wanted.iter().map(|(judge, text, answer)| (judge.row.clone(), text.clone(), Some(answer.clone()))).collect();
    let scores = session.host.score(&items)?;
    for ((judge, _, answer), score) in wanted.into_iter().zip(scores) {
        judge.set(answer, score);
    }
    Ok(())
}
