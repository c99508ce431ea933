//! Saving and loading checkpoints in the layouts transformers and PEFT use.
//!
//! A full checkpoint is a Hugging Face folder:
//!
//! ```text
//! config.json               the config as loaded, `dtype` set to the saved dtype
//! model.safetensors         HF keys, metadata {"format": "pt"}, tied lm_head not stored
//! tokenizer.json …          the tokenizer files the policy was loaded with, unchanged
//! meta.json                 petting: policy, version, parent, sha256 of the weights
//! ```
//!
//! An adapter is PEFT's folder: `adapter_config.json` and `adapter_model.safetensors`
//! (keys `base_model.model.<module>.lora_A.weight`, A (r, in), B (out, r)), plus `meta.json`.
//! Each file is written under a temporary name and renamed.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::language_model::LanguageModel;
use super::lora::LoraConfig;
use super::weights::{
    MAX_SHARD_BYTES, SafetensorsSet, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, Weights, shard_names, weights_digest,
    write_safetensors, write_weights,
};
use super::{Error, Result};

/// The weights file of a PEFT adapter.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The config file of a PEFT adapter.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// petting's record of a checkpoint.
pub const META_FILE: &str = "meta.json";

/// What `meta.json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointMeta {
    /// The policy this checkpoint belongs to.
    pub policy: String,
    /// Its version: 0 for the base, k+1 after the update of iteration k.
    pub version: u32,
    /// The checkpoint it was trained from (e.g. `shared/v000003`), none for a base.
    pub parent: Option<String>,
    /// `full` (a whole model) or `adapter` (a PEFT LoRA adapter).
    pub kind: String,
    /// The weights file in this folder.
    pub weights_file: String,
    /// sha256 of the weights file, lower-case hex.
    pub weights_sha256: String,
    /// The petting build that wrote it.
    pub code_version: String,
    /// For an adapter: sha256 of the base model's weights it was trained on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_weights_sha256: Option<String>,
}

impl CheckpointMeta {
    /// Reads `dir/meta.json`.
    pub fn read(dir: &Path) -> Result<CheckpointMeta> {
        let path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::Format { file: path, reason: e.to_string() })
    }

    /// Checks the weights files against the recorded digest (see [`weights_digest`]).
    pub fn verify(&self, dir: &Path) -> Result<()> {
        let path = dir.join(&self.weights_file);
        let mut names = vec![self.weights_file.clone()];
        if self.weights_file == WEIGHTS_INDEX_FILE {
            names.extend(shard_names(dir)?.unwrap_or_default().into_values());
            names.sort();
            names.dedup();
        }
        let files = names.into_iter().map(|n| Ok((sha256_file(&dir.join(&n))?, n))).collect::<Result<Vec<_>>>()?;
        let found = weights_digest(&files.into_iter().map(|(sha, n)| (n, sha)).collect::<Vec<_>>());
        if found != self.weights_sha256 {
            return Err(Error::Format {
                file: path,
                reason: format!("sha256 {found} differs from {} recorded in meta.json", self.weights_sha256),
            });
        }
        Ok(())
    }
}

/// sha256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let mut text =
        serde_json::to_string_pretty(value).map_err(|e| Error::Format { file: path.into(), reason: e.to_string() })?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
}

/// Identifies the checkpoint being written: the rest of `meta.json` is computed.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveAs<'a> {
    pub policy: &'a str,
    pub version: u32,
    pub parent: Option<&'a str>,
}

fn dtype_name(kind: tch::Kind) -> &'static str {
    match kind {
        tch::Kind::BFloat16 => "bfloat16",
        tch::Kind::Half => "float16",
        _ => "float32",
    }
}

impl LanguageModel {
    /// Writes the base model as a Hugging Face folder transformers loads unchanged, plus
    /// `meta.json`: one `model.safetensors`, or shards of at most 5 GB with their index.
    /// Adapters are not merged in (save them with [`LanguageModel::save_adapter`]).
    pub fn save(&self, dir: &Path, save_as: &SaveAs) -> Result<CheckpointMeta> {
        self.save_sharded(dir, save_as, MAX_SHARD_BYTES)
    }

