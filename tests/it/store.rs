//! The run store's contract, checked on every backend: in memory, on disk, and a real
//! S3-compatible server (SeaweedFS on 127.0.0.1, started by scripts/test.sh).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use petting::schema::Table;
use petting::sql::RunSql;
use petting::store::{CheckpointRef, CommitInfo, Error, Partition, PolicyRef, RunStore, Stage, StageId};
use petting::tables::{self, SampleRow, TurnRow};
use tempfile::TempDir;

use crate::support::{block_on, synthetic};

struct Backend {
    store: RunStore,
    _dir: Option<TempDir>,
}

fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let local = RunStore::open(dir.path().join("run").to_str().unwrap()).unwrap();
    let memory = RunStore::from_object_store(Arc::new(InMemory::new()), "runs/a", "memory://runs/a");
    let mut backends = vec![Backend { store: memory, _dir: None }, Backend { store: local, _dir: Some(dir) }];
    backends.extend(crate::support::s3_run_store().map(|store| Backend { store, _dir: None }));
    backends
}

fn info() -> CommitInfo {
    CommitInfo { run: "t".into(), seed: 3, config_sha256: "c0ffee".into(), ..CommitInfo::default() }
}

/// All object paths under the run, relative to it.
async fn listing(store: &RunStore) -> Vec<String> {
    let metas: Vec<_> = store.object_store().list(Some(store.root())).try_collect().await.unwrap();
    let mut paths: Vec<String> = metas
        .iter()
        .map(|m| {
            m.location.prefix_match(store.root()).unwrap().map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/")
        })
        .collect();
    paths.sort();
    paths
}

fn object(store: &RunStore, relative: &str) -> Path {
    Path::from(format!("{}/{relative}", store.root()))
}

async fn count_turns(store: &RunStore) -> Result<i64, petting::sql::Error> {
    let sql = RunSql::open(store).await?;
    let (_, batches) = sql.query("select count(*) as n from turns").await?;
    let column = batches[0].column(0).as_any().downcast_ref::<arrow::array::Int64Array>().unwrap().value(0);
    Ok(column)
}

#[test]
fn committed_rows_read_back_identical() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let markers = synthetic::commit_turns(&store, 2, 100, 40).await;
            assert_eq!(markers[0].files.len(), 3, "100 rows in parts of 40");
            for (iteration, marker) in markers.iter().enumerate() {
                let read: Vec<TurnRow> = store.read_rows(&[marker]).await.unwrap();
                assert_eq!(read, synthetic::turn_rows(iteration as u32, 100, 7), "{}", store.url());
            }
            assert_eq!(count_turns(&store).await.unwrap(), 200);
        });
    }
}

#[test]
fn two_writers_racing_on_one_marker_leave_exactly_one_winner() {
    for Backend { store, .. } in backends() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async {
            let attempt = |seed: u64| {
                let store = store.clone();
                tokio::spawn(async move {
                    let stage = StageId::at(Stage::Rollout, 0);
                    let rows = synthetic::turn_rows(0, 10 + seed as usize, seed);
                    let mut writer = store.begin(stage);
                    writer
                        .write_table(Table::Turns, Partition::Iteration(0), &[tables::to_batch(&rows).unwrap()])
                        .await
                        .unwrap();
                    writer.finish().commit(info()).await
                })
            };
            let (a, b) = (attempt(1), attempt(2));
            let results = [a.await.unwrap(), b.await.unwrap()];
            let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(winners.len(), 1, "exactly one attempt commits");
            let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
            assert!(matches!(loser, Error::AlreadyCommitted { .. }), "{loser}");
            assert!(loser.to_string().contains("rollout of iteration 0 is already committed"), "{loser}");

            // Both attempts wrote a part; only the winner's is visible.
            let parts: Vec<String> = listing(&store).await.into_iter().filter(|p| p.starts_with("turns/")).collect();
            assert_eq!(parts.len(), 2);
            let winner = winners[0];
            assert_eq!(count_turns(&store).await.unwrap() as u64, winner.rows());
            let stored = store.marker(&StageId::at(Stage::Rollout, 0)).await.unwrap().unwrap();
            assert_eq!(&stored.marker, winner);
        });
    }
}

