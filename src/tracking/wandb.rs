//! Weights & Biases in offline mode: the run file `wandb sync` uploads, written by hand
//! as TensorBoard's are. W&B keeps an offline run in a "datastore" file,
//! `offline-run-<time>-<id>/run-<id>.wandb`: a seven-byte header (`:W&B`, 0xBEE1,
//! version 0), then LevelDB-log records in 32 KiB blocks (CRC-32 of type and data, the
//! length, the type: whole, or first/middle/last pieces of one cut at a block's end),
//! each a `wandb_internal.Record` protocol buffer: the run (its id, project, name and
//! config), one history row per step, the summary, and the exit once the run is done.
//!
//! Each committed stage leaves its metrics under `_wandb/metrics/`, and the run's file is
//! rebuilt whole from them at every commit (an object store cannot append), so a resume,
//! or the other lane of an overlapped run, rewrites the same file with all of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::crc::{IEEE, crc32};
use super::{TrackedRun, protobuf};
use crate::store::layout::WANDB_DIR;
use crate::store::{RunStore, StageId};

const METRICS_DIR: &str = "_wandb/metrics";
const BLOCK: usize = 32 * 1024;
const RECORD_HEADER: usize = 7;

/// Record piece types of the LevelDB log.
const FULL: u8 = 1;
const FIRST: u8 = 2;
const MIDDLE: u8 = 3;
const LAST: u8 = 4;

/// Where W&B files the run when it is synced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WandbConfig {
    /// The W&B project the run goes into when `wandb sync` uploads it.
    pub project: String,
    /// The W&B entity (user or team); the logged-in user's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::store::Error),

    #[error("cannot read the W&B metrics file {file}: {reason}")]
    Metrics { file: String, reason: String },
}

/// One committed stage's metrics, as left under `_wandb/metrics/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StageMetrics {
    step: i64,
    finished_ms: i64,
    metrics: Vec<(String, f64)>,
}

/// Leaves stage `id`'s metrics in the store and rewrites the run's offline file from all
/// of them; returns the file's path in the store.
pub async fn stage_committed(
    store: &RunStore,
    config: &WandbConfig,
    run: &TrackedRun,
    id: StageId,
    (step, finished_ms): (i64, i64),
    metrics: &[(String, f64)],
    run_done: bool,
) -> Result<String, Error> {
    let at = id.iteration.map_or("run".to_string(), |k| k.to_string());
    let mine = StageMetrics { step, finished_ms, metrics: metrics.to_vec() };
    let file = format!("{METRICS_DIR}/{}-{at}.json", id.stage);
    store.put_file(&file, serde_json::to_vec(&mine).expect("metrics serialise")).await?;
    let stages = stored_metrics(store).await?;
    let run_id = run_id(store.url());
    let started_ms = stages.iter().map(|s| s.finished_ms).min().unwrap_or(finished_ms);
    let started = chrono::DateTime::from_timestamp_millis(started_ms).unwrap_or_default();
    let path = format!("{WANDB_DIR}/offline-run-{}-{run_id}/run-{run_id}.wandb", started.format("%Y%m%d_%H%M%S"));
    let records = records(config, run, &run_id, started_ms, &stages, run_done);
    store.put_file(&path, datastore(&records)).await?;
    Ok(path)
}

async fn stored_metrics(store: &RunStore) -> Result<Vec<StageMetrics>, Error> {
    let mut stages = Vec::new();
    for file in store.list_files(METRICS_DIR).await? {
        let Some(bytes) = store.get_file(&file).await? else { continue };
        let stage =
            serde_json::from_slice(&bytes).map_err(|e| Error::Metrics { file: file.clone(), reason: e.to_string() })?;
        stages.push(stage);
    }
    Ok(stages)
}

/// W&B's run ids are short lowercase words; one per store, so every lane and resume of a
/// run writes the same run.
fn run_id(store_url: &str) -> String {
    hex::encode(Sha256::digest(store_url.as_bytes()))[..8].to_string()
}

