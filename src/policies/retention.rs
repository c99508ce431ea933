//! Which committed checkpoint files a run keeps: the newest versions whole, version 0,
//! and (unless weights are pruned too) every version's weights. The rest is pruned by
//! `RunStore::prune` (see store/prune.rs for why and how).

use std::collections::BTreeMap;

use super::Retention;
use crate::model::{META_FILE, OPTIMIZER_FILE};
use crate::store::{FileEntry, StoredMarker};

/// The committed checkpoint files `retention` does not keep. Pure: the store is not read.
pub fn doomed_files(markers: &[StoredMarker], retention: &Retention) -> Vec<FileEntry> {
    let mut versions: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for m in markers {
        for c in &m.marker.checkpoints {
            versions.entry(&c.policy).or_default().push(c.version);
        }
    }
    let newest_kept: BTreeMap<&str, u32> = versions
        .into_iter()
        .map(|(policy, mut v)| {
            v.sort_unstable();
            v.dedup();
            let keep = v.len().saturating_sub(retention.keep_last as usize);
            (policy, v.get(keep).copied().unwrap_or(0))
        })
        .collect();
    let mut doomed = Vec::new();
    for m in markers {
        for c in &m.marker.checkpoints {
            if c.version == 0 || c.version >= newest_kept[c.policy.as_str()] {
                continue;
            }
            let keeps_weights = !retention.weights || retention.keep_every.is_some_and(|every| c.version % every == 0);
            let prefix = format!("{}/", c.dir);
            for file in m.marker.files.iter().filter(|f| f.path.starts_with(&prefix)) {
                let name = &file.path[prefix.len()..];
                let doomed_file = if keeps_weights { name == OPTIMIZER_FILE } else { name != META_FILE };
                if doomed_file {
                    doomed.push(file.clone());
                }
            }
        }
    }
    doomed
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    use crate::store::{CheckpointRef, CommitMarker, Stage};

    fn file(path: &str) -> FileEntry {
        FileEntry { path: path.into(), bytes: 1, sha256: "00".into(), table: None, rows: None }
    }

    /// The update marker that committed `version` of each of `policies`.
    fn update(version: u32, policies: &[&str]) -> StoredMarker {
        let mut checkpoints = Vec::new();
        let mut files = Vec::new();
        for policy in policies {
            let dir = format!("checkpoints/{policy}/v{version:06}.a");
            for name in ["model.safetensors", "optimizer.safetensors", "meta.json"] {
                files.push(file(&format!("{dir}/{name}")));
            }
            checkpoints.push(CheckpointRef {
                policy: policy.to_string(),
                version,
                parent_version: version.checked_sub(1),
                dir,
                weights_sha256: "w".into(),
            });
        }
        let now = Utc::now();
        let marker = CommitMarker {
            format: 1,
            run: "r".into(),
            stage: Stage::Update,
            iteration: version.checked_sub(1),
            shard: None,
            attempt: "a".into(),
            files,
            inputs: vec![],
            policies_used: vec![],
            opponents_used: vec![],
            checkpoints,
            seed: 0,
            config_sha256: String::new(),
            code_version: String::new(),
            started_at: now,
            finished_at: now,
            model_seconds: 0.0,
            sandbox_seconds: 0.0,
            reused_from: vec![],
            skipped_tasks: vec![],
            failed_episodes: vec![],
        };
        StoredMarker { path: String::new(), sha256: String::new(), marker }
    }

    fn paths(files: Vec<FileEntry>) -> Vec<String> {
        files.into_iter().map(|f| f.path).collect()
    }

    #[test]
    fn keeps_the_newest_versions_whole_and_only_drops_older_optimiser_states() {
        let markers: Vec<_> = (0..=4).map(|v| update(v, &["p"])).collect();
        let retention = Retention { keep_last: 2, weights: false, keep_every: None };
        assert_eq!(
            paths(doomed_files(&markers, &retention)),
            ["checkpoints/p/v000001.a/optimizer.safetensors", "checkpoints/p/v000002.a/optimizer.safetensors"]
        );
    }

    #[test]
    fn pruning_weights_keeps_version_0_every_nth_and_every_meta_json() {
        let markers: Vec<_> = (0..=5).map(|v| update(v, &["p"])).collect();
        let retention = Retention { keep_last: 1, weights: true, keep_every: Some(2) };
        assert_eq!(
            paths(doomed_files(&markers, &retention)),
            [
                "checkpoints/p/v000001.a/model.safetensors",
                "checkpoints/p/v000001.a/optimizer.safetensors",
                "checkpoints/p/v000002.a/optimizer.safetensors",
                "checkpoints/p/v000003.a/model.safetensors",
                "checkpoints/p/v000003.a/optimizer.safetensors",
                "checkpoints/p/v000004.a/optimizer.safetensors",
            ]
        );
    }

    #[test]
    fn each_policy_keeps_its_own_newest_versions() {
        // A policy trained less often (or forked later) keeps its own newest, not the run's.
        let mut markers: Vec<_> = (0..=3).map(|v| update(v, &["a"])).collect();
        markers.push(update(0, &["b"]));
        markers.push(update(1, &["b"]));
        let retention = Retention { keep_last: 1, weights: false, keep_every: None };
        assert_eq!(
            paths(doomed_files(&markers, &retention)),
            ["checkpoints/a/v000001.a/optimizer.safetensors", "checkpoints/a/v000002.a/optimizer.safetensors"]
        );
    }
}
