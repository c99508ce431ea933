//! The strict on-policy checks of an update (DESIGN §3), all made before anything is
//! written: the rollout's parts are this iteration's, the samples come from this
//! rollout, the latest committed checkpoint of every policy is version k and is what the
//! rollout sampled with, and every turns and samples row carries version k.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::algo::TRUNCATED_FINISH_REASON;
use crate::policies::{self, PolicyConfig};
use crate::schema::Table;
use crate::store::{PolicyRef, StoredMarker};
use crate::tables::{SampleRow, TurnRow};

use super::Error;

/// One candidate to train on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sequence {
    pub(super) candidate_id: String,
    pub(super) prompt: Vec<i64>,
    pub(super) response: Vec<i64>,
    /// Logprobs the rollout sampled the response with, and what sampled it.
    pub(super) sampled: Vec<f32>,
    pub(super) engine: String,
    pub(super) advantage: f64,
    /// The response ran into `max_new_tokens`.
    pub(super) truncated: bool,
    pub(super) agent: String,
    /// PPO's critic: its value of the turn at sampling time, and the target it is fitted to.
    pub(super) value: Option<f64>,
    pub(super) value_target: Option<f64>,
    /// `critic.values: token`: the same per response token, and each token's advantage.
    pub(super) token_values: Option<Vec<f32>>,
    pub(super) token_value_targets: Option<Vec<f32>>,
    pub(super) token_advantages: Option<Vec<f32>>,
}

/// What one policy trains on, once every check has passed.
#[derive(Debug)]
pub(super) struct TrainingSet {
    pub(super) name: String,
    pub(super) current: PolicyRef,
    pub(super) sequences: Vec<Sequence>,
}

/// Every turns part the rollout names must be one of this iteration.
pub(super) fn check_parts(rollout: &[StoredMarker], iteration: u32) -> Result<(), Error> {
    let prefix = format!("{}/iteration={iteration}/", Table::Turns);
    for m in rollout {
        if let Some(f) = m.marker.files_of(Table::Turns).find(|f| !f.path.starts_with(&prefix)) {
            return Err(Error::ForeignPart { iteration, marker: m.path.clone(), path: f.path.clone() });
        }
    }
    Ok(())
}

/// The advantage stage must have read exactly the committed rollout.
pub(super) fn check_samples_come_from(
    advantage: &[StoredMarker],
    rollout: &[StoredMarker],
    iteration: u32,
) -> Result<(), Error> {
    for a in advantage {
        if let Some(r) = rollout.iter().find(|r| !a.marker.inputs.contains(&r.input_ref())) {
            return Err(Error::StaleSamples { iteration, advantage: a.path.clone(), rollout: r.path.clone() });
        }
    }
    Ok(())
}

/// The strict on-policy checks (DESIGN §3), then each policy's sequences, in
/// candidate order. Every policy of `configs` gets a training set, with or without
/// samples.
pub(super) fn training_sets(
    configs: &BTreeMap<String, PolicyConfig>,
    markers: &[StoredMarker],
    rollout: &[StoredMarker],
    turns: &[TurnRow],
    samples: &[SampleRow],
    iteration: u32,
) -> Result<Vec<TrainingSet>, Error> {
    let mut current: HashMap<&str, PolicyRef> = HashMap::new();
    for name in configs.keys() {
        let latest = policies::latest_in(markers, name).ok_or(Error::NoCheckpoint { policy: name.clone() })?;
        if latest.version != iteration {
            return Err(Error::NotAligned { policy: name.clone(), iteration, latest: latest.version });
        }
        check_rollout_weights(rollout, &latest, iteration)?;
        current.insert(name, latest);
    }
    let by_id = check_turns(&current, rollout, turns, iteration)?;
    let mut sequences: HashMap<&str, Vec<Sequence>> = HashMap::new();
    for sample in samples {
        let expected = current_version(&current, Table::Samples, &sample.candidate_id, &sample.policy)?;
        check_version(
            Table::Samples,
            &sample.candidate_id,
            &sample.policy,
            sample.policy_version,
            expected,
            iteration,
        )?;
        let turn = by_id
            .get(sample.candidate_id.as_str())
            .ok_or_else(|| Error::MissingTurn { iteration, candidate_id: sample.candidate_id.clone() })?;
        if let Some(sequence) = sequence_of(sample, turn)? {
            sequences.entry(expected.policy.as_str()).or_default().push(sequence);
        }
    }
    Ok(configs
        .keys()
        .map(|name| {
            let mut seqs = sequences.remove(name.as_str()).unwrap_or_default();
            seqs.sort_by(|a, b| a.candidate_id.cmp(&b.candidate_id));
            TrainingSet { name: name.clone(), current: current[name.as_str()].clone(), sequences: seqs }
        })
        .collect())
}

