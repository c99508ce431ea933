//! The trainable policies: the one place that turns store checkpoints into [`LanguageModel`]
//! values and back, configured by their section of the run file (`policies:`, config.rs).
//!
//! ```text
//!  _commits/…/update.json ─ checkpoints: [{policy, version, dir, weights_sha256}]
//!          │                files: [{dir/model.safetensors, bytes, sha256}, …]
//!          ▼
//!  latest(store, name) ──► PolicyRef of the highest committed version
//!  load_all(store, configs, v) = fetch + LoadedPolicies::add, for every policy
//!     1. find the marker that committed (name, v); list the files under its dir
//!     2. local run: hash the files in place; other stores: copy them into the cache
//!        <cache>/checkpoints/<sha256 of the file list>/ (kept while the hashes match)
//!     3. LanguageModel::load (full) or base + load_adapter (LoRA), on the policy's device; LoRA
//!        policies on one base share one model (loaded.rs)
//!  save(writer, loaded, v, optimizer) ──► LanguageModel::save / save_adapter into a scratch
//!     folder, with the optimiser state (optimizer.safetensors) the next update continues,
//!     every file through StageWriter::write_file under layout::checkpoint_dir
//! ```
//!
//! A LoRA policy's checkpoints are PEFT adapters; the frozen base they sit on is a full
//! Hugging Face folder committed once with v0 (`checkpoints/<policy>/base.<attempt>/`)
//! and found again by its weights sha256, which every adapter's `meta.json` records.
//! The adapter is attached to the loaded policy under the policy's own name.

mod config;
mod files;
mod league;
mod loaded;
mod retention;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::model::{self, AdamWState, CheckpointMeta, LanguageModel, META_FILE, OPTIMIZER_FILE, SaveAs};
use crate::store::{self, CheckpointRef, PolicyRef, RunStore, StageWriter, StoredMarker};

pub use config::{ModelInit, PolicyConfig, Retention};
use files::materialise_file;
use files::{Scratch, copy_folder, file_name, upload_dir, write_meta};
pub(crate) use files::{cache_root, local_dir, materialise};
pub use league::{League, Record, Rule as LeagueRule};
pub use loaded::{LoadedPolicies, Member, Resident, load, load_all, past_member};
pub use retention::doomed_files;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(transparent)]
    Model(#[from] model::Error),

    #[error("policy {policy:?} is not one of the run's policies ({known:?})")]
    UnknownPolicy { policy: String, known: Vec<String> },

    #[error("no committed checkpoint of policy {policy:?} version {version} (latest committed: {latest})")]
    NotFound { policy: String, version: u32, latest: String },

    #[error("checkpoint {policy:?} v{version} is committed by more than one marker: {markers:?}")]
    Duplicate { policy: String, version: u32, markers: Vec<String> },

    #[error("checkpoint {dir} in {url}: {reason}")]
    Invalid { url: String, dir: String, reason: String },

    #[error("no committed base model with weights sha256 {sha256} (needed by the LoRA adapter {dir})")]
    NoBase { sha256: String, dir: String },

    #[error("checkpoint cache {}: {source}", path.display())]
    Cache { path: PathBuf, source: std::io::Error },

    #[error(
        "policy {policy}: iteration {iteration} samples with version {wanted}, but the latest committed \
         checkpoint is {}; {}",
        latest.map_or("none".to_string(), |v| format!("v{v}")),
        if iteration == wanted {
            "strict on-policy training refuses to sample with any other"
        } else {
            "its update would train on another rollout's samples"
        }
    )]
    StaleVersion { policy: String, iteration: u32, wanted: u32, latest: Option<u32> },
}

/// A committed full model that LoRA adapters of a policy are applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseRef {
    /// Folder relative to the run.
    pub dir: String,
    pub weights_sha256: String,
}

