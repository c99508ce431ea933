//! Reading and writing `*.safetensors` as transformers does, and where a new model's
//! tensors come from ([`Weights`]: files or a seeded random initialisation).
//!
//! A checkpoint is `model.safetensors`, or shards named by `model.safetensors.index.json`
//! (`{"weight_map": {tensor: file}}`). Every error names the file and the tensor.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use super::Error;
use crate::rng::{Counter, combine, tensor_key};

/// The single-file weights name transformers writes.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: u64,
    end: u64,
}

/// The tensors of one checkpoint, over one file or several shards. Only the headers are
/// read up front; each tensor is read from its file when asked for, so loading a model
/// holds one tensor's bytes at a time, never a whole file.
pub struct SafetensorsSet {
    files: Vec<(PathBuf, File)>,
    entries: HashMap<String, Entry>,
}

impl SafetensorsSet {
    /// `dir/model.safetensors`, or the shards `dir/model.safetensors.index.json` names.
    pub fn open_dir(dir: &Path) -> Result<SafetensorsSet, Error> {
        let single = dir.join(WEIGHTS_FILE);
        match shard_names(dir)? {
            Some(map) => {
                let mut shards: Vec<&String> = map.values().collect();
                shards.sort();
                shards.dedup();
                let set = SafetensorsSet::open_files(&shards.iter().map(|s| dir.join(s)).collect::<Vec<_>>())?;
                for (tensor, file) in &map {
                    match set.entries.get(tensor) {
                        Some(entry) if set.files[entry.file].0.ends_with(file) => {}
                        _ => return Err(Error::MissingTensor { file: dir.join(file), tensor: tensor.clone() }),
                    }
                }
                Ok(set)
            }
            None if single.exists() => SafetensorsSet::open_files(&[single]),
            None => Err(Error::MissingFile { file: single, what: "model weights (or model.safetensors.index.json)" }),
        }
    }

    /// Opens files and reads their headers; a tensor name must not appear twice.
    pub fn open_files(paths: &[PathBuf]) -> Result<SafetensorsSet, Error> {
        let mut set = SafetensorsSet { files: Vec::new(), entries: HashMap::new() };
        for path in paths {
            let mut file = File::open(path).map_err(|source| Error::io(path, source))?;
            let (header, metadata) = header_of(&mut file, path)?;
            let len = file.metadata().map_err(|source| Error::io(path, source))?.len();
            let index = set.files.len();
            for (name, info) in metadata.tensors() {
                let (start, end) = info.data_offsets;
                let (start, end) = (8 + header + start as u64, 8 + header + end as u64);
                let bytes = info.shape.iter().product::<usize>() * info.dtype.size();
                if end > len || start > end || (end - start) as usize != bytes {
                    return Err(Error::Format {
                        file: path.clone(),
                        reason: format!("tensor {name}: its data offsets do not fit the file ({len} bytes)"),
                    });
                }
                let entry = Entry { file: index, dtype: info.dtype, shape: info.shape.clone(), start, end };
                if let Some(previous) = set.entries.insert(name.clone(), entry) {
                    return Err(Error::Format {
                        file: path.clone(),
                        reason: format!("tensor {name} also appears in {}", set.files[previous.file].0.display()),
                    });
                }
            }
            set.files.push((path.clone(), file));
        }
        Ok(set)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The file a tensor lives in (or the first file, for a tensor that is missing).
    pub fn file_of(&self, name: &str) -> PathBuf {
        let index = self.entries.get(name).map_or(0, |e| e.file);
        self.files.get(index).map(|f| f.0.clone()).unwrap_or_default()
    }

    /// Shape and dtype as stored.
    pub fn info(&self, name: &str) -> Option<(Vec<usize>, Kind)> {
        let e = self.entries.get(name)?;
        Some((e.shape.clone(), kind_of(e.dtype).ok()?))
    }

    /// One tensor, checked against the expected shape, converted to `kind` on `device`.
    pub fn tensor(&self, name: &str, shape: &[i64], kind: Kind, device: Device) -> Result<Tensor, Error> {
        use std::os::unix::fs::FileExt;
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| Error::MissingTensor { file: self.file_of(name), tensor: name.to_owned() })?;
        let (path, file) = &self.files[entry.file];
        let found: Vec<i64> = entry.shape.iter().map(|&d| d as i64).collect();
        if found != shape {
            return Err(Error::Shape { file: path.clone(), tensor: name.to_owned(), expected: shape.to_vec(), found });
        }
        let stored = kind_of(entry.dtype)
            .map_err(|reason| Error::Format { file: path.clone(), reason: format!("tensor {name}: {reason}") })?;
        let mut bytes = vec![0u8; (entry.end - entry.start) as usize];
        file.read_exact_at(&mut bytes, entry.start).map_err(|source| Error::io(path, source))?;
        let tensor = Tensor::f_from_data_size(&bytes, shape, stored)
            .map_err(|e| Error::Format { file: path.clone(), reason: format!("tensor {name}: {e}") })?;
        Ok(tensor.to_device(device).to_kind(kind))
    }
}