/// The run's records in order: the header, the run, a history row per step (every
/// stage's metrics of that step, with `_step`, `_timestamp` and `_runtime`), the summary
/// (each metric's last value), and the exit when `run_done`.
fn records(
    config: &WandbConfig,
    run: &TrackedRun,
    run_id: &str,
    started_ms: i64,
    stages: &[StageMetrics],
    run_done: bool,
) -> Vec<Vec<u8>> {
    let mut rows: BTreeMap<i64, (i64, Vec<(String, f64)>)> = BTreeMap::new();
    for stage in stages {
        let row = rows.entry(stage.step).or_insert((stage.finished_ms, Vec::new()));
        row.0 = row.0.max(stage.finished_ms);
        row.1.extend(stage.metrics.iter().cloned());
    }
    let mut records = vec![header_record(), run_record(config, run, run_id, started_ms)];
    let mut summary: BTreeMap<String, f64> = BTreeMap::new();
    let mut last_ms = started_ms;
    for (step, (finished_ms, metrics)) in &rows {
        let mut items: Vec<(String, String)> =
            metrics.iter().map(|(key, value)| (key.clone(), json_number(*value))).collect();
        items.sort();
        items.push(("_step".into(), step.to_string()));
        items.push(("_timestamp".into(), json_number(*finished_ms as f64 / 1e3)));
        items.push(("_runtime".into(), json_number((finished_ms - started_ms) as f64 / 1e3)));
        summary.extend(metrics.iter().cloned());
        last_ms = last_ms.max(*finished_ms);
        records.push(record(2, &history_record(*step, &items)));
    }
    let summary: Vec<(String, String)> = summary.into_iter().map(|(k, v)| (k, json_number(v))).collect();
    records.push(record(3, &items_message(1, KeyField::NestedKey, &summary)));
    if run_done {
        let mut exit = Vec::new();
        protobuf::int64(1, 0, &mut exit);
        protobuf::int64(2, (last_ms - started_ms) / 1000, &mut exit);
        records.push(record(18, &exit));
    }
    records
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            // `Record.num`, counting from 1 as W&B's writer does.
            let mut numbered = Vec::new();
            protobuf::int64(1, i as i64 + 1, &mut numbered);
            numbered.append(&mut r);
            numbered
        })
        .collect()
}

/// `Record { <field> = message }`, its number set by the caller.
fn record(field: u32, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    protobuf::bytes(field, message, &mut out);
    out
}

/// `Record.header`: `HeaderRecord { VersionInfo version_info = 1 { string producer = 1 } }`,
/// the record W&B's own writer opens a file with.
fn header_record() -> Vec<u8> {
    let mut version = Vec::new();
    protobuf::bytes(1, crate::CODE_VERSION.as_bytes(), &mut version);
    let mut header = Vec::new();
    protobuf::bytes(1, &version, &mut header);
    record(21, &header)
}

/// `Record.run`: `RunRecord { run_id = 1; entity = 2; project = 3; config = 4;
/// display_name = 8; start_time = 17 }`, the config as `ConfigRecord { update = 1 }`.
fn run_record(config: &WandbConfig, run: &TrackedRun, run_id: &str, started_ms: i64) -> Vec<u8> {
    let mut message = Vec::new();
    protobuf::bytes(1, run_id.as_bytes(), &mut message);
    if let Some(entity) = &config.entity {
        protobuf::bytes(2, entity.as_bytes(), &mut message);
    }
    protobuf::bytes(3, config.project.as_bytes(), &mut message);
    let settings: Vec<(String, String)> =
        run.settings.iter().map(|(key, value)| (key.clone(), json_setting(value))).collect();
    protobuf::bytes(4, &items_message(1, KeyField::Key, &settings), &mut message);
    protobuf::bytes(8, run.name.as_bytes(), &mut message);
    let mut start = Vec::new();
    protobuf::int64(1, started_ms.div_euclid(1000), &mut start);
    protobuf::int64(2, started_ms.rem_euclid(1000) * 1_000_000, &mut start);
    protobuf::bytes(17, &start, &mut message);
    record(17, &message)
}

/// `HistoryRecord { repeated HistoryItem item = 1; HistoryStep step = 2 }`.
fn history_record(step: i64, items: &[(String, String)]) -> Vec<u8> {
    let mut message = items_message(1, KeyField::NestedKey, items);
    let mut history_step = Vec::new();
    protobuf::int64(1, step, &mut history_step);
    protobuf::bytes(2, &history_step, &mut message);
    message
}

/// How an item names its key: the config's by `key = 1`, history and summary items by
/// `repeated string nested_key = 2` (one part), as W&B's own writer does.
#[derive(Clone, Copy)]
enum KeyField {
    Key = 1,
    NestedKey = 2,
}

