//! A Hugging Face `config.json`, resolved once into an Option-free [`ModelConfig`].
//!
//! Two layers, as in candle's llama.rs `into_config`: [`HfConfig`] mirrors the file
//! (every key optional, unknown keys tolerated, since transformers adds keys every
//! release), and [`ModelConfig`] is what the forward code reads. The file's JSON is kept
//! verbatim so that a saved checkpoint writes back exactly the keys it was loaded with.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::Error;

/// The decoder families one implementation covers; they differ only in which tensors exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`: optional attention and MLP biases (`attention_bias`, `mlp_bias`).
    Llama,
    /// `Qwen2ForCausalLM`: biases on q/k/v, none on o_proj.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm on each head of q and k before the rotary embedding.
    Qwen3,
}

impl Architecture {
    /// The `architectures` entry transformers writes for this family.
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The `model_type` transformers writes for this family.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    fn from_names(model_type: Option<&str>, architectures: &[String]) -> Option<Architecture> {
        let by_type = |t: &str| match t {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            _ => None,
        };
        let by_class = |c: &str| match c {
            "LlamaForCausalLM" => Some(Architecture::Llama),
            "Qwen2ForCausalLM" => Some(Architecture::Qwen2),
            "Qwen3ForCausalLM" => Some(Architecture::Qwen3),
            _ => None,
        };
        match model_type {
            Some(t) => by_type(t),
            None => architectures.iter().find_map(|c| by_class(c)),
        }
    }
}

/// `eos_token_id` is a number or a list of numbers.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(i64),
    Many(Vec<i64>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<i64> {
        match self {
            OneOrMany::One(id) => vec![id],
            OneOrMany::Many(ids) => ids,
        }
    }
}

/// The key of `generation_config.json` petting reads.
#[derive(Debug, Deserialize)]
struct GenerationEos {
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
}

/// `rope_parameters` (transformers ≥ 5) or `rope_scaling` (older files).
#[derive(Debug, Clone, Deserialize)]
struct HfRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

/// `config.json` as written: every key optional, unknown keys ignored.
#[derive(Debug, Clone, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<HfRope>,
    rope_scaling: Option<HfRope>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    max_position_embeddings: Option<usize>,
    initializer_range: Option<f64>,
    eos_token_id: Option<OneOrMany>,
    bos_token_id: Option<i64>,
    pad_token_id: Option<i64>,
}

/// How rotary frequencies are scaled (`rope_type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Llama 3.1's band-wise frequency scaling.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

/// Everything the forward code needs, resolved once; no field is optional.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Width of one attention head; Qwen3 sets it apart from hidden_size / heads.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// lm_head shares the embedding matrix (no `lm_head.weight` in the file).
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (always for Qwen2).
    pub qkv_bias: bool,
    /// o_proj carries a bias (Llama `attention_bias`).
    pub o_bias: bool,
    /// gate/up/down carry a bias (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
    pub max_position_embeddings: usize,
    /// Standard deviation of the normal initialisation of a model made from scratch.
    pub initializer_range: f64,
    /// Generation ends at any of these ids.
    pub eos_token_ids: Vec<i64>,
    pub bos_token_id: Option<i64>,
    pub pad_token_id: Option<i64>,
    /// The file's JSON as read, written back unchanged by a checkpoint save.
    pub raw: Value,
}

impl ModelConfig {
    /// Reads and resolves `dir/config.json`. The EOS ids are config.json's, then those
    /// `generation_config.json` adds (what `generate` stops at in transformers: instruct
    /// models often end their turns with a token config.json does not name).
    pub fn from_dir(dir: &Path) -> Result<ModelConfig, Error> {
        let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
        config.add_generation_eos(dir)?;
        Ok(config)
    }

    /// Adds the EOS ids `dir/generation_config.json` names, if there is one.
    pub(crate) fn add_generation_eos(&mut self, dir: &Path) -> Result<(), Error> {
        let generation = dir.join("generation_config.json");
        if !generation.exists() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&generation).map_err(|source| Error::io(&generation, source))?;
        let parsed: GenerationEos = serde_json::from_str(&text)
            .map_err(|e| Error::Config { file: generation.clone(), reason: e.to_string() })?;
        for id in parsed.eos_token_id.map(OneOrMany::into_vec).unwrap_or_default() {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        Ok(())
    }