/// Version `version` of every policy, what iteration `iteration`'s rollout samples with
/// (`RunConfig::sampled_version`): refused unless it is committed and no later version
/// than `iteration` is (strictly on-policy, `version == iteration`: unless it is the latest).
/// A frozen policy samples with its only version, 0.
pub async fn load_for_rollout(
    store: &RunStore,
    configs: &BTreeMap<String, PolicyConfig>,
    iteration: u32,
    version: u32,
    resident: &Resident,
) -> Result<LoadedPolicies, Error> {
    let markers = store.markers().await?;
    for (name, config) in configs {
        let latest = latest_in(&markers, name).map(|r| r.version);
        let wanted = config.version_at(version)..=config.version_at(iteration);
        if !latest.is_some_and(|l| wanted.contains(&l)) {
            return Err(Error::StaleVersion { policy: name.clone(), iteration, wanted: *wanted.start(), latest });
        }
    }
    resident.take(store, configs, version).await
}

/// The latest committed version of `name` (its PolicyRef from the newest marker that
/// committed a checkpoint of it).
pub async fn latest(store: &RunStore, name: &str) -> Result<Option<PolicyRef>, Error> {
    Ok(latest_in(&store.markers().await?, name))
}

/// [`latest`] over markers already read.
pub fn latest_in(markers: &[StoredMarker], name: &str) -> Option<PolicyRef> {
    markers
        .iter()
        .flat_map(|m| &m.marker.checkpoints)
        .filter(|c| c.policy == name)
        .max_by_key(|c| c.version)
        .map(|c| PolicyRef { policy: c.policy.clone(), version: c.version, weights_sha256: c.weights_sha256.clone() })
}

/// The committed versions of `name`, ascending.
pub fn stored_versions(markers: &[StoredMarker], name: &str) -> Vec<u32> {
    let mut versions: Vec<u32> =
        markers.iter().flat_map(|m| &m.marker.checkpoints).filter(|c| c.policy == name).map(|c| c.version).collect();
    versions.sort_unstable();
    versions.dedup();
    versions
}

/// Loads each past version in `past` ((policy, version) pairs) beside the current ones, as
/// the members [`past_member`] names, unless already loaded.
pub async fn load_past(
    store: &RunStore,
    configs: &BTreeMap<String, PolicyConfig>,
    past: impl IntoIterator<Item = (String, u32)>,
    loaded: &mut LoadedPolicies,
) -> Result<(), Error> {
    let markers = store.markers().await?;
    for (policy, version) in past {
        if loaded.member(&past_member(&policy, version)).is_none() {
            loaded.add_past(configs, fetch(store, &markers, &policy, version).await?)?;
        }
    }
    Ok(())
}

/// The marker that committed version `version` of `name`, and its checkpoint entry.
pub fn find<'m>(
    markers: &'m [StoredMarker],
    name: &str,
    version: u32,
) -> Result<(&'m StoredMarker, &'m CheckpointRef), Error> {
    let found: Vec<(&StoredMarker, &CheckpointRef)> = markers
        .iter()
        .flat_map(|m| m.marker.checkpoints.iter().map(move |c| (m, c)))
        .filter(|(_, c)| c.policy == name && c.version == version)
        .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Error::NotFound {
            policy: name.to_string(),
            version,
            latest: latest_in(markers, name).map_or("none".into(), |r| format!("v{}", r.version)),
        }),
        many => Err(Error::Duplicate {
            policy: name.to_string(),
            version,
            markers: many.iter().map(|(m, _)| m.path.clone()).collect(),
        }),
    }
}

/// A checkpoint whose files are verified and on local disk, not yet loaded.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub name: String,
    pub version: u32,
    pub weights_sha256: String,
    /// Local folder of the checkpoint (a full model, or an adapter).
    pub dir: PathBuf,
    /// For an adapter: the committed base and its local folder.
    pub base: Option<(BaseRef, PathBuf)>,
}

/// Finds a checkpoint (and, for an adapter, its base) and makes its files local, each
/// checked against its marker's size and sha256; errors name the file. A stage that must refuse before writing anything
/// fetches every checkpoint it needs first and opens them one at a time.
pub async fn fetch(store: &RunStore, markers: &[StoredMarker], name: &str, version: u32) -> Result<Fetched, Error> {
    let (marker, checkpoint) = find(markers, name, version)?;
    let dir = materialise(store, &marker.marker.files, &checkpoint.dir).await?;
    let meta = CheckpointMeta::read(&dir)?;
    check_meta(store, checkpoint, &meta)?;
    let base = if meta.kind == "adapter" {
        let base_sha = meta.base_weights_sha256.clone().ok_or_else(|| Error::Invalid {
            url: store.url().to_string(),
            dir: checkpoint.dir.clone(),
            reason: "an adapter whose meta.json names no base_weights_sha256".into(),
        })?;
        let (base_marker, base) = find_base(markers, &base_sha, &checkpoint.dir)?;
        let base_dir = materialise(store, &base_marker.marker.files, &base.dir).await?;
        Some((base, base_dir))
    } else {
        None
    };
    Ok(Fetched { name: name.to_string(), version, weights_sha256: checkpoint.weights_sha256.clone(), dir, base })
}

