//! The embedded default's tokenizer, trained from the task corpus by `prepare-data`.
//!
//! A byte-level BPE in the layout of Qwen's `tokenizer.json` (a `Split` regex, then
//! `ByteLevel` without its own regex, a `ByteLevel` decoder), so transformers loads it
//! as a `PreTrainedTokenizerFast` and every text round-trips byte for byte: the 256 byte
//! symbols are always in the vocabulary, so unseen text still encodes.
//!
//! The split regex decides what BPE may merge. The tiny model must *copy* grids and move
//! strings, and the prompts around them are long constant English, so:
//!
//! ```text
//!  \n  digits  '.'  '#'  lone capitals (S, G, moves U D L R)   one piece per character
//!  everything else (words, spaces, other punctuation, code,    maximal runs, merged freely
//!  and a '.' followed by a space, which ends a sentence)
//! ```
//!
//! Each grid cell and each move is therefore one token wherever it appears (in the grid,
//! the tool's output and the planner's answer alike), while BPE turns frequent
//! boilerplate phrases, even whole sentences such as `print(bfs(grid, `, into single
//! tokens. A capital followed by a lower-case letter starts a word (`You`, `Error`).
//!
//! The split pieces stop BPE at every lone capital and digit, so constant lines that
//! mention S, G or a number (the rules, the helpers' documentation) would still cost
//! dozens of tokens in every prompt. Lines of words that at least 1% of the corpus
//! texts hold verbatim therefore become one (non-special) token each, matched before
//! BPE: the instructions cost a few tokens, and compute goes to the grid.
//!
//! Measured on the corpus of `pipelines/plan-path.yaml` (640 train tasks, 25,000
//! demonstrations), prompts rendered with the ChatML template and a generation prompt:
//! the tool agent's prompt is 157 tokens for every task (225 before line tokens), the
//! planner's about 195 (in the rollouts of a run). A 10×10 grid alone is 110 tokens
//! (cells and newlines); the planner's extra length is the tool's program and output.
//!
//! Training is deterministic: the same corpus gives a byte-identical `tokenizer.json`
//! (the BPE trainer breaks count ties by token ids, its alphabet is sorted, and JSON
//! maps are written in key or id order).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::config::ModelConfig;
use super::tokenizer::Tokenizer;
use super::{Error, Result};

/// Pads batches (and ends plain text); id 0.
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// Opens a chat turn; id 1.
pub const IM_START: &str = "<|im_start|>";
/// Closes a chat turn and ends generation; id 2.
pub const IM_END: &str = "<|im_end|>";

/// Vocabulary size of the embedded default, special tokens and the 256 bytes included.
pub const DEFAULT_VOCAB_SIZE: usize = 1024;

/// A minimal ChatML template: `<|im_start|>role\ncontent<|im_end|>\n` per message.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Pieces BPE never merges across: newline, digit, grid cell, lone capital; the rest
/// are maximal runs of anything else (see the module doc). A '.' before a space ends a
/// sentence, never a grid row (rows have no spaces), so it may join a phrase.
const SPLIT_PATTERN: &str = r"\n|[0-9]|\.(?! )|#|[A-Z](?![a-z])|(?:[^\n0-9.#A-Z]|[A-Z](?=[a-z])|\.(?= ))+";

/// The role names the ChatML template writes between the special tokens.
const ROLE_TEXTS: &str = "user\nassistant\n";

/// Pairs seen fewer times than this are not merged: one-off texts stay in small pieces.
const MIN_FREQUENCY: u64 = 2;

/// A line held verbatim by at least this share of the corpus texts is one token.
const LINE_TOKEN_SHARE: f64 = 0.01;

/// At most this many line tokens, the most frequent first.
const MAX_LINE_TOKENS: usize = 64;

/// The files of a built tokenizer, as a Hugging Face folder holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config_json: String,
    pub chat_template: String,
}

impl TokenizerFiles {
    pub const TOKENIZER_JSON: &'static str = "tokenizer.json";
    pub const TOKENIZER_CONFIG_JSON: &'static str = "tokenizer_config.json";
    pub const CHAT_TEMPLATE: &'static str = "chat_template.jinja";

