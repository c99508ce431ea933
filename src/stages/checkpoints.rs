//! The one place that turns store checkpoints into [`Policy`] values and back.
//!
//! ```text
//!  _commits/…/update.json ─ checkpoints: [{policy, version, dir, weights_sha256}]
//!          │                files: [{dir/model.safetensors, bytes, sha256}, …]
//!          ▼
//!  latest(store, name) ──► PolicyRef of the highest committed version
//!  load(store, config, name, v) = fetch + open
//!     1. find the marker that committed (name, v); list the files under its dir
//!     2. local run: hash the files in place; other stores: copy them into the cache
//!        <cache>/checkpoints/<sha256 of the file list>/ (kept while the hashes match)
//!     3. Policy::load (full) or base + load_adapter (LoRA), on the policy's device
//!  save(writer, loaded, v) ──► Policy::save / save_adapter into a scratch folder,
//!     every file through StageWriter::write_file under layout::checkpoint_dir
//! ```
//!
//! A LoRA policy's checkpoints are PEFT adapters; the frozen base they sit on is a full
//! Hugging Face folder committed once with v0 (`checkpoints/<policy>/base.<attempt>/`)
//! and found again by its weights sha256, which every adapter's `meta.json` records.
//! The adapter is attached to the loaded policy under the policy's own name.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::config::RunConfig;
use crate::model::{self, CheckpointMeta, LoadOptions, META_FILE, Policy, SaveAs, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use crate::store::{self, CheckpointRef, FileEntry, PolicyRef, RunStore, StageWriter, StoredMarker};

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
}

/// A policy version loaded from the store.
#[derive(Debug)]
pub struct LoadedPolicy {
    pub name: String,
    pub version: u32,
    /// sha256 of the weights file (the adapter's, for LoRA), as the marker records it.
    pub weights_sha256: String,
    pub policy: Policy,
    /// For a LoRA policy: the committed base the adapter sits on.
    pub base: Option<BaseRef>,
}

impl LoadedPolicy {
    /// The adapter to sample, score and train with: the policy's name for LoRA
    /// policies, `None` (the base weights) otherwise.
    pub fn adapter(&self) -> Option<&str> {
        self.base.as_ref().map(|_| self.name.as_str())
    }
}

/// A committed full model that LoRA adapters of a policy are applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseRef {
    /// Folder relative to the run.
    pub dir: String,
    pub weights_sha256: String,
}

/// Files of a Hugging Face folder that a self-contained copy of a base model keeps
/// (weights are added by name; evaluation fixtures and READMEs are left behind).
const HF_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
];

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

/// Loads version `version` of policy `name`, verifying every file's size and sha256
/// against its marker; errors name the file.
pub async fn load(store: &RunStore, config: &RunConfig, name: &str, version: u32) -> Result<LoadedPolicy, Error> {
    let markers = store.markers().await?;
    open(config, fetch(store, &markers, name, version).await?)
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

/// The verifying half of [`load`]: finds the checkpoint (and, for an adapter, its base)
/// and makes its checked files local. A stage that must refuse before writing anything
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

/// The loading half of [`load`]: the model on the device and dtype of its policy config,
/// with a LoRA adapter attached under the policy's name.
pub fn open(config: &RunConfig, fetched: Fetched) -> Result<LoadedPolicy, Error> {
    let policy_config = config.policies.get(&fetched.name).ok_or_else(|| Error::UnknownPolicy {
        policy: fetched.name.clone(),
        known: config.policies.keys().cloned().collect(),
    })?;
    let options = LoadOptions { device: policy_config.device, dtype: policy_config.dtype };
    let (policy, base) = match fetched.base {
        None => (Policy::load(&fetched.dir, &options)?, None),
        Some((base, base_dir)) => {
            let mut policy = Policy::load(&base_dir, &options)?;
            policy.load_adapter(&fetched.name, &fetched.dir)?;
            (policy, Some(base))
        }
    };
    Ok(LoadedPolicy {
        name: fetched.name,
        version: fetched.version,
        weights_sha256: fetched.weights_sha256,
        policy,
        base,
    })
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

/// The committed base folder whose weights file has `sha256`.
fn find_base<'m>(
    markers: &'m [StoredMarker],
    sha256: &str,
    adapter_dir: &str,
) -> Result<(&'m StoredMarker, BaseRef), Error> {
    markers
        .iter()
        .find_map(|m| {
            let entry = m
                .marker
                .files
                .iter()
                .find(|f| f.table.is_none() && f.sha256 == sha256 && file_name(&f.path) == WEIGHTS_FILE)?;
            let dir = entry.path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
            Some((m, BaseRef { dir, weights_sha256: sha256.to_string() }))
        })
        .ok_or_else(|| Error::NoBase { sha256: sha256.to_string(), dir: adapter_dir.to_string() })
}

fn file_name(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, name)| name)
}

