//! Where a model runs and in which dtype, as the config names them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A device: `cpu`, `cuda` (the first GPU) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Device {
    /// Whether this process can run on the device, or a one-line reason that says how to
    /// get a binary that can. Checked before any tensor is made: tch panics deep inside
    /// libtorch ("Could not run 'aten::empty_strided' with arguments from the 'CUDA'
    /// backend") when asked for a GPU it was not built for.
    pub fn check_available(self) -> Result<(), String> {
        let Device::Cuda(index) = self else { return Ok(()) };
        if option_env!("PETTING_LIBTORCH_VARIANT") != Some("cuda") {
            return Err(format!(
                "device {self}: this petting binary was built against the CPU libtorch; build the CUDA one with \
                 `scripts/install/libtorch.sh cuda` and `LIBTORCH=$PWD/.libtorch-cuda cargo build --release --target-dir target-cuda` \
                 (docs/gpu.md), or set the device to cpu"
            ));
        }
        let count = tch::Cuda::device_count().max(0) as usize;
        if count == 0 {
            return Err(format!(
                "device {self}: libtorch sees no CUDA device (driver missing, CUDA_VISIBLE_DEVICES, or no GPU on this \
                 machine); set the device to cpu"
            ));
        }
        if index >= count {
            return Err(format!(
                "device {self}: libtorch sees {count} CUDA device(s) (driver missing, CUDA_VISIBLE_DEVICES, or no GPU on \
                 this machine); use cuda:0..cuda:{} or cpu",
                count.saturating_sub(1)
            ));
        }
        Ok(())
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl schemars::JsonSchema for Device {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Device".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "pattern": "^(cpu|cuda(:[0-9]+)?)$"})
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Device, D::Error> {
        let text = String::deserialize(d)?;
        let device = match text.as_str() {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            other => other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Device::Cuda),
        };
        device.ok_or_else(|| serde::de::Error::custom(format!("unknown device {text:?}, expected cpu, cuda or cuda:N")))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}
