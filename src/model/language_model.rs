//! [`LanguageModel`]: a decoder with its weights, tokenizer, chat template and LoRA adapters.
//!
//! The base model's tensors live in one VarStore whose paths are the HF keys; each
//! adapter in its own VarStore with PEFT's keys. An optimizer for full fine-tuning is
//! built on [`LanguageModel::var_store`], one for an adapter on [`LanguageModel::adapter_var_store`].

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use super::chat_template::{ChatMessage, ChatTemplate, TemplateOptions};
use super::config::ModelConfig;
use super::decoder::CausalLm;
use super::device::{DType, Device};
use super::lora::LoraConfig;
use super::lora::{LoraWeights, lora_a_bound, targets_layer};
use super::tokenizer::Tokenizer;
use super::vision::{self, Vision};
use super::weights::{Init, SafetensorsSet, Weights};
use super::{Error, Result};

/// Where a policy runs and in which dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    pub device: Device,
    /// Weight dtype; when `None`, float32 on CPU and bfloat16 on CUDA.
    pub dtype: Option<DType>,
}

impl LoadOptions {
    pub fn tch_device(&self) -> tch::Device {
        match self.device {
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda(n) => tch::Device::Cuda(n),
        }
    }

    pub fn kind(&self) -> Kind {
        match (self.dtype, self.device) {
            (Some(DType::F32), _) | (None, Device::Cpu) => Kind::Float,
            (Some(DType::Bf16), _) | (None, Device::Cuda(_)) => Kind::BFloat16,
            (Some(DType::F16), _) => Kind::Half,
        }
    }
}

/// One LoRA adapter of a policy.
pub(crate) struct Adapter {
    pub(crate) name: String,
    pub(crate) config: LoraConfig,
    pub(crate) vs: VarStore,
}

/// Files beside the weights that a saved checkpoint carries over unchanged.
pub(crate) const ASSET_FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
];

/// A decoder ready to sample and train.
pub struct LanguageModel {
    pub(crate) lm: CausalLm,
    pub(crate) vs: VarStore,
    pub(crate) adapters: Vec<Adapter>,
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) chat_template: Option<ChatTemplate>,
    /// The vision tower of a vision-language model.
    pub(crate) vision: Option<Vision>,
    /// (file name, bytes) of the tokenizer files the policy was loaded with.
    pub(crate) assets: Vec<(String, Vec<u8>)>,
    pub(crate) options: LoadOptions,
}

impl std::fmt::Debug for LanguageModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanguageModel")
            .field("architecture", &self.lm.config.architecture)
            .field("options", &self.options)
            .field("adapters", &self.adapter_names())
            .finish()
    }
}

