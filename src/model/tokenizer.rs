//! `tokenizer.json` through the `tokenizers` crate (the library transformers' fast
//! tokenizers are), with ids as i64 as the model takes them.

use std::path::{Path, PathBuf};

use super::Error;

/// A Hugging Face fast tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    file: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("file", &self.file).field("vocab", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Reads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Tokenizer, Error> {
        if !path.exists() {
            return Err(Error::MissingFile { file: path.to_path_buf(), what: "tokenizer.json" });
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer { file: path.to_path_buf(), reason: e.to_string() })?;
        Ok(Tokenizer { inner, file: path.to_path_buf() })
    }

    /// Parses the text of a `tokenizer.json`; `file` is only for messages.
    pub fn from_json(text: &str, file: &Path) -> Result<Tokenizer, Error> {
        let inner: tokenizers::Tokenizer = text
            .parse()
            .map_err(|e: tokenizers::Error| Error::Tokenizer { file: file.to_path_buf(), reason: e.to_string() })?;
        Ok(Tokenizer { inner, file: file.to_path_buf() })
    }

    /// Token ids of `text`. Chat prompts are encoded without added special tokens, as
    /// transformers' `apply_chat_template` does (the template writes them itself).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>, Error> {
        let encoding = self.inner.encode(text, add_special_tokens).map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// Text of `ids`; `skip_special_tokens` drops tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String, Error> {
        let ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        self.inner.decode(&ids, skip_special_tokens).map_err(|e| self.error(e))
    }

    /// The id of a token (special tokens included).
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// Size of the vocabulary including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    fn error(&self, e: tokenizers::Error) -> Error {
        Error::Tokenizer { file: self.file.clone(), reason: e.to_string() }
    }
}