/// The files a marker lists directly under `dir`, as (file name, entry).
fn files_under<'f>(files: &'f [FileEntry], dir: &str) -> Vec<(&'f str, &'f FileEntry)> {
    let prefix = format!("{dir}/");
    files.iter().filter_map(|f| f.path.strip_prefix(&prefix).map(|name| (name, f))).collect()
}

/// A local folder holding exactly the committed files of `dir`, each checked against
/// its marker entry.
pub(crate) async fn materialise(store: &RunStore, files: &[FileEntry], dir: &str) -> Result<PathBuf, Error> {
    let entries = files_under(files, dir);
    if entries.is_empty() {
        return Err(Error::Invalid {
            url: store.url().to_string(),
            dir: dir.to_string(),
            reason: "its marker lists no files under it".into(),
        });
    }
    if let Some(local) = local_dir(store, dir)
        && holds_exactly(&local, &entries)
    {
        // A local run: hash in place instead of copying.
        for (name, entry) in &entries {
            check_local(store, &local.join(name), entry)?;
        }
        return Ok(local);
    }
    let cached = cache_root().join("checkpoints").join(cache_key(&entries));
    std::fs::create_dir_all(&cached).map_err(|source| Error::Cache { path: cached.clone(), source })?;
    for (name, entry) in &entries {
        let target = cached.join(name);
        if check_local(store, &target, entry).is_ok() {
            continue;
        }
        let bytes = store.read_file(entry).await?;
        write_atomic(&target, &bytes)?;
    }
    Ok(cached)
}

/// Where checkpoints of non-local runs are materialised: `$XDG_CACHE_HOME/petting`, else
/// the system temp dir. Read here rather than passed down because it only decides where
/// verified copies live, never what a stage computes.
fn cache_root() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("petting"),
        _ => std::env::temp_dir().join("petting-cache"),
    }
}

/// Names the cache folder by the content it must hold: the sha256 of its (name, sha256) list.
fn cache_key(entries: &[(&str, &FileEntry)]) -> String {
    let mut lines: Vec<String> = entries.iter().map(|(name, e)| format!("{name} {}\n", e.sha256)).collect();
    lines.sort();
    store::sha256_hex(lines.concat().as_bytes())
}

/// The folder itself when the run is on local disk.
fn local_dir(store: &RunStore, dir: &str) -> Option<PathBuf> {
    let root = url::Url::parse(store.url()).ok().filter(|u| u.scheme() == "file")?.to_file_path().ok()?;
    Some(root.join(dir))
}

/// Whether `local` holds the committed files and nothing else (a stray file could be
/// picked up by the loader, e.g. an extra safetensors shard).
fn holds_exactly(local: &Path, entries: &[(&str, &FileEntry)]) -> bool {
    let Ok(read) = std::fs::read_dir(local) else { return false };
    let mut found: Vec<String> = read.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect();
    let mut wanted: Vec<String> = entries.iter().map(|(name, _)| name.to_string()).collect();
    found.sort();
    wanted.sort();
    found == wanted
}

