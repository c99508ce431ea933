//! group and advantage on synthetic rollouts, checked against the pure functions of
//! `algo` (the oracle) for every estimator.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::memory::InMemory;
use petting::algo::Algorithm;
use petting::algo::advantage::{group_stats, kept_groups};
use petting::algo::grouping::{group_key, mixed_reward};
use petting::config::{self, RunConfig};
use petting::stages::{self, Session, advantage, group};
use petting::store::{RunStore, Stage, StageId};
use petting::tables::{GroupRow, SampleRow, TurnRow};

use crate::support::{RunFile, block_on, synthetic};

fn run_file(algorithm: &str, filter: &str) -> RunFile {
    RunFile::new(
        "store: memory://run
iterations: 1
env: {name: plan_path}
workflow: {kind: tool_planner}
agents: {tool: {policy: shared}, planner: {policy: shared}}
policies: {shared: {model: m}}
algorithm: {alpha: 0.5}
",
    )
    .set("algorithm.name", algorithm)
    .set("algorithm.filter", filter)
}

/// A run with a frozen config and one committed rollout of synthetic turns.
async fn run_with_rollout(algorithm: &str, filter: &str) -> (RunStore, RunConfig, Vec<TurnRow>) {
    let store = RunStore::from_object_store(Arc::new(InMemory::new()), "run", "memory://run");
    let text = run_file(algorithm, filter).text();
    store.init_config(&text).await.unwrap();
    let config = config::parse(&text, std::path::Path::new("it.yaml")).unwrap();
    synthetic::commit_turns(&store, 1, 512, 200).await;
    (store, config, synthetic::turn_rows(0, 512, 7))
}

