//! `petting model info|generate|score|import-gguf`.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{Context, bail};
use petting::model::{
    ChatMessage, GenerationRequest, GenerationSettings, LanguageModel, LoadOptions, ModelConfig, Sampling,
    ScoreRequest, TemplateOptions, gguf,
};
use petting::model::{DType, Device};
use serde_json::{Value, json};

use super::args::{ImportGgufArgs, ModelGenerateArgs, ModelLoadArgs, ModelScoreArgs};

/// Parses `cpu`/`cuda:N` and `f32`/`bf16`/`f16` with the iteration.yaml parsers.
fn parse<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(Value::String(text.to_owned())).with_context(|| format!("invalid {what} {text:?}"))
}

fn load(args: &ModelLoadArgs) -> anyhow::Result<LanguageModel> {
    let options = LoadOptions {
        device: parse::<Device>(&args.device, "device")?,
        dtype: args.dtype.as_deref().map(|d| parse::<DType>(d, "dtype")).transpose()?,
    };
    let mut policy = LanguageModel::load(&args.dir, &options)?;
    if let Some(adapter) = &args.adapter {
        policy.load_adapter("adapter", adapter)?;
    }
    Ok(policy)
}

pub fn info(dir: &Path) -> anyhow::Result<()> {
    let config = ModelConfig::from_dir(dir)?;
    let index = dir.join(petting::model::WEIGHTS_INDEX_FILE);
    let files: Vec<std::path::PathBuf> = if index.exists() {
        let parsed: Value = serde_json::from_str(&std::fs::read_to_string(&index)?)?;
        let mut names: Vec<String> = parsed["weight_map"]
            .as_object()
            .context("no weight_map in the index")?
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|n| dir.join(n)).collect()
    } else {
        vec![dir.join(petting::model::WEIGHTS_FILE)]
    };
    let (mut parameters, mut dtypes) = (0u64, std::collections::BTreeSet::new());
    for file in &files {
        for (dtype, shape) in petting::model::read_header(file)?.1.values() {
            parameters += shape.iter().product::<usize>() as u64;
            dtypes.insert(match dtype.as_str() {
                "F32" => "float32".to_owned(),
                "BF16" => "bfloat16".to_owned(),
                "F16" => "float16".to_owned(),
                other => other.to_lowercase(),
            });
        }
    }
    let c = &config;
    let out = json!({
        "architecture": c.architecture.hf_class(),
        "model_type": c.architecture.model_type(),
        "parameters": parameters,
        "dtype": dtypes.into_iter().collect::<Vec<_>>().join(","),
        "layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "attention_heads": c.num_attention_heads,
        "key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "tied_embeddings": c.tie_word_embeddings,
        "weight_files": files.len(),
        "tokenizer": dir.join("tokenizer.json").exists(),
    });
    println!("{out}");
    Ok(())
}

pub fn generate(args: ModelGenerateArgs) -> anyhow::Result<()> {
    let mut policy = load(&args.model)?;
    let prompt_ids = match (&args.prompt, &args.chat) {
        (Some(prompt), _) => policy.require_tokenizer()?.encode(prompt, true)?,
        (None, Some(chat)) => {
            let messages: Vec<ChatMessage> =
                serde_json::from_str(chat).context("--chat must be a JSON list of {\"role\", \"content\"} objects")?;
            let options = TemplateOptions { add_generation_prompt: true, enable_thinking: args.enable_thinking };
            policy.encode_chat(&messages, &options)?.1
        }
        (None, None) => bail!("give --prompt or --chat"),
    };
    let sampling = match args.temperature {
        Some(t) if !args.greedy && t > 0.0 => Sampling::Sample { temperature: t, top_k: args.top_k, top_p: args.top_p },
        _ => Sampling::Greedy,
    };
    let settings = GenerationSettings {
        stop_strings: args.stop.clone(),
        ..GenerationSettings::new(sampling, args.max_new_tokens)
    };
    let adapter = args.model.adapter.as_ref().map(|_| "adapter".to_owned());
    let requests: Vec<GenerationRequest> = (0..args.num_sequences as u64)
        .map(|i| GenerationRequest {
            prompt_ids: prompt_ids.clone(),
            seed: args.seed + i,
            adapter: adapter.clone(),
            images: None,
        })
        .collect();
    let mut stdout = std::io::stdout().lock();
    for g in policy.generate(&requests, &settings)? {
        let line =
            json!({"text": g.text, "token_ids": g.token_ids, "logprobs": g.logprobs, "finish_reason": g.finish_reason});
        writeln!(stdout, "{line}")?;
    }
    Ok(())
}

pub fn score(args: ModelScoreArgs) -> anyhow::Result<()> {
    let mut policy = load(&args.model)?;
    let file = std::fs::File::open(&args.input).with_context(|| format!("{}", args.input.display()))?;
    let adapter = args.model.adapter.as_ref().map(|_| "adapter".to_owned());
    let (mut lines, mut requests) = (Vec::new(), Vec::new());
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(&line).with_context(|| format!("{}:{}", args.input.display(), n + 1))?;
        let ids = |key: &str| -> anyhow::Result<Vec<i64>> {
            value[key]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .with_context(|| format!("{}:{}: `{key}` must be a list of token ids", args.input.display(), n + 1))
        };
        requests.push(ScoreRequest {
            prompt_ids: ids("prompt_ids")?,
            response_ids: ids("response_ids")?,
            adapter: adapter.clone(),
            images: None,
        });
        lines.push(value);
    }
    let scores = policy.score(&requests, args.max_tokens)?;
    let mut stdout = std::io::stdout().lock();
    for (mut value, logprobs) in lines.into_iter().zip(scores) {
        value["logprobs"] = json!(logprobs);
        writeln!(stdout, "{value}")?;
    }
    Ok(())
}

pub fn import_gguf(args: ImportGgufArgs) -> anyhow::Result<()> {
    let dtype = parse::<DType>(&args.dtype, "dtype")?;
    let summary = gguf::import(&args.file, &args.output, dtype)?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
