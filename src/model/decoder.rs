//! The decoder of the Llama, Qwen2 and Qwen3 families, in forward order:
//! rotary → RMSNorm → linear (+ LoRA) → MLP → attention → layer → `Model` → `CausalLm`.
//!
//! The three families are one network that differs only in which tensors exist
//! ([`ModelConfig`]: q/k/v and o biases, MLP biases, per-head q/k RMSNorm, tied lm_head),
//! so one set of blocks serves all three and [`Architecture`](super::Architecture) picks
//! the tensors. VarStore paths are the Hugging Face safetensors keys
//! (`model.layers.3.self_attn.q_proj.weight`), and each field is named after its key's
//! last segment, so saving the VarStore writes a checkpoint transformers loads, and LoRA
//! finds `q_proj` by name.
//!
//! Shapes: B batch rows, L new positions, S positions attended to (cache + new), H query
//! heads, K key/value heads, D head width, E hidden size, V vocabulary.

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::Error;
use super::config::{ModelConfig, RopeScaling};
use super::decode_attention::{self, SharedColumns};
use super::kv_cache::{KvCache, Placement};
use super::lora::{LoraWeights, Route};
use super::packed_linear::{PackedWeight, packable};
use super::weights::{Init, Weights};

/// Adds a tensor from `weights` under `path.name` to the VarStore.
fn param(path: &Path, name: &str, shape: &[i64], init: Init, weights: &Weights) -> Result<Tensor, Error> {
    let full = path.path(name);
    let tensor = weights.get(&full, shape, init, path.kind(), path.device())?;
    Ok(path.add(name, tensor, true))
}

// ---------------------------------------------------------------------------------------
// Rotary position embedding

/// Inverse frequencies of rotary embeddings, computed as transformers does (float32).
#[derive(Debug)]
pub(crate) struct Rotary {
    /// (D/2,) float32.
    inv_freq: Tensor,
}

impl Rotary {
    fn new(cfg: &ModelConfig, device: tch::Device) -> Rotary {
        let dim = cfg.head_dim as i64;
        // inv_freq = 1 / base^(arange(0, D, 2) / D), in float32 like `_compute_default_rope_parameters`.
        let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device)).to_kind(Kind::Float) / dim as f64;
        let mut inv_freq = Tensor::pow_scalar(cfg.rope_theta, &exponent).reciprocal();
        if let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } =
            cfg.rope_scaling
        {
            // transformers `_compute_llama3_parameters`: long wavelengths are slowed by
            // `factor`, short ones kept, and the band between interpolated.
            let old = original_max_position_embeddings as f64;
            let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
            let wavelen = (inv_freq.reciprocal()) * (2.0 * std::f64::consts::PI);
            let scaled = inv_freq.where_self(&wavelen.le(low_wavelen), &(&inv_freq / factor));
            let smooth = (old / &wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            let smoothed: Tensor = (1.0 - &smooth) * &scaled / factor + &smooth * &scaled;
            let medium = wavelen.ge(high_wavelen).logical_and(&wavelen.le(low_wavelen));
            inv_freq = smoothed.where_self(&medium, &scaled);
        }
        Rotary { inv_freq }
    }

    /// cos and sin for positions (B, L): each (B, 1, L, D), in `kind`.
    pub(crate) fn cos_sin(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        // (B, L, 1) · (D/2,) → (B, L, D/2); one product per element, as transformers' matmul.
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }

    /// cos and sin for M-RoPE positions (3, B, L) (temporal, row, column), each (B, 1, L,
    /// D) in `kind`: the frequencies split into `sections` (summing to D/2), the i-th
    /// section turning with axis i mod 3, as Qwen2.5-VL's language model does.
    pub(crate) fn cos_sin_mrope(&self, positions: &Tensor, sections: &[i64], kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq; // (3, B, L, D/2)
        let parts = freqs.split_with_sizes(sections, -1);
        let picked: Vec<Tensor> = parts.iter().enumerate().map(|(i, part)| part.get((i % 3) as i64)).collect();
        let freqs = Tensor::cat(&picked, -1);
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }
}