/// The tensor → shard map of `dir/model.safetensors.index.json`, if the folder has one.
pub fn shard_names(dir: &Path) -> Result<Option<BTreeMap<String, String>>, Error> {
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if !index.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&index).map_err(|source| Error::io(&index, source))?;
    let parsed: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Format { file: index.clone(), reason: format!("not valid JSON: {e}") })?;
    let map = parsed
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Format { file: index.clone(), reason: "no `weight_map` object".into() })?;
    let mut names = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().filter(|f| !f.contains('/') && !f.is_empty()).ok_or_else(|| Error::Format {
            file: index.clone(),
            reason: format!("tensor {tensor}: its shard must be a file name beside the index"),
        })?;
        names.insert(tensor.clone(), file.to_string());
    }
    Ok(Some(names))
}

/// The header length and metadata of an open safetensors file.
fn header_of(file: &mut File, path: &Path) -> Result<(u64, Metadata), Error> {
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|source| Error::io(path, source))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(Error::Format { file: path.into(), reason: format!("header of {n} bytes is not plausible") });
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(|source| Error::io(path, source))?;
    let metadata: Metadata = serde_json::from_slice(&header)
        .map_err(|e| Error::Format { file: path.into(), reason: format!("not a safetensors header: {e}") })?;
    Ok((n, metadata))
}

fn kind_of(dtype: Dtype) -> Result<Kind, String> {
    Ok(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F64 => Kind::Double,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        other => return Err(format!("dtype {other:?} is not supported")),
    })
}

fn dtype_of(kind: Kind) -> Result<Dtype, String> {
    Ok(match kind {
        Kind::Float => Dtype::F32,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Double => Dtype::F64,
        Kind::Int64 => Dtype::I64,
        Kind::Int => Dtype::I32,
        Kind::Int8 => Dtype::I8,
        Kind::Uint8 => Dtype::U8,
        Kind::Bool => Dtype::BOOL,
        other => return Err(format!("kind {other:?} cannot be saved")),
    })
}

/// Writes tensors as transformers does: CPU, contiguous, header metadata `{"format": "pt"}`.
/// Returns the file's sha256.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<String, Error> {
    write_safetensors_with(path, tensors, &[])
}