/// Repeated `{ <key>; string value_json = 16 }` items in field `field`: the shape of W&B's
/// history, summary and config items.
fn items_message(field: u32, key_field: KeyField, items: &[(String, String)]) -> Vec<u8> {
    let mut message = Vec::new();
    for (key, value_json) in items {
        let mut item = Vec::new();
        protobuf::bytes(key_field as u32, key.as_bytes(), &mut item);
        protobuf::bytes(16, value_json.as_bytes(), &mut item);
        protobuf::bytes(field, &item, &mut message);
    }
    message
}

/// A metric as JSON: non-finite values as W&B's writer spells them.
fn json_number(value: f64) -> String {
    match value {
        v if v.is_nan() => "NaN".into(),
        v if v == f64::INFINITY => "Infinity".into(),
        v if v == f64::NEG_INFINITY => "-Infinity".into(),
        v => serde_json::Value::from(v).to_string(),
    }
}

/// A setting's text as JSON: numbers, booleans and lists as themselves, the rest as a string.
fn json_setting(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if !value.is_string() => value.to_string(),
        _ => serde_json::Value::from(text).to_string(),
    }
}

/// The datastore file: the header, then each record as LevelDB-log pieces that never
/// cross a 32 KiB block, a block's tail too short for a piece's header zero-filled.
fn datastore(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b":W&B".to_vec();
    out.extend_from_slice(&0xBEE1u16.to_le_bytes());
    out.push(0);
    for record in records {
        let mut rest = record.as_slice();
        let mut first = true;
        loop {
            let left = BLOCK - out.len() % BLOCK;
            if left < RECORD_HEADER {
                out.resize(out.len() + left, 0);
                continue;
            }
            let room = left - RECORD_HEADER;
            let more = rest.len() > room;
            let (piece, after) = rest.split_at(rest.len().min(room));
            let kind = match (first, more) {
                (true, false) => FULL,
                (true, true) => FIRST,
                (false, true) => MIDDLE,
                (false, false) => LAST,
            };
            let mut checked = vec![kind];
            checked.extend_from_slice(piece);
            out.extend_from_slice(&crc32(IEEE, &checked).to_le_bytes());
            out.extend_from_slice(&(piece.len() as u16).to_le_bytes());
            out.push(kind);
            out.extend_from_slice(piece);
            rest = after;
            first = false;
            if !more {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the pieces back as W&B's reader does, checking each checksum.
    fn pieces(file: &[u8]) -> Vec<(u8, Vec<u8>)> {
        assert_eq!(&file[..7], b":W&B\xe1\xbe\x00");
        let mut at = 7;
        let mut out = Vec::new();
        while at < file.len() {
            if BLOCK - at % BLOCK < RECORD_HEADER {
                at += BLOCK - at % BLOCK;
                continue;
            }
            let checksum = u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
            let length = u16::from_le_bytes(file[at + 4..at + 6].try_into().unwrap()) as usize;
            let kind = file[at + 6];
            let data = file[at + 7..at + 7 + length].to_vec();
            let mut checked = vec![kind];
            checked.extend_from_slice(&data);
            assert_eq!(checksum, crc32(IEEE, &checked));
            assert!(at / BLOCK == (at + 7 + length - 1) / BLOCK, "a piece crosses a block");
            out.push((kind, data));
            at += 7 + length;
        }
        out
    }

    #[test]
    fn a_record_longer_than_a_block_is_cut_into_first_middle_and_last_pieces() {
        let small = vec![1u8; 10];
        let large: Vec<u8> = (0..80_000u32).map(|i| i as u8).collect();
        let file = datastore(&[small.clone(), large.clone(), small.clone()]);
        let read = pieces(&file);
        let kinds: Vec<u8> = read.iter().map(|p| p.0).collect();
        assert_eq!(kinds, [FULL, FIRST, MIDDLE, LAST, FULL]);
        let joined: Vec<u8> = read[1..4].iter().flat_map(|p| p.1.clone()).collect();
        assert_eq!(joined, large);
        assert_eq!(read[4].1, small);
    }

    #[test]
    fn settings_keep_their_json_types() {
        assert_eq!(json_setting("8"), "8");
        assert_eq!(json_setting("true"), "true");
        assert_eq!(json_setting(r#"["a","b"]"#), r#"["a","b"]"#);
        assert_eq!(json_setting("runs/x"), r#""runs/x""#);
        assert_eq!(json_number(0.5), "0.5");
        assert_eq!(json_number(f64::NAN), "NaN");
    }
}