/// x·cos + rotate_half(x)·sin, with rotate_half(x) = cat(−x₂, x₁) over the last dim.
pub(crate) fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size().last().copied().expect("a last dim") / 2;
    let rotated = Tensor::cat(&[-x.narrow(-1, half, half), x.narrow(-1, 0, half)], -1);
    x * cos + rotated * sin
}

// ---------------------------------------------------------------------------------------
// RMSNorm

#[derive(Debug)]
pub(crate) struct RmsNorm {
    pub(crate) weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(path: Path, size: i64, eps: f64, weights: &Weights) -> Result<RmsNorm, Error> {
        Ok(RmsNorm { weight: param(&path, "weight", &[size], Init::Ones, weights)?, eps })
    }

    /// A norm of a weight read outside a VarStore (a frozen vision tower's).
    pub(crate) fn of_weight(weight: Tensor, eps: f64) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    /// Normalises the last dim in float32, then scales in the input dtype (transformers' order).
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        // libtorch's fused kernel gives the same float32 values in one pass (1.7-4x faster
        // than the eight operations below); where a gradient flows, the composite keeps
        // the backward it was checked with.
        if x.kind() == Kind::Float && !x.requires_grad() {
            return x.rms_norm([self.weight.size()[0]], Some(&self.weight), self.eps);
        }
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let variance = x32.square().mean_dim(-1, true, Kind::Float);
        let normed = x32 * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

// ---------------------------------------------------------------------------------------
// Linear, with optional LoRA adapters

/// y = x·Wᵀ + b, plus the LoRA update of the adapter each batch row uses.
#[derive(Debug)]
pub(crate) struct Linear {
    /// (out, in).
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    /// The last segment of the HF key (`q_proj`), which LoRA targets match.
    pub(crate) name: &'static str,
    /// Full HF prefix of this layer (`model.layers.0.self_attn.q_proj`).
    pub(crate) prefix: String,
    /// Adapters by slot; `None` where an adapter does not target this layer.
    pub(crate) adapters: Vec<Option<LoraWeights>>,
    /// The weight packed for the generate call under way ([`CausalLm::pack_weights`]).
    packed: Option<PackedWeight>,
}

impl Linear {
    fn new(
        parent: &Path,
        name: &'static str,
        dims: (i64, i64),
        bias: bool,
        std: f64,
        weights: &Weights,
    ) -> Result<Linear, Error> {
        let (in_dim, out_dim) = dims;
        let sub = parent / name;
        let weight = param(&sub, "weight", &[out_dim, in_dim], Init::Normal(std), weights)?;
        let bias = if bias { Some(param(&sub, "bias", &[out_dim], Init::Zeros, weights)?) } else { None };
        let prefix = sub.components().collect::<Vec<_>>().join(".");
        Ok(Linear { weight, bias, name, prefix, adapters: Vec::new(), packed: None })
    }

