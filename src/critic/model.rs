//! `critic.model`: a separate critic model, whose trunk gives the features the heads
//! read in place of the policy's own.
//!
//! The heads read the policies' token ids (the critic inputs are built from the stored
//! turns), so the critic model must tokenize as every policy it values does: its
//! tokenizer.json is checked against the policy's, byte for byte by sha256, before a
//! single forward. Its folder is the same at every version: the heads, the agents'
//! adapters on it where `critic.lora` trains it, their optimiser state and their
//! version live in the policy's checkpoint as they do on a shared trunk.

use std::path::{Path, PathBuf};

use crate::model::{LanguageModel, LoadOptions, sha256_file};

/// Why a separate critic model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("critic.model {}: {source}", folder.display())]
    Load { folder: PathBuf, source: crate::model::Error },

    #[error(
        "critic.model {} tokenizes otherwise than policy {policy}: its tokenizer.json has sha256 {critic}, the \
         policy's {policy_sha256}; the heads read the policy's token ids, so give a critic model with the \
         policy's tokenizer (or leave critic.model out to value on the policy's own trunk)",
        folder.display()
    )]
    Tokenizer { folder: PathBuf, policy: String, critic: String, policy_sha256: String },

    #[error(
        "critic.model {}: policy {policy}'s tokenizer.json was found neither in its checkpoint nor in its model \
         folder, so whether the critic model reads its token ids cannot be checked",
        folder.display()
    )]
    NoPolicyTokenizer { folder: PathBuf, policy: String },
}

/// The critic model in `folder`, on `options`' device and dtype, once its tokenizer is
/// found to be policy `policy`'s (whose tokenizer.json has `policy_sha256`, if known).
pub fn load(
    folder: &Path,
    options: &LoadOptions,
    policy: &str,
    policy_sha256: Option<&str>,
) -> Result<LanguageModel, Error> {
    let load_error = |source| Error::Load { folder: folder.to_path_buf(), source };
    let Some(policy_sha256) = policy_sha256 else {
        return Err(Error::NoPolicyTokenizer { folder: folder.to_path_buf(), policy: policy.to_owned() });
    };
    let critic = sha256_file(&folder.join("tokenizer.json")).map_err(load_error)?;
    if critic != policy_sha256 {
        return Err(Error::Tokenizer {
            folder: folder.to_path_buf(),
            policy: policy.to_owned(),
            critic,
            policy_sha256: policy_sha256.to_owned(),
        });
    }
    LanguageModel::load(folder, options).map_err(load_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::fixture;

    #[test]
    fn a_critic_model_must_tokenize_as_the_policy_does() {
        let folder = fixture("hf-tiny-llama");
        let same = sha256_file(&fixture("hf-tiny-qwen3").join("tokenizer.json")).unwrap();
        let model = load(&folder, &LoadOptions::default(), "pilot", Some(&same)).unwrap();
        assert_eq!(model.config().hidden_size, 64);
        let other = "0".repeat(64);
        let refused = load(&folder, &LoadOptions::default(), "pilot", Some(&other)).unwrap_err().to_string();
        assert!(refused.contains("tokenizes otherwise than policy pilot") && refused.contains(&other), "{refused}");
        let unknown = load(&folder, &LoadOptions::default(), "pilot", None).unwrap_err().to_string();
        assert!(unknown.contains("neither in its checkpoint nor in its model folder"), "{unknown}");
        let missing = load(Path::new("/no/such/critic"), &LoadOptions::default(), "pilot", Some(&same));
        assert!(missing.unwrap_err().to_string().starts_with("critic.model /no/such/critic: "));
    }
}