/// [`write_safetensors`] with more header metadata beside `format`. The data is written
/// one tensor at a time (a model is never copied whole) and hashed as it is written,
/// under a temporary name then renamed, so a crash never leaves a half file.
pub(crate) fn write_safetensors_with(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &[(&str, String)],
) -> Result<String, Error> {
    let format = |reason: String| Error::Format { file: path.into(), reason };
    let mut order: Vec<&(String, Tensor)> = tensors.iter().collect();
    order.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    let mut meta: BTreeMap<&str, String> = BTreeMap::from([("format", "pt".to_owned())]);
    meta.extend(metadata.iter().map(|(k, v)| (*k, v.clone())));
    header.insert("__metadata__".into(), serde_json::json!(meta));
    let mut offset = 0usize;
    for (name, tensor) in &order {
        let dtype = dtype_of(tensor.kind()).map_err(|reason| format(format!("tensor {name}: {reason}")))?;
        let bytes = tensor.numel() * tensor.kind().elt_size_in_bytes();
        let entry =
            serde_json::json!({"dtype": dtype, "shape": tensor.size(), "data_offsets": [offset, offset + bytes]});
        header.insert(name.clone(), entry);
        offset += bytes;
    }
    let mut header = serde_json::to_vec(&header).map_err(|e| format(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let tmp = path.with_extension("safetensors.partial");
    let mut out = HashingWriter::create(&tmp)?;
    out.write(&(header.len() as u64).to_le_bytes())?;
    out.write(&header)?;
    for (name, tensor) in order {
        let cpu = tensor.detach().to_device(Device::Cpu).contiguous();
        let numel = cpu.numel();
        let mut bytes = vec![0u8; numel * cpu.kind().elt_size_in_bytes()];
        cpu.f_copy_data_u8(&mut bytes, numel)
            .map_err(|e| Error::Torch { context: format!("copying {name}"), source: e })?;
        out.write(&bytes)?;
    }
    let sha256 = out.finish()?;
    std::fs::rename(&tmp, path).map_err(|source| Error::io(path, source))?;
    Ok(sha256)
}

/// Files written to disk with their sha256 computed on the way.
struct HashingWriter {
    path: PathBuf,
    file: std::io::BufWriter<File>,
    hasher: Sha256,
}

impl HashingWriter {
    fn create(path: &Path) -> Result<HashingWriter, Error> {
        let file = File::create(path).map_err(|source| Error::io(path, source))?;
        Ok(HashingWriter {
            path: path.into(),
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.hasher.update(bytes);
        self.file.write_all(bytes).map_err(|source| Error::io(&self.path, source))
    }

    fn finish(self) -> Result<String, Error> {
        let path = self.path;
        let file = self.file.into_inner().map_err(|e| Error::io(&path, e.into_error()))?;
        file.sync_all().map_err(|source| Error::io(&path, source))?;
        Ok(hex::encode(self.hasher.finalize()))
    }
}

/// Shards transformers would start a new one after: its `save_pretrained` default.
pub const MAX_SHARD_BYTES: usize = 5_000_000_000;

/// Writes a model's tensors as `model.safetensors`, or, when they take more than
/// `max_shard_bytes`, as shards `model-0000i-of-0000n.safetensors` (filled in name order)
/// with `model.safetensors.index.json`, as transformers' `save_pretrained` does. Returns
/// every written file with its sha256.
pub fn write_weights(
    dir: &Path,
    tensors: &[(String, Tensor)],
    max_shard_bytes: usize,
) -> Result<Vec<(String, String)>, Error> {
    let size = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let mut order: Vec<&(String, Tensor)> = tensors.iter().collect();
    order.sort_by(|a, b| a.0.cmp(&b.0));
    let mut shards: Vec<(Vec<(String, Tensor)>, usize)> = vec![(Vec::new(), 0)];
    for (name, tensor) in order {
        let last = shards.last_mut().expect("one shard at least");
        if last.1 > 0 && last.1 + size(tensor) > max_shard_bytes {
            shards.push((Vec::new(), 0));
        }
        let last = shards.last_mut().expect("one shard at least");
        last.0.push((name.clone(), tensor.shallow_clone()));
        last.1 += size(tensor);
    }
    if shards.len() == 1 {
        let sha256 = write_safetensors(&dir.join(WEIGHTS_FILE), &shards[0].0)?;
        return Ok(vec![(WEIGHTS_FILE.to_string(), sha256)]);
    }
    let n = shards.len();
    let mut written = Vec::with_capacity(n + 1);
    let mut weight_map = BTreeMap::new();
    let total: usize = shards.iter().map(|s| s.1).sum();
    for (i, (shard, _)) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        weight_map.extend(shard.iter().map(|(tensor, _)| (tensor.clone(), name.clone())));
        written.push((name.clone(), write_safetensors(&dir.join(&name), shard)?));
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let mut text = serde_json::to_string_pretty(&index).expect("an index serialises");
    text.push('\n');
    let path = dir.join(WEIGHTS_INDEX_FILE);
    std::fs::write(&path, &text).map_err(|source| Error::io(&path, source))?;
    written.push((WEIGHTS_INDEX_FILE.to_string(), hex::encode(Sha256::digest(text.as_bytes()))));
    Ok(written)
}

/// The identity of a model's weights: the sha256 of `model.safetensors`, or for shards,
/// the sha256 of their `<file> <sha256>` lines (index included), sorted by file name.
pub fn weights_digest(files: &[(String, String)]) -> String {
    match files {
        [(_, sha256)] => sha256.clone(),
        _ => {
            let mut lines: Vec<String> = files.iter().map(|(name, sha)| format!("{name} {sha}\n")).collect();
            lines.sort();
            hex::encode(Sha256::digest(lines.concat().as_bytes()))
        }
    }
}

/// Whether a file of a Hugging Face folder holds (or indexes) its weights.
pub fn is_weight_file(name: &str) -> bool {
    name == WEIGHTS_FILE || name == WEIGHTS_INDEX_FILE || (name.starts_with("model-") && name.ends_with(".safetensors"))
}

/// Tensor name → (dtype, shape), as a safetensors header lists them.
pub type TensorShapes = BTreeMap<String, (String, Vec<usize>)>;

/// The header of a safetensors file: its metadata and tensor shapes, for checks.
pub fn read_header(path: &Path) -> Result<(HashMap<String, String>, TensorShapes), Error> {
    let mut file = File::open(path).map_err(|source| Error::io(path, source))?;
    let (_, metadata) = header_of(&mut file, path)?;
    let tensors =
        metadata.tensors().into_iter().map(|(k, v)| (k, (format!("{:?}", v.dtype), v.shape.clone()))).collect();
    Ok((metadata.metadata().clone().unwrap_or_default(), tensors))
}

/// How a tensor of a freshly made model is initialised (transformers' `_init_weights`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    /// Normal(0, std): linear and embedding weights.
    Normal(f64),
    /// Uniform(-bound, bound): LoRA A (kaiming-uniform with a = √5, as PEFT).
    Uniform(f64),
    /// Biases, LoRA B.
    Zeros,
    /// RMSNorm weights.
    Ones,
}

/// Where the tensors of a model being built come from.
pub(crate) enum Weights<'a> {
    /// A checkpoint's files.
    Files(&'a SafetensorsSet),
    /// Seeded random values: tensor `name` draws from the stream keyed by (seed, name),
    /// so its values do not depend on the order of construction.
    Random { seed: u64 },
}

impl Weights<'_> {
    pub(crate) fn get(
        &self,
        name: &str,
        shape: &[i64],
        init: Init,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor, Error> {
        match self {
            Weights::Files(set) => set.tensor(name, shape, kind, device),
            Weights::Random { seed } => {
                Ok(random_tensor(combine(*seed, tensor_key(name)), shape, init).to_device(device).to_kind(kind))
            }
        }
    }
}

/// A float32 CPU tensor with values from the stream `key`.
pub(crate) fn random_tensor(key: u64, shape: &[i64], init: Init) -> Tensor {
    match init {
        Init::Zeros => Tensor::zeros(shape, (Kind::Float, Device::Cpu)),
        Init::Ones => Tensor::ones(shape, (Kind::Float, Device::Cpu)),
        Init::Normal(std) => {
            let numel: i64 = shape.iter().product();
            let mut stream = Counter::new(key);
            let values: Vec<f32> = (0..numel).map(|_| (stream.next_normal() * std) as f32).collect();
            Tensor::from_slice(&values).reshape(shape)
        }
        Init::Uniform(bound) => {
            let numel: i64 = shape.iter().product();
            let mut stream = Counter::new(key);
            let values: Vec<f32> = (0..numel).map(|_| ((stream.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
            Tensor::from_slice(&values).reshape(shape)
        }
    }
}