    /// (…, in) → (…, out).
    pub(crate) fn forward(&self, x: &Tensor, pass: &Pass) -> Tensor {
        let y = match (&self.packed, pass.packed) {
            (Some(packed), true) => packed.forward(x, self.bias.as_ref()),
            _ => linear(x, &self.weight, self.bias.as_ref()),
        };
        pass.route.apply(&self.adapters, &self.prefix, x, y)
    }
}

/// Up to this many rows, `linear` multiplies in the weight's own orientation.
const FEW_ROWS: i64 = 256;

/// Weight rows per product in that orientation.
const WEIGHT_BLOCK: i64 = 4096;

/// x·Wᵀ + b, (…, in) → (…, out).
///
/// On CPU with few rows (decoding), MKL computes x·Wᵀ by repacking the whole weight on
/// every call; (W·xᵀ)ᵀ runs 1.2–2× faster on two threads, and a tall weight (the lm_head)
/// a further 1.4× faster in blocks of rows (measured in BENCHMARKS.md). The result is the
/// same product up to float summation order.
fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    let mut shape = x.size();
    let in_dim = *shape.last().expect("a linear input has a last dim");
    let rows = if in_dim == 0 { 0 } else { x.numel() as i64 / in_dim };
    if x.device() != tch::Device::Cpu || rows > FEW_ROWS || rows == 0 {
        return x.linear(weight, bias);
    }
    let xt = x.reshape([rows, in_dim]).tr();
    let out_dim = weight.size()[0];
    let yt = if out_dim <= WEIGHT_BLOCK {
        weight.mm(&xt)
    } else {
        Tensor::cat(&weight.split(WEIGHT_BLOCK, 0).iter().map(|w| w.mm(&xt)).collect::<Vec<_>>(), 0)
    };
    let y = yt.tr().contiguous();
    *shape.last_mut().expect("checked above") = out_dim;
    let y = y.view(shape.as_slice());
    match bias {
        Some(b) => y + b,
        None => y,
    }
}

// ---------------------------------------------------------------------------------------
// MLP

#[derive(Debug)]
pub(crate) struct Mlp {
    pub(crate) gate_proj: Linear,
    pub(crate) up_proj: Linear,
    pub(crate) down_proj: Linear,
}

impl Mlp {
    fn new(path: Path, cfg: &ModelConfig, weights: &Weights) -> Result<Mlp, Error> {
        let (e, i, std, bias) =
            (cfg.hidden_size as i64, cfg.intermediate_size as i64, cfg.initializer_range, cfg.mlp_bias);
        Ok(Mlp {
            gate_proj: Linear::new(&path, "gate_proj", (e, i), bias, std, weights)?,
            up_proj: Linear::new(&path, "up_proj", (e, i), bias, std, weights)?,
            down_proj: Linear::new(&path, "down_proj", (i, e), bias, std, weights)?,
        })
    }

    /// down(silu(gate(x)) · up(x)); (B, L, E) → (B, L, E).
    fn forward(&self, x: &Tensor, pass: &Pass) -> Tensor {
        let gate = self.gate_proj.forward(x, pass).silu();
        self.down_proj.forward(&(gate * self.up_proj.forward(x, pass)), pass)
    }
}

// ---------------------------------------------------------------------------------------
// Attention

/// Per-forward inputs shared by every layer: rotary tables, mask, cache use, adapter routing.
pub(crate) struct Pass<'a> {
    /// (B, 1, L, D) each.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// Boolean (B, 1, L, S), true where a query may attend a key; `None` with `causal` for
    /// plain causal attention over unpadded rows.
    pub(crate) mask: Option<Tensor>,
    pub(crate) causal: bool,
    /// Where this pass's keys and values go in each block's cache, if anywhere.
    pub(crate) cache: CacheStep<'a>,
    pub(crate) route: &'a Route,
    /// Multiply by the weights packed for this generate call, where packed: only the
    /// sampler's forwards, which run inside the call that packed them.
    pub(crate) packed: bool,
}

/// How a forward uses the blocks' caches ([`KvCache`]).
pub(crate) enum CacheStep<'a> {
    /// No cache: attend to this pass's own positions.
    None,
    /// Prefill: write each row's positions where the placement says, attend to its
    /// slot's columns up to them.
    Placed(&'a Placement),
    /// Decode: write slot i's one new position at column `columns[i]` ((B,) int64),
    /// attend to slots `0..B`, columns `0..span`; `shared` says which slots hold copies
    /// of another's first columns.
    Columns { columns: &'a Tensor, span: i64, shared: &'a SharedColumns },
}