    /// [`LanguageModel::save`] with shards of at most `max_shard_bytes`.
    pub fn save_sharded(&self, dir: &Path, save_as: &SaveAs, max_shard_bytes: usize) -> Result<CheckpointMeta> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // A vision-language model writes its whole config and its tower beside the decoder.
        let (raw, tower) = self.vision.as_ref().map_or((&self.lm.config.raw, &[][..]), |v| v.checkpoint_parts());
        let mut config = raw.clone();
        if let Some(map) = config.as_object_mut() {
            // transformers ≥ 4.56 writes `dtype` (older files: `torch_dtype`).
            let key =
                if map.contains_key("torch_dtype") && !map.contains_key("dtype") { "torch_dtype" } else { "dtype" };
            map.insert(key.into(), dtype_name(self.kind()).into());
        }
        write_json(&dir.join("config.json"), &config)?;
        let mut tensors: Vec<(String, tch::Tensor)> = self.vs.variables().into_iter().collect();
        tensors.extend(tower.iter().map(|(name, t)| (name.clone(), t.shallow_clone())));
        let written = write_weights(dir, &tensors, max_shard_bytes)?;
        for (name, bytes) in &self.assets {
            write_atomic(&dir.join(name), bytes)?;
        }
        let weights_file = if written.len() == 1 { WEIGHTS_FILE } else { WEIGHTS_INDEX_FILE };
        let meta = CheckpointMeta {
            policy: save_as.policy.to_owned(),
            version: save_as.version,
            parent: save_as.parent.map(str::to_owned),
            kind: "full".into(),
            weights_file: weights_file.into(),
            weights_sha256: weights_digest(&written),
            code_version: crate::CODE_VERSION.into(),
            base_weights_sha256: None,
        };
        write_json(&dir.join(META_FILE), &meta)?;
        Ok(meta)
    }

    /// Writes one adapter in PEFT's layout, plus `meta.json`. `base_model` is recorded as
    /// `base_model_name_or_path`.
    pub fn save_adapter(
        &self,
        name: &str,
        dir: &Path,
        base_model: Option<&str>,
        save_as: &SaveAs,
    ) -> Result<CheckpointMeta> {
        let adapter = &self.adapters[self.adapter_slot(name)?];
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        write_json(&dir.join(ADAPTER_CONFIG_FILE), &PeftConfig::from_lora(&adapter.config, base_model))?;
        let tensors: Vec<(String, tch::Tensor)> = adapter.vs.variables().into_iter().collect();
        let weights_sha256 = write_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors)?;
        let meta = CheckpointMeta {
            policy: save_as.policy.to_owned(),
            version: save_as.version,
            parent: save_as.parent.map(str::to_owned),
            kind: "adapter".into(),
            weights_file: ADAPTER_WEIGHTS_FILE.into(),
            weights_sha256,
            code_version: crate::CODE_VERSION.into(),
            base_weights_sha256: None,
        };
        write_json(&dir.join(META_FILE), &meta)?;
        Ok(meta)
    }

    /// Adds the PEFT adapter in `dir` under `name`; every tensor must be one this base has
    /// a place for, with the right shape.
    pub fn load_adapter(&mut self, name: &str, dir: &Path) -> Result<()> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let peft: PeftConfig = serde_json::from_str(&text)
            .map_err(|e| Error::Format { file: config_path.clone(), reason: e.to_string() })?;
        let lora = peft.to_lora().map_err(|reason| Error::Format { file: config_path, reason })?;
        self.load_adapter_file(name, &lora, &dir.join(ADAPTER_WEIGHTS_FILE))
    }

    /// Adds the adapter whose tensors (PEFT keys) are in the safetensors file `path`
    /// under `name`, with the settings `lora`; every tensor must be one this base has a
    /// place for, with the right shape.
    pub fn load_adapter_file(&mut self, name: &str, lora: &LoraConfig, path: &Path) -> Result<()> {
        let files = SafetensorsSet::open_files(&[path.to_path_buf()])?;
        self.insert_adapter(name, lora, &Weights::Files(&files))?;
        let known = self.adapters.last().expect("just inserted").vs.variables();
        if let Some(extra) = files.names().into_iter().find(|n| !known.contains_key(*n)) {
            let extra = extra.to_owned();
            self.adapters.pop();
            return Err(Error::Format {
                file: path.to_path_buf(),
                reason: format!("tensor {extra} does not belong to a LoRA adapter of this model's linear layers"),
            });
        }
        Ok(())
    }
}