/// The rollout's record of the weights it sampled `latest.policy` with must be `latest`.
fn check_rollout_weights(rollout: &[StoredMarker], latest: &PolicyRef, iteration: u32) -> Result<(), Error> {
    for m in rollout {
        for used in m.marker.policies_used.iter().filter(|u| u.policy == latest.policy) {
            if used != latest {
                return Err(Error::WeightsMismatch {
                    policy: latest.policy.clone(),
                    iteration,
                    marker: m.path.clone(),
                    rollout_version: used.version,
                    rollout_sha256: used.weights_sha256.clone(),
                    version: latest.version,
                    checkpoint_sha256: latest.weights_sha256.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The latest version of the policy a row of `table` names; one of the run's policies.
fn current_version<'c>(
    current: &'c HashMap<&str, PolicyRef>,
    table: Table,
    candidate_id: &str,
    policy: &str,
) -> Result<&'c PolicyRef, Error> {
    current.get(policy).ok_or_else(|| Error::UnknownPolicy {
        table,
        candidate_id: candidate_id.to_string(),
        policy: policy.to_string(),
    })
}

/// Every turns row: a known policy the rollout recorded, sampled by its latest version's weights.
fn check_turns<'t>(
    current: &HashMap<&str, PolicyRef>,
    rollout: &[StoredMarker],
    turns: &'t [TurnRow],
    iteration: u32,
) -> Result<HashMap<&'t str, &'t TurnRow>, Error> {
    let recorded: HashSet<&str> =
        rollout.iter().flat_map(|m| &m.marker.policies_used).map(|p| p.policy.as_str()).collect();
    let mut by_id = HashMap::with_capacity(turns.len());
    for turn in turns {
        let expected = current_version(current, Table::Turns, &turn.candidate_id, &turn.policy)?;
        if !recorded.contains(turn.policy.as_str()) {
            return Err(Error::UnrecordedPolicy { policy: turn.policy.clone(), iteration });
        }
        check_version(Table::Turns, &turn.candidate_id, &turn.policy, turn.policy_version, expected, iteration)?;
        if turn.weights_sha256 != expected.weights_sha256 {
            return Err(Error::RowWeights {
                policy: turn.policy.clone(),
                iteration,
                candidate_id: turn.candidate_id.clone(),
                version: expected.version,
                found: turn.weights_sha256.clone(),
                expected: expected.weights_sha256.clone(),
            });
        }
        by_id.insert(turn.candidate_id.as_str(), turn);
    }
    Ok(by_id)
}

fn check_version(
    table: Table,
    candidate_id: &str,
    policy: &str,
    found: u32,
    expected: &PolicyRef,
    iteration: u32,
) -> Result<(), Error> {
    if found == expected.version {
        return Ok(());
    }
    Err(Error::RowVersion {
        policy: policy.to_string(),
        iteration,
        table,
        candidate_id: candidate_id.to_string(),
        found,
        expected: expected.version,
    })
}

/// The sequence a sample trains on; None when its response is empty (nothing to train).
fn sequence_of(sample: &SampleRow, turn: &TurnRow) -> Result<Option<Sequence>, Error> {
    let bad = |reason: String| Error::BadRow { candidate_id: sample.candidate_id.clone(), reason };
    if turn.policy != sample.policy {
        return Err(bad(format!(
            "samples routes it to {:?}, but turns says {:?} sampled it",
            sample.policy, turn.policy
        )));
    }
    if turn.response_tokens.len() != turn.response_logprobs.len() {
        return Err(bad(format!(
            "{} response tokens but {} logprobs",
            turn.response_tokens.len(),
            turn.response_logprobs.len()
        )));
    }
    if turn.prompt_tokens.is_empty() {
        return Err(bad("the prompt has no tokens".into()));
    }
    if turn.response_tokens.is_empty() {
        return Ok(None);
    }
    let per_token = [
        ("token_values", &sample.token_values),
        ("token_value_targets", &sample.token_value_targets),
        ("token_advantages", &sample.token_advantages),
    ];
    for (column, values) in per_token {
        if let Some(values) = values.as_ref().filter(|v| v.len() != turn.response_tokens.len()) {
            return Err(bad(format!(
                "samples.{column} has {} values for its {} response tokens",
                values.len(),
                turn.response_tokens.len()
            )));
        }
    }
    Ok(Some(Sequence {
        candidate_id: sample.candidate_id.clone(),
        prompt: turn.prompt_tokens.iter().map(|&t| i64::from(t)).collect(),
        response: turn.response_tokens.iter().map(|&t| i64::from(t)).collect(),
        sampled: turn.response_logprobs.clone(),
        engine: turn.engine.clone(),
        advantage: sample.advantage,
        truncated: turn.finish_reason == TRUNCATED_FINISH_REASON,
        agent: sample.agent.clone(),
        value: sample.value,
        value_target: sample.value_target,
        token_values: sample.token_values.clone(),
        token_value_targets: sample.token_value_targets.clone(),
        token_advantages: sample.token_advantages.clone(),
    }))
}
