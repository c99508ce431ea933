//! One policy's PPO-clip steps over its samples, and the `updates` rows they record.

use std::sync::Arc;
use std::time::Instant;

use crate::algo::Truncated;
use crate::algo::loss::{Advantage, ppo_clip_loss, truncated_importance_weight};
use crate::algo::stats::{mean_max, mismatch};
use crate::config::RunConfig;
use crate::model::{
    AdamWState, DataParallel, LanguageModel, MicroBatching, OptimizerConfig, PpoClip, ScoreRequest, StepResult, Totals,
    Trainer, prompt_groups,
};
use crate::progress::Progress;
use crate::ranks::Ranks;
use crate::rng::{Key, name_key, permutation, stream};
use crate::tables::{LogprobGapRow, UpdateRow};

use super::Error;
use super::checks::{Sequence, TrainingSet};
use super::data_parallel::{gather, shard};
use super::memory::micro_batching;

/// What a PPO update of one policy runs with.
pub(super) struct PpoSettings<'a> {
    name: String,
    iteration: u32,
    iterations: u32,
    epochs: u32,
    mini_batch: usize,
    micro: MicroBatching,
    grad_clip: f64,
    clip: PpoClip,
    max_drift: f64,
    /// Rollouts may be stale: the updates rows report stale samples apart.
    stale_rows: bool,
    /// The first step's forward can give its old logprobs: no dropout makes it differ
    /// from a no-grad pass.
    reuse_first_forward: bool,
    optimizer: &'a OptimizerConfig,
    /// The dtype the policy's weights are held in, for messages.
    dtype: String,
    /// With ranks, shard the optimiser state over them (ZeRO-1).
    shard_state: bool,
    truncated: Truncated,
    seed: u64,
}

impl PpoSettings<'_> {
    pub(super) fn new<'a>(config: &'a RunConfig, name: &str, iteration: u32, model: &LanguageModel) -> PpoSettings<'a> {
        let update = &config.update;
        let algorithm = &config.algorithm;
        PpoSettings {
            name: name.to_string(),
            iteration,
            iterations: config.iterations,
            epochs: update.epochs,
            mini_batch: update.mini_batch_sequences.max(1) as usize,
            micro: MicroBatching { temperature: config.behaviour_temperature(), ..micro_batching(update, model) },
            grad_clip: update.grad_clip,
            clip: PpoClip {
                epsilon: algorithm.clip_epsilon,
                aggregation: config.loss_aggregation(),
                importance_cap: config.importance_cap(),
            },
            max_drift: update.max_logprob_drift,
            stale_rows: config.rollout.max_staleness > 0,
            reuse_first_forward: config.policies[name].lora.as_ref().is_none_or(|l| l.dropout == 0.0),
            optimizer: &config.policies[name].optimizer,
            dtype: format!("{:?}", model.kind()),
            shard_state: update.shard_optimizer_state,
            truncated: algorithm.truncated,
            seed: stream(&[config.seed, Key::PPO, u64::from(iteration), name_key(name)]),
        }
    }

    /// The advantage `sequence` trains with (its tokens' own where the critic gave them),
    /// or none when it is masked out of the loss.
    fn trained_advantage<'s>(&self, sequence: &'s Sequence) -> Option<Advantage<'s>> {
        let advantage = match &sequence.token_advantages {
            Some(tokens) => Advantage::Tokens(tokens),
            None => Advantage::Sequence(sequence.advantage),
        };
        (!(sequence.truncated && self.truncated == Truncated::Mask)).then_some(advantage)
    }

    /// Optimiser steps over `sequences` samples: every epoch in mini-batches.
    pub(super) fn steps(&self, sequences: usize) -> u64 {
        sequences.div_ceil(self.mini_batch) as u64 * u64::from(self.epochs)
    }
}

/// What a policy's PPO update recorded: a row per step, a gap row per sample.
pub(super) struct Trained {
    pub(super) steps: Vec<UpdateRow>,
    pub(super) gaps: Vec<LogprobGapRow>,
}