/// The oracle: rewards of each group, in candidate order.
fn groups_of(config: &RunConfig, turns: &[TurnRow]) -> BTreeMap<String, Vec<(String, f64)>> {
    let mut groups: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for t in turns {
        let key = group_key(config.algorithm.name.grouping(), &t.task_id, &t.agent, t.turn);
        let reward = mixed_reward(config.algorithm.alpha, t.team_reward, t.local_reward);
        groups.entry(key).or_default().push((t.candidate_id.clone(), reward));
    }
    for members in groups.values_mut() {
        members.sort_by(|a, b| a.0.cmp(&b.0));
    }
    groups
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn groups_match_the_oracle_statistics_and_filters() {
    block_on(async {
        let (store, config, turns) =
            run_with_rollout("at_grpo", "{drop_degenerate: true, drop_lowest_mean_fraction: 0.25}").await;
        let marker = group::run(&store, &config, 0).await.unwrap();
        let rows: Vec<GroupRow> = store.read_rows(&[&marker]).await.unwrap();
        let oracle = groups_of(&config, &turns);
        assert_eq!(
            rows.iter().map(|r| r.group_id.clone()).collect::<Vec<_>>(),
            oracle.keys().cloned().collect::<Vec<_>>()
        );

        let stats: Vec<_> =
            oracle.values().map(|m| group_stats(&m.iter().map(|(_, r)| *r).collect::<Vec<_>>())).collect();
        let kept = kept_groups(&stats, true, 0.25);
        assert!(kept.iter().any(|k| !k) && kept.iter().any(|k| *k), "the filters must bite on this data");
        for ((row, stats), kept) in rows.iter().zip(&stats).zip(kept) {
            assert_eq!(row.size as usize, stats.size, "{}", row.group_id);
            assert!(close(row.mean, stats.mean) && close(row.std, stats.std), "{row:?} vs {stats:?}");
            assert_eq!((row.degenerate, row.kept), (stats.degenerate, kept), "{}", row.group_id);
            assert_eq!(row.agent.as_deref(), Some(row.group_id.rsplit('/').next().unwrap()));
        }
    });
}

#[test]
fn every_estimator_matches_its_pure_function() {
    for (name, algorithm) in [
        ("at_grpo", Algorithm::AtGrpo),
        ("grpo", Algorithm::Grpo),
        ("dr_grpo", Algorithm::DrGrpo),
        ("magrpo", Algorithm::Magrpo),
        ("marloo", Algorithm::Marloo),
        ("maremax", Algorithm::Maremax),
    ] {
        block_on(async {
            let (store, config, turns) = run_with_rollout(name, "{}").await;
            group::run(&store, &config, 0).await.unwrap();
            let marker = advantage::run(&store, &config, 0, &Session::default()).await.unwrap();
            let samples: Vec<SampleRow> = store.read_rows(&[&marker]).await.unwrap();
            assert_eq!(samples.len(), turns.len(), "{name}: nothing is filtered");

            let by_id: BTreeMap<&str, &SampleRow> = samples.iter().map(|s| (s.candidate_id.as_str(), s)).collect();
            let mut nonzero = 0;
            for (group_id, members) in groups_of(&config, &turns) {
                let rewards: Vec<f64> = members.iter().map(|(_, r)| *r).collect();
                let expected = algorithm.advantages(&rewards, config.algorithm.std_epsilon);
                for ((id, reward), want) in members.iter().zip(expected) {
                    let got = by_id[id.as_str()];
                    assert_eq!(got.group_id, group_id);
                    assert!(
                        close(got.mixed_reward, *reward) && close(got.advantage, want),
                        "{name} {id}: {got:?}, want {want}"
                    );
                    nonzero += usize::from(want != 0.0);
                }
            }
            assert!(nonzero > samples.len() / 2, "{name}: the data must exercise the estimator");
        });
    }
}

#[test]
fn a_truncation_penalty_is_added_to_the_reward_of_cut_replies_only() {
    block_on(async {
        let store = RunStore::from_object_store(Arc::new(InMemory::new()), "run", "memory://run");
        let text = run_file("at_grpo", "{}")
            .set("algorithm.truncated", "penalty")
            .set("algorithm.truncation_penalty", "-0.75")
            .text();
        store.init_config(&text).await.unwrap();
        let config = config::parse(&text, std::path::Path::new("it.yaml")).unwrap();
        let mut turns = synthetic::turn_rows(0, 512, 7);
        turns.iter_mut().step_by(5).for_each(|t| t.finish_reason = "length".into());
        synthetic::commit_rows(&store, 0, &turns, 200).await;
        group::run(&store, &config, 0).await.unwrap();
        let marker = advantage::run(&store, &config, 0, &Session::default()).await.unwrap();
        let samples: Vec<SampleRow> = store.read_rows(&[&marker]).await.unwrap();
        let by_id: BTreeMap<&str, &SampleRow> = samples.iter().map(|s| (s.candidate_id.as_str(), s)).collect();
        let mut groups: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
        for t in &turns {
            let penalty = if t.finish_reason == "length" { -0.75 } else { 0.0 };
            let reward = mixed_reward(0.5, t.team_reward, t.local_reward) + penalty;
            let key = group_key(config.algorithm.name.grouping(), &t.task_id, &t.agent, t.turn);
            groups.entry(key).or_default().push((t.candidate_id.clone(), reward));
        }
        for members in groups.values_mut() {
            members.sort_by(|a, b| a.0.cmp(&b.0));
            let rewards: Vec<f64> = members.iter().map(|(_, r)| *r).collect();
            let expected = Algorithm::AtGrpo.advantages(&rewards, config.algorithm.std_epsilon);
            for ((id, reward), want) in members.iter().zip(expected) {
                let got = by_id[id.as_str()];
                assert!(close(got.mixed_reward, *reward) && close(got.advantage, want), "{id}: {got:?}, want {want}");
            }
        }
    });
}

#[test]
fn at_grpo_advantages_sum_to_zero_per_group_and_carry_policy_and_lengths() {
    block_on(async {
        let (store, config, turns) = run_with_rollout("at_grpo", "{}").await;
        group::run(&store, &config, 0).await.unwrap();
        let marker = advantage::run(&store, &config, 0, &Session::default()).await.unwrap();
        let samples: Vec<SampleRow> = store.read_rows(&[&marker]).await.unwrap();
        let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
        for s in &samples {
            *sums.entry(&s.group_id).or_default() += s.advantage;
        }
        assert!(sums.values().all(|s| s.abs() < 1e-9), "{sums:?}");
        let turn = turns.iter().find(|t| t.candidate_id == samples[0].candidate_id).unwrap();
        assert_eq!((samples[0].policy.as_str(), samples[0].policy_version), ("shared", 0));
        assert_eq!(samples[0].response_token_count as usize, turn.response_tokens.len());
        assert_eq!(marker.inputs.len(), 2, "rollout and group markers");
    });
}

#[test]
fn a_stage_refuses_to_run_before_its_inputs_are_committed() {
    block_on(async {
        let (store, config, _) = run_with_rollout("at_grpo", "{}").await;
        let err = advantage::run(&store, &config, 0, &Session::default()).await.unwrap_err();
        assert!(matches!(err, stages::Error::NotReady { needs: Stage::Group, .. }), "{err}");
        assert_eq!(err.to_string(), "advantage of iteration 0 needs group of iteration 0 committed first");
        let err = group::run(&store, &config, 1).await.unwrap_err();
        assert!(err.to_string().contains("needs rollout of iteration 1"), "{err}");
        assert!(store.marker(&StageId::at(Stage::Advantage, 0)).await.unwrap().is_none());
    });
}

#[test]
fn re_running_a_stage_reproduces_its_table_bit_for_bit() {
    let sha = || {
        block_on(async {
            let (store, config, _) = run_with_rollout("at_grpo", "{}").await;
            group::run(&store, &config, 0).await.unwrap();
            let marker = advantage::run(&store, &config, 0, &Session::default()).await.unwrap();
            marker.files.iter().map(|f| f.sha256.clone()).collect::<Vec<_>>()
        })
    };
    assert_eq!(sha(), sha());
}
