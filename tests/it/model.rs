//! The model against Hugging Face `transformers` (the fixtures in `tests/fixtures`),
//! checkpoints, LoRA, malformed folders, and the `petting model` commands.

use std::path::{Path, PathBuf};

use petting::model::{
    ChatMessage, Error, GenerationRequest, GenerationSettings, LanguageModel, LoadOptions, MicroBatching,
    SafetensorsSet, Sampling, SaveAs, ScoreRequest, TemplateOptions, Totals,
};
use serde_json::Value;
use tch::{Kind, Tensor};

use crate::support::run;

fn fixture(family: &str) -> PathBuf {
    crate::support::fixture(&format!("hf-tiny-{family}"))
}

const FAMILIES: [&str; 3] = ["qwen3", "qwen2", "llama"];

struct Case {
    messages: Vec<ChatMessage>,
    rendered: String,
    input_ids: Vec<i64>,
    greedy: Vec<i64>,
    logprobs: Vec<f64>,
    ce_loss: f64,
    grad_norm: f64,
    logits: Tensor,
}

fn cases(dir: &Path) -> Vec<Case> {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let logits = SafetensorsSet::open_files(&[dir.join("reference_logits.safetensors")]).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect::<Vec<i64>>();
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["logits_tensor"].as_str().unwrap();
            let (shape, _) = logits.info(name).unwrap();
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            Case {
                messages: serde_json::from_value(c["messages"].clone()).unwrap(),
                rendered: c["rendered"].as_str().unwrap().to_owned(),
                input_ids: ids(&c["input_ids"]),
                greedy: ids(&c["greedy_continuation"]),
                logprobs: c["continuation_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
                ce_loss: c["continuation_ce_loss"].as_f64().unwrap(),
                grad_norm: c["grad_l2_norm"].as_f64().unwrap(),
                logits: logits.tensor(name, &shape, Kind::Float, tch::Device::Cpu).unwrap(),
            }
        })
        .collect()
}