#[derive(Debug)]
pub(crate) struct Attention {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    /// Qwen3: RMSNorm over D of each head of q and k.
    pub(crate) q_norm: Option<RmsNorm>,
    pub(crate) k_norm: Option<RmsNorm>,
    pub(crate) kv_cache: KvCache,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(path: Path, cfg: &ModelConfig, weights: &Weights) -> Result<Attention, Error> {
        let (e, d) = (cfg.hidden_size as i64, cfg.head_dim as i64);
        let (h, k) = (cfg.num_attention_heads as i64, cfg.num_key_value_heads as i64);
        let std = cfg.initializer_range;
        let (q_norm, k_norm) = if cfg.qk_norm {
            (
                Some(RmsNorm::new(&path / "q_norm", d, cfg.rms_norm_eps, weights)?),
                Some(RmsNorm::new(&path / "k_norm", d, cfg.rms_norm_eps, weights)?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            q_proj: Linear::new(&path, "q_proj", (e, h * d), cfg.qkv_bias, std, weights)?,
            k_proj: Linear::new(&path, "k_proj", (e, k * d), cfg.qkv_bias, std, weights)?,
            v_proj: Linear::new(&path, "v_proj", (e, k * d), cfg.qkv_bias, std, weights)?,
            o_proj: Linear::new(&path, "o_proj", (h * d, e), cfg.o_bias, std, weights)?,
            q_norm,
            k_norm,
            kv_cache: KvCache::default(),
            heads: h,
            kv_heads: k,
            head_dim: d,
        })
    }

    /// (B, L, E) → (B, L, E).
    fn forward(&mut self, x: &Tensor, pass: &Pass) -> Tensor {
        let (b, l, _) = x.size3().expect("attention input is (B, L, E)");
        let (h, k, d) = (self.heads, self.kv_heads, self.head_dim);
        // 1. Projections, split into heads: (B, L, H|K, D).
        let q = self.q_proj.forward(x, pass).view([b, l, h, d]);
        let key = self.k_proj.forward(x, pass).view([b, l, k, d]);
        let value = self.v_proj.forward(x, pass).view([b, l, k, d]);
        // 2. Qwen3 normalises each head of q and k before the rotation.
        let q = self.q_norm.as_ref().map_or(q.shallow_clone(), |n| n.forward(&q));
        let key = self.k_norm.as_ref().map_or(key.shallow_clone(), |n| n.forward(&key));
        // 3. (B, H|K, L, D), rotated by position.
        let q = apply_rotary(&q.transpose(1, 2), &pass.cos, &pass.sin);
        let key = apply_rotary(&key.transpose(1, 2), &pass.cos, &pass.sin);
        let value = value.transpose(1, 2);
        // 4. With the cache, attend to every position held so far: (B, K, S, D).
        let (key, value) = match pass.cache {
            CacheStep::None => (key, value),
            CacheStep::Placed(placement) => self.kv_cache.write_placed(placement, &key, &value),
            CacheStep::Columns { columns, span, shared } => {
                let (key, value) = self.kv_cache.write_columns(columns, span, &key, &value);
                if decode_attention::supported(&q) {
                    let y = decode_attention::attend(&q, &key, &value, columns, shared, 1.0 / (d as f64).sqrt());
                    return self.o_proj.forward(&y.transpose(1, 2).reshape([b, l, h * d]), pass);
                }
                (key, value)
            }
        };
        // 5. Scaled dot-product attention; K heads serve H/K query heads each (GQA).
        let causal = pass.causal && pass.mask.is_none() && l > 1;
        let grouped = h != k;
        let (key, value, grouped) = if grouped && expand_kv_for_mask(q.device(), pass.mask.is_some()) {
            (repeat_kv(&key, h / k), repeat_kv(&value, h / k), false)
        } else {
            (key, value, grouped)
        };
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &key,
            &value,
            pass.mask.as_ref(),
            0.0,
            causal,
            Some(1.0 / (d as f64).sqrt()),
            grouped,
        );
        // 6. Heads back together: (B, L, H·D) → (B, L, E).
        self.o_proj.forward(&y.transpose(1, 2).reshape([b, l, h * d]), pass)
    }
}

