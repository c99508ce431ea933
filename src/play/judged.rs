//! Tasks whose answers an environment host scores (a reasoning-gym dataset's scorer, a
//! Python reward function), and the scoring of a step's answers, in one request.

use std::sync::Arc;
use std::time::Duration;

use crate::envs::code::{self, Code};
use crate::envs::hosted::{HostSession, Judge};
use crate::envs::math::{self, Math, extract_answer, extract_output_answer};
use crate::envs::{AnyEnv, DatasetKind, Env, ReasoningGymConfig};
use crate::sandbox::RunOutput;
use crate::workflows::{Agent, Episode};

use super::Error;

fn bad(env: &'static str) -> impl Fn(String) -> crate::envs::Error {
    move |reason| crate::envs::Error::Instance { env, reason }
}

/// A math or code dataset row whose answers the run's reward function scores (it reads
/// the row).
pub(super) fn judged_row(kind: DatasetKind, session: &Arc<HostSession>, instance: &str) -> Result<AnyEnv, Error> {
    let row = serde_json::from_str(instance).map_err(|e| bad("dataset")(e.to_string()))?;
    let judge = Judge::new(Arc::clone(session), row);
    Ok(match kind {
        DatasetKind::Math(config) => {
            let parsed: math::Instance = serde_json::from_str(instance).map_err(|e| bad("math")(e.to_string()))?;
            let tool_timeout = Duration::from_secs_f64(config.tool_timeout_seconds);
            AnyEnv::Math(Math::judged(config.tolerance, tool_timeout, parsed, judge))
        }
        DatasetKind::Code(config) => {
            let parsed: code::Instance = serde_json::from_str(instance).map_err(|e| bad("code")(e.to_string()))?;
            AnyEnv::Code(Code::judged(config, parsed, judge))
        }
    })
}

/// A reasoning-gym task: a math episode whose answers the dataset's scorer scores (it
/// reads the whole entry).
pub(super) fn judged_entry(
    gym: &ReasoningGymConfig,
    session: &Arc<HostSession>,
    instance: &str,
) -> Result<AnyEnv, Error> {
    let bad = bad("reasoning_gym");
    let parsed: math::Instance = serde_json::from_str(instance).map_err(|e| bad(e.to_string()))?;
    let entry = parsed.entry.clone().ok_or_else(|| bad("the task has no entry to score against".into()))?;
    let entry = serde_json::from_str(&entry).map_err(|e| bad(e.to_string()))?;
    let tool_timeout = Duration::from_secs_f64(math::DEFAULT_TOOL_TIMEOUT_SECONDS);
    Ok(AnyEnv::Math(Math::judged(gym.tolerance, tool_timeout, parsed, Judge::new(Arc::clone(session), entry))))
}

/// Has the host score, in one request, every answer of this step that a judged task
/// will read: each reply's and each tool program's output's answer (math), each
/// reply's program (code). `runs` pairs a joint reply of `joints` with its tool
/// program's output; joint replies of several agents are not judged by a host.
pub(super) fn judge_answers(
    joints: &[(&Episode, Vec<(Agent, &str)>)],
    runs: &[(usize, Option<RunOutput>)],
) -> Result<(), Error> {
    // (judge, the text scored, its answer), each answer of a task once.
    let mut wanted: Vec<(Arc<Judge>, String, String)> = Vec::new();
    for (i, run) in runs {
        let (episode, joint) = &joints[*i];
        let [(_, reply)] = joint.as_slice() else { continue };
        let reply = reply.to_string();
        let (judge, answers) = match episode.env() {
            AnyEnv::Math(math) if math.judge().is_some() => {
                let from_reply = extract_answer(&reply).map(|answer| (reply.clone(), answer));
                let ran = run.as_ref().filter(|r| r.ok());
                let from_program =
                    ran.and_then(|r| extract_output_answer(&r.stdout).map(|answer| (r.stdout.clone(), answer)));
                (math.judge(), from_reply.into_iter().chain(from_program).collect::<Vec<_>>())
            }
            // The coder's program, as the environment reads it from the reply.
            AnyEnv::Code(code) if code.judge().is_some() => {
                (code.judge(), code.parse(&reply).ok().map(|program| (reply.clone(), program)).into_iter().collect())
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