fn load(dir: &Path) -> LanguageModel {
    LanguageModel::load(dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

fn greedy_16() -> GenerationSettings {
    GenerationSettings { eos_token_ids: Some(Vec::new()), ..GenerationSettings::new(Sampling::Greedy, 16) }
}

fn score_request(case: &Case) -> ScoreRequest {
    ScoreRequest { prompt_ids: case.input_ids.clone(), response_ids: case.greedy.clone(), adapter: None, images: None }
}

/// Mean token cross-entropy of each request's response and ‖∇‖₂ over all base weights.
fn loss_and_grad_norm(policy: &mut LanguageModel, request: ScoreRequest, batching: &MicroBatching) -> (f64, f64) {
    policy.var_store().trainable_variables().iter_mut().for_each(|t| t.zero_grad());
    let mut loss_value = 0.0;
    policy
        .backward(&[request], batching, 0, &mut |mb| {
            let loss = -(&mb.logprobs * &mb.mask).sum(Kind::Float) / mb.mask.sum(Kind::Float);
            loss_value = loss.double_value(&[]);
            Ok(loss)
        })
        .unwrap();
    let squares: f64 = policy
        .var_store()
        .trainable_variables()
        .iter()
        .map(|t| t.grad().square().sum(Kind::Double).double_value(&[]))
        .sum();
    (loss_value, squares.sqrt())
}

#[test]
fn fixtures_match_transformers_one_prompt_at_a_time() {
    for family in FAMILIES {
        let dir = fixture(family);
        let mut policy = load(&dir);
        for (i, case) in cases(&dir).iter().enumerate() {
            let what = format!("{family} case {i}");
            // Chat template and tokenizer.
            let options = TemplateOptions { add_generation_prompt: true, ..Default::default() };
            let (text, ids) = policy.encode_chat(&case.messages, &options).unwrap();
            assert_eq!(text, case.rendered, "{what}: rendered chat");
            assert_eq!(ids, case.input_ids, "{what}: chat token ids");
            // Logits of the prompt.
            let logits = policy.logits(std::slice::from_ref(&case.input_ids), &[]).unwrap();
            let err = max_abs_diff(&logits[0], &case.logits);
            assert!(err <= 1e-4, "{what}: logits max abs error {err}");
            // Greedy continuation and its logprobs.
            let request =
                GenerationRequest { prompt_ids: case.input_ids.clone(), seed: 0, adapter: None, images: None };
            let out = policy.generate(&[request], &greedy_16()).unwrap();
            assert_eq!(out[0].token_ids, case.greedy, "{what}: greedy continuation");
            for (j, (got, want)) in out[0].logprobs.iter().zip(&case.logprobs).enumerate() {
                assert!((*got as f64 - want).abs() <= 1e-4, "{what}: sampled logprob {j}: {got} vs {want}");
            }
            let scored = policy.score(&[score_request(case)], 4096).unwrap();
            for (j, (got, want)) in scored[0].iter().zip(&case.logprobs).enumerate() {
                assert!((*got as f64 - want).abs() <= 1e-4, "{what}: scored logprob {j}: {got} vs {want}");
            }
            // Cross-entropy and the gradient norm: plain, with recomputed activations, and
            // with lm_head's logits projected two tokens at a time (with and without it).
            let two_tokens = 2 * policy.config().vocab_size as i64;
            for batching in [
                MicroBatching::new(1 << 20, false),
                MicroBatching::new(1 << 20, true),
                MicroBatching { max_logits: two_tokens, ..MicroBatching::new(1 << 20, false) },
                MicroBatching { max_logits: two_tokens, ..MicroBatching::new(1 << 20, true) },
            ] {
                let (loss, norm) = loss_and_grad_norm(&mut policy, score_request(case), &batching);
                assert!((loss - case.ce_loss).abs() <= 1e-5, "{what}: loss {loss} vs {}", case.ce_loss);
                let rel = (norm - case.grad_norm).abs() / case.grad_norm;
                assert!(rel <= 1e-4, "{what} ({batching:?}): grad norm {norm} vs {} (rel {rel})", case.grad_norm);
            }
        }
    }
}

#[test]
fn fixtures_match_transformers_batched_with_left_padding() {
    for family in FAMILIES {
        let dir = fixture(family);
        let mut policy = load(&dir);
        let cases = cases(&dir);
        let prompts: Vec<Vec<i64>> = cases.iter().map(|c| c.input_ids.clone()).collect();
        let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
        assert!(lengths.iter().min() < lengths.iter().max(), "the cases must need padding");
        // Logits of all prompts in one left-padded batch.
        let logits = policy.logits(&prompts, &[]).unwrap();
        for (i, case) in cases.iter().enumerate() {
            let err = max_abs_diff(&logits[i], &case.logits);
            assert!(err <= 1e-4, "{family} case {i}: batched logits max abs error {err}");
        }
        // Greedy continuations in one batch.
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .map(|p| GenerationRequest { prompt_ids: p.clone(), seed: 0, adapter: None, images: None })
            .collect();
        let out = policy.generate(&requests, &greedy_16()).unwrap();
        for (i, case) in cases.iter().enumerate() {
            assert_eq!(out[i].token_ids, case.greedy, "{family} case {i}: batched greedy");
            for (got, want) in out[i].logprobs.iter().zip(&case.logprobs) {
                assert!((*got as f64 - want).abs() <= 1e-4, "{family} case {i}: batched logprob {got} vs {want}");
            }
        }
        // Scores and per-case losses of the three pairs in one micro-batch, and in several.
        let requests: Vec<ScoreRequest> = cases.iter().map(score_request).collect();
        for budget in [1 << 20, 80] {
            let scored = policy.score(&requests, budget).unwrap();
            for (i, case) in cases.iter().enumerate() {
                let ce = -scored[i].iter().map(|&x| x as f64).sum::<f64>() / scored[i].len() as f64;
                assert!(
                    (ce - case.ce_loss).abs() <= 1e-5,
                    "{family} case {i} (budget {budget}): ce {ce} vs {}",
                    case.ce_loss
                );
            }
        }
    }
}

#[test]
fn qwen3_chat_template_matches_transformers() {
    if !crate::support::full_suite("qwen3_chat_template_matches_transformers") {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".models/qwen3-tokenizer");
    assert!(dir.join("tokenizer.json").exists(), "run scripts/install/test-models.sh");
    let template = petting::model::ChatTemplate::from_dir(&dir).unwrap().expect("a chat template");
    let tokenizer = petting::model::Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(crate::support::fixture("qwen3-chat-template.json")).unwrap())
            .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for (i, case) in cases.iter().enumerate() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let options = TemplateOptions {
            add_generation_prompt: case["options"]["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: case["options"]["enable_thinking"].as_bool(),
        };
        let text = template.render(&messages, &options).unwrap();
        assert_eq!(text, case["rendered"].as_str().unwrap(), "case {i}: rendered");
        let ids = tokenizer.encode(&text, false).unwrap();
        let want: Vec<i64> = case["input_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(ids, want, "case {i}: token ids");
    }
}

#[test]
fn a_saved_checkpoint_reloads_bit_identically_in_the_layout_transformers_writes() {
    for family in FAMILIES {
        let src = fixture(family);
        let policy = load(&src);
        let out = tempfile::tempdir().unwrap();
        let meta =
            policy.save(out.path(), &SaveAs { policy: "shared", version: 3, parent: Some("shared/v000002") }).unwrap();
        assert_eq!(meta.weights_sha256, petting::model::sha256_file(&out.path().join("model.safetensors")).unwrap());
        assert_eq!((meta.version, meta.parent.as_deref()), (3, Some("shared/v000002")));
        meta.verify(out.path()).unwrap();
        // Same tensors, bit for bit.
        let reloaded = load(out.path());
        let (a, b) = (policy.var_store().variables(), reloaded.var_store().variables());
        assert_eq!(a.len(), b.len());
        for (name, t) in &a {
            assert!(t.equal(&b[name]), "{family}: {name} changed");
        }
        // The layout transformers wrote: the same keys, dtypes and shapes, format "pt".
        let (ours_meta, ours) = petting::model::read_header(&out.path().join("model.safetensors")).unwrap();
        let (_, theirs) = petting::model::read_header(&src.join("model.safetensors")).unwrap();
        assert_eq!(ours, theirs, "{family}: safetensors keys, dtypes, shapes");
        assert_eq!(ours_meta.get("format").map(String::as_str), Some("pt"));
        let read_json = |p: PathBuf| serde_json::from_str::<Value>(&std::fs::read_to_string(p).unwrap()).unwrap();
        assert_eq!(
            read_json(out.path().join("config.json")),
            read_json(src.join("config.json")),
            "{family}: config.json"
        );
        for file in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
            assert_eq!(
                std::fs::read(out.path().join(file)).unwrap(),
                std::fs::read(src.join(file)).unwrap(),
                "{family}: {file}"
            );
        }
    }
}

#[test]
fn sharded_weights_load_like_a_single_file() {
    let src = fixture("qwen2");
    let whole = load(&src);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    // Two shards and their index, as transformers' save_pretrained(max_shard_size=…) writes.
    let mut names: Vec<(String, Tensor)> = whole.var_store().variables().into_iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let (first, second) = names.split_at(names.len() / 2);
    let shard = |i: usize| format!("model-0000{i}-of-00002.safetensors");
    petting::model::write_safetensors(&dir.path().join(shard(1)), first).unwrap();
    petting::model::write_safetensors(&dir.path().join(shard(2)), second).unwrap();
    let map: serde_json::Map<String, Value> = first
        .iter()
        .map(|(n, _)| (n.clone(), Value::from(shard(1))))
        .chain(second.iter().map(|(n, _)| (n.clone(), Value::from(shard(2)))))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let sharded = load(dir.path());
    for (name, t) in whole.var_store().variables() {
        assert!(t.equal(&sharded.var_store().variables()[&name]), "{name}");
    }
}

fn broken_copy(family: &str) -> tempfile::TempDir {
    let src = fixture(family);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn load_error(dir: &Path) -> Error {
    LanguageModel::load(dir, &LoadOptions::default()).expect_err("a malformed folder must not load")
}

#[test]
fn malformed_folders_name_the_file_and_the_tensor() {
    // Missing weights file.
    let dir = broken_copy("qwen3");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_error(dir.path());
    assert!(matches!(err, Error::MissingFile { .. }) && err.to_string().contains("model.safetensors"), "{err}");

    // A missing tensor and a wrong shape: rewrite the file without / with a changed tensor.
    let dir = broken_copy("qwen3");
    let weights = dir.path().join("model.safetensors");
    let policy = load(dir.path());
    let variables = || -> Vec<(String, Tensor)> { policy.var_store().variables().into_iter().collect() };
    let mut tensors = variables();
    tensors.retain(|(n, _)| n != "model.layers.1.self_attn.k_norm.weight");
    petting::model::write_safetensors(&weights, &tensors).unwrap();
    let err = load_error(dir.path());
    let text = err.to_string();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
    assert!(text.contains("model.safetensors") && text.contains("model.layers.1.self_attn.k_norm.weight"), "{text}");

    let mut tensors = variables();
    for (name, t) in tensors.iter_mut() {
        if name == "model.layers.2.mlp.up_proj.weight" {
            *t = t.narrow(0, 0, 100);
        }
    }
    petting::model::write_safetensors(&weights, &tensors).unwrap();
    let err = load_error(dir.path());
    let text = err.to_string();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert!(
        text.contains("model.safetensors")
            && text.contains("model.layers.2.mlp.up_proj.weight")
            && text.contains("[100, 64]"),
        "{text}"
    );

    // Unknown architecture.
    let dir = broken_copy("llama");
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace("\"llama\"", "\"mamba\"");
    std::fs::write(&config, text).unwrap();
    let err = load_error(dir.path());
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert!(err.to_string().contains("config.json") && err.to_string().contains("mamba"), "{err}");

    // A file for another family: qwen2's q/k/v biases are weights a llama config lacks.
    let dir = broken_copy("qwen2");
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace("\"qwen2\"", "\"llama\"");
    std::fs::write(&config, text).unwrap();
    let err = load_error(dir.path()).to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("unexpected tensor") && err.contains("_proj.bias"),
        "{err}"
    );
}

fn base_logits(policy: &mut LanguageModel, prompts: &[Vec<i64>], adapter: Option<&str>) -> Vec<Tensor> {
    let adapters: Vec<Option<String>> = prompts.iter().map(|_| adapter.map(str::to_owned)).collect();
    policy.logits(prompts, &adapters).unwrap()
}

#[test]
fn a_fresh_lora_adapter_leaves_logits_unchanged_and_training_changes_only_adapter_tensors() {
    let dir = fixture("qwen3");
    let mut policy = load(&dir);
    let cases = cases(&dir);
    let prompts: Vec<Vec<i64>> = cases.iter().map(|c| c.input_ids.clone()).collect();
    let before = base_logits(&mut policy, &prompts, None);
    let lora = petting::model::LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, targets: Vec::new() };
    policy.add_adapter("planner", &lora, 7).unwrap();
    policy.add_adapter("tool", &lora, 8).unwrap();
    // Zero-initialised B: the adapter's logits are the base's, exactly.
    let with = base_logits(&mut policy, &prompts, Some("planner"));
    for (a, b) in before.iter().zip(&with) {
        assert!(a.equal(b), "a zero-B adapter changed the logits");
    }
    let base_before: Vec<(String, Tensor)> =
        policy.var_store().variables().into_iter().map(|(n, t)| (n, t.copy())).collect();
    let tool_before: Vec<(String, Tensor)> =
        policy.adapter_var_store("tool").unwrap().variables().into_iter().map(|(n, t)| (n, t.copy())).collect();
    let planner_before: Vec<(String, Tensor)> =
        policy.adapter_var_store("planner").unwrap().variables().into_iter().map(|(n, t)| (n, t.copy())).collect();
    assert_eq!(planner_before.len(), 3 * 7 * 2, "A and B for 7 linear layers in each of 3 layers");

    // A few AdamW steps on the planner adapter only.
    use tch::nn::OptimizerConfig;
    let mut opt = tch::nn::AdamW::default().build(policy.adapter_var_store("planner").unwrap(), 1e-2).unwrap();
    let requests: Vec<ScoreRequest> = cases
        .iter()
        .map(|c| ScoreRequest {
            prompt_ids: c.input_ids.clone(),
            response_ids: c.greedy.clone(),
            adapter: Some("planner".into()),
            images: None,
        })
        .collect();
    let mut losses = Vec::new();
    for _ in 0..4 {
        opt.zero_grad();
        policy
            .backward(&requests, &MicroBatching::new(1 << 20, false), 0, &mut |mb| {
                let loss = -(&mb.logprobs * &mb.mask).sum(Kind::Float) / mb.mask.sum(Kind::Float);
                losses.push(loss.double_value(&[]));
                Ok(loss)
            })
            .unwrap();
        opt.step();
    }
    assert!(losses[3] < losses[0], "training lowers the loss: {losses:?}");
    for (name, t) in &base_before {
        assert!(t.equal(&policy.var_store().variables()[name]), "base tensor {name} changed");
    }
    for (name, t) in &tool_before {
        assert!(
            t.equal(&policy.adapter_var_store("tool").unwrap().variables()[name]),
            "the other adapter's {name} changed"
        );
    }
    let planner_now = policy.adapter_var_store("planner").unwrap().variables();
    let changed = planner_before.iter().filter(|(n, t)| !t.equal(&planner_now[n])).count();
    assert_eq!(changed, planner_before.len(), "every planner tensor trains (B from zero, then A)");
    // Rows pick their adapter: base and tool rows are still the base model.
    let mixed = policy.logits(&prompts, &[None, Some("tool".into()), Some("planner".into())]).unwrap();
    assert!(mixed[0].equal(&before[0]) && mixed[1].equal(&before[1]));
    assert!(max_abs_diff(&mixed[2], &before[2]) > 1e-3, "the trained adapter changes its row's logits");

    // PEFT layout, and a reload gives the same logits.
    let out = tempfile::tempdir().unwrap();
    policy
        .save_adapter(
            "planner",
            out.path(),
            Some("hf-tiny-qwen3"),
            &SaveAs { policy: "planner", version: 1, parent: None },
        )
        .unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["peft_type"].as_str(), config["r"].as_u64(), config["lora_alpha"].as_f64()),
        (Some("LORA"), Some(4), Some(8.0))
    );
    assert_eq!(config["task_type"], "CAUSAL_LM");
    let (_, keys) = petting::model::read_header(&out.path().join("adapter_model.safetensors")).unwrap();
    let a = &keys["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    let b = &keys["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"];
    assert_eq!((a.1.clone(), b.1.clone()), (vec![4, 64], vec![96, 4]), "A (r, in), B (out, r)");
    let mut fresh = load(&dir);
    fresh.load_adapter("planner", out.path()).unwrap();
    let reloaded = base_logits(&mut fresh, &prompts, Some("planner"));
    assert!(reloaded[2].equal(&mixed[2]));
}