/// The verified local folder of one committed checkpoint alone (an adapter without its
/// base): what an inference server loads.
pub async fn checkpoint_folder(
    store: &RunStore,
    markers: &[StoredMarker],
    name: &str,
    version: u32,
) -> Result<PathBuf, Error> {
    let (marker, checkpoint) = find(markers, name, version)?;
    materialise(store, &marker.marker.files, &checkpoint.dir).await
}

/// The verified local folder of the subfolder `part` of a committed checkpoint (a
/// critic's heads), or none when that version has none.
pub async fn checkpoint_part(
    store: &RunStore,
    markers: &[StoredMarker],
    name: &str,
    version: u32,
    part: &str,
) -> Result<Option<PathBuf>, Error> {
    let (marker, checkpoint) = find(markers, name, version)?;
    let dir = format!("{}/{part}", checkpoint.dir);
    if files::files_under(&marker.marker.files, &dir).is_empty() {
        return Ok(None);
    }
    Ok(Some(materialise(store, &marker.marker.files, &dir).await?))
}

/// The sha256 of the tokenizer.json policy `name` reads at `version`: its checkpoint's
/// (a full checkpoint keeps the tokenizer it was loaded with), else its model folder's
/// (an adapter's base is that folder's model), else none.
pub fn tokenizer_sha256(
    markers: &[StoredMarker],
    config: &PolicyConfig,
    name: &str,
    version: u32,
) -> Result<Option<String>, Error> {
    let (marker, checkpoint) = find(markers, name, version)?;
    let path = format!("{}/tokenizer.json", checkpoint.dir);
    if let Some(entry) = marker.marker.files.iter().find(|f| f.path == path) {
        return Ok(Some(entry.sha256.clone()));
    }
    let folder = config.model.join("tokenizer.json");
    Ok(folder.is_file().then(|| crate::model::sha256_file(&folder)).transpose()?)
}

/// A local copy of the optimiser state committed with version `version` of `name`,
/// checked against its marker, if it has one (v0 has none: its first update starts the
/// optimisation). Read it with `AdamWState::load`.
pub async fn optimizer_file(
    store: &RunStore,
    markers: &[StoredMarker],
    name: &str,
    version: u32,
) -> Result<Option<PathBuf>, Error> {
    let (marker, checkpoint) = find(markers, name, version)?;
    let path = format!("{}/{OPTIMIZER_FILE}", checkpoint.dir);
    match marker.marker.files.iter().find(|f| f.path == path) {
        Some(entry) => Ok(Some(materialise_file(store, entry).await?)),
        None => Ok(None),
    }
}

/// meta.json must describe the checkpoint its marker says the folder holds.
fn check_meta(store: &RunStore, checkpoint: &CheckpointRef, meta: &CheckpointMeta) -> Result<(), Error> {
    let problem = if meta.policy != checkpoint.policy || meta.version != checkpoint.version {
        Some(format!("meta.json describes {} v{}", meta.policy, meta.version))
    } else if meta.weights_sha256 != checkpoint.weights_sha256 {
        Some(format!(
            "meta.json records weights sha256 {}, the commit marker {}",
            meta.weights_sha256, checkpoint.weights_sha256
        ))
    } else {
        None
    };
    match problem {
        Some(reason) => Err(Error::Invalid { url: store.url().to_string(), dir: checkpoint.dir.clone(), reason }),
        None => Ok(()),
    }
}