/// Runs the PPO-clip steps, continuing the optimiser state `optimizer`; one row per step,
/// and the state to save with the result.
///
/// The old logprobs are recomputed under the current weights. The first mini-batch's
/// come from its own training forward (the weights are still the old policy's; ratio
/// exactly 1), unless LoRA dropout makes that forward noisy; the others' from a no-grad
/// pass before the first step. Their drift from the sampled logprobs is checked after
/// the first step, before anything is written.
///
/// With `ranks`, each rank forwards its shard of every mini-batch and of the no-grad
/// pass (data_parallel.rs), the trainer sums the gradients over the ranks, and every
/// rank ends with the same weights, which they compare.
pub(super) fn train_ppo(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    set: &TrainingSet,
    settings: &PpoSettings,
    optimizer: Option<AdamWState>,
    ranks: Option<&Arc<Ranks>>,
    progress: &dyn Progress,
) -> Result<(Trained, Option<AdamWState>), super::super::Error> {
    let sequences = &set.sequences;
    if sequences.is_empty() {
        return Ok((Trained { steps: Vec::new(), gaps: Vec::new() }, optimizer));
    }
    let requests: Vec<ScoreRequest> = sequences
        .iter()
        .map(|s| ScoreRequest {
            prompt_ids: s.prompt.clone(),
            response_ids: s.response.clone(),
            adapter: adapter.map(str::to_owned),
            images: None,
        })
        .collect();
    let epochs: Vec<Vec<usize>> =
        (0..settings.epochs).map(|e| mini_batch_order(&requests, stream(&[settings.seed, u64::from(e)]))).collect();
    let steps: Vec<&[usize]> = epochs.iter().flat_map(|order| order.chunks(settings.mini_batch)).collect();
    // The old logprobs: the first step's samples get theirs from that step's own forward
    // when it can give them, every other sample from a no-grad pass now.
    let from_own_forward = if settings.reuse_first_forward { steps[0].len() } else { 0 };
    let (world, rank) = ranks.map_or((1, 0), |r| (r.size(), r.rank()));
    let lengths = |i: usize| requests[i].response_ids.len();
    let mut old = vec![Vec::new(); sequences.len()];
    let scored = &epochs[0][from_own_forward..];
    let my_scored = shard(scored, &requests, world, rank);
    let scored_requests: Vec<ScoreRequest> = my_scored.iter().map(|&i| requests[i].clone()).collect();
    let scored_logprobs = model.score_batched(&scored_requests, &settings.micro)?;
    let scored_logprobs = gather(ranks, scored, &lengths, &my_scored, scored_logprobs, "the old logprobs' gather")
        .map_err(Error::from)?;
    for (&i, logprobs) in scored.iter().zip(scored_logprobs) {
        old[i] = logprobs;
    }

    let parallel = ranks.map(|ranks| DataParallel { ranks: ranks.clone(), shard_state: settings.shard_state });
    let mut trainer = Trainer::new(model, adapter, settings.optimizer, settings.grad_clip, optimizer, parallel)?;
    let total = schedule_length(trainer.steps_taken(), steps.len() as u64, settings.iterations, settings.iteration);
    let mut rows = Vec::new();
    let mut drift = Vec::new();
    for (step, chunk) in steps.into_iter().enumerate() {
        if ranks.is_some() {
            crate::ranks::die_if_told(rank, step);
        }
        let start = Instant::now();
        let own_forward = step == 0 && from_own_forward > 0;
        let advantage = |i: usize| settings.trained_advantage(&sequences[i]);
        let whole: Vec<ScoreRequest> = chunk.iter().map(|&i| requests[i].clone()).collect();
        let totals = Totals::of(&whole, &chunk.iter().map(|&i| advantage(i)).collect::<Vec<_>>());
        let mine = shard(chunk, &requests, world, rank);
        let batch: Vec<ScoreRequest> = mine.iter().map(|&i| requests[i].clone()).collect();
        let old_batch: Vec<&[f32]> = mine.iter().map(|&i| old[i].as_slice()).collect();
        let sampled: Vec<&[f32]> = mine.iter().map(|&i| sequences[i].sampled.as_slice()).collect();
        let advantages: Vec<Option<Advantage>> = mine.iter().map(|&i| advantage(i)).collect();
        let lr = settings.optimizer.learning_rate(trainer.steps_taken(), total);
        let seed = stream(&[settings.seed, Key::PPO, step as u64]);
        let old_given = (!own_forward).then_some(old_batch.as_slice());
        let mut done = trainer.ppo_step(
            model,
            &batch,
            old_given,
            &sampled,
            &advantages,
            totals,
            settings.clip,
            settings.micro,
            seed,
            lr,
        )?;
        done.logprobs =
            gather(ranks, chunk, &lengths, &mine, std::mem::take(&mut done.logprobs), "the logprobs' gather")
                .map_err(Error::from)?;
        if own_forward {
            for (&i, logprobs) in chunk.iter().zip(&done.logprobs) {
                old[i] = logprobs.clone();
            }
        }
        if step == 0 {
            drift = check_drift(set, settings, &old)?;
        }
        let tokens: usize = whole.iter().map(|r| r.response_ids.len()).sum();
        let facts = StepFacts { step: step as u64, done: &done, lr, start };
        rows.push(step_row(settings, set, chunk, &old, &drift, facts));
        progress.advance(1.0, tokens as u64);
    }
    check_finite(set, settings, &trainer, &rows)?;
    if let Some(ranks) = ranks {
        let what = format!("{} v{} weights", set.name, set.current.version + 1);
        ranks.agree(&what, &trainer.weights_digest()).map_err(Error::from)?;
    }
    let gaps = gap_rows(set, &old);
    Ok((Trained { steps: rows, gaps }, trainer.state()?))
}

