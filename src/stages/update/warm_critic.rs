//! `critic.warm_start`: a fork's value heads fitted, before its first PPO iteration, to the
//! returns of the rollouts its source committed before the fork point, so that PPO's
//! first advantages are not a fresh critic's noise.
//!
//! The returns need no values (GAE with λ = 1 is the discounted return), so any stored
//! independent rollout serves: a GRPO run's as well as a PPO run's. The features are
//! those of the forked version K, the trunk iteration K's values will be computed on.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use crate::config::{ForkConfig, RunConfig};
use crate::critic::{CriticConfig, CriticInput, CriticWarmStart, Critics, FitSet, Trunk, inputs, returns};
use crate::model::LanguageModel;
use crate::play::RolloutMode;
use crate::rng::{Key, name_key, stream};
use crate::store::{RunStore, Stage, StoredMarker};
use crate::tables::{TurnRow, UpdateRow};

use super::Error;
use super::critic_fit::row;

/// The source's turns of the iterations the warm start reads, with each one's return
/// and critic input.
pub(super) struct WarmTurns {
    turns: Vec<TurnRow>,
    returns: HashMap<String, f64>,
    inputs: HashMap<String, CriticInput>,
}

/// Reads the turns of `fork`'s source in iterations K − `warm.iterations` … K − 1.
pub(super) async fn read(
    source: &RunStore,
    config: &RunConfig,
    critic: &CriticConfig,
    warm: &CriticWarmStart,
    fork: &ForkConfig,
) -> Result<WarmTurns, crate::stages::Error> {
    let fail = |reason: String| Error::WarmCritic { reason: format!("{} @{}: {reason}", fork.from, fork.iteration) };
    let source_config = crate::config::of_run(source).await?;
    if source_config.rollout.mode != RolloutMode::Independent {
        let reason = "its rollouts are trees, whose turns are not one trajectory per episode; fork from a run \
                      with rollout.mode: independent";
        return Err(fail(reason.into()).into());
    }
    let first = fork.iteration.saturating_sub(warm.iterations);
    let mut markers: Vec<StoredMarker> = Vec::new();
    for k in first..fork.iteration {
        markers.extend(source.committed(Stage::Rollout, Some(k)).await?.unwrap_or_default());
    }
    if markers.is_empty() {
        return Err(fail(format!("the source committed no rollout in iterations {first}..{}", fork.iteration)).into());
    }
    let refs: Vec<&crate::store::CommitMarker> = markers.iter().map(|m| &m.marker).collect();
    let turns: Vec<TurnRow> = source.read_rows(&refs).await?;
    let returns = returns(&turns, &config.algorithm);
    let inputs = inputs(&turns, critic);
    Ok(WarmTurns { turns, returns, inputs })
}

/// Fits the heads of policy `name`'s agents (loaded from `saved`, or fresh) to `warm`'s
/// returns on `model`'s features; the heads and one `updates` row per step (version K to
/// K).
#[allow(clippy::too_many_arguments)]
pub(super) fn fit(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    config: &RunConfig,
    critic: &CriticConfig,
    warm_start: &CriticWarmStart,
    data: &WarmTurns,
    name: &str,
    saved: Option<&Path>,
    version: u32,
) -> Result<(Critics, Vec<UpdateRow>), crate::stages::Error> {
    let agents = config.agents_of(name);
    let mut critics = Critics::load(model, saved, &agents, critic, config.seed)?;
    let mut trunk = Trunk { model, adapter, max_tokens: config.update.micro_batch_tokens as usize };
    let fit_config = CriticConfig { epochs: warm_start.epochs, ..critic.clone() };
    let mut rows = Vec::new();
    for agent in agents {
        let mine: Vec<&TurnRow> = data.turns.iter().filter(|t| t.agent == agent).collect();
        if mine.is_empty() {
            continue;
        }
        let started = Instant::now();
        let agent_inputs: Vec<CriticInput> = mine.iter().map(|t| data.inputs[&t.candidate_id].clone()).collect();
        // Every position of a turn has its return: γ is 1 between a reply's tokens.
        let targets: Vec<f64> = mine
            .iter()
            .zip(&agent_inputs)
            .flat_map(|(t, input)| std::iter::repeat_n(data.returns[&t.candidate_id], input.positions))
            .collect();
        // Fitted afresh, not held near the fresh head's values: no old values, no clip.
        let set = FitSet { inputs: &agent_inputs, old_values: None, targets: &targets };
        let seed = stream(&[config.seed, Key::CRITIC, u64::from(version), name_key(agent), Key::INIT]);
        let steps = critics.fit(&mut trunk, agent, &set, &fit_config, config.update.grad_clip, seed)?;
        let seconds = started.elapsed().as_secs_f64() / steps.len().max(1) as f64;
        rows.extend(
            steps.into_iter().map(|step| UpdateRow { version_to: version, ..row(name, version, step, seconds) }),
        );
    }
    Ok((critics, rows))
}