/// The committed base folder whose weights have the digest `sha256` (a base folder,
/// `…/base.<attempt>/`, before any other folder holding the same weights).
fn find_base<'m>(
    markers: &'m [StoredMarker],
    sha256: &str,
    adapter_dir: &str,
) -> Result<(&'m StoredMarker, BaseRef), Error> {
    let mut found: Vec<(&StoredMarker, String)> = Vec::new();
    for m in markers {
        let mut by_dir: BTreeMap<&str, Vec<(String, String)>> = BTreeMap::new();
        for f in m.marker.files.iter().filter(|f| f.table.is_none()) {
            let (dir, name) = f.path.rsplit_once('/').unwrap_or(("", &f.path));
            if model::is_weight_file(name) {
                by_dir.entry(dir).or_default().push((name.to_string(), f.sha256.clone()));
            }
        }
        let matching = by_dir.into_iter().filter(|(_, files)| model::weights_digest(files) == sha256);
        found.extend(matching.map(|(dir, _)| (m, dir.to_string())));
    }
    found.sort_by_key(|(_, dir)| !file_name(dir).starts_with("base."));
    let (marker, dir) = found
        .into_iter()
        .next()
        .ok_or_else(|| Error::NoBase { sha256: sha256.to_string(), dir: adapter_dir.to_string() })?;
    Ok((marker, BaseRef { dir, weights_sha256: sha256.to_string() }))
}

/// Writes policy `name` of `loaded` as its version `version`: see [`save_policy`].
pub async fn save(
    writer: &mut StageWriter<'_>,
    loaded: &mut LoadedPolicies,
    name: &str,
    version: u32,
    optimizer: Option<&AdamWState>,
    part: Option<(&str, &Path)>,
) -> Result<CheckpointRef, Error> {
    let base = loaded.base(name).cloned();
    let (policy, _) =
        loaded.model(name).ok_or_else(|| Error::UnknownPolicy { policy: name.into(), known: Vec::new() })?;
    save_policy(writer, name, policy, base.as_ref(), version, optimizer, part).await
}

/// Writes `policy` as version `version` of `name` (parent `version - 1`, none for v0)
/// into the attempt, under `layout::checkpoint_dir`, with the optimiser state the next
/// update continues, and with `part` (name, local folder) that folder's files as the
/// checkpoint's subfolder of that name (a critic's heads); returns the entry for
/// `CommitInfo::checkpoints`. A LoRA policy (one with a `base`) writes its adapter only;
/// the base must be committed already (see [`save_base`]).
pub async fn save_policy(
    writer: &mut StageWriter<'_>,
    name: &str,
    model: &LanguageModel,
    base: Option<&BaseRef>,
    version: u32,
    optimizer: Option<&AdamWState>,
    part: Option<(&str, &Path)>,
) -> Result<CheckpointRef, Error> {
    let dir = store::layout::checkpoint_dir(name, version, writer.attempt());
    let parent = version.checked_sub(1).map(|p| format!("{name}/v{p:06}"));
    let save_as = SaveAs { policy: name, version, parent: parent.as_deref() };
    let scratch = Scratch::new(name)?;
    let meta = match base {
        None => model.save(&scratch.0, &save_as)?,
        Some(base) => {
            let mut meta = model.save_adapter(name, &scratch.0, Some(&base.dir), &save_as)?;
            meta.base_weights_sha256 = Some(base.weights_sha256.clone());
            write_meta(&scratch.0, &meta)?;
            meta
        }
    };
    if let Some(state) = optimizer {
        state.save(&scratch.0.join(OPTIMIZER_FILE))?;
    }
    upload_dir(writer, &scratch.0, &dir).await?;
    if let Some((part, local)) = part {
        upload_dir(writer, local, &format!("{dir}/{part}")).await?;
    }
    Ok(CheckpointRef {
        policy: name.to_string(),
        version,
        parent_version: version.checked_sub(1),
        dir,
        weights_sha256: meta.weights_sha256,
    })
}

/// Commits the pretrained folder `model_dir` itself as v0 of `name` (a full checkpoint).
pub async fn save_pretrained_copy(
    writer: &mut StageWriter<'_>,
    name: &str,
    model_dir: &Path,
) -> Result<CheckpointRef, Error> {
    let dir = store::layout::checkpoint_dir(name, 0, writer.attempt());
    let (weights_file, weights_sha256) = copy_folder(writer, model_dir, &dir).await?;
    let meta = CheckpointMeta {
        policy: name.to_string(),
        version: 0,
        parent: None,
        kind: "full".into(),
        weights_file,
        weights_sha256: weights_sha256.clone(),
        code_version: crate::CODE_VERSION.into(),
        base_weights_sha256: None,
    };
    let mut text = serde_json::to_string_pretty(&meta).expect("meta serialises");
    text.push('\n');
    writer.write_file(format!("{dir}/{META_FILE}"), Bytes::from(text)).await?;
    Ok(CheckpointRef { policy: name.to_string(), version: 0, parent_version: None, dir, weights_sha256 })
}

