//! PPO's advantages: every turn valued by its agent's critic (version k, on the policy's
//! trunk of version k), once or at every token of its reply (`critic.values`), then GAE
//! along each agent's turns of every episode.
//!
//! With `critic.model`, the features come from that separate model and the policy is not
//! loaded at all.
//!
//! The values are computed here rather than in the rollout: they are the critic's, not
//! the sampler's (a vLLM rollout has no value head), the critic of version k judges the
//! whole iteration at once, and a replay fork re-values stored turns with its own critic
//! without rewriting them. They are kept in `samples` beside the advantages they made.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::algo::AlgorithmConfig;
use crate::algo::critic::{Estimates, Whitening, episode_gae, episode_rewards};
use crate::config::RunConfig;
use crate::critic::{CRITIC_DIR, CriticConfig, Critics, Trunk, ValuesAt, episodes, inputs as critic_inputs, steps};
use crate::policies;
use crate::store::{CommitInfo, CommitMarker, InputRef, RunStore, Stage, StageId, StoredMarker};
use crate::tables::{SampleRow, TurnRow};

use super::super::{Error, Session, commit_rows, critic_trunk, inputs, run_info, separate_critic_model, verify_inputs};

pub(super) async fn run(
    store: &RunStore,
    config: &RunConfig,
    critic: &CriticConfig,
    iteration: u32,
    session: &Session,
) -> Result<CommitMarker, Error> {
    let stage = StageId::at(Stage::Advantage, iteration);
    // Begun first: the marker's seconds then include the critic's forwards.
    let writer = store.begin(stage);
    let rollout = inputs(store, stage, Stage::Rollout, iteration).await?;
    let groups = inputs(store, stage, Stage::Group, iteration).await?;
    verify_inputs(store, &groups).await?;
    let rollout_markers: Vec<&crate::store::CommitMarker> = rollout.iter().map(|m| &m.marker).collect();
    let turns: Vec<TurnRow> = store.read_rows(&rollout_markers).await?;
    let mut read: Vec<InputRef> = rollout.iter().chain(&groups).map(StoredMarker::input_ref).collect();
    let started = Instant::now();
    let values = values(store, config, critic, iteration, session, &turns, &mut read).await?;
    let model_seconds = started.elapsed().as_secs_f64();
    let samples = samples(&turns, &values, &config.algorithm, critic);
    commit_rows(writer, &samples, CommitInfo { inputs: read, model_seconds, ..run_info(config) }).await
}

/// Every turn's values (one, or one per reply token), by candidate id, from its agent's
/// critic in its policy's checkpoint of version `iteration` (one policy in memory at a
/// time); each checkpoint read is added to `read`.
async fn values(
    store: &RunStore,
    config: &RunConfig,
    critic: &CriticConfig,
    iteration: u32,
    session: &Session,
    turns: &[TurnRow],
    read: &mut Vec<InputRef>,
) -> Result<HashMap<String, Vec<f64>>, Error> {
    let markers = store.markers().await?;
    let mut inputs = critic_inputs(turns, critic);
    let mut loaded = session.policies.take(store, &config.policies, iteration).await?;
    let mut values = HashMap::with_capacity(turns.len());
    for name in config.policies.keys() {
        let mut by_agent: BTreeMap<&str, Vec<&TurnRow>> = BTreeMap::new();
        for row in turns.iter().filter(|r| &r.policy == name) {
            by_agent.entry(row.agent.as_str()).or_default().push(row);
        }
        if by_agent.is_empty() {
            continue;
        }
        let (source, _) = policies::find(&markers, name, iteration)?;
        if !read.contains(&source.input_ref()) {
            read.push(source.input_ref());
        }
        let saved = policies::checkpoint_part(store, &markers, name, iteration, CRITIC_DIR).await?;
        // A separate critic model is all the values need; else the policy's own trunk.
        let mut separate = separate_critic_model(critic, &markers, &config.policies[name], name, iteration)?;
        if separate.is_none() {
            loaded.keep_only(name);
            if loaded.member(name).is_none() {
                loaded.add(&config.policies, policies::fetch(store, &markers, name, iteration).await?)?;
            }
        }
        let (model, adapter) = critic_trunk(&mut separate, &mut loaded, name);
        let agents: Vec<&str> = by_agent.keys().copied().collect();
        let critics = Critics::load(model, saved.as_deref(), &agents, critic, config.seed)?;
        let adapter = adapter.map(str::to_owned);
        let max_tokens = config.update.micro_batch_tokens as usize;
        let mut trunk = Trunk { model, adapter: adapter.as_deref(), max_tokens };
        for (agent, rows) in by_agent {
            let agent_inputs: Vec<_> =
                rows.iter().map(|r| inputs.remove(&r.candidate_id).expect("every turn has an input")).collect();
            let flat = tokio::task::block_in_place(|| critics.values(&mut trunk, agent, &agent_inputs))?;
            let mut flat = flat.into_iter();
            for (row, input) in rows.iter().zip(&agent_inputs) {
                values.insert(row.candidate_id.clone(), flat.by_ref().take(input.positions).collect());
            }
        }
    }
    session.policies.give_back(loaded);
    Ok(values)
}