/// The optimiser steps the learning-rate schedule of a run of `iterations` spans, seen
/// from iteration `iteration`: those taken before it (the continued optimiser state
/// counts them, so a resumed or forked run and an iteration with fewer samples keep
/// their place) and, for this and every later iteration, as many as this one takes.
fn schedule_length(taken: u64, this_iteration: u64, iterations: u32, iteration: u32) -> u64 {
    let left = u64::from(iterations.saturating_sub(iteration).max(1));
    taken + this_iteration * left
}

/// An error unless a step was taken where there was something to train, and every
/// trained weight is finite: a NaN committed would be sampled from, and trained on, from
/// then on.
fn check_finite(set: &TrainingSet, settings: &PpoSettings, trainer: &Trainer, rows: &[UpdateRow]) -> Result<(), Error> {
    let (policy, version) = (set.name.clone(), set.current.version);
    let trained: Vec<&UpdateRow> = rows.iter().filter(|r| r.tokens > 0).collect();
    if !trained.is_empty() && trained.iter().all(|r| r.skipped == Some(true)) {
        return Err(Error::NoFiniteStep {
            policy,
            version,
            steps: trained.len(),
            lr: settings.optimizer.lr,
            grad_clip: settings.grad_clip,
            dtype: settings.dtype.clone(),
        });
    }
    let names = trainer.non_finite_weights();
    if !names.is_empty() {
        let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
        let more = if names.len() > 3 { format!(" and {} more", names.len() - 3) } else { String::new() };
        return Err(Error::NonFiniteWeights {
            policy,
            version,
            names: format!("{}{more}", shown.join(", ")),
            lr: settings.optimizer.lr,
            grad_clip: settings.grad_clip,
        });
    }
    if let Some(row) = trained.iter().find(|r| r.weights_change.is_some_and(|c| !c.is_finite())) {
        return Err(Error::WeightsOverflow {
            policy,
            version,
            step: row.step,
            change: row.weights_change.unwrap_or_default(),
            lr: settings.optimizer.lr,
        });
    }
    Ok(())
}

/// Each sample's engine-vs-trainer gap, from the trainer's logprobs before the first step.
fn gap_rows(set: &TrainingSet, trainer: &[Vec<f32>]) -> Vec<LogprobGapRow> {
    set.sequences
        .iter()
        .zip(trainer)
        .map(|(s, ours)| {
            let diffs: Vec<f64> = ours.iter().zip(&s.sampled).map(|(a, b)| f64::from(a - b)).collect();
            let (gap_mean, gap_max) = mean_max(diffs.iter().map(|d| d.abs()));
            LogprobGapRow {
                candidate_id: s.candidate_id.clone(),
                policy: set.name.clone(),
                version: set.current.version,
                engine: s.engine.clone(),
                tokens: diffs.len() as u32,
                gap_mean,
                gap_max,
                log_ratio_mean: diffs.iter().sum::<f64>() / diffs.len().max(1) as f64,
                staleness: Some(s.staleness),
            }
        })
        .collect()
}