/// Every response token's logprob and every trainable tensor's gradient of a
/// token-summed loss, split as `batching` says.
fn logprobs_and_gradients(
    policy: &mut LanguageModel,
    requests: &[ScoreRequest],
    batching: &MicroBatching,
    adapter: Option<&str>,
) -> (Vec<Vec<f32>>, Vec<(String, Tensor)>) {
    let vs = match adapter {
        Some(name) => policy.adapter_var_store(name).unwrap(),
        None => policy.var_store(),
    };
    vs.trainable_variables().iter_mut().for_each(|t| t.zero_grad());
    let logprobs = policy
        .backward(requests, batching, 0, &mut |mb| {
            // Weighted per request, so a response in the wrong row would show.
            let weights: Vec<f32> = mb.indices.iter().map(|&i| 1.0 + i as f32).collect();
            let w = Tensor::from_slice(&weights).view([-1, 1]);
            Ok((&mb.logprobs * &mb.mask * w).sum(Kind::Float))
        })
        .unwrap();
    let vs = match adapter {
        Some(name) => policy.adapter_var_store(name).unwrap(),
        None => policy.var_store(),
    };
    let mut grads: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(n, t)| (n, t.grad().copy())).collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    (logprobs, grads)
}

#[test]
fn a_shared_prompt_forwarded_once_gives_the_logprobs_and_gradients_of_separate_rows() {
    for family in ["qwen3", "qwen2", "llama"] {
        let dir = fixture(family);
        let mut policy = load(&dir);
        let cases = cases(&dir);
        // Two groups of three responses of different lengths, and a request alone.
        let mut requests = Vec::new();
        for (c, case) in cases.iter().take(2).enumerate() {
            for k in 0..3 {
                let response: Vec<i64> = case.greedy.iter().skip(k).take(4 + 3 * k).map(|&t| t + c as i64).collect();
                requests.push(ScoreRequest {
                    prompt_ids: case.input_ids.clone(),
                    response_ids: response,
                    adapter: None,
                    images: None,
                });
            }
        }
        requests.insert(2, ScoreRequest { response_ids: vec![5, 6], ..score_request(&cases[2]) });
        let with_adapter: Vec<ScoreRequest> =
            requests.iter().map(|r| ScoreRequest { adapter: Some("planner".into()), ..r.clone() }).collect();
        for (adapter, requests) in [(None, &requests), (Some("planner"), &with_adapter)] {
            if adapter.is_some() {
                // The base freezes: from here on only the adapter trains.
                let lora = petting::model::LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, targets: Vec::new() };
                policy.add_adapter("planner", &lora, 7).unwrap();
                // As a trained adapter: a fresh one's B is 0, which makes every A
                // gradient 0 on both sides and the comparison of A's vacuous.
                tch::manual_seed(3);
                for (name, b) in policy.adapter_var_store("planner").unwrap().variables() {
                    if name.contains("lora_B") {
                        tch::no_grad(|| b.shallow_clone().copy_(&(Tensor::randn_like(&b) * 0.02)));
                    }
                }
            }
            for recompute in [false, true] {
                let separate = MicroBatching { share_prefix: false, ..MicroBatching::new(1 << 20, recompute) };
                let shared = MicroBatching { share_prefix: true, ..separate };
                let what = format!("{family}, adapter {adapter:?}, recompute {recompute}");
                let (lp_a, grads_a) = logprobs_and_gradients(&mut policy, requests, &separate, adapter);
                let (lp_b, grads_b) = logprobs_and_gradients(&mut policy, requests, &shared, adapter);
                for (a, b) in lp_a.iter().zip(&lp_b) {
                    assert_eq!(a.len(), b.len());
                    for (x, y) in a.iter().zip(b) {
                        assert!((x - y).abs() < 1e-4, "{what}: logprob {x} vs {y}");
                    }
                }
                if adapter.is_some() {
                    let a_grads = grads_a.iter().filter(|(name, _)| name.contains("lora_A"));
                    let largest = a_grads.map(|(_, g)| g.abs().max().double_value(&[])).fold(0.0, f64::max);
                    assert!(largest > 1e-6, "{what}: the A gradients are all zero, so comparing them shows nothing");
                }
                for ((name, a), (_, b)) in grads_a.iter().zip(&grads_b) {
                    let scale = a.abs().max().double_value(&[]).max(1e-6);
                    let err = max_abs_diff(a, b) / scale;
                    assert!(err < 1e-4, "{what}: gradient of {name} differs by {err} (relative)");
                }
                let scored = policy.score(requests, 1 << 20).unwrap();
                assert!(scored.iter().flatten().zip(lp_a.iter().flatten()).all(|(x, y)| (x - y).abs() < 1e-4));
            }
        }
    }
}

