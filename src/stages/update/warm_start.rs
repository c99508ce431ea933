//! The supervised warm start: v0 of a scratch policy trained on the solver
//! demonstrations prepare-data committed (the embedded default), one `updates` row of
//! mode "sft" per step.

use std::collections::HashSet;
use std::time::Instant;

use crate::config::RunConfig;
use crate::model::{LanguageModel, ScoreRequest, Trainer};
use crate::progress::Progress;
use crate::rng::{Key, permutation, stream};
use crate::tables::{DemonstrationRow, UpdateRow};

use super::Error;
use crate::stages;

/// (prompt ids, response ids) of the demonstrations of the agents `name` plays: the
/// user message rendered with the chat template (generation prompt, no thinking) and
/// the reply followed by EOS. A prompt over `warm_start.max_prompt_tokens` is an error.
pub(super) fn examples(
    model: &LanguageModel,
    config: &RunConfig,
    name: &str,
    demos: &[DemonstrationRow],
) -> Result<Vec<ScoreRequest>, stages::Error> {
    let agents: HashSet<&str> = config.agents_of(name).into_iter().collect();
    let eos = *model.config().eos_token_ids.first().ok_or_else(|| Error::Init {
        policy: name.to_string(),
        reason: "config.json has no eos_token_id to end the demonstrations with".into(),
    })?;
    let warm = config.warm_start.as_ref().expect("a warm start is configured");
    let max_prompt = warm.max_prompt_tokens as usize;
    let mut examples = Vec::new();
    for demo in demos.iter().filter(|d| agents.contains(d.agent.as_str())) {
        let (_, prompt_ids) = model.agent_prompt(&demo.prompt, max_prompt)?;
        let mut response_ids = model.require_tokenizer()?.encode(&demo.response, false)?;
        response_ids.push(eos);
        examples.push(ScoreRequest { prompt_ids, response_ids, adapter: None, images: None });
    }
    if examples.is_empty() {
        return Err(Error::Init {
            policy: name.to_string(),
            reason: format!("warm_start is set but prepare-data committed no demonstrations for its agents {agents:?}"),
        }
        .into());
    }
    Ok(examples)
}

/// `steps` AdamW steps of `batch_size` examples (seeded shuffles, cycling), token-mean
/// cross-entropy on the response tokens.
pub(super) fn train(
    model: &mut LanguageModel,
    name: &str,
    examples: &[ScoreRequest],
    config: &RunConfig,
    progress: &dyn Progress,
) -> Result<Vec<UpdateRow>, stages::Error> {
    let warm = config.warm_start.as_ref().expect("a warm start is configured");
    let seed = stream(&[config.seed, Key::SFT, crate::rng::name_key(name)]);
    let (steps, batch) = (warm.steps as usize, warm.batch_size as usize);
    let mut order = Vec::with_capacity(steps * batch);
    for cycle in 0.. {
        if order.len() >= steps * batch {
            break;
        }
        order.extend(permutation(examples.len(), stream(&[seed, cycle])));
    }
    let micro = super::memory::micro_batching(&config.update, model);
    let mut trainer = Trainer::new(model, None, &warm.optimizer, config.update.grad_clip, None, None)?;
    let mut rows = Vec::with_capacity(steps);
    for step in 0..steps {
        let start = Instant::now();
        let chosen: Vec<ScoreRequest> =
            order[step * batch..(step + 1) * batch].iter().map(|&i| examples[i].clone()).collect();
        let tokens: usize = chosen.iter().map(|r| r.response_ids.len()).sum();
        let lr = warm.optimizer.learning_rate(step as u64, steps as u64);
        let done = trainer.sft_step(model, &chosen, micro, stream(&[seed, Key::SFT, step as u64]), lr)?;
        let nll = -done.logprobs.iter().flatten().map(|&x| f64::from(x)).sum::<f64>() / tokens.max(1) as f64;
        rows.push(UpdateRow {
            policy: name.to_string(),
            mode: "sft".into(),
            version_from: 0,
            version_to: 0,
            step: step as u32,
            loss: nll,
            clip_fraction: 0.0,
            ratio_mean: 1.0,
            ratio_max: 1.0,
            logprob_drift_mean: 0.0,
            logprob_drift_max: 0.0,
            approx_kl: 0.0,
            grad_norm: done.grad_norm,
            entropy: 0.0,
            tokens: tokens as u64,
            sequences: chosen.len() as u32,
            learning_rate: lr,
            weights_change: Some(done.weights_change),
            skipped: Some(done.skipped),
            truncated: None,
            mismatch_fraction: None,
            mismatch_p95: None,
            ranks: None,
            allreduce_bytes: None,
            allreduce_seconds: None,
            seconds: start.elapsed().as_secs_f64(),
            agent: None,
            explained_variance: None,
            stale_sequences: None,
            stale_logprob_drift_mean: None,
            stale_mismatch_fraction: None,
        });
        progress.advance(1.0, tokens as u64);
    }
    Ok(rows)
}