/// Whether a masked grouped-query call should repeat K/V to every query head first.
///
/// On CUDA, SDPA's kernels that take a mask (memory-efficient, cuDNN) do not take
/// `enable_gqa`, so a masked grouped call falls back to the math path (full score
/// matrices); repeating K/V keeps it on a fused kernel. On CPU the flash kernel takes
/// both, and repeating costs 10-20x (BENCHMARKS.md, "Attention call shape").
fn expand_kv_for_mask(device: tch::Device, masked: bool) -> bool {
    masked && device.is_cuda()
}

/// (B, K, S, D) → (B, K·n, S, D), each head repeated n times in place (as `enable_gqa`
/// pairs query head i with key head i / n).
fn repeat_kv(x: &Tensor, n: i64) -> Tensor {
    let (b, k, s, d) = x.size4().expect("keys are (B, K, S, D)");
    x.unsqueeze(2).expand([b, k, n, s, d], false).reshape([b, k * n, s, d])
}

// ---------------------------------------------------------------------------------------
// Decoder layer

#[derive(Debug)]
pub(crate) struct DecoderLayer {
    pub(crate) self_attn: Attention,
    pub(crate) mlp: Mlp,
    pub(crate) input_layernorm: RmsNorm,
    pub(crate) post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn new(path: Path, cfg: &ModelConfig, weights: &Weights) -> Result<DecoderLayer, Error> {
        let (e, eps) = (cfg.hidden_size as i64, cfg.rms_norm_eps);
        Ok(DecoderLayer {
            self_attn: Attention::new(&path / "self_attn", cfg, weights)?,
            mlp: Mlp::new(&path / "mlp", cfg, weights)?,
            input_layernorm: RmsNorm::new(&path / "input_layernorm", e, eps, weights)?,
            post_attention_layernorm: RmsNorm::new(&path / "post_attention_layernorm", e, eps, weights)?,
        })
    }

    /// Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(·)). (B, L, E).
    pub(crate) fn forward(&mut self, x: &Tensor, pass: &Pass) -> Tensor {
        let x = x + self.self_attn.forward(&self.input_layernorm.forward(x), pass);
        let mlp = self.mlp.forward(&self.post_attention_layernorm.forward(&x), pass);
        x + mlp
    }
}

// ---------------------------------------------------------------------------------------
// Model and CausalLm

/// Embedding, layers and final norm (`model.*`).
#[derive(Debug)]
pub(crate) struct Model {
    /// (V, E).
    pub(crate) embed_tokens: Tensor,
    pub(crate) layers: Vec<DecoderLayer>,
    pub(crate) norm: RmsNorm,
    pub(crate) rotary: Rotary,
}

/// The model plus its language-model head.
#[derive(Debug)]
pub struct CausalLm {
    pub(crate) model: Model,
    /// (V, E): the embedding itself when tied.
    pub(crate) lm_head: Tensor,
    /// The lm_head packed for the generate call under way.
    packed_head: Option<PackedWeight>,
    pub(crate) config: ModelConfig,
}