    /// Reads and resolves a `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::io(path, source))?;
        ModelConfig::from_json(&text).map_err(|reason| Error::Config { file: path.to_path_buf(), reason })
    }

    /// Resolves the text of a `config.json`; the error is the reason, without the file.
    pub fn from_json(text: &str) -> Result<ModelConfig, String> {
        let raw: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let hf: HfConfig = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        let architecture = Architecture::from_names(hf.model_type.as_deref(), &hf.architectures).ok_or_else(|| {
            format!(
                "unknown architecture (model_type {:?}, architectures {:?}); supported: llama, qwen2, qwen3",
                hf.model_type.as_deref().unwrap_or(""),
                hf.architectures
            )
        })?;
        let need = |v: Option<usize>, key: &str| v.ok_or_else(|| format!("missing key `{key}`"));
        let hidden_size = need(hf.hidden_size, "hidden_size")?;
        let num_attention_heads = need(hf.num_attention_heads, "num_attention_heads")?;
        let num_key_value_heads = hf.num_key_value_heads.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads {num_attention_heads} is not a positive multiple of num_key_value_heads {num_key_value_heads}"
            ));
        }
        let head_dim = hf.head_dim.unwrap_or(hidden_size / num_attention_heads);
        if !head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {head_dim} must be even for rotary embeddings"));
        }
        if let Some(act) = hf.hidden_act.as_deref()
            && act != "silu"
        {
            return Err(format!("hidden_act {act:?} is not supported (silu only)"));
        }
        // Newer files nest rope settings in rope_parameters, older ones use rope_theta and rope_scaling.
        let rope = hf.rope_parameters.as_ref().or(hf.rope_scaling.as_ref());
        let rope_theta = rope.and_then(|r| r.rope_theta).or(hf.rope_theta).unwrap_or(10000.0);
        let rope_type = rope.and_then(|r| r.rope_type.clone().or_else(|| r.legacy_type.clone()));
        let rope_scaling = match rope_type.as_deref() {
            None | Some("default") => RopeScaling::Default,
            Some("llama3") => {
                let r = rope.expect("a rope type comes from a rope object");
                RopeScaling::Llama3 {
                    factor: r.factor.ok_or("rope llama3 scaling needs `factor`")?,
                    low_freq_factor: r.low_freq_factor.ok_or("rope llama3 scaling needs `low_freq_factor`")?,
                    high_freq_factor: r.high_freq_factor.ok_or("rope llama3 scaling needs `high_freq_factor`")?,
                    original_max_position_embeddings: r
                        .original_max_position_embeddings
                        .ok_or("rope llama3 scaling needs `original_max_position_embeddings`")?,
                }
            }
            Some(other) => return Err(format!("rope_type {other:?} is not supported (default, llama3)")),
        };
        let attention_bias = hf.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias, mlp_bias, qk_norm) = match architecture {
            Architecture::Llama => (attention_bias, attention_bias, hf.mlp_bias.unwrap_or(false), false),
            Architecture::Qwen2 => (true, false, false, false),
            Architecture::Qwen3 => (attention_bias, attention_bias, false, true),
        };
        let eos_token_ids = hf.eos_token_id.map(OneOrMany::into_vec).unwrap_or_default();
        Ok(ModelConfig {
            architecture,
            vocab_size: need(hf.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(hf.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(hf.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm,
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(4096),
            initializer_range: hf.initializer_range.unwrap_or(0.02),
            eos_token_ids,
            bos_token_id: hf.bos_token_id,
            pad_token_id: hf.pad_token_id,
            raw,
        })
    }

    /// Parameters, counting tied embeddings once.
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (self.hidden_size as u64, self.intermediate_size as u64, self.vocab_size as u64);
        let (q, kv) =
            ((self.num_attention_heads * self.head_dim) as u64, (self.num_key_value_heads * self.head_dim) as u64);
        let d = self.head_dim as u64;
        let attention = h * q
            + 2 * h * kv
            + q * h
            + if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.o_bias { h } else { 0 }
            + if self.qk_norm { 2 * d } else { 0 };
        let mlp = 3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 };
        let layer = attention + mlp + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers as u64 * layer + h + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"model_type":"qwen3","vocab_size":512,"hidden_size":64,"intermediate_size":160,
        "num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":24,
        "rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},"tie_word_embeddings":true,
        "eos_token_id":2,"pad_token_id":0,"some_future_key":{"x":1}}"#;

    #[test]
    fn qwen3_resolves_rope_parameters_and_keeps_unknown_keys() {
        let c = ModelConfig::from_json(QWEN3).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert_eq!((c.head_dim, c.rope_theta, c.qk_norm, c.qkv_bias), (24, 1e6, true, false));
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.raw["some_future_key"]["x"], 1);
    }

    #[test]
    fn qwen2_always_has_qkv_bias_and_llama_takes_top_level_rope_theta() {
        let q2 = ModelConfig::from_json(&QWEN3.replace("qwen3", "qwen2")).unwrap();
        assert!(q2.qkv_bias && !q2.o_bias && !q2.qk_norm);
        let llama = r#"{"model_type":"llama","vocab_size":8,"hidden_size":8,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2,"rope_theta":500000.0,"eos_token_id":[1,2]}"#;
        let c = ModelConfig::from_json(llama).unwrap();
        assert_eq!((c.rope_theta, c.head_dim, c.num_key_value_heads), (500000.0, 4, 2));
        assert_eq!(c.eos_token_ids, vec![1, 2]);
    }

    #[test]
    fn generation_config_adds_its_eos_ids() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":7}"#;
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        assert_eq!(ModelConfig::from_dir(dir.path()).unwrap().eos_token_ids, vec![7]);
        std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": [9, 7], "top_p": 0.8}"#).unwrap();
        assert_eq!(ModelConfig::from_dir(dir.path()).unwrap().eos_token_ids, vec![7, 9]);
        std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
        let err = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("generation_config.json"), "{err}");
    }

    #[test]
    fn unknown_architectures_and_missing_keys_are_named() {
        let err = ModelConfig::from_json(&QWEN3.replace("qwen3", "gpt2")).unwrap_err();
        assert!(err.contains("unknown architecture") && err.contains("gpt2"), "{err}");
        let err = ModelConfig::from_json(&QWEN3.replace("\"vocab_size\":512,", "")).unwrap_err();
        assert!(err.contains("vocab_size"), "{err}");
        let err = ModelConfig::from_json(&QWEN3.replace("\"default\"", "\"yarn\"")).unwrap_err();
        assert!(err.contains("yarn"), "{err}");
    }

    #[test]
    fn parameter_count_matches_the_bench_anchor() {
        // The anchors' counts: bench-tiny has 4,196,864 parameters (tied embeddings counted once).
        let path = crate::model::testing::fixture("model-configs/bench-tiny.config.json");
        assert_eq!(ModelConfig::from_file(&path).unwrap().parameter_count(), 4_196_864);
        let path = crate::model::testing::fixture("model-configs/bench-small.config.json");
        assert_eq!(ModelConfig::from_file(&path).unwrap().parameter_count(), 134_236_160);
    }
}
