//! The critic's part of a PPO update: each agent's value head fitted to its samples' GAE
//! targets on the features of the policy's new trunk (or of the critic model, trained
//! with the head under `critic.lora`), then saved into the new version's checkpoint
//! beside the policy.
//!
//! The features are taken after the policy's steps, from the weights version k+1 holds:
//! those the next iteration's values are computed on. The clip is against the values the
//! advantage stage recorded (`samples.value`), as PPO clips against the old critic.
//! With ranks, every rank fits alike (the same features, order and steps on CPU), and
//! the leader saves.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use crate::config::RunConfig;
use crate::critic::{CriticConfig, CriticInput, Critics, FitSet, FitStep, Trunk};
use crate::model::LanguageModel;
use crate::rng::{Key, name_key, stream};
use crate::tables::UpdateRow;

use super::Error;
use super::checks::{Sequence, TrainingSet};

/// The heads after their fit, and one `updates` row per step.
pub(super) struct Fitted {
    pub(super) critics: Critics,
    pub(super) rows: Vec<UpdateRow>,
}

/// Fits the heads of every agent `set`'s policy plays (loaded from `saved`, the critic
/// folder of version k, or fresh) on its samples, whose critic inputs are `inputs`: at
/// every response token where the samples carry token values, else at the turn's state.
#[allow(clippy::too_many_arguments)]
pub(super) fn fit(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    config: &RunConfig,
    critic: &CriticConfig,
    set: &TrainingSet,
    inputs: &HashMap<String, CriticInput>,
    saved: Option<&Path>,
    iteration: u32,
) -> Result<Fitted, crate::stages::Error> {
    let agents = config.agents_of(&set.name);
    let mut critics = Critics::load(model, saved, &agents, critic, config.seed)?;
    let mut trunk = Trunk { model, adapter, max_tokens: config.update.micro_batch_tokens as usize };
    let mut rows = Vec::new();
    for agent in agents {
        let mine: Vec<_> = set.sequences.iter().filter(|s| s.agent == agent).collect();
        if mine.is_empty() {
            continue;
        }
        let (mut old, mut targets) = (Vec::new(), Vec::new());
        for s in &mine {
            let (values, value_targets) = values_of(s, inputs[&s.candidate_id].positions)?;
            old.extend(values);
            targets.extend(value_targets);
        }
        let started = Instant::now();
        let agent_inputs: Vec<CriticInput> = mine.iter().map(|s| inputs[&s.candidate_id].clone()).collect();
        let seed = stream(&[config.seed, Key::CRITIC, u64::from(iteration), name_key(agent)]);
        let fit_set = FitSet { inputs: &agent_inputs, old_values: Some(&old), targets: &targets };
        let steps = critics.fit(&mut trunk, agent, &fit_set, critic, config.update.grad_clip, seed)?;
        let seconds = started.elapsed().as_secs_f64() / steps.len().max(1) as f64;
        rows.extend(steps.into_iter().map(|step| row(&set.name, set.current.version, step, seconds)));
    }
    Ok(Fitted { critics, rows })
}

/// A sample's values at sampling time and its targets: one per response token, or one
/// for the turn, as many as its critic input values (`critic.values` as the advantage
/// stage ran it).
fn values_of(s: &Sequence, positions: usize) -> Result<(Vec<f64>, Vec<f64>), Error> {
    let bad = |reason: String| Error::BadRow { candidate_id: s.candidate_id.clone(), reason };
    let floats = |xs: &[f32]| xs.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let (values, targets) = match (&s.token_values, &s.token_value_targets, s.value, s.value_target) {
        (Some(values), Some(targets), _, _) => (floats(values), floats(targets)),
        (None, None, Some(value), Some(target)) => (vec![value], vec![target]),
        _ => return Err(bad("samples gives it no value or value_target, which ppo's advantage stage writes".into())),
    };
    if values.len() != positions {
        return Err(bad(format!(
            "samples gives it {} values but critic.values asks for {positions}: the advantage stage ran with \
             another critic.values; rerun it",
            values.len()
        )));
    }
    Ok((values, targets))
}

/// The `updates` row of one step of a head.
pub(super) fn row(policy: &str, version: u32, step: FitStep, seconds: f64) -> UpdateRow {
    UpdateRow {
        policy: policy.to_owned(),
        mode: "critic".into(),
        version_from: version,
        version_to: version + 1,
        step: step.step,
        loss: step.loss,
        clip_fraction: step.clip_fraction,
        ratio_mean: 0.0,
        ratio_max: 0.0,
        logprob_drift_mean: 0.0,
        logprob_drift_max: 0.0,
        approx_kl: 0.0,
        grad_norm: step.grad_norm,
        entropy: 0.0,
        tokens: 0,
        sequences: step.sequences,
        learning_rate: step.learning_rate,
        weights_change: Some(step.weights_change),
        skipped: Some(step.skipped),
        truncated: None,
        mismatch_fraction: None,
        mismatch_p95: None,
        ranks: None,
        allreduce_bytes: None,
        allreduce_seconds: None,
        seconds,
        agent: Some(step.agent),
        explained_variance: step.explained_variance,
        stale_sequences: None,
        stale_logprob_drift_mean: None,
        stale_mismatch_fraction: None,
    }
}