impl CausalLm {
    /// Builds the network under `root` (a VarStore root), taking tensors from `weights`.
    pub(crate) fn new(root: Path, cfg: &ModelConfig, weights: &Weights) -> Result<CausalLm, Error> {
        let (v, e) = (cfg.vocab_size as i64, cfg.hidden_size as i64);
        let model_path = &root / "model";
        let embed_path = &model_path / "embed_tokens";
        let embed_tokens = param(&embed_path, "weight", &[v, e], Init::Normal(cfg.initializer_range), weights)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(&model_path / "layers" / i, cfg, weights))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = RmsNorm::new(&model_path / "norm", e, cfg.rms_norm_eps, weights)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            param(&(&root / "lm_head"), "weight", &[v, e], Init::Normal(cfg.initializer_range), weights)?
        };
        let rotary = Rotary::new(cfg, root.device());
        Ok(CausalLm {
            model: Model { embed_tokens, layers, norm, rotary },
            lm_head,
            packed_head: None,
            config: cfg.clone(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Token ids (B, L) → final hidden states (B, L, E), through every layer.
    pub(crate) fn hidden(&mut self, input_ids: &Tensor, pass: &Pass) -> Tensor {
        let x = self.embed(input_ids);
        self.hidden_of_embeddings(x, pass)
    }

    /// The embedding rows of token ids (B, L) → (B, L, E).
    pub(crate) fn embed(&self, input_ids: &Tensor) -> Tensor {
        self.model.embed_tokens.embedding_rows(input_ids)
    }

    /// Input embeddings (B, L, E) (token rows, some replaced by an image's features) →
    /// final hidden states (B, L, E).
    pub(crate) fn hidden_of_embeddings(&mut self, mut x: Tensor, pass: &Pass) -> Tensor {
        for layer in &mut self.model.layers {
            x = layer.forward(&x, pass);
        }
        self.model.norm.forward(&x)
    }

    /// Hidden states (…, E) → logits (…, V).
    pub(crate) fn head(&self, hidden: &Tensor) -> Tensor {
        linear(hidden, &self.lm_head, None)
    }

    /// Logits of the last position only, (B, V): what sampling needs.
    pub(crate) fn logits_last(&mut self, input_ids: &Tensor, pass: &Pass) -> Tensor {
        let hidden = self.hidden(input_ids, pass);
        let last = hidden.select(1, hidden.size()[1] - 1);
        if pass.packed { self.sampling_head(&last) } else { self.head(&last) }
    }

    /// [`CausalLm::head`] by the lm_head packed for the generate call under way, if packed.
    pub(crate) fn sampling_head(&self, hidden: &Tensor) -> Tensor {
        match &self.packed_head {
            Some(packed) => packed.forward(hidden, None),
            None => self.head(hidden),
        }
    }

    /// Packs every linear weight and the lm_head for oneDNN where they can be
    /// ([`packed_linear`](super::packed_linear)) and `fits` takes the copy's bytes, for
    /// the forwards of one generate call whose passes say `packed`;
    /// [`CausalLm::unpack_weights`] drops them after.
    pub(crate) fn pack_weights(&mut self, fits: impl FnOnce(u64) -> bool) -> Result<(), Error> {
        if !packable(&self.lm_head) {
            return Ok(());
        }
        let bytes = |w: &Tensor| (w.numel() * w.kind().elt_size_in_bytes()) as u64;
        let head_bytes = bytes(&self.lm_head);
        let linears = self.linears_mut();
        if !fits(head_bytes + linears.iter().map(|l| bytes(&l.weight)).sum::<u64>()) {
            return Ok(());
        }
        for linear in linears {
            linear.packed = Some(PackedWeight::new(&linear.weight)?);
        }
        self.packed_head = Some(PackedWeight::new(&self.lm_head)?);
        Ok(())
    }

    pub(crate) fn unpack_weights(&mut self) {
        for linear in self.linears_mut() {
            linear.packed = None;
        }
        self.packed_head = None;
    }

    /// Empties every attention block's cache.
    pub(crate) fn clear_kv_cache(&mut self) {
        for layer in &mut self.model.layers {
            layer.self_attn.kv_cache.clear();
        }
    }

    /// Sets the slots and columns each cache allocates at its first write.
    pub(crate) fn reserve_kv_cache(&mut self, slots: i64, capacity: i64) {
        for layer in &mut self.model.layers {
            layer.self_attn.kv_cache.reserve(slots, capacity);
        }
    }

    /// Copies a slot's first `len` cached positions into another slot, in every cache.
    pub(crate) fn copy_kv_slot(&mut self, from: i64, to: i64, len: i64) {
        for layer in &mut self.model.layers {
            layer.self_attn.kv_cache.copy_slot(from, to, len);
        }
    }

    /// Bytes held by every cache.
    pub(crate) fn kv_cache_bytes(&self) -> u64 {
        self.model.layers.iter().map(|l| l.self_attn.kv_cache.bytes()).sum()
    }

    /// Bytes one cached position takes in every layer together (keys and values).
    pub(crate) fn kv_bytes_per_position(&self, kind: Kind) -> u64 {
        let c = &self.config;
        (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim) as u64 * kind.elt_size_in_bytes() as u64
    }

    /// Every linear layer, in HF key order, for attaching adapters.
    pub(crate) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = Vec::new();
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            out.extend([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj]);
            let m = &mut layer.mlp;
            out.extend([&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]);
        }
        out
    }
}

