//! GGUF (llama.cpp's format) → a Hugging Face folder.
//!
//! ```text
//! file.gguf ─ header: metadata key/values, tensor infos (name, dims, type, offset)
//!           ─ data: tensors, each F32/F16/BF16 or quantised in blocks
//!     │ dequantise (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q6_K), rename blk.N.* → model.layers.N.*,
//!     │ undo the Q/K row permutation of llama-architecture files
//!     ▼
//! config.json, model.safetensors (f32 or bf16), tokenizer.json, tokenizer_config.json
//! (with the chat template), generation_config.json
//! ```
//!
//! llama.cpp's converter permutes the rows of q_proj and k_proj of `llama` models so
//! that its interleaved RoPE can rotate adjacent pairs: per head, the rows
//! (h, 2, D/2) become (h, D/2, 2). Reversing that gives the checkpoint transformers'
//! half-split rotation expects. Qwen2/Qwen3 files are not permuted (NEOX rotation).
//!
//! Dequantisation follows ggml's reference `dequantize_row_*` (ggml-quants.c); a test
//! compares it with the `gguf` Python package's independent numpy implementation.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use super::Error;
use super::device::DType;
use super::weights::{WEIGHTS_FILE, write_safetensors};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    fn as_i64(&self) -> Option<i64> {
        match self {
            GgufValue::Int(v) => Some(*v),
            _ => None,
        }
    }
    fn as_f64(&self) -> Option<f64> {
        match self {
            GgufValue::Float(v) => Some(*v),
            GgufValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// ggml order: dims[0] varies fastest (the reverse of a torch shape).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

/// A parsed GGUF file, its bytes in memory.
pub struct GgufFile {
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensor>,
    data_start: usize,
    bytes: Vec<u8>,
    path: std::path::PathBuf,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or("the file ends inside its header")?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u64()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn value(&mut self, kind: u32) -> Result<GgufValue, String> {
        Ok(match kind {
            0 => GgufValue::Int(i64::from(self.take(1)?[0])),
            1 => GgufValue::Int(i64::from(self.take(1)?[0] as i8)),
            2 => GgufValue::Int(i64::from(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))),
            3 => GgufValue::Int(i64::from(i16::from_le_bytes(self.take(2)?.try_into().expect("2")))),
            4 => GgufValue::Int(i64::from(self.u32()?)),
            5 => GgufValue::Int(i64::from(self.u32()? as i32)),
            6 => GgufValue::Float(f64::from(f32::from_le_bytes(self.take(4)?.try_into().expect("4")))),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                let inner = self.u32()?;
                let n = self.u64()? as usize;
                GgufValue::Array((0..n).map(|_| self.value(inner)).collect::<Result<_, _>>()?)
            }
            10 => GgufValue::Int(self.u64()? as i64),
            11 => GgufValue::Int(self.u64()? as i64),
            12 => GgufValue::Float(f64::from_le_bytes(self.take(8)?.try_into().expect("8"))),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let format = |reason: String| Error::Format { file: path.to_path_buf(), reason };
        let mut r = Reader { bytes: &bytes, pos: 0 };
        if r.take(4).map_err(format)? != b"GGUF" {
            return Err(format("not a GGUF file (no GGUF magic)".into()));
        }
        let version = r.u32().map_err(format)?;
        if !(2..=3).contains(&version) {
            return Err(format(format!("GGUF version {version} is not supported (2, 3)")));
        }
        let n_tensors = r.u64().map_err(format)?;
        let n_kv = r.u64().map_err(format)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string().map_err(format)?;
            let kind = r.u32().map_err(format)?;
            let value = r.value(kind).map_err(|e| format(format!("metadata {key}: {e}")))?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string().map_err(format)?;
            let n_dims = r.u32().map_err(format)?;
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>, _>>().map_err(format)?;
            let ggml_type = r.u32().map_err(format)?;
            let offset = r.u64().map_err(format)?;
            tensors.push(GgufTensor { name, dims, ggml_type, offset });
        }
        let alignment = metadata.get("general.alignment").and_then(GgufValue::as_i64).unwrap_or(32) as usize;
        let data_start = r.pos.div_ceil(alignment) * alignment;
        Ok(GgufFile { metadata, tensors, data_start, bytes, path: path.to_path_buf() })
    }

    fn meta(&self, key: &str) -> Result<&GgufValue, Error> {
        self.metadata
            .get(key)
            .ok_or_else(|| Error::Format { file: self.path.clone(), reason: format!("metadata key {key} is missing") })
    }

    fn meta_i64(&self, key: &str) -> Result<i64, Error> {
        self.meta(key)?
            .as_i64()
            .ok_or_else(|| Error::Format { file: self.path.clone(), reason: format!("{key} is not an integer") })
    }

    /// A tensor dequantised to float32, in torch shape (dims reversed).
    pub fn tensor(&self, info: &GgufTensor) -> Result<Tensor, Error> {
        let numel: u64 = info.dims.iter().product();
        let (block, block_bytes) = block_size(info.ggml_type).ok_or_else(|| Error::Format {
            file: self.path.clone(),
            reason: format!("tensor {}: ggml type {} is not supported", info.name, info.ggml_type),
        })?;
        let size = (numel as usize).div_ceil(block) * block_bytes;
        let start = self.data_start + info.offset as usize;
        let data = self.bytes.get(start..start + size).ok_or_else(|| Error::Format {
            file: self.path.clone(),
            reason: format!("tensor {}: data lies past the end of the file", info.name),
        })?;
        let values = dequantize(info.ggml_type, data, numel as usize).map_err(|reason| Error::Format {
            file: self.path.clone(),
            reason: format!("tensor {}: {reason}", info.name),
        })?;
        let shape: Vec<i64> = info.dims.iter().rev().map(|&d| d as i64).collect();
        Ok(Tensor::from_slice(&values).reshape(shape))
    }
}

/// (values per block, bytes per block) of a ggml type.
pub fn block_size(ggml_type: u32) -> Option<(usize, usize)> {
    Some(match ggml_type {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        30 => (1, 2),     // BF16
        2 => (32, 18),    // Q4_0: f16 d, 16 bytes of nibbles
        3 => (32, 20),    // Q4_1: f16 d, f16 m, 16 bytes
        6 => (32, 22),    // Q5_0: f16 d, u32 high bits, 16 bytes
        7 => (32, 24),    // Q5_1: f16 d, f16 m, u32 high bits, 16 bytes
        8 => (32, 34),    // Q8_0: f16 d, 32 int8
        12 => (256, 144), // Q4_K: f16 d, f16 dmin, 12 bytes scales, 128 bytes
        14 => (256, 210), // Q6_K: 128 low, 64 high, 16 int8 scales, f16 d
        _ => return None,
    })
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises `numel` values of ggml type `ggml_type` (ggml's `dequantize_row_*`).
pub fn dequantize(ggml_type: u32, data: &[u8], numel: usize) -> Result<Vec<f32>, String> {
    let (block, block_bytes) =
        block_size(ggml_type).ok_or_else(|| format!("ggml type {ggml_type} is not supported"))?;
    if !numel.is_multiple_of(block) {
        return Err(format!("{numel} values are not whole blocks of {block}"));
    }
    if data.len() < numel / block * block_bytes {
        return Err(format!("{} bytes hold fewer than {numel} values", data.len()));
    }
    let mut out = Vec::with_capacity(numel);
    for b in data.chunks_exact(block_bytes).take(numel / block) {
        match ggml_type {
            0 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            1 => out.push(f16_at(b, 0)),
            30 => out.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            2 => {
                let (d, qs) = (f16_at(b, 0), &b[2..18]);
                out.extend(qs.iter().map(|q| ((q & 0xF) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|q| ((q >> 4) as i32 - 8) as f32 * d));
            }
            3 => {
                let (d, m, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..20]);
                out.extend(qs.iter().map(|q| (q & 0xF) as f32 * d + m));
                out.extend(qs.iter().map(|q| (q >> 4) as f32 * d + m));
            }
            6 | 7 => {
                let (d, m, rest) =
                    if ggml_type == 6 { (f16_at(b, 0), 0.0, &b[2..]) } else { (f16_at(b, 0), f16_at(b, 2), &b[4..]) };
                let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let qs = &rest[4..20];
                let offset = if ggml_type == 6 { 16 } else { 0 };
                let low: Vec<f32> = (0..16)
                    .map(|j| {
                        let high = ((qh >> j) << 4) & 0x10;
                        (((qs[j] & 0x0F) as u32 | high) as i32 - offset) as f32 * d + m
                    })
                    .collect();
                let upper: Vec<f32> = (0..16)
                    .map(|j| {
                        let high = (qh >> (j + 12)) & 0x10;
                        (((qs[j] >> 4) as u32 | high) as i32 - offset) as f32 * d + m
                    })
                    .collect();
                out.extend(low);
                out.extend(upper);
            }
            8 => {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| (q as i8) as f32 * d));
            }
            12 => dequantize_q4_k(b, &mut out),
            14 => dequantize_q6_k(b, &mut out),
            _ => unreachable!("block_size accepted the type"),
        }
    }
    Ok(out)
}

/// The j-th 6-bit (scale, min) pair of a Q4_K block's 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn dequantize_q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    // Four groups of 64 values: 32 low nibbles with one scale, 32 high nibbles with the next.
    for group in 0..4 {
        let q = &qs[group * 32..group * 32 + 32];
        let (sc1, m1) = scale_min_k4(2 * group, scales);
        let (sc2, m2) = scale_min_k4(2 * group + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(q.iter().map(|&x| d1 * (x & 0xF) as f32 - min1));
        out.extend(q.iter().map(|&x| d2 * (x >> 4) as f32 - min2));
    }
}

fn dequantize_q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    // Two halves of 128 values; each value is 4 low bits from ql and 2 high bits from qh.
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[half * 64..], &qh[half * 32..], &sc[half * 8..]);
        let mut y = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ImportSummary {
    pub architecture: String,
    pub tensors: usize,
    pub parameters: u64,
    pub vocab_size: usize,
    pub dtype: String,
}

