//! The strict on-policy checks of an update (DESIGN §3), all made before anything is
//! written: the rollout's parts are this iteration's, the samples come from this
//! rollout, the latest committed checkpoint of every policy is version k and is what the
//! rollout sampled with, and every turns and samples row carries version k. With
//! `rollout.max_staleness` s, a row may carry any committed version from k − s to k, and
//! the rollout's record and the row's weights digest must be that version's.

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
    /// How many versions behind the trained one sampled it (0 strictly on-policy).
    pub(super) staleness: u32,
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

/// The versions a row of iteration `iteration` may have been sampled by: its policy's
/// committed checkpoints from `iteration − max_staleness` to `iteration`.
struct Allowed<'m> {
    iteration: u32,
    max_staleness: u32,
    /// (policy, version) → weights sha256 of every committed checkpoint.
    committed: HashMap<(&'m str, u32), &'m str>,
}

impl<'m> Allowed<'m> {
    fn new(markers: &'m [StoredMarker], iteration: u32, max_staleness: u32) -> Self {
        let committed = markers
            .iter()
            .flat_map(|m| &m.marker.checkpoints)
            .map(|c| ((c.policy.as_str(), c.version), c.weights_sha256.as_str()))
            .collect();
        Allowed { iteration, max_staleness, committed }
    }

    /// An error unless `table`'s row `candidate_id` of `policy`, sampled by `found`, is
    /// within the bound; its staleness otherwise.
    fn staleness(&self, table: Table, candidate_id: &str, policy: &str, found: u32) -> Result<u32, Error> {
        let (iteration, bound) = (self.iteration, self.max_staleness);
        match iteration.checked_sub(found) {
            Some(behind) if behind <= bound => Ok(behind),
            Some(behind) if bound > 0 => Err(Error::PastStaleness {
                policy: policy.to_string(),
                iteration,
                table,
                candidate_id: candidate_id.to_string(),
                found,
                behind,
                bound,
            }),
            _ => Err(Error::RowVersion {
                policy: policy.to_string(),
                iteration,
                table,
                candidate_id: candidate_id.to_string(),
                found,
                expected: iteration,
            }),
        }
    }

    /// The weights digest of version `version` of `policy`, empty when none is committed.
    fn weights(&self, policy: &str, version: u32) -> &'m str {
        self.committed.get(&(policy, version)).copied().unwrap_or_default()
    }
}

/// The strict on-policy checks (DESIGN §3), or those of bounded staleness, then each
/// policy's sequences, in candidate order. Every trainable policy of `configs` gets a
/// training set, with or without samples; a frozen one's turns must be its version 0's.
pub(super) fn training_sets(
    configs: &BTreeMap<String, PolicyConfig>,
    markers: &[StoredMarker],
    rollout: &[StoredMarker],
    turns: &[TurnRow],
    samples: &[SampleRow],
    iteration: u32,
    max_staleness: u32,
) -> Result<Vec<TrainingSet>, Error> {
    let allowed = Allowed::new(markers, iteration, max_staleness);
    let mut current: HashMap<&str, PolicyRef> = HashMap::new();
    let mut frozen: HashSet<&str> = HashSet::new();
    for (name, config) in configs {
        if !config.trainable {
            check_rollout_weights(rollout, name, false, &allowed)?;
            frozen.insert(name);
            continue;
        }
        let latest = policies::latest_in(markers, name).ok_or(Error::NoCheckpoint { policy: name.clone() })?;
        if latest.version != iteration {
            return Err(Error::NotAligned { policy: name.clone(), iteration, latest: latest.version });
        }
        check_rollout_weights(rollout, name, true, &allowed)?;
        current.insert(name, latest);
    }
    let by_id = check_turns(&current, &frozen, &allowed, rollout, turns)?;
    let mut sequences: HashMap<&str, Vec<Sequence>> = HashMap::new();
    for sample in samples {
        let expected = current_version(&current, Table::Samples, &sample.candidate_id, &sample.policy)?;
        let turn = by_id
            .get(sample.candidate_id.as_str())
            .ok_or_else(|| Error::MissingTurn { iteration, candidate_id: sample.candidate_id.clone() })?;
        let staleness =
            allowed.staleness(Table::Samples, &sample.candidate_id, &sample.policy, sample.policy_version)?;
        if sample.policy_version != turn.policy_version {
            return Err(Error::BadRow {
                candidate_id: sample.candidate_id.clone(),
                reason: format!(
                    "samples says v{} sampled it, but turns says v{}",
                    sample.policy_version, turn.policy_version
                ),
            });
        }
        if let Some(mut sequence) = sequence_of(sample, turn)? {
            sequence.staleness = staleness;
            sequences.entry(expected.policy.as_str()).or_default().push(sequence);
        }
    }
    Ok(configs
        .iter()
        .filter(|(_, config)| config.trainable)
        .map(|(name, _)| {
            let mut seqs = sequences.remove(name.as_str()).unwrap_or_default();
            seqs.sort_by(|a, b| a.candidate_id.cmp(&b.candidate_id));
            TrainingSet { name: name.clone(), current: current[name.as_str()].clone(), sequences: seqs }
        })
        .collect())
}