fn check_local(store: &RunStore, path: &Path, entry: &FileEntry) -> Result<(), Error> {
    let corrupt = |expected: String, actual: String| store::Error::Corrupt {
        url: store.url().to_string(),
        path: entry.path.clone(),
        expected,
        actual,
    };
    let bytes = std::fs::metadata(path)
        .map_err(|_| store::Error::MissingFile { url: store.url().to_string(), path: entry.path.clone() })?
        .len();
    if bytes != entry.bytes {
        return Err(corrupt(format!("{} bytes", entry.bytes), format!("{bytes} bytes")).into());
    }
    let sha256 = model::sha256_file(path)?;
    if sha256 != entry.sha256 {
        return Err(corrupt(format!("sha256 {}", entry.sha256), format!("sha256 {sha256}")).into());
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|source| Error::Cache { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Cache { path: path.to_path_buf(), source })
}

/// A scratch folder for writing one checkpoint before it goes to the store; removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Result<Scratch, Error> {
        let path = cache_root().join("writing").join(format!("{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).map_err(|source| Error::Cache { path: path.clone(), source })?;
        Ok(Scratch(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes every file of a local folder under `dir` of the attempt, in name order.
async fn upload_dir(writer: &mut StageWriter<'_>, local: &Path, dir: &str) -> Result<(), Error> {
    let read = std::fs::read_dir(local).map_err(|source| Error::Cache { path: local.to_path_buf(), source })?;
    let mut names: Vec<String> = read.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect();
    names.sort();
    for name in names {
        let path = local.join(&name);
        let bytes = std::fs::read(&path).map_err(|source| Error::Cache { path: path.clone(), source })?;
        writer.write_file(format!("{dir}/{name}"), Bytes::from(bytes)).await?;
    }
    Ok(())
}

/// Writes `loaded.policy` as version `version` of `loaded.name` (parent `version - 1`,
/// none for v0) into the attempt, under `layout::checkpoint_dir`, and returns the entry
/// for `CommitInfo::checkpoints`. A LoRA policy writes its adapter only; its base must be
/// committed already (see [`save_base`]).
pub async fn save(writer: &mut StageWriter<'_>, loaded: &LoadedPolicy, version: u32) -> Result<CheckpointRef, Error> {
    let dir = store::layout::checkpoint_dir(&loaded.name, version, writer.attempt());
    let parent = version.checked_sub(1).map(|p| format!("{}/v{p:06}", loaded.name));
    let save_as = SaveAs { policy: &loaded.name, version, parent: parent.as_deref() };
    let scratch = Scratch::new(&loaded.name)?;
    let meta = match &loaded.base {
        None => loaded.policy.save(&scratch.0, &save_as)?,
        Some(base) => {
            let mut meta = loaded.policy.save_adapter(&loaded.name, &scratch.0, Some(&base.dir), &save_as)?;
            meta.base_weights_sha256 = Some(base.weights_sha256.clone());
            write_meta(&scratch.0, &meta)?;
            meta
        }
    };
    upload_dir(writer, &scratch.0, &dir).await?;
    Ok(CheckpointRef {
        policy: loaded.name.clone(),
        version,
        parent_version: version.checked_sub(1),
        dir,
        weights_sha256: meta.weights_sha256,
    })
}

fn write_meta(dir: &Path, meta: &CheckpointMeta) -> Result<(), Error> {
    let mut text = serde_json::to_string_pretty(meta).expect("meta serialises");
    text.push('\n');
    write_atomic(&dir.join(META_FILE), text.as_bytes())
}

/// The weights files of a Hugging Face folder: `model.safetensors`, or the index and
/// the shards it names. Returns (files, the file whose sha256 identifies the weights).
fn weight_files(model_dir: &Path) -> Result<(Vec<String>, String), Error> {
    let index = model_dir.join(WEIGHTS_INDEX_FILE);
    if !index.exists() {
        return Ok((vec![WEIGHTS_FILE.to_string()], WEIGHTS_FILE.to_string()));
    }
    let text = std::fs::read_to_string(&index).map_err(|source| Error::Cache { path: index.clone(), source })?;
    let parsed: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| model::Error::Format { file: index.clone(), reason: format!("not valid JSON: {e}") })?;
    let mut files: Vec<String> = parsed
        .get("weight_map")
        .and_then(|m| m.as_object())
        .map(|m| m.values().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    files.sort();
    files.dedup();
    files.push(WEIGHTS_INDEX_FILE.to_string());
    Ok((files, WEIGHTS_INDEX_FILE.to_string()))
}

/// Copies a pretrained Hugging Face folder byte for byte into the attempt under `dir`
/// (config, weights, tokenizer files), so the run does not depend on the folder staying
/// put. Returns the sha256 of the file that identifies the weights.
async fn copy_folder(writer: &mut StageWriter<'_>, model_dir: &Path, dir: &str) -> Result<(String, String), Error> {
    let (weights, identifying) = weight_files(model_dir)?;
    let mut names: Vec<String> = HF_FILES.iter().map(|s| s.to_string()).chain(weights).collect();
    names.retain(|n| n == &identifying || model_dir.join(n).exists());
    let mut sha = String::new();
    for name in names {
        let path = model_dir.join(&name);
        let bytes = std::fs::read(&path).map_err(|e| model::Error::Io { file: path.clone(), source: e })?;
        if name == identifying {
            sha = store::sha256_hex(&bytes);
        }
        writer.write_file(format!("{dir}/{name}"), Bytes::from(bytes)).await?;
    }
    Ok((identifying, sha))
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

/// Commits the pretrained folder `model_dir` as the frozen base of LoRA policy `name`,
/// at `checkpoints/<name>/base.<attempt>/`. Its weights must be a single
/// `model.safetensors`, the file adapters name by sha256.
pub async fn save_base(writer: &mut StageWriter<'_>, name: &str, model_dir: &Path) -> Result<BaseRef, Error> {
    let dir = format!("checkpoints/{name}/base.{}", writer.attempt());
    let (weights_file, weights_sha256) = copy_folder(writer, model_dir, &dir).await?;
    if weights_file != WEIGHTS_FILE {
        return Err(Error::Invalid {
            url: model_dir.display().to_string(),
            dir,
            reason: format!("a LoRA base must have one {WEIGHTS_FILE}; merge the shards first"),
        });
    }
    Ok(BaseRef { dir, weights_sha256 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CommitMarker, Stage};

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
        let key = cache_key(&[("x", &a), ("y", &b)]);
        assert_eq!(key, cache_key(&[("y", &b), ("x", &a)]));
        let c = entry("d/y", "3");
        assert_ne!(key, cache_key(&[("x", &a), ("y", &c)]));
    }
}
