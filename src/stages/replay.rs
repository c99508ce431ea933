//! The rollout of a replay fork (`--from URL@K:group`): the source run's committed turns
//! of iteration K, copied instead of sampled, so group, advantage and update can run with
//! another estimator on exactly the same data (each row credited as this run credits it).
//! The copy is on-policy by construction: the rows must have been sampled by the very
//! weights this run holds as version K.
//! The pipeline runs this stage in place of rollout K (see [`replays`]).

use std::collections::{BTreeMap, HashSet};

use crate::config::{ForkConfig, RunConfig};
use crate::policies;
use crate::store::{CommitInfo, CommitMarker, InputRef, RunStore, Shard, Split, Stage, StageId, StoredMarker};
use crate::tables::TurnRow;
use crate::tasks;

use super::Error;

/// The fork whose rollout iteration `iteration` of this run copies rather than samples.
pub fn replays(config: &RunConfig, iteration: u32) -> Option<&ForkConfig> {
    config.fork.as_ref().filter(|f| f.replay && f.iteration == iteration)
}

/// Checks that the source can be replayed into a run with `config`: same sampling setup,
/// and a committed rollout of iteration K. Returns the source and that rollout's markers.
pub async fn check(config: &RunConfig, fork: &ForkConfig) -> Result<(RunStore, Vec<StoredMarker>), Error> {
    let fail = |reason: String| Error::Replay { from: fork.from.clone(), iteration: fork.iteration, reason };
    let source = RunStore::open(&fork.from)?;
    let differences = config.sampling_differences(&crate::config::of_run(&source).await?);
    if !differences.is_empty() {
        return Err(fail(format!(
            "replayed turns must be sampled as this run would sample them, but {} differ from the source's",
            differences.join(", ")
        )));
    }
    let markers = source.committed(Stage::Rollout, Some(fork.iteration)).await?.ok_or_else(|| {
        fail(format!("it has no committed rollout of iteration {}; replay needs one to copy", fork.iteration))
    })?;
    Ok((source, markers))
}

/// Commits the source's turns of iteration K (this shard's tasks) as this run's rollout.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    fork: &ForkConfig,
    shard: Option<Shard>,
) -> Result<CommitMarker, Error> {
    let k = fork.iteration;
    let stage = StageId { shard, ..StageId::at(Stage::Rollout, k) };
    super::refuse_if_committed(store, stage).await?;
    let (source, source_markers) = check(config, fork).await?;
    let ours = store.markers().await?;
    let mut sampled_with = BTreeMap::new();
    for marker in &source_markers {
        if !marker.marker.opponents_used.is_empty() {
            return Err(Error::Replay {
                from: fork.from.clone(),
                iteration: k,
                reason: "its rollout played a league's past versions, which a fork does not hold".into(),
            });
        }
        for used in &marker.marker.policies_used {
            let ours_at = config.policies.get(&used.policy).map_or(k, |p| p.version_at(k));
            let (_, held) = policies::find(&ours, &used.policy, ours_at)?;
            if used.version != ours_at || held.weights_sha256 != used.weights_sha256 {
                return Err(Error::Replay {
                    from: fork.from.clone(),
                    iteration: k,
                    reason: format!(
                        "its rollout sampled policy {} v{} with weights {}, but this run's v{k} is {}",
                        used.policy,
                        used.version,
                        &used.weights_sha256[..12.min(used.weights_sha256.len())],
                        &held.weights_sha256[..12.min(held.weights_sha256.len())]
                    ),
                });
            }
            sampled_with.insert(used.policy.clone(), used.clone());
        }
    }
    let markers: Vec<&CommitMarker> = source_markers.iter().map(|m| &m.marker).collect();
    let (prepared, train) = tasks::read(store, Split::Train).await?;
    let batch: HashSet<String> = tasks::batch(&train, config.rollout.tasks_per_iteration, config.seed, k, shard)
        .into_iter()
        .map(|t| t.task_id)
        .collect();
    let run = config.run_name();
    let mut rows: Vec<TurnRow> = source
        .read_rows::<TurnRow>(&markers)
        .await?
        .into_iter()
        .filter(|r| batch.contains(&r.task_id))
        .map(|r| TurnRow { run: run.clone(), ..r })
        .collect();
    // Credited as this run's algorithm credits them: a replay compares estimators.
    super::credit(&mut rows, &config.algorithm);
    let reused_from = source_markers
        .iter()
        .map(|m| InputRef { marker: format!("{}/{}", source.url(), m.path), sha256: m.sha256.clone() })
        .collect();
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: sampled_with.into_values().collect(),
        reused_from,
        ..super::run_info(config)
    };
    super::commit_by_agent(store.begin(stage), rows, info).await
}