trait EmbeddingRows {
    fn embedding_rows(&self, ids: &Tensor) -> Tensor;
}

impl EmbeddingRows for Tensor {
    /// Rows of a (V, E) table for (B, L) ids: (B, L, E).
    fn embedding_rows(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(self, ids, -1, false, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, grouped: bool) -> Tensor {
        Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, false, None, grouped)
    }

    #[test]
    fn fused_rms_norm_gives_what_the_composite_gives() {
        tch::manual_seed(4);
        let opts = (Kind::Float, tch::Device::Cpu);
        let norm = RmsNorm { weight: Tensor::randn([48], opts), eps: 1e-6 };
        let x = Tensor::randn([3, 5, 48], opts) * 3.0;
        let fused = norm.forward(&x);
        // A tensor that needs a gradient takes the composite path.
        let composite = norm.forward(&x.copy().set_requires_grad(true)).detach();
        let diff = f64::try_from((fused - composite).abs().max()).unwrap();
        assert!(diff < 1e-6, "fused and composite RMSNorm differ by {diff}");
    }

    #[test]
    fn masked_grouped_attention_equals_repeated_heads_and_each_row_unmasked_alone() {
        tch::manual_seed(3);
        let opts = (Kind::Float, tch::Device::Cpu);
        // Decode shape: 3 rows, 6 query heads over 2 key heads, 7 cached columns.
        let q = Tensor::randn([3, 6, 1, 8], opts);
        let k = Tensor::randn([3, 2, 7, 8], opts);
        let v = Tensor::randn([3, 2, 7, 8], opts);
        let lens = [7i64, 4, 1];
        let mask = Tensor::arange(7, (Kind::Int64, tch::Device::Cpu))
            .view([1, 1, 1, 7])
            .lt_tensor(&Tensor::from_slice(&lens).view([3, 1, 1, 1]));
        let grouped = attend(&q, &k, &v, Some(&mask), true);
        let repeated = attend(&q, &repeat_kv(&k, 3), &repeat_kv(&v, 3), Some(&mask), false);
        assert!(grouped.allclose(&repeated, 1e-6, 1e-6, false));
        for (row, &len) in lens.iter().enumerate() {
            let (qr, kr, vr) = (q.narrow(0, row as i64, 1), k.narrow(0, row as i64, 1), v.narrow(0, row as i64, 1));
            let alone = attend(&qr, &kr.narrow(2, 0, len), &vr.narrow(2, 0, len), None, true);
            assert!(grouped.narrow(0, row as i64, 1).allclose(&alone, 1e-6, 1e-6, false), "row {row}");
        }
        let everything = Tensor::ones([3, 1, 1, 7], (Kind::Bool, tch::Device::Cpu));
        assert!(attend(&q, &k, &v, Some(&everything), true).allclose(
            &attend(&q, &k, &v, None, true),
            1e-6,
            1e-6,
            false
        ));
    }
}