/// Each token's |recomputed − sampled| logprob; an error when their mean over the samples
/// of the trained version exceeds the limit (the weights or the sampler are not what the
/// rollout says). A stale sample's drift is the policy's change as well, and unchecked:
/// its weights digest was.
fn check_drift(set: &TrainingSet, settings: &PpoSettings, old: &[Vec<f32>]) -> Result<Vec<Vec<f64>>, Error> {
    let non_finite = old.iter().flatten().filter(|x| !x.is_finite()).count();
    if non_finite > 0 {
        return Err(Error::NonFiniteLogprobs {
            policy: set.name.clone(),
            version: set.current.version,
            tokens: non_finite,
        });
    }
    let drift: Vec<Vec<f64>> = old
        .iter()
        .zip(&set.sequences)
        .map(|(o, s)| o.iter().zip(&s.sampled).map(|(a, b)| f64::from((a - b).abs())).collect())
        .collect();
    let fresh = drift.iter().zip(&set.sequences).filter(|(_, s)| s.staleness == 0);
    let (mean, max) = mean_max(fresh.flat_map(|(d, _)| d.iter().copied()));
    // A NaN mean fails too.
    if mean.is_nan() || mean > settings.max_drift {
        return Err(Error::Drift {
            policy: set.name.clone(),
            version: set.current.version,
            mean,
            max,
            limit: settings.max_drift,
        });
    }
    Ok(drift)
}

/// The order an epoch takes the samples in: the groups of samples with one prompt in a
/// seeded random order, each group's samples together, so that a mini-batch holds whole
/// groups (as verl's do) and forwards each shared prompt once.
fn mini_batch_order(requests: &[ScoreRequest], seed: u64) -> Vec<usize> {
    let mut groups = prompt_groups(requests);
    permutation(groups.len(), seed).into_iter().flat_map(|g| std::mem::take(&mut groups[g])).collect()
}

struct StepFacts<'a> {
    step: u64,
    done: &'a StepResult,
    lr: f64,
    start: Instant,
}