/// `adapter_config.json` as PEFT writes it for LoRA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PeftConfig {
    #[serde(default)]
    alpha_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    auto_mapping: Option<serde_json::Value>,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    #[serde(default = "none_bias")]
    bias: String,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    inference_mode: bool,
    #[serde(default)]
    init_lora_weights: serde_json::Value,
    #[serde(default)]
    layers_pattern: Option<serde_json::Value>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    #[serde(default)]
    modules_to_save: Option<serde_json::Value>,
    peft_type: String,
    r: u32,
    #[serde(default)]
    rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    revision: Option<String>,
    target_modules: serde_json::Value,
    #[serde(default)]
    task_type: Option<String>,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    use_rslora: bool,
}

fn none_bias() -> String {
    "none".into()
}

impl PeftConfig {
    fn from_lora(lora: &LoraConfig, base_model: Option<&str>) -> PeftConfig {
        let targets: Vec<String> = if lora.targets.is_empty() {
            super::lora::ALL_LINEAR.iter().map(|s| s.to_string()).collect()
        } else {
            lora.targets.clone()
        };
        PeftConfig {
            alpha_pattern: Default::default(),
            auto_mapping: None,
            base_model_name_or_path: base_model.map(str::to_owned),
            bias: "none".into(),
            fan_in_fan_out: false,
            inference_mode: true,
            init_lora_weights: true.into(),
            layers_pattern: None,
            layers_to_transform: None,
            lora_alpha: lora.alpha,
            lora_dropout: lora.dropout,
            modules_to_save: None,
            peft_type: "LORA".into(),
            r: lora.rank,
            rank_pattern: Default::default(),
            revision: None,
            target_modules: targets.into(),
            task_type: Some("CAUSAL_LM".into()),
            use_dora: false,
            use_rslora: false,
        }
    }

    fn to_lora(&self) -> std::result::Result<LoraConfig, String> {
        if self.peft_type != "LORA" {
            return Err(format!("peft_type {:?} is not supported (LORA)", self.peft_type));
        }
        if self.use_dora || self.use_rslora || self.bias != "none" || self.fan_in_fan_out {
            return Err("use_dora, use_rslora, fan_in_fan_out and bias other than \"none\" are not supported".into());
        }
        if !self.rank_pattern.is_empty()
            || !self.alpha_pattern.is_empty()
            || self.modules_to_save.as_ref().is_some_and(|m| !m.is_null())
        {
            return Err("rank_pattern, alpha_pattern and modules_to_save are not supported".into());
        }
        let targets = match &self.target_modules {
            serde_json::Value::String(s) if s == "all-linear" => Vec::new(),
            serde_json::Value::Array(items) => {
                let mut t: Vec<String> = items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
                t.sort_by_key(|n| super::lora::ALL_LINEAR.iter().position(|a| a == n));
                t
            }
            other => {
                return Err(format!("target_modules {other} is not supported (a list of names or \"all-linear\")"));
            }
        };
        Ok(LoraConfig { rank: self.r, alpha: self.lora_alpha, dropout: self.lora_dropout, targets })
    }
}