impl LanguageModel {
    /// Loads a Hugging Face folder: `config.json`, `model.safetensors` (or shards and
    /// their index), and, where present, `tokenizer.json` and the chat template.
    /// A vision-language folder (`qwen2_5_vl`) loads its vision tower beside the decoder.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<LanguageModel> {
        let (config, vision) = match vision::read_config(dir)? {
            Some((config, parts)) => (config, Some(parts)),
            None => (ModelConfig::from_dir(dir)?, None),
        };
        let files = SafetensorsSet::open_dir(dir)?;
        let mut policy = LanguageModel::build(config, &Weights::Files(&files), options)?;
        policy.vision = vision.map(|parts| Vision::load(dir, parts, &files, options)).transpose()?;
        // A tensor the model has no place for means the config does not describe the file.
        let known = policy.vs.variables();
        let tied_head = |n: &str| n == "lm_head.weight" && policy.lm.config.tie_word_embeddings;
        let tower = |n: &str| policy.vision.is_some() && Vision::owns(n);
        if let Some(extra) = files
            .names()
            .into_iter()
            .find(|n| !known.contains_key(*n) && !tied_head(n) && !tower(n) && !n.ends_with("rotary_emb.inv_freq"))
        {
            return Err(Error::Format {
                file: files.file_of(extra),
                reason: format!(
                    "unexpected tensor {extra}: a {} model with this config.json has no such weight",
                    policy.lm.config.architecture.model_type()
                ),
            });
        }
        drop(files);
        policy.attach_tokenizer_files(dir)?;
        Ok(policy)
    }

    /// A model made from a `config.json` alone, initialised as transformers'
    /// `_init_weights` does (normal(0, initializer_range) weights, zero biases, unit norms),
    /// with values from counter-based streams keyed by `seed` and each tensor's name.
    pub fn scratch(config: ModelConfig, seed: u64, options: &LoadOptions) -> Result<LanguageModel> {
        LanguageModel::build(config, &Weights::Random { seed }, options)
    }

    fn build(config: ModelConfig, weights: &Weights, options: &LoadOptions) -> Result<LanguageModel> {
        options.device.check_available().map_err(|reason| Error::Device { reason })?;
        let mut vs = VarStore::new(options.tch_device());
        vs.set_kind(options.kind());
        let lm = CausalLm::new(vs.root(), &config, weights)?;
        Ok(LanguageModel {
            lm,
            vs,
            adapters: Vec::new(),
            tokenizer: None,
            chat_template: None,
            vision: None,
            assets: Vec::new(),
            options: *options,
        })
    }

    /// Takes the tokenizer and chat template from `dir` (e.g. a scratch model's folder).
    pub fn attach_tokenizer_files(&mut self, dir: &Path) -> Result<()> {
        let tokenizer_path = dir.join("tokenizer.json");
        if tokenizer_path.exists() {
            self.tokenizer = Some(Tokenizer::from_file(&tokenizer_path)?);
        }
        self.chat_template = ChatTemplate::from_dir(dir)?;
        self.assets.clear();
        for name in ASSET_FILES {
            let path = dir.join(name);
            if path.exists() {
                self.assets.push((name.to_owned(), std::fs::read(&path).map_err(|e| Error::io(&path, e))?));
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &ModelConfig {
        &self.lm.config
    }

    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    pub fn device(&self) -> tch::Device {
        self.options.tch_device()
    }

    pub fn kind(&self) -> Kind {
        self.options.kind()
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The tokenizer, or an error saying the folder had none.
    pub fn require_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| Error::MissingFile { file: PathBuf::from("tokenizer.json"), what: "a tokenizer" })
    }

    /// Renders a conversation with the chat template and tokenises it (no added special
    /// tokens, as `apply_chat_template(tokenize=True)`): (text, ids).
    pub fn encode_chat(&self, messages: &[ChatMessage], options: &TemplateOptions) -> Result<(String, Vec<i64>)> {
        let template = self.chat_template.as_ref().ok_or_else(|| Error::MissingFile {
            file: PathBuf::from("chat_template.jinja"),
            what: "a chat template",
        })?;
        let text = template.render(messages, options)?;
        let ids = self.require_tokenizer()?.encode(&text, false)?;
        Ok((text, ids))
    }

    /// How every agent prompt reaches a model, in rollout, evaluation and the SFT warm
    /// start alike: one user message, answer directly (Qwen3's non-thinking mode; other
    /// templates ignore the flag). A prompt of more than `max_tokens` is an error, never
    /// cut: either end holds what the model cannot do without (the chat header and the
    /// task, or the generation prompt).
    pub fn agent_prompt(&self, text: &str, max_tokens: usize) -> Result<(String, Vec<i64>)> {
        let options = TemplateOptions { add_generation_prompt: true, enable_thinking: Some(false) };
        let (rendered, ids) = self.encode_chat(&[ChatMessage::new("user", text)], &options)?;
        if ids.len() > max_tokens {
            let start: String = text.chars().take(80).collect();
            return Err(Error::PromptTooLong { tokens: ids.len(), limit: max_tokens, start });
        }
        Ok((rendered, ids))
    }

    /// A conversation as an OpenAI-compatible client sends it (messages and the tools
    /// offered), rendered to the opening of the assistant's reply; not tokenised, since
    /// a continued conversation reuses the ids sampled for its earlier turns.
    pub fn chat_text(&self, messages: &serde_json::Value, tools: Option<&serde_json::Value>) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| Error::MissingFile {
            file: PathBuf::from("chat_template.jinja"),
            what: "a chat template",
        })?;
        let options = TemplateOptions { add_generation_prompt: true, enable_thinking: None };
        template.render_json(messages, tools, &options)
    }

    /// The base model's variables (HF keys): what full fine-tuning optimises.
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// About how many bytes of activations a training forward keeps per token for the
    /// backward pass: per layer the norms, q/k/v, attention and residual outputs (≈ 10
    /// hidden widths) and the MLP's gate, up, activation and product (4 intermediate).
    pub fn activation_bytes_per_token(&self) -> u64 {
        let c = &self.lm.config;
        let per_layer = 10 * c.hidden_size as u64 + 4 * c.intermediate_size as u64;
        per_layer * c.num_hidden_layers as u64 * self.kind().elt_size_in_bytes() as u64
    }

    /// Parameters of the base model, counting tied embeddings once.
    pub fn parameter_count(&self) -> u64 {
        self.vs.variables().values().map(|t| t.numel() as u64).sum()
    }

    /// Names of the adapters, in the order they were added.
    pub fn adapter_names(&self) -> Vec<String> {
        self.adapters.iter().map(|a| a.name.clone()).collect()
    }

    pub(crate) fn adapter_slot(&self, name: &str) -> Result<usize> {
        self.adapters
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| Error::UnknownAdapter { name: name.to_owned(), have: self.adapter_names() })
    }

    /// The variables of one adapter (PEFT keys): what that adapter's optimizer trains.
    pub fn adapter_var_store(&self, name: &str) -> Result<&VarStore> {
        Ok(&self.adapters[self.adapter_slot(name)?].vs)
    }

    /// The settings of one adapter.
    pub fn adapter_config(&self, name: &str) -> Result<&LoraConfig> {
        Ok(&self.adapters[self.adapter_slot(name)?].config)
    }

    /// Adds a LoRA adapter with A kaiming-uniform from streams keyed by `seed` and B zero,
    /// so the model's outputs do not change until it trains. The base is frozen.
    pub fn add_adapter(&mut self, name: &str, config: &LoraConfig, seed: u64) -> Result<()> {
        self.insert_adapter(name, config, &Weights::Random { seed })
    }

    /// Adds an adapter with tensors from `weights` (PEFT keys), checking every shape.
    pub(crate) fn insert_adapter(&mut self, name: &str, config: &LoraConfig, weights: &Weights) -> Result<()> {
        if self.adapters.iter().any(|a| a.name == name) {
            return Err(Error::DuplicateAdapter { name: name.to_owned() });
        }
        if config.rank == 0 {
            return Err(Error::Request { reason: format!("adapter {name:?}: rank must be positive") });
        }
        if let Some(t) =
            config.targets.iter().find(|t| t.as_str() != "all-linear" && !super::lora::ALL_LINEAR.contains(&t.as_str()))
        {
            return Err(Error::Request {
                reason: format!(
                    "adapter {name:?}: unknown target module {t:?}; expected some of {:?}",
                    super::lora::ALL_LINEAR
                ),
            });
        }
        let device = self.device();
        let kind = Kind::Float;
        let vs = VarStore::new(device);
        let slot = self.adapters.len();
        let r = i64::from(config.rank);
        let scale = config.alpha / f64::from(config.rank);
        for linear in self.lm.linears_mut() {
            while linear.adapters.len() <= slot {
                linear.adapters.push(None);
            }
            if !targets_layer(&config.targets, linear.name) {
                continue;
            }
            let (out_dim, in_dim) = linear.weight.size2().expect("a linear weight is 2-d");
            let root = vs.root();
            let path = &root / "base_model" / "model";
            let path = linear.prefix.split('.').fold(path, |p, seg| &p / seg);
            let (a_path, b_path) = (&path / "lora_A", &path / "lora_B");
            let a =
                weights.get(&a_path.path("weight"), &[r, in_dim], Init::Uniform(lora_a_bound(in_dim)), kind, device)?;
            let b = weights.get(&b_path.path("weight"), &[out_dim, r], Init::Zeros, kind, device)?;
            let a = a_path.add("weight", a, true);
            let b = b_path.add("weight", b, true);
            linear.adapters[slot] = Some(LoraWeights { a, b, scale, dropout: config.dropout });
        }
        self.vs.freeze();
        self.adapters.push(Adapter { name: name.to_owned(), config: config.clone(), vs });
        Ok(())
    }

    /// Token ids of a padded batch as a (B, L) tensor on the policy's device.
    pub(crate) fn ids_tensor(&self, rows: &[Vec<i64>]) -> Tensor {
        let l = rows.first().map_or(0, Vec::len) as i64;
        let flat: Vec<i64> = rows.iter().flatten().copied().collect();
        Tensor::from_slice(&flat).reshape([rows.len() as i64, l]).to_device(self.device())
    }

    /// The id used to pad batches: `pad_token_id`, else the first EOS id, else 0.
    pub(crate) fn pad_id(&self) -> i64 {
        let c = &self.lm.config;
        c.pad_token_id.or_else(|| c.eos_token_ids.first().copied()).unwrap_or(0)
    }
}