/// The `updates` row of one step: the PPO terms by `algo::loss` on the logprobs the
/// step's forward computed (before the step), weighted as the step weighted them, with
/// the pre-update drift and entropy.
fn step_row(
    settings: &PpoSettings,
    set: &TrainingSet,
    chunk: &[usize],
    old: &[Vec<f32>],
    drift: &[Vec<f64>],
    facts: StepFacts,
) -> UpdateRow {
    let new = &facts.done.logprobs;
    let truncated = chunk.iter().filter(|&&i| set.sequences[i].truncated).count();
    // The loss's terms are those of the sequences it trained on.
    // (row of the step's logprobs, sample, advantage)
    let trained: Vec<(usize, usize, Advantage)> = chunk
        .iter()
        .enumerate()
        .filter_map(|(row, &i)| Some((row, i, settings.trained_advantage(&set.sequences[i])?)))
        .collect();
    let chunk: Vec<usize> = trained.iter().map(|&(_, i, _)| i).collect();
    let pairs: Vec<Vec<(f64, f64)>> = trained
        .iter()
        .map(|&(row, i, _)| new[row].iter().zip(&old[i]).map(|(&n, &o)| (f64::from(n), f64::from(o))).collect())
        .collect();
    let sequences: Vec<(&[(f64, f64)], Advantage)> =
        pairs.iter().zip(&trained).map(|(p, &(_, _, advantage))| (p.as_slice(), advantage)).collect();
    let weights: Option<Vec<Vec<f64>>> = settings.clip.importance_cap.map(|cap| {
        chunk
            .iter()
            .map(|&i| {
                let sampled = &set.sequences[i].sampled;
                old[i]
                    .iter()
                    .zip(sampled)
                    .map(|(&o, &e)| truncated_importance_weight(o.into(), e.into(), cap))
                    .collect()
            })
            .collect()
    });
    let summary = ppo_clip_loss(&sequences, weights.as_deref(), settings.clip.epsilon, settings.clip.aggregation);
    let (stale, fresh): (Vec<usize>, Vec<usize>) = chunk.iter().partition(|&&i| set.sequences[i].staleness > 0);
    let log_ratios = |samples: &[usize]| -> Vec<f64> {
        let ratios = |i: usize| old[i].iter().zip(&set.sequences[i].sampled).map(|(&t, &s)| f64::from(t - s));
        samples.iter().flat_map(|&i| ratios(i)).collect()
    };
    let drifts = |samples: &[usize]| mean_max(samples.iter().flat_map(|&i| drift[i].iter().copied()));
    let (drift_mean, drift_max) = drifts(&fresh);
    let (mismatch_fraction, mismatch_p95) = mismatch(log_ratios(&fresh).into_iter());
    let stale_rows =
        settings.stale_rows.then(|| (stale.len() as u32, drifts(&stale).0, mismatch(log_ratios(&stale).into_iter()).0));
    let (entropy, _) = mean_max(chunk.iter().flat_map(|&i| old[i].iter().map(|&x| -f64::from(x))));
    UpdateRow {
        policy: settings.name.clone(),
        mode: "ppo".into(),
        version_from: set.current.version,
        version_to: set.current.version + 1,
        step: facts.step as u32,
        loss: summary.loss,
        clip_fraction: summary.clip_fraction,
        ratio_mean: summary.ratio_mean,
        ratio_max: summary.ratio_max,
        logprob_drift_mean: drift_mean,
        logprob_drift_max: drift_max,
        approx_kl: summary.approx_kl,
        grad_norm: facts.done.grad_norm,
        entropy,
        tokens: summary.tokens as u64,
        sequences: chunk.len() as u32,
        learning_rate: facts.lr,
        weights_change: Some(facts.done.weights_change),
        skipped: Some(facts.done.skipped),
        truncated: Some(truncated as u32),
        mismatch_fraction: Some(mismatch_fraction),
        mismatch_p95: Some(mismatch_p95),
        ranks: facts.done.all_reduce.map(|a| a.ranks),
        allreduce_bytes: facts.done.all_reduce.map(|a| a.bytes),
        allreduce_seconds: facts.done.all_reduce.map(|a| a.seconds),
        seconds: facts.start.elapsed().as_secs_f64(),
        agent: None,
        explained_variance: None,
        stale_sequences: stale_rows.map(|(n, _, _)| n),
        stale_logprob_drift_mean: stale_rows.map(|(_, drift, _)| drift),
        stale_mismatch_fraction: stale_rows.map(|(_, _, fraction)| fraction),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_spans_the_steps_taken_and_those_still_to_come() {
        // Iteration 0 of 10, 4 steps each: 40, as a fixed step count would say.
        assert_eq!(schedule_length(0, 4, 10, 0), 40);
        // Iteration 3 after 9 steps (the filters left fewer samples in 0-2), 4 this time:
        // the 9 taken and 7 iterations of 4, not 10 x 4 with step 12 next.
        assert_eq!(schedule_length(9, 4, 10, 3), 37);
        // A run extended past its configured iterations still has this one to go.
        assert_eq!(schedule_length(40, 4, 10, 10), 44);
    }

    #[test]
    fn an_epoch_keeps_each_groups_samples_together() {
        let sample =
            |prompt: i64| ScoreRequest { prompt_ids: vec![prompt], response_ids: vec![1], adapter: None, images: None };
        let sequences: Vec<ScoreRequest> = [7, 8, 7, 9, 8, 7].into_iter().map(sample).collect();
        let order = mini_batch_order(&sequences, 3);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..6).collect::<Vec<_>>());
        let prompts: Vec<i64> = order.iter().map(|&i| sequences[i].prompt_ids[0]).collect();
        let runs = prompts.windows(2).filter(|w| w[0] != w[1]).count() + 1;
        assert_eq!(runs, 3, "one run per prompt: {prompts:?}");
        assert_eq!(order, mini_batch_order(&sequences, 3));
        let seeds: std::collections::BTreeSet<Vec<usize>> = (0..20).map(|s| mini_batch_order(&sequences, s)).collect();
        assert!(seeds.len() > 1, "the seed orders the groups");
    }
}