/// Commits the pretrained folder `model_dir` (one `model.safetensors` or shards) as the
/// frozen base of LoRA policy `name`, at `checkpoints/<name>/base.<attempt>/`; adapters
/// name it by its weights digest.
pub async fn save_base(writer: &mut StageWriter<'_>, name: &str, model_dir: &Path) -> Result<BaseRef, Error> {
    let dir = format!("checkpoints/{name}/base.{}", writer.attempt());
    let (_, weights_sha256) = copy_folder(writer, model_dir, &dir).await?;
    Ok(BaseRef { dir, weights_sha256 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CommitMarker, FileEntry, Stage};

    fn marker(path: &str, checkpoints: Vec<CheckpointRef>) -> StoredMarker {
        let json = serde_json::json!({
            "format": 1, "run": "r", "stage": "update", "iteration": null, "shard": null, "attempt": "a",
            "files": [], "inputs": [], "policies_used": [], "checkpoints": checkpoints, "seed": 0,
            "config_sha256": "", "code_version": "", "started_at": "2024-01-01T00:00:00Z",
            "finished_at": "2024-01-01T00:00:00Z"
        });
        let mut marker: CommitMarker = serde_json::from_value(json).unwrap();
        marker.stage = Stage::Update;
        StoredMarker { path: path.into(), sha256: "m".into(), marker }
    }

    fn checkpoint(policy: &str, version: u32, sha: &str) -> CheckpointRef {
        CheckpointRef {
            policy: policy.into(),
            version,
            parent_version: version.checked_sub(1),
            dir: format!("checkpoints/{policy}/v{version:06}.a"),
            weights_sha256: sha.into(),
        }
    }

    #[test]
    fn latest_is_the_highest_committed_version_of_that_policy() {
        let markers = vec![
            marker("_commits/update.json", vec![checkpoint("a", 0, "a0"), checkpoint("b", 0, "b0")]),
            marker("_commits/iteration=0/update.json", vec![checkpoint("a", 1, "a1"), checkpoint("b", 1, "b1")]),
            marker("_commits/iteration=1/update.json", vec![checkpoint("a", 2, "a2")]),
        ];
        let a = latest_in(&markers, "a").unwrap();
        assert_eq!((a.version, a.weights_sha256.as_str()), (2, "a2"));
        assert_eq!(latest_in(&markers, "b").unwrap().weights_sha256, "b1");
        assert_eq!(latest_in(&markers, "c"), None);
        assert_eq!(find(&markers, "b", 0).unwrap().0.path, "_commits/update.json");
        let missing = find(&markers, "b", 2).unwrap_err().to_string();
        assert!(missing.contains("\"b\" version 2") && missing.contains("latest committed: v1"), "{missing}");
    }

    #[test]
    fn a_version_committed_twice_is_refused() {
        let markers = vec![
            marker("_commits/update.json", vec![checkpoint("a", 0, "x")]),
            marker("_commits/iteration=0/update.json", vec![checkpoint("a", 0, "y")]),
        ];
        assert!(matches!(find(&markers, "a", 0), Err(Error::Duplicate { .. })));
    }

    #[test]
    fn the_cache_key_depends_on_names_and_hashes_not_order() {
        let entry = |path: &str, sha: &str| FileEntry {
            path: path.into(),
            bytes: 1,
            sha256: sha.into(),
            table: None,
            rows: None,
        };
        let (a, b) = (entry("d/x", "1"), entry("d/y", "2"));
        let key = files::cache_key(&[("x", &a), ("y", &b)]);
        assert_eq!(key, files::cache_key(&[("y", &b), ("x", &a)]));
        let c = entry("d/y", "3");
        assert_ne!(key, files::cache_key(&[("x", &a), ("y", &c)]));
    }
}