/// Inverse of llama.cpp's `permute` of q/k rows: (h, D/2, 2, in) → (h, 2, D/2, in).
fn unpermute(w: &Tensor, heads: i64) -> Tensor {
    let (rows, cols) = w.size2().expect("a 2-d projection");
    w.reshape([heads, rows / heads / 2, 2, cols]).transpose(1, 2).reshape([rows, cols])
}

/// Maps a GGUF tensor name to its Hugging Face key.
fn hf_name(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_owned());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (module, kind) = tail.rsplit_once('.')?;
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// f32 metadata is stored as f32: print it as the shortest f32 so 1e-5 stays 1e-5.
fn f32_clean(v: f64) -> f64 {
    (v as f32).to_string().parse().unwrap_or(v)
}

/// Converts a GGUF file into a Hugging Face folder at `out`.
pub fn import(path: &Path, out: &Path, dtype: DType) -> Result<ImportSummary, Error> {
    let file = GgufFile::open(path)?;
    let format = |reason: String| Error::Format { file: path.to_path_buf(), reason };
    let arch = file.meta("general.architecture")?.as_str().unwrap_or_default().to_owned();
    let (class, model_type) = match arch.as_str() {
        "llama" => ("LlamaForCausalLM", "llama"),
        "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
        "qwen3" => ("Qwen3ForCausalLM", "qwen3"),
        other => return Err(format(format!("architecture {other:?} is not supported (llama, qwen2, qwen3)"))),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = file.meta_i64(&key("embedding_length"))?;
    let heads = file.meta_i64(&key("attention.head_count"))?;
    let kv_heads = file.meta(&key("attention.head_count_kv")).ok().and_then(GgufValue::as_i64).unwrap_or(heads);
    let head_dim = file.meta(&key("attention.key_length")).ok().and_then(GgufValue::as_i64).unwrap_or(hidden / heads);
    let tokens: Vec<String> = match file.meta("tokenizer.ggml.tokens")? {
        GgufValue::Array(items) => items.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect(),
        _ => return Err(format("tokenizer.ggml.tokens is not a list".into())),
    };
    let vocab_size = file.meta(&key("vocab_size")).ok().and_then(GgufValue::as_i64).unwrap_or(tokens.len() as i64);
    let tied = !file.tensors.iter().any(|t| t.name == "output.weight");
    let id = |k: &str| file.metadata.get(k).and_then(GgufValue::as_i64);
    let (bos, eos, pad) =
        (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"), id("tokenizer.ggml.padding_token_id"));
    let kind = match dtype {
        DType::F32 => Kind::Float,
        DType::Bf16 => Kind::BFloat16,
        DType::F16 => Kind::Half,
    };
    let dtype_name = match dtype {
        DType::F32 => "float32",
        DType::Bf16 => "bfloat16",
        DType::F16 => "float16",
    };

    // 1. Weights: dequantise, rename, un-permute q/k of llama files.
    let mut tensors = Vec::with_capacity(file.tensors.len());
    let mut parameters = 0u64;
    let has_qkv_bias = file.tensors.iter().any(|t| t.name.ends_with("attn_q.bias"));
    for info in &file.tensors {
        let name = hf_name(&info.name)
            .ok_or_else(|| format(format!("tensor {} has no Hugging Face counterpart", info.name)))?;
        let mut t = file.tensor(info)?;
        if arch == "llama" {
            if name.ends_with("q_proj.weight") {
                t = unpermute(&t, heads);
            } else if name.ends_with("k_proj.weight") {
                t = unpermute(&t, kv_heads);
            } else if name.ends_with("q_proj.bias") || name.ends_with("k_proj.bias") {
                let h = if name.contains("q_proj") { heads } else { kv_heads };
                t = unpermute(&t.unsqueeze(1), h).squeeze_dim(1);
            }
        }
        parameters += t.numel() as u64;
        tensors.push((name, t.to_kind(kind)));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    write_safetensors(&out.join(WEIGHTS_FILE), &tensors)?;

    // 2. config.json, as transformers writes it for this family.
    let mut config = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": file.meta_i64(&key("feed_forward_length"))?,
        "num_hidden_layers": file.meta_i64(&key("block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": file.meta_i64(&key("context_length"))?,
        "rms_norm_eps": f32_clean(file.meta(&key("attention.layer_norm_rms_epsilon"))?.as_f64().unwrap_or(1e-6)),
        "rope_theta": f32_clean(file.meta(&key("rope.freq_base")).ok().and_then(GgufValue::as_f64).unwrap_or(10000.0)),
        "tie_word_embeddings": tied,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": true,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "dtype": dtype_name,
    });
    if model_type == "llama" {
        config["attention_bias"] = has_qkv_bias.into();
        config["mlp_bias"] = false.into();
    }
    write_pretty(&out.join("config.json"), &config)?;
    write_pretty(
        &out.join("generation_config.json"),
        &json!({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}),
    )?;

    // 3. Tokenizer.
    let tokenizer = tokenizer_json(&file, &tokens).map_err(format)?;
    write_pretty(&out.join("tokenizer.json"), &tokenizer)?;
    let token_text = |id: Option<i64>| id.and_then(|i| tokens.get(i as usize)).cloned();
    let mut tokenizer_config = json!({
        "add_bos_token": file.metadata.get("tokenizer.ggml.add_bos_token") == Some(&GgufValue::Bool(true)),
        "add_prefix_space": false,
        "bos_token": token_text(bos),
        "eos_token": token_text(eos),
        "pad_token": token_text(pad),
        "unk_token": token_text(id("tokenizer.ggml.unknown_token_id")),
        "clean_up_tokenization_spaces": false,
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(template) = file.metadata.get("tokenizer.chat_template").and_then(GgufValue::as_str) {
        tokenizer_config["chat_template"] = template.into();
    }
    write_pretty(&out.join("tokenizer_config.json"), &tokenizer_config)?;
    Ok(ImportSummary {
        architecture: class.into(),
        tensors: tensors.len(),
        parameters,
        vocab_size: vocab_size as usize,
        dtype: dtype_name.into(),
    })
}

fn write_pretty(path: &Path, value: &Value) -> Result<(), Error> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| Error::Format { file: path.into(), reason: e.to_string() })?;
    std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))
}

/// A byte-level BPE `tokenizer.json` from the GGUF vocabulary and merges, with the
/// pre-tokenizer the file's `tokenizer.ggml.pre` names (as in the original tokenizer.json).
fn tokenizer_json(file: &GgufFile, tokens: &[String]) -> Result<Value, String> {
    let model = file.metadata.get("tokenizer.ggml.model").and_then(GgufValue::as_str).unwrap_or_default();
    if model != "gpt2" {
        return Err(format!("tokenizer.ggml.model {model:?} is not supported (gpt2: byte-level BPE)"));
    }
    let merges: Vec<Value> = match file.metadata.get("tokenizer.ggml.merges") {
        Some(GgufValue::Array(items)) => items.iter().filter_map(|v| v.as_str().map(Value::from)).collect(),
        _ => return Err("tokenizer.ggml.merges is missing".into()),
    };
    let types: Vec<i64> = match file.metadata.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(items)) => items.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let vocab: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), Value::from(i))).collect();
    // Control (3) and user-defined (4) tokens are added tokens; control ones are special.
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == 3 || **ty == 4)
        .map(|(i, (t, ty))| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": *ty != 3, "special": *ty == 3})
        })
        .collect();
    let pre = file.metadata.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let (normalizer, pre_tokenizer) = match pre {
        "default" | "gpt2" => (Value::Null, byte_level(true)),
        // SmolLM's tokenizer.json: single digits, then GPT-2's byte-level split.
        "smollm" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                 "behavior": "Isolated", "invert": false},
                byte_level(false)]}),
        ),
        other => return Err(format!("pre-tokenizer {other:?} is not supported (default, gpt2, smollm, qwen2)")),
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_and_q8_0_blocks_dequantise_by_hand() {
        // Q4_0: d = 0.5 (f16 0x3800); nibble q gives (q − 8)·d.
        let mut block = vec![0x00, 0x38];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(2, &block, 32).unwrap();
        assert_eq!(v[0], -4.0);
        assert_eq!(v[15], 3.5);
        assert_eq!(v[16], 3.5);
        assert_eq!(v[31], -4.0);
        // Q8_0: d = 2.0 (f16 0x4000), int8 values.
        let mut block = vec![0x00, 0x40];
        block.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
        let v = dequantize(8, &block, 32).unwrap();
        assert_eq!((v[0], v[16], v[31]), (-32.0, 0.0, 30.0));
    }

    #[test]
    fn unpermute_inverts_llama_cpps_permute() {
        // llama.cpp: w.reshape(h, 2, D/2, in).swapaxes(1, 2).reshape(w.shape)
        let w = Tensor::arange(8 * 3, (Kind::Float, tch::Device::Cpu)).reshape([8, 3]);
        let permuted = w.reshape([2, 2, 2, 3]).transpose(1, 2).reshape([8, 3]);
        assert!(unpermute(&permuted, 2).equal(&w));
    }

    #[test]
    fn gguf_names_map_to_hf_keys() {
        assert_eq!(hf_name("blk.7.attn_output.weight").as_deref(), Some("model.layers.7.self_attn.o_proj.weight"));
        assert_eq!(hf_name("blk.0.ffn_norm.weight").as_deref(), Some("model.layers.0.post_attention_layernorm.weight"));
        assert_eq!(hf_name("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(hf_name("blk.0.something.weight"), None);
    }
}
