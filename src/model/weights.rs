//! Reading and writing `*.safetensors` as transformers does, and where a new model's
//! tensors come from ([`Weights`]: files or a seeded random initialisation).
//!
//! A checkpoint is `model.safetensors`, or shards named by `model.safetensors.index.json`
//! (`{"weight_map": {tensor: file}}`). Every error names the file and the tensor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, SafeTensors, View};
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
    start: usize,
    end: usize,
}

/// The tensors of one checkpoint, over one file or several shards, read into memory.
pub struct SafetensorsSet {
    files: Vec<(PathBuf, Vec<u8>)>,
    entries: HashMap<String, Entry>,
}

impl SafetensorsSet {
    /// `dir/model.safetensors`, or the shards `dir/model.safetensors.index.json` names.
    pub fn open_dir(dir: &Path) -> Result<SafetensorsSet, Error> {
        let index = dir.join(WEIGHTS_INDEX_FILE);
        let single = dir.join(WEIGHTS_FILE);
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|source| Error::io(&index, source))?;
            let parsed: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::Format { file: index.clone(), reason: format!("not valid JSON: {e}") })?;
            let map = parsed
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::Format { file: index.clone(), reason: "no `weight_map` object".into() })?;
            let mut shards: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            shards.sort();
            shards.dedup();
            let set = SafetensorsSet::open_files(&shards.iter().map(|s| dir.join(s)).collect::<Vec<_>>())?;
            for (tensor, file) in map {
                let file = file.as_str().unwrap_or_default();
                match set.entries.get(tensor) {
                    Some(entry) if set.files[entry.file].0.ends_with(file) => {}
                    _ => {
                        return Err(Error::MissingTensor { file: dir.join(file), tensor: tensor.clone() });
                    }
                }
            }
            Ok(set)
        } else if single.exists() {
            SafetensorsSet::open_files(&[single])
        } else {
            Err(Error::MissingFile { file: single, what: "model weights (or model.safetensors.index.json)" })
        }
    }

    /// Reads whole files; a tensor name must not appear twice.
    pub fn open_files(paths: &[PathBuf]) -> Result<SafetensorsSet, Error> {
        let mut set = SafetensorsSet { files: Vec::new(), entries: HashMap::new() };
        for path in paths {
            let bytes = std::fs::read(path).map_err(|source| Error::io(path, source))?;
            let (header, metadata) = SafeTensors::read_metadata(&bytes)
                .map_err(|e| Error::Format { file: path.clone(), reason: format!("not a safetensors file: {e:?}") })?;
            let file = set.files.len();
            for (name, info) in metadata.tensors() {
                let (start, end) = info.data_offsets;
                let entry = Entry {
                    file,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: 8 + header + start,
                    end: 8 + header + end,
                };
                if let Some(previous) = set.entries.insert(name.clone(), entry) {
                    return Err(Error::Format {
                        file: path.clone(),
                        reason: format!("tensor {name} also appears in {}", set.files[previous.file].0.display()),
                    });
                }
            }
            set.files.push((path.clone(), bytes));
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
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| Error::MissingTensor { file: self.file_of(name), tensor: name.to_owned() })?;
        let file = &self.files[entry.file];
        let found: Vec<i64> = entry.shape.iter().map(|&d| d as i64).collect();
        if found != shape {
            return Err(Error::Shape {
                file: file.0.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found,
            });
        }
        let stored = kind_of(entry.dtype)
            .map_err(|reason| Error::Format { file: file.0.clone(), reason: format!("tensor {name}: {reason}") })?;
        let tensor = Tensor::f_from_data_size(&file.1[entry.start..entry.end], shape, stored)
            .map_err(|e| Error::Format { file: file.0.clone(), reason: format!("tensor {name}: {e}") })?;
        Ok(tensor.to_device(device).to_kind(kind))
    }
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

struct TensorBytes {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &TensorBytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes tensors as transformers does: CPU, contiguous, header metadata `{"format": "pt"}`.
/// Written to a temporary name and renamed, so a crash never leaves a half file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), Error> {
    write_safetensors_with(path, tensors, &[])
}

/// [`write_safetensors`] with more header metadata beside `format`.
pub(crate) fn write_safetensors_with(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &[(&str, String)],
) -> Result<(), Error> {
    let mut data: BTreeMap<&str, TensorBytes> = BTreeMap::new();
    for (name, tensor) in tensors {
        let cpu = tensor.detach().to_device(Device::Cpu).contiguous();
        let dtype = dtype_of(cpu.kind())
            .map_err(|reason| Error::Format { file: path.into(), reason: format!("tensor {name}: {reason}") })?;
        let numel = cpu.numel();
        let mut bytes = vec![0u8; numel * cpu.kind().elt_size_in_bytes()];
        cpu.f_copy_data_u8(&mut bytes, numel)
            .map_err(|e| Error::Torch { context: format!("copying {name}"), source: e })?;
        let shape = cpu.size().iter().map(|&d| d as usize).collect();
        data.insert(name, TensorBytes { dtype, shape, bytes });
    }
    let mut header = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    header.extend(metadata.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let metadata = Some(header);
    let tmp = path.with_extension("safetensors.partial");
    safetensors::tensor::serialize_to_file(data.iter().map(|(k, v)| (*k, v)), &metadata, &tmp)
        .map_err(|e| Error::Format { file: path.into(), reason: format!("writing: {e:?}") })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::io(path, source))
}

/// Tensor name → (dtype, shape), as a safetensors header lists them.
pub type TensorShapes = BTreeMap<String, (String, Vec<usize>)>;

/// The header of a safetensors file: its metadata and tensor shapes, for checks.
pub fn read_header(path: &Path) -> Result<(HashMap<String, String>, TensorShapes), Error> {
    use std::io::Read;
    // Only the header: 8 bytes of length, then that much JSON.
    let mut file = std::fs::File::open(path).map_err(|source| Error::io(path, source))?;
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