    /// (file name, text) of each file.
    pub fn files(&self) -> [(&'static str, &str); 3] {
        [
            (Self::TOKENIZER_JSON, &self.tokenizer_json),
            (Self::TOKENIZER_CONFIG_JSON, &self.tokenizer_config_json),
            (Self::CHAT_TEMPLATE, &self.chat_template),
        ]
    }

    /// Writes the files into `dir` (which must exist), e.g. beside a scratch config.
    pub fn write_to(&self, dir: &Path) -> Result<()> {
        for (name, text) in self.files() {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// The tokenizer, parsed.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_json(&self.tokenizer_json, Path::new(Self::TOKENIZER_JSON))
    }
}

fn tokenizer_error(reason: impl ToString) -> Error {
    Error::Tokenizer { file: PathBuf::from(TokenizerFiles::TOKENIZER_JSON), reason: reason.to_string() }
}

/// Trains a byte-level BPE of at most `vocab_size` tokens on `corpus` (every prompt and
/// response the model will see) and returns its files with `chat_template`.
pub fn build_tokenizer<S: AsRef<str> + Sync>(
    corpus: &[S],
    vocab_size: usize,
    chat_template: &str,
) -> Result<TokenizerFiles> {
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    let split = Split::new(SplitPattern::Regex(SPLIT_PATTERN.into()), SplitDelimiterBehavior::Isolated, false)
        .map_err(tokenizer_error)?;
    let byte_level = ByteLevel::new(false, false, false);
    let pieces: Vec<PreTokenizerWrapper> = vec![split.into(), byte_level.into()];
    tokenizer.with_pre_tokenizer(Some(Sequence::new(pieces)));
    tokenizer.with_decoder(Some(byte_level));

    let specials: Vec<AddedToken> =
        [END_OF_TEXT, IM_START, IM_END].iter().map(|t| AddedToken::from(*t, true)).collect();
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let lines = frequent_lines(corpus);
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size.saturating_sub(lines.len()))
        .min_frequency(MIN_FREQUENCY)
        .special_tokens(specials)
        .initial_alphabet(alphabet)
        .show_progress(false)
        .build()
        .into();
    // The role names count as often as the texts, so each becomes one token.
    // BPE learns the rest of the text; the line tokens take the last ids.
    let roles = std::iter::repeat_n(ROLE_TEXTS.to_owned(), corpus.len().max(1));
    let texts = corpus.iter().map(|t| without_lines(t.as_ref(), &lines)).chain(roles);
    tokenizer.train(&mut trainer, texts).map_err(tokenizer_error)?;
    let line_tokens: Vec<AddedToken> = lines.iter().map(|l| AddedToken::from(l.as_str(), false)).collect();
    tokenizer.add_tokens(&line_tokens);

    Ok(TokenizerFiles {
        tokenizer_json: tokenizer.to_string(true).map_err(tokenizer_error)?,
        tokenizer_config_json: tokenizer_config(chat_template),
        chat_template: chat_template.to_owned(),
    })
}

/// Lines with a lower-case letter (so not grid rows or moves) that at least
/// [`LINE_TOKEN_SHARE`] of the texts hold, most frequent first, ties by text.
fn frequent_lines<S: AsRef<str>>(corpus: &[S]) -> Vec<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for text in corpus {
        let lines: HashSet<&str> = text.as_ref().split('\n').collect();
        for line in lines.into_iter().filter(|l| l.len() > 1 && l.chars().any(|c| c.is_ascii_lowercase())) {
            *counts.entry(line).or_default() += 1;
        }
    }
    let least = ((corpus.len() as f64 * LINE_TOKEN_SHARE).ceil() as usize).max(MIN_FREQUENCY as usize);
    let mut frequent: Vec<(&str, usize)> = counts.into_iter().filter(|&(_, n)| n >= least).collect();
    frequent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    frequent.into_iter().take(MAX_LINE_TOKENS).map(|(line, _)| line.to_owned()).collect()
}