#[test]
fn a_sequences_sample_does_not_depend_on_its_batch_mates() {
    let mut policy = load(&fixture("llama"));
    let cases = cases(&fixture("llama"));
    let settings = GenerationSettings {
        eos_token_ids: Some(Vec::new()),
        ..GenerationSettings::new(Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 }, 12)
    };
    let request = |i: usize, seed: u64| GenerationRequest {
        prompt_ids: cases[i].input_ids.clone(),
        seed,
        adapter: None,
        images: None,
    };
    let alone = policy.generate(&[request(1, 42)], &settings).unwrap();
    let batched = policy.generate(&[request(0, 1), request(1, 42), request(2, 3)], &settings).unwrap();
    assert_eq!(alone[0].token_ids, batched[1].token_ids);
    let other_seed = policy.generate(&[request(1, 43)], &settings).unwrap();
    assert_ne!(alone[0].token_ids, other_seed[0].token_ids, "another seed gives another sample");
    // The recorded logprobs are those a scoring pass computes.
    let scored = policy
        .score(
            &[ScoreRequest {
                prompt_ids: cases[1].input_ids.clone(),
                response_ids: alone[0].token_ids.clone(),
                adapter: None,
                images: None,
            }],
            1024,
        )
        .unwrap();
    for (a, b) in alone[0].logprobs.iter().zip(&scored[0]) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn model_info_names_the_architecture_and_parameter_count() {
    let dir = fixture("qwen3");
    let (ok, stdout, stderr) = run(&["model", "info", dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let info: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(info["architecture"], "Qwen3ForCausalLM");
    assert_eq!(info["dtype"], "float32");
    // 512×64 embedding (tied) + 3 layers + final norm, counted from the safetensors file.
    let expected: i64 = petting::model::read_header(&dir.join("model.safetensors"))
        .unwrap()
        .1
        .values()
        .map(|(_, shape)| shape.iter().product::<usize>() as i64)
        .sum();
    assert_eq!(info["parameters"].as_i64(), Some(expected));
}

#[test]
fn model_generate_and_score_print_one_json_object_per_sequence() {
    let dir = fixture("qwen2");
    let case = &cases(&dir)[1];
    let chat = serde_json::to_string(&case.messages).unwrap();
    let (ok, stdout, stderr) =
        run(&["model", "generate", dir.to_str().unwrap(), "--chat", &chat, "--max-new-tokens", "16", "--greedy"]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let out: Value = serde_json::from_str(lines[0]).unwrap();
    let ids: Vec<i64> = out["token_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    // EOS may end it early; up to there it is transformers' greedy continuation.
    assert_eq!(ids[..], case.greedy[..ids.len()]);
    assert_eq!(out["logprobs"].as_array().unwrap().len(), ids.len());
    assert!(out["text"].is_string());

    let input = tempfile::NamedTempFile::new().unwrap();
    let line = serde_json::json!({"prompt_ids": case.input_ids, "response_ids": case.greedy});
    std::fs::write(input.path(), format!("{line}\n{line}\n")).unwrap();
    let (ok, stdout, stderr) =
        run(&["model", "score", dir.to_str().unwrap(), "--input", input.path().to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2);
    let out: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(out["prompt_ids"], line["prompt_ids"]);
    for (got, want) in out["logprobs"].as_array().unwrap().iter().zip(&case.logprobs) {
        assert!((got.as_f64().unwrap() - want).abs() <= 1e-4);
    }
}

fn smollm2_gguf() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "run scripts/install/test-models.sh");
    path
}

#[test]
fn imported_smollm2_says_the_capital_of_france_is_paris() {
    if !crate::support::full_suite("imported_smollm2_says_the_capital_of_france_is_paris") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("smollm2");
    let (ok, stdout, stderr) =
        run(&["model", "import-gguf", smollm2_gguf().to_str().unwrap(), "--output", dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["architecture"], "LlamaForCausalLM");
    // A normal HF folder: 30 layers × 9 tensors + embedding + final norm, lm_head tied.
    assert_eq!(summary["tensors"], 272);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!((config["rms_norm_eps"].as_f64(), config["rope_theta"].as_f64()), (Some(1e-5), Some(100000.0)));
    assert_eq!(
        (config["num_key_value_heads"].as_i64(), config["tie_word_embeddings"].as_bool()),
        (Some(3), Some(true))
    );

    let mut policy = load(&dir);
    let messages = vec![ChatMessage::new("user", "What is the capital of France?")];
    let (text, ids) =
        policy.encode_chat(&messages, &TemplateOptions { add_generation_prompt: true, ..Default::default() }).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), "{text}");
    assert_eq!(ids[0], 1, "<|im_start|> is one special token");
    let request = GenerationRequest { prompt_ids: ids, seed: 0, adapter: None, images: None };
    let out = policy.generate(&[request], &GenerationSettings::new(Sampling::Greedy, 24)).unwrap();
    assert_eq!(out[0].text.trim(), "The capital of France is Paris.", "{:?}", out[0]);
    assert_eq!(out[0].finish_reason, petting::model::FinishReason::Eos);
}

#[test]
fn gguf_dequantisation_matches_the_gguf_python_package() {
    if !crate::support::full_suite("gguf_dequantisation_matches_the_gguf_python_package") {
        return;
    }
    let Some(python) = std::env::var_os("PETTING_PYTHON") else {
        panic!("PETTING_PYTHON is not set: run the tests with scripts/test.sh (it installs the gguf package)");
    };
    let dir = tempfile::tempdir().unwrap();
    // Random blocks of each type with finite f16 scales, dequantised by gguf-py's numpy code.
    let script = r#"
import sys, numpy as np
from gguf import GGMLQuantizationType as T, quants, constants
out = sys.argv[1]
rng = np.random.default_rng(5)
for t in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.BF16]:
    block, size = constants.GGML_QUANT_SIZES[t]
    n_blocks = 6
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    halves = rng.uniform(-1, 1, size=(n_blocks, size // 2)).astype(np.float16).view(np.uint8).reshape(n_blocks, -1)
    # Scales and mins are f16: at the start of a block, or at its end for Q6_K.
    if t == T.Q6_K:
        raw[:, 208:210] = halves[:, 0:2]
    elif t in (T.F16,):
        raw = halves[:, :size]
    elif t == T.BF16:
        raw = rng.uniform(-4, 4, size=(n_blocks,)).astype(np.float32).view(np.uint32).__rshift__(16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    else:
        raw[:, 0:4] = halves[:, 0:4]
    values = quants.dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
    raw.tofile(f"{out}/{int(t)}.bin")
    values.tofile(f"{out}/{int(t)}.f32")
"#;
    let status = std::process::Command::new(python).arg("-c").arg(script).arg(dir.path()).status().unwrap();
    assert!(status.success(), "the gguf reference script failed");
    for ggml_type in [2u32, 3, 6, 7, 8, 12, 14, 1, 30] {
        let raw = std::fs::read(dir.path().join(format!("{ggml_type}.bin"))).unwrap();
        let want: Vec<f32> = std::fs::read(dir.path().join(format!("{ggml_type}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let (block, bytes) = petting::model::gguf::block_size(ggml_type).unwrap();
        let got = petting::model::gguf::dequantize(ggml_type, &raw, raw.len() / bytes * block).unwrap();
        assert_eq!(got.len(), want.len(), "type {ggml_type}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "type {ggml_type} value {i}: {g} vs {w}");
        }
    }
}

/// Writes a trained full checkpoint and a trained LoRA adapter, with the logprobs petting
/// computes for them, into $PETTING_EXPORT_DIR, for `scripts/experiments/check-transformers-load.py`
/// (which needs torch + transformers + peft, too large for CI). Run on demand:
/// `PETTING_EXPORT_DIR=/tmp/x cargo test --test it export_for_transformers -- --ignored`.
#[test]
#[ignore = "writes files for the transformers check; run on demand"]
fn export_for_transformers() {
    let out = PathBuf::from(std::env::var_os("PETTING_EXPORT_DIR").expect("set PETTING_EXPORT_DIR"));
    use tch::nn::OptimizerConfig;
    let mut lines = Vec::new();
    for family in FAMILIES {
        let dir = fixture(family);
        let cases = cases(&dir);
        let requests: Vec<ScoreRequest> = cases.iter().map(score_request).collect();
        let mean_ce = |mb: &petting::model::MicroBatch| {
            Ok(-(&mb.logprobs * &mb.mask).sum(Kind::Float) / mb.mask.sum(Kind::Float))
        };
        // Full fine-tuning: two AdamW steps, so the weights are no longer the fixture's.
        let mut policy = load(&dir);
        let mut opt = tch::nn::AdamW::default().build(policy.var_store(), 1e-2).unwrap();
        for _ in 0..2 {
            opt.zero_grad();
            policy.backward(&requests, &MicroBatching::new(1 << 20, false), 0, &mut |mb| mean_ce(mb)).unwrap();
            opt.step();
        }
        let full = out.join(format!("{family}-full"));
        policy.save(&full, &SaveAs { policy: family, version: 1, parent: None }).unwrap();
        let scores = policy.score(&requests, 1 << 20).unwrap();
        for (r, s) in requests.iter().zip(&scores) {
            lines.push(serde_json::json!({"dir": full, "adapter": null, "prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "logprobs": s}));
        }
        // LoRA on the original base: two steps on an adapter.
        let mut policy = load(&dir);
        let lora = petting::model::LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, targets: Vec::new() };
        policy.add_adapter("a", &lora, 1).unwrap();
        let requests: Vec<ScoreRequest> =
            requests.iter().map(|r| ScoreRequest { adapter: Some("a".into()), ..r.clone() }).collect();
        let mut opt = tch::nn::AdamW::default().build(policy.adapter_var_store("a").unwrap(), 1e-2).unwrap();
        for _ in 0..2 {
            opt.zero_grad();
            policy.backward(&requests, &MicroBatching::new(1 << 20, false), 0, &mut |mb| mean_ce(mb)).unwrap();
            opt.step();
        }
        let adapter = out.join(format!("{family}-adapter"));
        policy
            .save_adapter(
                "a",
                &adapter,
                Some(dir.to_str().unwrap()),
                &SaveAs { policy: family, version: 1, parent: None },
            )
            .unwrap();
        let scores = policy.score(&requests, 1 << 20).unwrap();
        for (r, s) in requests.iter().zip(&scores) {
            lines.push(serde_json::json!({"dir": dir, "adapter": adapter, "prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "logprobs": s}));
        }
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(out.join("expected.jsonl"), text).unwrap();
}

#[test]
fn running_out_of_memory_is_an_error_naming_what_ran_out_not_a_panic() {
    use std::os::unix::process::CommandExt;
    // 32 sequences of 28k tokens, scored in one micro-batch: many GiB, in a 2 GiB address space.
    let input = tempfile::NamedTempFile::new().unwrap();
    let ids: Vec<i64> = (0..28_000).map(|i| 3 + i % 500).collect();
    let line = serde_json::json!({"prompt_ids": &ids[..20_000], "response_ids": &ids[20_000..]}).to_string();
    std::fs::write(input.path(), format!("{line}\n").repeat(32)).unwrap();
    let mut command = crate::support::petting();
    let fixture = fixture("qwen3");
    command.args(["model", "score", fixture.to_str().unwrap(), "--input", input.path().to_str().unwrap()]);
    command.args(["--max-tokens", "100000000"]);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
    }
    let (ok, _, stderr) = crate::support::output_of(command.output().unwrap());
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("out of memory while scoring 32 sequences"), "{stderr}");
    assert!(stderr.contains("DefaultCPUAllocator: can't allocate memory"), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("frame #") && !stderr.contains("unwrap"), "{stderr}");
}

/// The last prompt position's logprobs at `temperature`, from the fixture's logits (computed
/// by `transformers`).
fn transformers_logprobs(case: &Case, temperature: f64) -> Tensor {
    let last = case.logits.get(case.logits.size()[0] - 1) / temperature;
    last.log_softmax(-1, Kind::Double)
}

#[test]
fn sampled_and_trained_logprobs_are_those_of_the_tempered_distribution() {
    let dir = fixture("llama");
    let mut policy = load(&dir);
    let case = &cases(&dir)[0];
    let settings = GenerationSettings {
        eos_token_ids: Some(Vec::new()),
        ..GenerationSettings::new(Sampling::Sample { temperature: 0.7, top_k: 0, top_p: 1.0 }, 1)
    };
    let (tempered, raw) = (transformers_logprobs(case, 0.7), transformers_logprobs(case, 1.0));
    let requests: Vec<GenerationRequest> = (0..16)
        .map(|seed| GenerationRequest { prompt_ids: case.input_ids.clone(), seed, adapter: None, images: None })
        .collect();
    let sampled = policy.generate(&requests, &settings).unwrap();
    let mut moved = 0.0f64;
    for generation in &sampled {
        let token = generation.token_ids[0];
        let want = tempered.double_value(&[token]);
        let got = f64::from(generation.logprobs[0]);
        assert!((got - want).abs() < 1e-4, "token {token}: sampled logprob {got}, transformers at T=0.7 {want}");
        // The trainer scores with the same temperature.
        let request =
            ScoreRequest { prompt_ids: case.input_ids.clone(), response_ids: vec![token], adapter: None, images: None };
        let batching = MicroBatching { temperature: 0.7, ..MicroBatching::new(4096, false) };
        let scored = f64::from(policy.score_batched(&[request], &batching).unwrap()[0][0]);
        assert!((scored - want).abs() < 1e-4, "token {token}: trainer's logprob {scored} vs {want}");
        moved = moved.max((want - raw.double_value(&[token])).abs());
    }
    assert!(moved > 1e-2, "temperature 0.7 must differ from 1 on some token (largest gap {moved})");
}

/// A trainer for the whole of `policy` at `lr`, no decay.
fn trainer(policy: &LanguageModel, lr: f64) -> petting::model::Trainer {
    let config = petting::model::OptimizerConfig { lr, weight_decay: 0.0, ..Default::default() };
    petting::model::Trainer::new(policy, None, &config, 1.0, None, None).unwrap()
}

/// Two responses to one prompt: the fixture's greedy continuation and another.
fn two_responses(case: &Case) -> Vec<ScoreRequest> {
    let other: Vec<i64> = case.greedy.iter().take(6).map(|&t| (t + 7) % 256).collect();
    [case.greedy[..6].to_vec(), other]
        .into_iter()
        .map(|response_ids| ScoreRequest {
            prompt_ids: case.input_ids.clone(),
            response_ids,
            adapter: None,
            images: None,
        })
        .collect()
}

fn sequence_logprob(policy: &mut LanguageModel, request: &ScoreRequest) -> f64 {
    policy.score(std::slice::from_ref(request), 4096).unwrap()[0].iter().map(|&x| f64::from(x)).sum()
}

#[test]
fn one_ppo_step_raises_a_positive_advantage_response_and_lowers_a_negative_one() {
    use petting::algo::loss::{Advantage, Aggregation, ppo_clip_loss, truncated_importance_weight};
    let dir = fixture("llama");
    let case = &cases(&dir)[0];
    let requests = two_responses(case);
    // With the cap, each token gets its own advantage (a token-level critic's), of the
    // response's sign: 1, 0.5, 1, 0.5, … and −1, −0.5, ….
    let per_token = |r: usize, sign: f32| -> Vec<f32> {
        (0..requests[r].response_ids.len()).map(|j| sign * [1.0, 0.5][j % 2]).collect()
    };
    let (first, second) = (per_token(0, 1.0), per_token(1, -1.0));
    for importance_cap in [None, Some(2.0)] {
        let advantages = match importance_cap {
            None => [Some(Advantage::Sequence(1.0)), Some(Advantage::Sequence(-1.0))],
            Some(_) => [Some(Advantage::Tokens(&first)), Some(Advantage::Tokens(&second))],
        };
        let mut policy = load(&dir);
        let before: Vec<f64> = requests.iter().map(|r| sequence_logprob(&mut policy, r)).collect();
        let old = policy.score(&requests, 4096).unwrap();
        // The engine's logprobs off the trainer's, so that the importance weights are not
        // all 1: a little above, far above (weight e^-0.9) and below past the cap (e^1 > 2).
        let offset = |j: usize| [0.05f32, 0.9, -1.0][j % 3];
        let sampled: Vec<Vec<f32>> =
            old.iter().map(|lp| lp.iter().enumerate().map(|(j, x)| x + offset(j)).collect()).collect();
        let old: Vec<&[f32]> = old.iter().map(Vec::as_slice).collect();
        let sampled: Vec<&[f32]> = sampled.iter().map(Vec::as_slice).collect();
        let clip = petting::model::PpoClip { epsilon: 0.2, aggregation: Aggregation::TokenMean, importance_cap };
        let mut trainer = trainer(&policy, 1e-3);
        let micro = MicroBatching::new(4096, false);
        let done = trainer.ppo_step(
            &mut policy,
            &requests,
            Some(&old),
            &sampled,
            &advantages,
            Totals::of(&requests, &advantages),
            clip,
            micro,
            0,
            1e-3,
        );
        let done = done.unwrap();
        assert!(!done.skipped && done.loss.is_finite(), "{importance_cap:?}: {:?}", (done.loss, done.grad_norm));
        // The tensor loss weighs each token as the pure function does: ratio 1 (the old
        // logprobs are the step's own forward), times the capped importance weight.
        let pairs: Vec<Vec<(f64, f64)>> =
            old.iter().map(|lp| lp.iter().map(|&x| (f64::from(x), f64::from(x))).collect()).collect();
        let sequences: Vec<(&[(f64, f64)], Advantage)> =
            pairs.iter().map(Vec::as_slice).zip(advantages.map(Option::unwrap)).collect();
        let weights: Option<Vec<Vec<f64>>> = importance_cap.map(|cap| {
            old.iter()
                .zip(&sampled)
                .map(|(o, s)| {
                    o.iter().zip(*s).map(|(&o, &s)| truncated_importance_weight(o.into(), s.into(), cap)).collect()
                })
                .collect()
        });
        let expected = ppo_clip_loss(&sequences, weights.as_deref(), 0.2, Aggregation::TokenMean).loss;
        assert!((done.loss - expected).abs() < 1e-4, "{importance_cap:?}: loss {} vs {expected}", done.loss);
        drop(trainer);
        let after: Vec<f64> = requests.iter().map(|r| sequence_logprob(&mut policy, r)).collect();
        assert!(after[0] > before[0], "{importance_cap:?}: A = +1 response {} -> {}", before[0], after[0]);
        assert!(after[1] < before[1], "{importance_cap:?}: A = -1 response {} -> {}", before[1], after[1]);
    }
}

#[test]
fn a_step_with_a_non_finite_loss_is_skipped_and_moves_nothing() {
    use petting::algo::loss::{Advantage, Aggregation};
    let dir = fixture("llama");
    let case = &cases(&dir)[0];
    let requests = two_responses(case);
    let mut policy = load(&dir);
    let before = policy.score(&requests, 4096).unwrap();
    let sampled: Vec<&[f32]> = before.iter().map(Vec::as_slice).collect();
    let clip = petting::model::PpoClip { epsilon: 0.2, aggregation: Aggregation::TokenMean, importance_cap: None };
    let mut trainer = trainer(&policy, 1e-3);
    let micro = MicroBatching::new(4096, false);
    let advantages = [Some(Advantage::Sequence(f64::NAN)), Some(Advantage::Sequence(1.0))];
    let done = trainer
        .ppo_step(
            &mut policy,
            &requests,
            None,
            &sampled,
            &advantages,
            Totals::of(&requests, &advantages),
            clip,
            micro,
            0,
            1e-3,
        )
        .unwrap();
    assert!(done.skipped, "a NaN advantage makes a NaN loss: {:?}", (done.loss, done.grad_norm));
    assert_eq!((done.weights_change, trainer.steps_taken()), (0.0, 0), "no step was taken");
    assert!(trainer.non_finite_weights().is_empty());
    drop(trainer);
    assert_eq!(policy.score(&requests, 4096).unwrap(), before, "the weights are unchanged");
}

#[test]
fn a_prompt_over_the_limit_is_an_error_not_a_cut() {
    let policy = load(&fixture("qwen3"));
    let (_, ids) = policy.agent_prompt("Plan a path from S to G.", 4096).unwrap();
    assert_eq!(policy.agent_prompt("Plan a path from S to G.", ids.len()).unwrap().1, ids, "at the limit: as it is");
    let err = policy.agent_prompt("Plan a path from S to G.", ids.len() - 1).unwrap_err();
    assert!(matches!(err, Error::PromptTooLong { tokens, limit, .. } if tokens == ids.len() && limit == ids.len() - 1));
    let message = err.to_string();
    assert!(message.contains("rollout.max_prompt_tokens") && message.contains("Plan a path"), "{message}");
}

#[test]
fn a_masked_response_trains_as_if_it_were_not_in_the_mini_batch() {
    use petting::algo::loss::{Advantage, Aggregation};
    let dir = fixture("llama");
    let case = &cases(&dir)[0];
    let requests = two_responses(case);
    let clip = petting::model::PpoClip { epsilon: 0.2, aggregation: Aggregation::TokenMean, importance_cap: None };
    let micro = MicroBatching::new(4096, false);
    let step = |requests: &[ScoreRequest], advantages: &[Option<f64>]| -> Vec<Vec<f32>> {
        let advantages: Vec<Option<Advantage>> = advantages.iter().map(|a| a.map(Advantage::Sequence)).collect();
        let advantages = advantages.as_slice();
        let mut policy = load(&dir);
        let sampled = policy.score(requests, 4096).unwrap();
        let sampled: Vec<&[f32]> = sampled.iter().map(Vec::as_slice).collect();
        let mut trainer = trainer(&policy, 1e-3);
        let totals = Totals::of(requests, advantages);
        trainer.ppo_step(&mut policy, requests, None, &sampled, advantages, totals, clip, micro, 0, 1e-3).unwrap();
        drop(trainer);
        policy.score(&two_responses(case), 4096).unwrap()
    };
    let masked = step(&requests, &[Some(1.0), None]);
    let alone = step(&requests[..1], &[Some(1.0)]);
    for (a, b) in masked.iter().flatten().zip(alone.iter().flatten()) {
        assert!((a - b).abs() < 1e-5, "masked {a} vs trained alone {b}");
    }
    let both = step(&requests, &[Some(1.0), Some(1.0)]);
    assert!(both.iter().flatten().zip(alone.iter().flatten()).any(|(a, b)| (a - b).abs() > 1e-4), "the mask matters");
}