/// The samples of `turns`: GAE over each episode (task, episode) in play order, with
/// each turn's values from `values`, the truncation penalty in the reward where it
/// applies, the advantages of each policy whitened if asked (with token values, over
/// all its tokens). With token values the per-token columns are filled and the turn's
/// own columns hold its first token's.
fn samples(
    turns: &[TurnRow],
    values: &HashMap<String, Vec<f64>>,
    algorithm: &AlgorithmConfig,
    critic: &CriticConfig,
) -> Vec<SampleRow> {
    let by_token = critic.values == ValuesAt::Token;
    let mut samples = Vec::with_capacity(turns.len());
    let mut estimates: Vec<Estimates> = Vec::with_capacity(turns.len());
    for episode in episodes(turns) {
        let steps = steps(&episode, algorithm);
        let own: Vec<Vec<f64>> = episode.iter().map(|r| values[&r.candidate_id].clone()).collect();
        let episode_estimates = episode_gae(algorithm.alpha, critic.discounts(algorithm.gamma), &steps, &own);
        let rewards = episode_rewards(algorithm.alpha, &steps);
        for (i, row) in episode.iter().enumerate() {
            let (e, own) = (&episode_estimates[i], &own[i]);
            let per_token = |xs: &[f64]| by_token.then(|| floats(&xs[..row.response_tokens.len()]));
            samples.push(SampleRow {
                candidate_id: row.candidate_id.clone(),
                group_id: row.task_id.clone(),
                agent: row.agent.clone(),
                policy: row.policy.clone(),
                policy_version: row.policy_version,
                mixed_reward: rewards[i],
                // Set below, after whitening.
                advantage: 0.0,
                response_token_count: row.response_tokens.len() as u32,
                value: Some(own[0]),
                value_target: Some(e.returns[0]),
                token_values: per_token(own),
                token_value_targets: per_token(&e.returns),
                token_advantages: None,
            });
        }
        estimates.extend(episode_estimates);
    }
    if critic.whiten_advantages {
        whiten_per_policy(&samples, &mut estimates, by_token);
    }
    for (sample, e) in samples.iter_mut().zip(estimates) {
        sample.advantage = e.advantages[0];
        if by_token {
            sample.token_advantages = Some(floats(&e.advantages[..sample.response_token_count as usize]));
        }
    }
    samples.sort_by(|a, b| a.candidate_id.cmp(&b.candidate_id));
    samples
}

/// Each policy's advantages shifted and scaled together, by the statistics of those it
/// trains on: each sample's, or with token values each response token's (an empty
/// reply's one value, at its state, trains nothing).
fn whiten_per_policy(samples: &[SampleRow], estimates: &mut [Estimates], by_token: bool) {
    let mut policies: Vec<&str> = samples.iter().map(|s| s.policy.as_str()).collect();
    policies.sort_unstable();
    policies.dedup();
    for policy in policies {
        let mine: Vec<usize> = (0..samples.len()).filter(|&i| samples[i].policy == policy).collect();
        let trained = |i: usize| if by_token { samples[i].response_token_count as usize } else { 1 };
        let counted: Vec<f64> = mine.iter().flat_map(|&i| estimates[i].advantages[..trained(i)].to_vec()).collect();
        let whitening = Whitening::of(&counted);
        for &i in &mine {
            for a in estimates[i].advantages.iter_mut() {
                *a = whitening.apply(*a);
            }
        }
    }
}