#[test]
fn an_uncommitted_attempt_is_invisible_to_sql_and_collected_by_gc() {
    for Backend { store, .. } in backends() {
        block_on(async {
            synthetic::commit_turns(&store, 1, 50, 50).await;
            // What a writer killed before its commit leaves behind: written parts, no marker.
            let mut killed = store.begin(StageId::at(Stage::Rollout, 1));
            let rows = synthetic::turn_rows(1, 30, 9);
            killed
                .write_table(Table::Turns, Partition::Iteration(1), &[tables::to_batch(&rows).unwrap()])
                .await
                .unwrap();
            let orphan = killed.finish().files()[0].path.clone();
            assert!(listing(&store).await.contains(&orphan));

            let sql = RunSql::open(&store).await.unwrap();
            let (_, batches) = sql.query("select distinct iteration from turns").await.unwrap();
            assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1, "iteration 1 was never committed");
            assert_eq!(count_turns(&store).await.unwrap(), 50);

            let spared = store.gc(Duration::from_secs(3600), false).await.unwrap();
            assert!(spared.deleted.is_empty());
            assert_eq!(spared.spared, vec![orphan.clone()]);

            let dry = store.gc(Duration::ZERO, true).await.unwrap();
            assert_eq!(dry.deleted.len(), 1);
            assert!(listing(&store).await.contains(&orphan), "a dry run deletes nothing");

            let report = store.gc(Duration::ZERO, false).await.unwrap();
            assert_eq!(report.deleted.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(), vec![orphan.clone()]);
            assert!(!listing(&store).await.contains(&orphan));
            assert_eq!(count_turns(&store).await.unwrap(), 50, "gc keeps every committed row");
            assert_eq!(store.verify().await.unwrap(), (1, 0));
        });
    }
}

/// Commits one part and returns its path and bytes.
async fn one_committed_part(store: &RunStore) -> (String, Bytes) {
    let marker = &synthetic::commit_turns(store, 1, 64, 64).await[0];
    let path = marker.files[0].path.clone();
    let bytes = store.object_store().get(&object(store, &path)).await.unwrap().bytes().await.unwrap();
    (path, bytes)
}

#[test]
fn a_truncated_part_is_an_error_naming_the_file() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let (path, bytes) = one_committed_part(&store).await;
            store.object_store().put(&object(&store, &path), bytes.slice(..bytes.len() / 2).into()).await.unwrap();

            let marker = store.marker(&StageId::at(Stage::Rollout, 0)).await.unwrap().unwrap();
            let err = store.read_table(&[&marker.marker], Table::Turns).await.unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
            let message = err.to_string();
            assert!(message.contains(&path) && message.contains("bytes"), "{message}");

            let message = count_turns(&store).await.unwrap_err().to_string();
            assert!(message.contains(&path) && message.contains("truncated"), "SQL must name the file: {message}");
            assert!(matches!(store.verify().await, Err(Error::Corrupt { .. })));
        });
    }
}

#[test]
fn a_changed_byte_is_caught_by_the_sha256() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let (path, bytes) = one_committed_part(&store).await;
            let mut changed = bytes.to_vec();
            changed[bytes.len() / 2] ^= 0x40;
            store.object_store().put(&object(&store, &path), Bytes::from(changed).into()).await.unwrap();

            let err = store.verify().await.unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, Error::Corrupt { .. }) && message.contains(&path) && message.contains("sha256"),
                "{message}"
            );
            let marker = store.marker(&StageId::at(Stage::Rollout, 0)).await.unwrap().unwrap();
            assert!(matches!(store.read_table(&[&marker.marker], Table::Turns).await, Err(Error::Corrupt { .. })));
        });
    }
}

#[test]
fn a_deleted_committed_file_is_reported_missing() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let (path, _) = one_committed_part(&store).await;
            store.object_store().delete(&object(&store, &path)).await.unwrap();
            let err = store.verify().await.unwrap_err();
            assert!(matches!(err, Error::MissingFile { .. }) && err.to_string().contains(&path), "{err}");
            let message = count_turns(&store).await.unwrap_err().to_string();
            assert!(message.contains(&path) && message.contains("does not exist"), "{message}");
        });
    }
}