/// The rollout's record of the weights it sampled `policy` with must be a committed
/// version within the bound (a frozen policy's: its only version, 0), and that version's
/// weights.
fn check_rollout_weights(
    rollout: &[StoredMarker],
    policy: &str,
    trainable: bool,
    allowed: &Allowed,
) -> Result<(), Error> {
    for m in rollout {
        for used in m.marker.policies_used.iter().filter(|u| u.policy == policy) {
            // Strictly on-policy, any other version is the latest one's mismatch.
            let version = match (trainable, allowed.max_staleness) {
                (false, _) => 0,
                (true, 0) => allowed.iteration,
                (true, _) => {
                    allowed.staleness(Table::Turns, &format!("(the rollout {})", m.path), policy, used.version)?;
                    used.version
                }
            };
            let checkpoint = allowed.weights(policy, version);
            if used.version != version || used.weights_sha256 != checkpoint {
                return Err(Error::WeightsMismatch {
                    policy: policy.to_string(),
                    iteration: allowed.iteration,
                    marker: m.path.clone(),
                    rollout_version: used.version,
                    rollout_sha256: used.weights_sha256.clone(),
                    version,
                    checkpoint_sha256: checkpoint.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The past versions the rollout records its league's roles played, each a committed
/// version no later than the iteration, with that version's weights.
fn check_opponents<'m>(rollout: &'m [StoredMarker], allowed: &Allowed) -> Result<HashSet<(&'m str, u32)>, Error> {
    let mut past = HashSet::new();
    for m in rollout {
        for used in &m.marker.opponents_used {
            let checkpoint = allowed.weights(&used.policy, used.version);
            if used.version > allowed.iteration || used.weights_sha256 != checkpoint {
                return Err(Error::WeightsMismatch {
                    policy: used.policy.clone(),
                    iteration: allowed.iteration,
                    marker: m.path.clone(),
                    rollout_version: used.version,
                    rollout_sha256: used.weights_sha256.clone(),
                    version: used.version,
                    checkpoint_sha256: checkpoint.to_string(),
                });
            }
            past.insert((used.policy.as_str(), used.version));
        }
    }
    Ok(past)
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

/// Every turns row: a known policy the rollout recorded, sampled by an allowed
/// version's weights (a frozen policy's: version 0's, the row marked untrainable), its
/// staleness column (where it has one) what its version says.
fn check_turns<'t>(
    current: &HashMap<&str, PolicyRef>,
    frozen: &HashSet<&str>,
    allowed: &Allowed,
    rollout: &[StoredMarker],
    turns: &'t [TurnRow],
) -> Result<HashMap<&'t str, &'t TurnRow>, Error> {
    let iteration = allowed.iteration;
    let recorded: HashSet<&str> =
        rollout.iter().flat_map(|m| &m.marker.policies_used).map(|p| p.policy.as_str()).collect();
    let past = check_opponents(rollout, allowed)?;
    let mut by_id = HashMap::with_capacity(turns.len());
    for turn in turns {
        let is_frozen = frozen.contains(turn.policy.as_str());
        // A league role's turn: a past version the rollout records having played, never trained.
        let is_past =
            !is_frozen && turn.trainable == Some(false) && past.contains(&(turn.policy.as_str(), turn.policy_version));
        if !is_frozen {
            current_version(current, Table::Turns, &turn.candidate_id, &turn.policy)?;
        }
        if !recorded.contains(turn.policy.as_str()) {
            return Err(Error::UnrecordedPolicy { policy: turn.policy.clone(), iteration });
        }
        let (id, version) = (&turn.candidate_id, turn.policy_version);
        let staleness = match (is_frozen, is_past) {
            (false, true) => None,
            (true, _) if version == 0 => Some(0),
            (true, _) => {
                return Err(Error::RowVersion {
                    policy: turn.policy.clone(),
                    iteration,
                    table: Table::Turns,
                    candidate_id: id.clone(),
                    found: version,
                    expected: 0,
                });
            }
            (false, false) => Some(allowed.staleness(Table::Turns, id, &turn.policy, version)?),
        };
        let expected = allowed.weights(&turn.policy, version);
        if turn.weights_sha256 != expected {
            return Err(Error::RowWeights {
                policy: turn.policy.clone(),
                iteration,
                candidate_id: id.clone(),
                version,
                found: turn.weights_sha256.clone(),
                expected: expected.to_string(),
            });
        }
        if let Some(recorded) = turn.staleness.filter(|&s| Some(s) != staleness) {
            let reason = match staleness {
                Some(s) => format!("turns.staleness is {recorded}, but v{version} is {s} behind v{iteration}"),
                None => format!("turns.staleness is {recorded}, but a league's past version is never trained"),
            };
            return Err(Error::BadRow { candidate_id: id.clone(), reason });
        }
        if !is_past && turn.trainable.is_some_and(|t| t == is_frozen) {
            let (flag, policy) = (is_frozen, if is_frozen { "frozen" } else { "trainable" });
            return Err(Error::BadRow {
                candidate_id: id.clone(),
                reason: format!("turns.trainable is {flag}, but its policy {:?} is {policy}", turn.policy),
            });
        }
        by_id.insert(id.as_str(), turn);
    }
    Ok(by_id)
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
        staleness: 0,
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