/// `text` without the lines that are tokens of their own.
fn without_lines(text: &str, lines: &[String]) -> String {
    text.split('\n').filter(|l| !lines.iter().any(|t| t == l)).collect::<Vec<_>>().join("\n")
}

/// `tokenizer_config.json` as transformers writes it for a fast tokenizer; spaces are
/// not cleaned up on decode, so decoding stays the inverse of encoding.
fn tokenizer_config(chat_template: &str) -> String {
    let added = |id: u32, content: &str| {
        (
            id.to_string(),
            serde_json::json!({
                "content": content, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true
            }),
        )
    };
    let added_tokens: serde_json::Map<String, serde_json::Value> =
        [added(0, END_OF_TEXT), added(1, IM_START), added(2, IM_END)].into_iter().collect();
    let config = serde_json::json!({
        "added_tokens_decoder": added_tokens,
        "bos_token": null,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 1024,
        "pad_token": END_OF_TEXT,
        "split_special_tokens": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null
    });
    serde_json::to_string_pretty(&config).expect("a JSON value serialises")
}

/// A scratch model's config: `config.json` of `dir` with `vocab_size` set to the
/// tokenizer's and EOS / pad / BOS ids taken from it (in the raw JSON too, so a saved
/// checkpoint's `config.json` describes its weights).
pub fn scratch_config(dir: &Path, tokenizer: &Tokenizer) -> Result<ModelConfig> {
    let mut config = ModelConfig::from_dir(dir)?;
    let id = |token: &str| {
        tokenizer.token_id(token).ok_or_else(|| tokenizer_error(format!("the tokenizer has no {token} token")))
    };
    let (eos, pad) = (id(IM_END)?, id(END_OF_TEXT)?);
    config.vocab_size = tokenizer.vocab_size();
    config.eos_token_ids = vec![eos];
    config.pad_token_id = Some(pad);
    config.bos_token_id = None;
    if let Some(raw) = config.raw.as_object_mut() {
        raw.insert("vocab_size".into(), config.vocab_size.into());
        raw.insert("eos_token_id".into(), eos.into());
        raw.insert("pad_token_id".into(), pad.into());
        raw.insert("bos_token_id".into(), serde_json::Value::Null);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: &str = "..#...S...\n.#..G.....\n";

    fn corpus() -> Vec<String> {
        let mut texts = Vec::new();
        for i in 0..40 {
            texts.push(format!(
                "You are the planner of a team of two. Current state:\n{GRID}Tool agent's program:\n```python\nprint(bfs(grid, S, G))\n```\nIts output:\nRRDDL\n\nEnd your reply with the moves after ####, for example: #### RRDL {i}"
            ));
            texts.push("#### RRDDLU".to_string());
        }
        texts
    }

    fn built() -> (TokenizerFiles, Tokenizer) {
        let files = build_tokenizer(&corpus(), 1000, CHATML_TEMPLATE).unwrap();
        let tokenizer = files.tokenizer().unwrap();
        (files, tokenizer)
    }

    fn pieces(tokenizer: &Tokenizer, text: &str) -> Vec<String> {
        let ids = tokenizer.encode(text, false).unwrap();
        ids.iter().map(|&id| tokenizer.decode(&[id], false).unwrap()).collect()
    }

    #[test]
    fn special_tokens_have_fixed_ids_and_split_out() {
        let (_, t) = built();
        assert_eq!((t.token_id(END_OF_TEXT), t.token_id(IM_START), t.token_id(IM_END)), (Some(0), Some(1), Some(2)));
        let ids = t.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.last(), Some(&2));
        assert_eq!(pieces(&t, "<|im_start|>user\n")[1], "user", "the role name is one token");
    }

    #[test]
    fn every_corpus_text_and_unseen_text_round_trips() {
        let (_, t) = built();
        let unseen = "Ünïcödé ✓ \t\r\n  tabs, 0x1F and ~`|\\ bytes";
        for text in corpus().iter().map(String::as_str).chain([unseen, "", "\n\n", " "]) {
            let ids = t.encode(text, false).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), text);
        }
    }

    #[test]
    fn grid_cells_and_moves_are_one_token_each_and_boilerplate_merges() {
        let (_, t) = built();
        assert_eq!(pieces(&t, "..#S\n"), [".", ".", "#", "S", "\n"]);
        // The same moves are the same tokens in the tool's output and in the answer.
        assert_eq!(pieces(&t, "RRDDL\n"), ["R", "R", "D", "D", "L", "\n"]);
        assert_eq!(pieces(&t, "#### RRD"), ["#", "#", "#", "#", " ", "R", "R", "D"]);
        assert_eq!(pieces(&t, "12"), ["1", "2"]);
        assert_eq!(
            pieces(&t, "You are the planner of a team of two. Current state:")[0],
            "You are the planner of a team of two. Current state:"
        );
        // A frequent phrase (40 times in the corpus) is one token.
        assert_eq!(pieces(&t, "Its output:"), ["Its output:"]);
    }

    #[test]
    fn frequent_lines_are_one_token_even_with_capitals_and_digits() {
        let (_, t) = built();
        let line = "print(bfs(grid, S, G))";
        assert_eq!(pieces(&t, &format!("{line}\n{line}")), [line, "\n", line]);
        // Grid rows and move strings never become line tokens, however frequent.
        assert_eq!(pieces(&t, "RRDDL"), ["R", "R", "D", "D", "L"]);
        // A line that varies (the corpus ends it with the text's index) stays in pieces.
        assert!(pieces(&t, "End your reply with the moves after ####, for example: #### RRDL 7").len() > 5);
    }

    #[test]
    fn the_same_corpus_gives_byte_identical_files() {
        let (a, _) = built();
        let (b, _) = built();
        assert_eq!(a, b);
        let mut other = corpus();
        other.push("a different text, twice".into());
        other.push("a different text, twice".into());
        assert_ne!(build_tokenizer(&other, 1000, CHATML_TEMPLATE).unwrap().tokenizer_json, a.tokenizer_json);
    }

    #[test]
    fn the_vocabulary_respects_its_budget_and_keeps_all_bytes() {
        let (_, all) = built();
        assert!(
            all.vocab_size() > 300 && all.vocab_size() < 1000,
            "every pair seen twice merged: {}",
            all.vocab_size()
        );
        let small = build_tokenizer(&corpus(), 300, CHATML_TEMPLATE).unwrap().tokenizer().unwrap();
        assert_eq!(small.vocab_size(), 300);
        let bytes: Vec<String> = (0u8..=255).map(|b| String::from_utf8_lossy(&[b]).into_owned()).collect();
        assert!(bytes.iter().filter(|b| b.len() == 1).all(|b| small.encode(b, false).unwrap().len() == 1));
    }

    #[test]
    fn scratch_config_takes_vocab_and_ids_from_the_tokenizer() {
        let (_, t) = built();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/petting-tiny-qwen3");
        let c = scratch_config(&dir, &t).unwrap();
        assert_eq!(c.architecture, super::super::Architecture::Qwen3);
        assert_eq!(
            (c.vocab_size, c.eos_token_ids.clone(), c.pad_token_id, c.bos_token_id),
            (t.vocab_size(), vec![2], Some(0), None)
        );
        assert_eq!(c.raw["vocab_size"], t.vocab_size());
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.head_dim), (128, 3, 4, 32));
        // 640,064 parameters besides the (tied) embedding.
        assert_eq!(c.parameter_count() - (c.vocab_size as u64) * 128, 640_064);
    }

    #[test]
    fn the_shipped_chat_template_is_the_chatml_constant_and_renders() {
        use super::super::{ChatMessage, ChatTemplate, TemplateOptions};
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/petting-tiny-qwen3");
        let text = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
        assert_eq!(text, CHATML_TEMPLATE);
        let template = ChatTemplate::from_dir(&dir).unwrap().unwrap();
        let options = TemplateOptions { add_generation_prompt: true, ..Default::default() };
        let out = template.render(&[ChatMessage::new("user", "go")], &options).unwrap();
        assert_eq!(out, "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n");
    }
}