#[test]
fn a_batch_with_the_wrong_schema_is_refused_before_anything_is_written() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let sample = SampleRow {
                candidate_id: "c".into(),
                group_id: "g".into(),
                agent: "tool".into(),
                policy: "p".into(),
                policy_version: 0,
                mixed_reward: 1.0,
                advantage: 0.0,
                response_token_count: 3,
                value: None,
                value_target: None,
                token_values: None,
                token_value_targets: None,
                token_advantages: None,
            };
            let mut writer = store.begin(StageId::at(Stage::Rollout, 0));
            let batch = tables::to_batch(&[sample]).unwrap();
            let err = writer.write_table(Table::Turns, Partition::Iteration(0), &[batch]).await.unwrap_err();
            assert!(matches!(err, Error::SchemaMismatch { table: Table::Turns, .. }), "{err}");
            assert!(err.to_string().contains("column run is missing"), "{err}");
            assert!(listing(&store).await.is_empty());
        });
    }
}

#[test]
fn a_file_lost_before_the_commit_prevents_the_commit() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let mut writer = store.begin(StageId::at(Stage::Group, 0));
            let rows = synthetic::turn_rows(0, 5, 1);
            writer
                .write_table(Table::Turns, Partition::Iteration(0), &[tables::to_batch(&rows).unwrap()])
                .await
                .unwrap();
            let pending = writer.finish();
            let path = pending.files()[0].path.clone();
            store.object_store().delete(&object(&store, &path)).await.unwrap();
            let err = pending.commit(info()).await.unwrap_err();
            assert!(matches!(err, Error::LostBeforeCommit { .. }) && err.to_string().contains(&path), "{err}");
            assert!(store.marker(&StageId::at(Stage::Group, 0)).await.unwrap().is_none());
        });
    }
}

#[test]
fn a_marker_that_does_not_parse_is_an_error_naming_it_and_stops_gc() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let (part, _) = one_committed_part(&store).await;
            let bad = "_commits/iteration=0/group.json";
            store.object_store().put(&object(&store, bad), Bytes::from_static(b"{\"format\": 1").into()).await.unwrap();
            let err = store.markers().await.unwrap_err();
            assert!(matches!(err, Error::InvalidMarker { .. }) && err.to_string().contains(bad), "{err}");
            assert!(store.gc(Duration::ZERO, false).await.is_err());
            assert!(listing(&store).await.contains(&part), "gc deleted nothing");
        });
    }
}

#[test]
fn markers_record_provenance_and_checkpoints_show_in_sql() {
    for Backend { store, .. } in backends() {
        block_on(async {
            let rollout = synthetic::commit_turns(&store, 1, 8, 8).await;
            let input = store.marker(&StageId::at(Stage::Rollout, 0)).await.unwrap().unwrap();
            assert_eq!(input.marker, rollout[0]);

            let mut writer = store.begin(StageId::at(Stage::Update, 0));
            let dir = petting::store::layout::checkpoint_dir("shared", 1, writer.attempt());
            writer.write_file(format!("{dir}/model.safetensors"), Bytes::from_static(b"weights")).await.unwrap();
            writer.write_file(format!("{dir}/meta.json"), Bytes::from_static(b"{}")).await.unwrap();
            let commit = CommitInfo {
                inputs: vec![input.input_ref()],
                policies_used: vec![PolicyRef { policy: "shared".into(), version: 0, weights_sha256: "aa".into() }],
                checkpoints: vec![CheckpointRef {
                    policy: "shared".into(),
                    version: 1,
                    parent_version: Some(0),
                    dir: dir.clone(),
                    weights_sha256: "bb".into(),
                }],
                ..info()
            };
            let marker = writer.finish().commit(commit).await.unwrap();
            assert_eq!(marker.inputs[0].sha256, input.sha256);
            assert_eq!(marker.code_version, petting::CODE_VERSION);

            let sql = RunSql::open(&store).await.unwrap();
            let (_, batches) = sql
                .query("select policy, version, parent_version, iteration, stage, path, bytes from checkpoints")
                .await
                .unwrap();
            let text = arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
            assert!(
                text.contains(&format!("| shared | 1       | 0              | 0         | update | {dir} | 9     |")),
                "{text}"
            );
            let (_, batches) =
                sql.query("select stage, iteration, files, rows from commits order by stage").await.unwrap();
            let text = arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
            assert!(
                text.contains("| rollout | 0         | 1     | 8    |")
                    && text.contains("| update  | 0         | 2     | 0    |"),
                "{text}"
            );
        });
    }
}