/// f32 copies, as the per-token columns hold them.
fn floats(xs: &[f64]) -> Vec<f32> {
    xs.iter().map(|&x| x as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{TRUNCATED_FINISH_REASON, Truncated};

    fn turn(episode: u32, node_id: u32, agent: &str, local_reward: f64, team_reward: f64) -> TurnRow {
        TurnRow {
            candidate_id: format!("e{episode}/n{node_id}"),
            task_id: "t".into(),
            episode,
            node_id,
            agent: agent.into(),
            policy: "shared".into(),
            local_reward,
            team_reward,
            response_tokens: vec![1, 2],
            finish_reason: "stop".into(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn each_episode_is_its_own_trajectory_and_the_values_and_targets_are_kept() {
        // Two episodes of a, b; the second stored out of play order and truncated at b.
        let mut cut = turn(1, 1, "b", 0.0, 1.0);
        cut.finish_reason = TRUNCATED_FINISH_REASON.into();
        let rows = vec![turn(0, 0, "a", 0.0, 0.0), turn(0, 1, "b", 0.5, 2.0), cut, turn(1, 0, "a", 0.2, 0.0)];
        let values: HashMap<String, Vec<f64>> =
            [("e0/n0", 1.0), ("e0/n1", 0.5), ("e1/n0", 0.0), ("e1/n1", 0.25)].map(|(k, v)| (k.into(), vec![v])).into();
        let algorithm = AlgorithmConfig { alpha: 1.0, truncated: Truncated::Penalty, ..AlgorithmConfig::default() };
        let critic = CriticConfig { lambda: 1.0, whiten_advantages: false, ..CriticConfig::default() };
        let got = samples(&rows, &values, &algorithm, &critic);
        let ids: Vec<&str> = got.iter().map(|s| s.candidate_id.as_str()).collect();
        assert_eq!(ids, ["e0/n0", "e0/n1", "e1/n0", "e1/n1"]);
        // Episode 0, R = 2: a's reward 0 + 2, b's 0.5 + 2; one turn each, so A = r − V.
        // Episode 1, R = 1: a 0.2 + 1; b 0 − 1 (truncation penalty) + 1 = 0.
        let rewards: Vec<f64> = got.iter().map(|s| s.mixed_reward).collect();
        assert_eq!(rewards, [2.0, 2.5, 1.2, 0.0]);
        let advantages: Vec<f64> = got.iter().map(|s| s.advantage).collect();
        assert_eq!(advantages, [1.0, 2.0, 1.2, -0.25]);
        assert_eq!(got[3].value, Some(0.25));
        assert_eq!(got[3].value_target, Some(0.0));
        // Whitened: mean 0 and variance 1 over the policy's samples.
        let whitened = samples(&rows, &values, &algorithm, &CriticConfig { whiten_advantages: true, ..critic });
        let a: Vec<f64> = whitened.iter().map(|s| s.advantage).collect();
        let mean = a.iter().sum::<f64>() / 4.0;
        let variance = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0;
        assert!(mean.abs() < 1e-12 && (variance - 1.0).abs() < 1e-6, "{a:?}");
        assert_eq!(whitened[3].value_target, Some(0.0), "targets are not whitened");
        assert!(whitened.iter().all(|s| s.token_advantages.is_none() && s.token_values.is_none()));
    }

    #[test]
    fn token_values_give_every_reply_token_its_own_advantage_whitened_over_all_tokens() {
        // One episode: a replies with 2 tokens, then b with 2; R = 1 at b's turn.
        let rows = vec![turn(0, 0, "a", 0.0, 0.0), turn(0, 1, "b", 0.0, 1.0)];
        let values: HashMap<String, Vec<f64>> =
            [("e0/n0", vec![0.5, 0.25]), ("e0/n1", vec![0.0, 0.5])].map(|(k, v)| (k.into(), v)).into();
        let algorithm = AlgorithmConfig { alpha: 1.0, ..AlgorithmConfig::default() };
        let critic = CriticConfig {
            values: ValuesAt::Token,
            token_lambda: 1.0,
            whiten_advantages: false,
            ..CriticConfig::default()
        };
        let got = samples(&rows, &values, &algorithm, &critic);
        // Each agent's one turn ends its trajectory with reward 1 (α·R at its last turn);
        // λ = 1 within a reply: A = 1 − V at every token, the target 1 at every token.
        assert_eq!(got[0].token_advantages, Some(vec![0.5, 0.75]));
        assert_eq!(got[1].token_advantages, Some(vec![1.0, 0.5]));
        assert_eq!(got[0].token_value_targets, Some(vec![1.0, 1.0]));
        assert_eq!(got[1].token_values, Some(vec![0.0, 0.5]));
        assert_eq!((got[0].advantage, got[0].value, got[0].value_target), (0.5, Some(0.5), Some(1.0)));
        let whitened = samples(&rows, &values, &algorithm, &CriticConfig { whiten_advantages: true, ..critic });
        let all: Vec<f32> = whitened.iter().flat_map(|s| s.token_advantages.clone().unwrap()).collect();
        // 0.5, 0.75, 1, 0.5: mean 0.6875, variance 0.04296875.
        let expected: Vec<f32> =
            [0.5f64, 0.75, 1.0, 0.5].iter().map(|a| ((a - 0.6875) / (0.04296875f64 + 1e-8).sqrt()) as f32).collect();
        assert!(all.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-5), "{all:?} vs {expected:?}");
        assert!((whitened[1].advantage - f64::from(all[2])).abs() < 1e-6, "the turn's advantage is its first token's");
    }
}
