//! A checkpoint's files on local disk: verified copies of committed folders (in place
//! for a local run, in a cache otherwise), scratch folders for writing one, and the
//! upload of a folder into a stage's attempt.

use std::path::{Path, PathBuf};

use crate::model::{self, CheckpointMeta, META_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use crate::store::{self, FileEntry, RunStore, StageWriter};

use super::Error;

/// Files of a Hugging Face folder that a self-contained copy of a base model keeps
/// (weights are added by name; evaluation fixtures and READMEs are left behind).
pub(super) const HF_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
];

pub(super) fn file_name(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, name)| name)
}

/// The files a marker lists directly under `dir`, as (file name, entry).
pub(super) fn files_under<'f>(files: &'f [FileEntry], dir: &str) -> Vec<(&'f str, &'f FileEntry)> {
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
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Cache { path: parent.to_path_buf(), source })?;
        }
        let bytes = store.read_file(entry).await?;
        write_atomic(&target, &bytes)?;
    }
    Ok(cached)
}

/// A local copy of one committed file, checked against its marker entry: in place for a
/// local run, else in the cache under its sha256.
pub(super) async fn materialise_file(store: &RunStore, entry: &FileEntry) -> Result<PathBuf, Error> {
    let (dir, name) = entry.path.rsplit_once('/').unwrap_or(("", &entry.path));
    if let Some(local) = local_dir(store, dir).map(|d| d.join(name))
        && local.exists()
    {
        check_local(store, &local, entry)?;
        return Ok(local);
    }
    let cached = cache_root().join("files").join(&entry.sha256);
    if check_local(store, &cached, entry).is_err() {
        std::fs::create_dir_all(cache_root().join("files"))
            .map_err(|source| Error::Cache { path: cache_root(), source })?;
        write_atomic(&cached, &store.read_file(entry).await?)?;
    }
    Ok(cached)
}

/// Where checkpoints of non-local runs are materialised: `$XDG_CACHE_HOME/petting`, else
/// the system temp dir. Read here rather than passed down because it only decides where
/// verified copies live, never what a stage computes.
pub(crate) fn cache_root() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("petting"),
        _ => std::env::temp_dir().join("petting-cache"),
    }
}

/// Names the cache folder by the content it must hold: the sha256 of its (name, sha256) list.
pub(super) fn cache_key(entries: &[(&str, &FileEntry)]) -> String {
    let mut lines: Vec<String> = entries.iter().map(|(name, e)| format!("{name} {}\n", e.sha256)).collect();
    lines.sort();
    store::sha256_hex(lines.concat().as_bytes())
}

/// The folder itself when the run is on local disk.
pub(crate) fn local_dir(store: &RunStore, dir: &str) -> Option<PathBuf> {
    let root = url::Url::parse(store.url()).ok().filter(|u| u.scheme() == "file")?.to_file_path().ok()?;
    Some(root.join(dir))
}

/// Whether `local` holds the committed files and nothing else (a stray file could be
/// picked up by the loader, e.g. an extra safetensors shard).
fn holds_exactly(local: &Path, entries: &[(&str, &FileEntry)]) -> bool {
    let Ok(read) = std::fs::read_dir(local) else { return false };
    let mut found: Vec<String> = read.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect();
    // A file in a subfolder (a checkpoint's critic/) is found as its folder.
    let mut wanted: Vec<String> =
        entries.iter().map(|(name, _)| name.split('/').next().unwrap_or(name).to_string()).collect();
    found.sort();
    wanted.sort();
    wanted.dedup();
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

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|source| Error::Cache { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Cache { path: path.to_path_buf(), source })
}

/// A scratch folder for writing one checkpoint before it goes to the store; removed on drop.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    pub(super) fn new(label: &str) -> Result<Scratch, Error> {
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
pub(super) async fn upload_dir(writer: &mut StageWriter<'_>, local: &Path, dir: &str) -> Result<(), Error> {
    let read = std::fs::read_dir(local).map_err(|source| Error::Cache { path: local.to_path_buf(), source })?;
    let mut names: Vec<String> = read.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect();
    names.sort();
    for name in names {
        writer.write_local_file(format!("{dir}/{name}"), &local.join(&name)).await?;
    }
    Ok(())
}

pub(super) fn write_meta(dir: &Path, meta: &CheckpointMeta) -> Result<(), Error> {
    let mut text = serde_json::to_string_pretty(meta).expect("meta serialises");
    text.push('\n');
    write_atomic(&dir.join(META_FILE), text.as_bytes())
}

/// The weights files of a Hugging Face folder: `model.safetensors`, or the shards its
/// index names and the index. Returns (files, the file loaders open first).
pub(super) fn weight_files(model_dir: &Path) -> Result<(Vec<String>, String), Error> {
    let Some(map) = model::shard_names(model_dir)? else {
        return Ok((vec![WEIGHTS_FILE.to_string()], WEIGHTS_FILE.to_string()));
    };
    let mut files: Vec<String> = map.into_values().collect();
    files.sort();
    files.dedup();
    files.push(WEIGHTS_INDEX_FILE.to_string());
    Ok((files, WEIGHTS_INDEX_FILE.to_string()))
}

/// Copies a pretrained Hugging Face folder byte for byte into the attempt under `dir`
/// (config, weights, tokenizer files), file by file in chunks, so the run does not depend
/// on the folder staying put. Returns (the file loaders open first, the weights digest).
pub(super) async fn copy_folder(
    writer: &mut StageWriter<'_>,
    model_dir: &Path,
    dir: &str,
) -> Result<(String, String), Error> {
    let (weights, identifying) = weight_files(model_dir)?;
    let mut written = Vec::new();
    for name in &weights {
        written.push((name.clone(), writer.write_local_file(format!("{dir}/{name}"), &model_dir.join(name)).await?));
    }
    for name in HF_FILES.iter().filter(|n| model_dir.join(n).exists()) {
        writer.write_local_file(format!("{dir}/{name}"), &model_dir.join(name)).await?;
    }
    Ok((identifying, model::weights_digest(&written)))
}
