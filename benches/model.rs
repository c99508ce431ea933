//! The model workloads the Hugging Face `transformers` anchors measure (BENCHMARKS.md,
//! "Models against Hugging Face transformers"), measured the same way (`scripts/bench/models.sh`):
//!
//! * A `prefill`: one forward over 16 × 256 random prompt tokens (full logits), and the
//!   same keeping the last position only (a 1-token generate);
//!   `greedy`: generate 128 new tokens for 16 × 256 prompts, EOS masked until the end;
//! * B `sampled`: the same with temperature 1, top-p 1, top-k 0, per-token logprobs;
//! * C `ce` / `ppo`: one training step on 16 × 384 tokens (zero grad, forward, loss,
//!   backward, AdamW lr 1e-5, weight decay 0.01); PPO-clip with old logprobs from a
//!   no-grad pass before timing and one N(0, 1) advantage per sequence.
//!
//! * `grpo`: one GRPO step as TRL's `GRPOTrainer` takes it (`scripts/bench/grpo_trl.py`
//!   is the other side), on a real model folder (`--model-dir`): 4 math prompts from
//!   `datasets/math/gsm_symbolic.jsonl` in the model's chat template × 4 completions of
//!   exactly 64 sampled tokens, a reward counting ids ≡ 3 mod 64, group-normalised
//!   advantages, then what petting's update does with one mini-batch: one PPO-clip step
//!   whose own forward gives the old logprobs, with petting's AdamW (lr 1e-5, no
//!   weight decay).
//!
//! * `decode`: greedy generate of exactly `--new-tokens` tokens for `--batch` random
//!   prompts of `--prompt-len` tokens, with the sampler's own split of prefill and decode
//!   time: the GPU workload (`--device cuda --dtype bf16 --config
//!   benches/configs/qwen3-1.7b.config.json`; `scripts/bench/decode_hf.py` is the other side).
//!
//! Random weights from the bench configs (`LanguageModel::scratch`, seed 0; `--config` for another
//! shape), float32 on CPU unless `--dtype`, 2 threads.
//! One warm-up and 5 timed reps (`--reps`); a rep of ≥ 0.25 s during which other processes
//! used ≥ 0.30 cores is discarded and redone, as the anchors do. One JSON line per run is
//! appended to `--out`.
//!
//! `cargo bench --bench model -- --model bench-small --workload greedy --out results.jsonl`

use std::io::Write;
use std::time::Instant;

use petting::algo::loss::Aggregation;
use petting::model::{
    ChatMessage, DType, Device, GenerationRequest, GenerationSettings, GenerationStats, LanguageModel, LoadOptions,
    MicroBatching, ModelConfig, OptimizerConfig, PpoClip, Sampling, SaveAs, ScoreRequest, TemplateOptions, Trainer,
};
use tch::Kind;
use tch::nn::OptimizerConfig as _;

struct Args {
    model: String,
    model_dir: Option<String>,
    config: Option<String>,
    device: Device,
    dtype: Option<DType>,
    batch: usize,
    prompt_len: usize,
    new_tokens: usize,
    workload: String,
    reps: usize,
    out: Option<String>,
    tag: String,
}

fn parse_args() -> Args {
    let mut args = Args {
        model: "bench-tiny".into(),
        model_dir: None,
        config: None,
        device: Device::Cpu,
        dtype: None,
        batch: 64,
        prompt_len: 256,
        new_tokens: 128,
        workload: "greedy".into(),
        reps: 5,
        out: None,
        tag: "default".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--model" => args.model = it.next().expect("--model NAME"),
            "--model-dir" => args.model_dir = it.next(),
            "--dtype" => {
                args.dtype = match it.next().as_deref() {
                    Some("f32") => Some(DType::F32),
                    Some("bf16") => Some(DType::Bf16),
                    other => panic!("--dtype f32|bf16, not {other:?}"),
                }
            }
            "--config" => args.config = it.next(),
            "--device" => {
                let name = it.next().expect("--device cpu|cuda|cuda:N");
                args.device =
                    serde_json::from_value(serde_json::Value::String(name)).expect("--device cpu|cuda|cuda:N");
            }
            "--batch" => args.batch = it.next().expect("--batch N").parse().expect("a number"),
            "--prompt-len" => args.prompt_len = it.next().expect("--prompt-len N").parse().expect("a number"),
            "--new-tokens" => args.new_tokens = it.next().expect("--new-tokens N").parse().expect("a number"),
            "--workload" => args.workload = it.next().expect("--workload NAME"),
            "--reps" => args.reps = it.next().expect("--reps N").parse().expect("a number"),
            "--out" => args.out = it.next(),
            "--tag" => args.tag = it.next().expect("--tag NAME"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// Busy CPU seconds of the whole machine (user+nice+system+irq+softirq+steal).
fn busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let v: Vec<f64> = stat.lines().next().unwrap().split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    let ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v.get(7).copied().unwrap_or(0.0);
    ticks / 100.0 // USER_HZ is 100 on Linux x86-64
}

/// CPU seconds this process has used.
fn own_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

/// Waits until other processes use < 0.25 cores over 5 s (at most 15 min), like wait_quiet.py.
fn wait_quiet() {
    let start = Instant::now();
    loop {
        let (b0, o0) = (busy_seconds(), own_seconds());
        std::thread::sleep(std::time::Duration::from_secs(5));
        let other = ((busy_seconds() - b0) - (own_seconds() - o0)).max(0.0) / 5.0;
        if other < 0.25 || start.elapsed().as_secs() > 900 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
}

/// Runs `f` once; returns (seconds, cores' worth of CPU other processes used meanwhile).
fn timed(f: &mut dyn FnMut()) -> (f64, f64) {
    let (b0, o0) = (busy_seconds(), own_seconds());
    let t0 = Instant::now();
    f();
    let dt = t0.elapsed().as_secs_f64();
    let other = ((busy_seconds() - b0) - (own_seconds() - o0)).max(0.0);
    (dt, other / dt)
}

/// 1 warm-up, then `reps` kept reps: (kept seconds, other-cores of each, discarded).
fn measure(reps: usize, f: &mut dyn FnMut()) -> (Vec<f64>, Vec<f64>, Vec<(f64, f64)>) {
    f();
    let (mut kept, mut loads, mut discarded) = (Vec::new(), Vec::new(), Vec::new());
    while kept.len() < reps {
        let (dt, other) = timed(f);
        if dt >= 0.25 && other >= 0.30 {
            discarded.push((dt, other));
            wait_quiet();
            continue;
        }
        kept.push(dt);
        loads.push(other);
    }
    (kept, loads, discarded)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

/// Token ids in [3, V) from a fixed stream (their values do not affect speed).
fn random_ids(rows: usize, len: usize, vocab: usize, seed: u64) -> Vec<Vec<i64>> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..rows).map(|_| (0..len).map(|_| 3 + (next() % (vocab as u64 - 3)) as i64).collect()).collect()
}

fn main() {
    petting::allocator::keep_freed_memory(); // as the petting binary does
    let args = parse_args();
    tch::set_num_threads(2);
    args.device.check_available().unwrap();
    let options = LoadOptions { device: args.device, dtype: args.dtype };
    let mut policy = match &args.model_dir {
        Some(dir) => LanguageModel::load(std::path::Path::new(dir), &options).unwrap(),
        None => {
            let config_path = args.config.clone().map(std::path::PathBuf::from).unwrap_or_else(|| {
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("tests/fixtures/model-configs/{}.config.json", args.model))
            });
            LanguageModel::scratch(ModelConfig::from_file(&config_path).unwrap(), 0, &options).unwrap()
        }
    };
    let vocab = policy.config().vocab_size;
    let total_tokens;
    // The sampler's own account of each `decode` call, the warm-up first.
    let mut generation_stats: Vec<GenerationStats> = Vec::new();
    let (kept, loads, discarded) = match args.workload.as_str() {
        "prefill" | "prefill_keep1" => {
            let prompts = random_ids(16, 256, vocab, 1234);
            total_tokens = 16 * 256;
            if args.workload == "prefill" {
                measure(args.reps, &mut || {
                    let logits = policy.logits(&prompts, &[]).unwrap();
                    assert_eq!(logits[0].size(), vec![256, vocab as i64]);
                })
            } else {
                let requests: Vec<GenerationRequest> = prompts
                    .iter()
                    .map(|p| GenerationRequest { prompt_ids: p.clone(), seed: 0, adapter: None, images: None })
                    .collect();
                let settings = GenerationSettings::new(Sampling::Greedy, 1);
                measure(args.reps, &mut || {
                    policy.generate(&requests, &settings).unwrap();
                })
            }
        }
        "greedy" | "sampled" => {
            let prompts = random_ids(16, 256, vocab, 1234);
            total_tokens = 16 * 128;
            let sampling = if args.workload == "greedy" {
                Sampling::Greedy
            } else {
                Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 }
            };
            let settings = GenerationSettings { min_new_tokens: 128, ..GenerationSettings::new(sampling, 128) };
            let mut round = 0u64;
            measure(args.reps, &mut || {
                round += 1;
                let requests: Vec<GenerationRequest> = prompts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| GenerationRequest {
                        prompt_ids: p.clone(),
                        seed: round * 100 + i as u64,
                        adapter: None,
                        images: None,
                    })
                    .collect();
                let out = policy.generate(&requests, &settings).unwrap();
                assert!(out.iter().all(|g| g.token_ids.len() == 128 && g.logprobs.len() == 128));
            })
        }
        "decode" => {
            let prompts = random_ids(args.batch, args.prompt_len, vocab, 1234);
            total_tokens = args.batch * args.new_tokens;
            let settings = GenerationSettings {
                min_new_tokens: args.new_tokens,
                ..GenerationSettings::new(Sampling::Greedy, args.new_tokens)
            };
            let requests: Vec<GenerationRequest> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| GenerationRequest { prompt_ids: p.clone(), seed: i as u64, adapter: None, images: None })
                .collect();
            measure(args.reps, &mut || {
                let (out, stats) = policy.generate_with_stats(&requests, &settings).unwrap();
                assert!(out.iter().all(|g| g.token_ids.len() == args.new_tokens));
                generation_stats.push(stats);
            })
        }
        "ce" | "ppo" => {
            let ids = random_ids(16, 384, vocab, 4321);
            total_tokens = 16 * 384;
            // The first token is the prompt; the 383 after it are scored (transformers' shifted CE).
            let requests: Vec<ScoreRequest> = ids
                .iter()
                .map(|s| ScoreRequest {
                    prompt_ids: s[..1].to_vec(),
                    response_ids: s[1..].to_vec(),
                    adapter: None,
                    images: None,
                })
                .collect();
            let old = policy.score(&requests, usize::MAX).unwrap();
            let old = tch::Tensor::from_slice(&old.concat()).view([16, 383]);
            let advantages = tch::Tensor::from_slice(
                &random_ids(1, 16, 1 << 20, 99)[0]
                    .iter()
                    .map(|&x| ((x as f64 / (1 << 19) as f64) - 1.0) as f32)
                    .collect::<Vec<f32>>(),
            )
            .view([16, 1]);
            let mut opt = tch::nn::AdamW { beta1: 0.9, beta2: 0.999, wd: 0.01, eps: 1e-8, amsgrad: false }
                .build(policy.var_store(), 1e-5)
                .unwrap();
            let ppo = args.workload == "ppo";
            measure(args.reps, &mut || {
                opt.zero_grad();
                policy
                    .backward(&requests, &MicroBatching::new(usize::MAX, false), 0, &mut |mb| {
                        let idx = tch::Tensor::from_slice(&mb.indices.iter().map(|&i| i as i64).collect::<Vec<_>>());
                        let n = mb.mask.sum(Kind::Float);
                        Ok(if ppo {
                            let (old, adv) = (old.index_select(0, &idx), advantages.index_select(0, &idx));
                            let ratio = (&mb.logprobs - old).exp();
                            let pg_loss1 = -&adv * &ratio;
                            let pg_loss2 = -&adv * ratio.clamp(0.8, 1.2);
                            (pg_loss1.max_other(&pg_loss2) * &mb.mask).sum(Kind::Float) / n
                        } else {
                            -(&mb.logprobs * &mb.mask).sum(Kind::Float) / n
                        })
                    })
                    .unwrap();
                opt.step();
            })
        }
        "save" | "load" => {
            // A full checkpoint written (one tensor at a time, hashed as written) or read
            // back from a folder in the page cache, as an update and the next stage do.
            let out = tempfile::tempdir().unwrap();
            let save_as = SaveAs { policy: "bench", version: 1, parent: None };
            policy.save(out.path(), &save_as).unwrap();
            std::fs::copy(
                std::path::Path::new(args.model_dir.as_deref().expect("--model-dir")).join("tokenizer.json"),
                out.path().join("tokenizer.json"),
            )
            .unwrap();
            total_tokens = 0;
            if args.workload == "save" {
                measure(args.reps, &mut || {
                    policy.save(out.path(), &save_as).unwrap();
                })
            } else {
                measure(args.reps, &mut || {
                    drop(LanguageModel::load(out.path(), &options).unwrap());
                })
            }
        }
        "grpo" => {
            total_tokens = GRPO_PROMPTS * GRPO_K * GRPO_COMPLETION;
            let mut step = grpo_step(&mut policy);
            measure(args.reps, &mut step)
        }
        other => panic!("unknown workload {other} (prefill, prefill_keep1, greedy, sampled, decode, ce, ppo, grpo)"),
    };
    let med = median(&kept);
    let line = serde_json::json!({
        "side": "petting-tch",
        "model": args.model_dir.as_deref().or(args.config.as_deref()).unwrap_or(&args.model),
        "device": args.device.to_string(),
        "dtype": format!("{:?}", policy.kind()),
        "generation": generation_summary(&generation_stats, &args),
        "workload": args.workload,
        "tag": args.tag,
        "reps_s": kept,
        "median_s": med,
        "min_s": kept.iter().cloned().fold(f64::INFINITY, f64::min),
        "max_s": kept.iter().cloned().fold(0.0, f64::max),
        "tokens_per_s": total_tokens as f64 / med,
        "max_other_cores": loads.iter().cloned().fold(0.0, f64::max),
        "discarded": discarded,
        "peak_rss_mib": peak_rss_mib(),
        "glibc_tunables": std::env::var("GLIBC_TUNABLES").unwrap_or_default(),
        "debug_assertions": cfg!(debug_assertions),
    });
    println!("{line}");
    if let Some(out) = args.out {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(out).unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

/// Medians over the timed reps of where a `decode` call's time went (discarded reps included).
fn generation_summary(stats: &[GenerationStats], args: &Args) -> serde_json::Value {
    let Some((first, timed)) = stats.split_first() else { return serde_json::Value::Null };
    let prefill = median(&timed.iter().map(|s| s.prefill_seconds).collect::<Vec<_>>());
    let decode = median(&timed.iter().map(|s| s.decode_seconds).collect::<Vec<_>>());
    serde_json::json!({
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "slots": first.slots, "kv_cache_gib": first.kv_cache_bytes as f64 / (1u64 << 30) as f64,
        "prefill_s": prefill, "decode_s": decode,
        // The first token of each row comes from the prefill.
        "decode_tokens_per_s": (first.generated_tokens - args.batch) as f64 / decode,
    })
}

const GRPO_PROMPTS: usize = 4;
const GRPO_K: usize = 4;
const GRPO_COMPLETION: usize = 64;

/// One GRPO step on `policy`, as a closure to time: sample, reward, advantages, old
/// logprobs, one PPO-clip step.
fn grpo_step(policy: &mut LanguageModel) -> impl FnMut() + '_ {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/math/gsm_symbolic.jsonl");
    let text = std::fs::read_to_string(data).unwrap();
    let options = TemplateOptions { add_generation_prompt: true, ..Default::default() };
    let prompts: Vec<Vec<i64>> = text
        .lines()
        .take(GRPO_PROMPTS)
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let message = ChatMessage::new("user", row["problem"].as_str().unwrap());
            policy.encode_chat(&[message], &options).unwrap().1
        })
        .collect();
    let optimizer = OptimizerConfig { lr: 1e-5, weight_decay: 0.0, ..OptimizerConfig::default() };
    let mut trainer = Trainer::new(policy, None, &optimizer, 1.0, None, None).unwrap();
    let settings = GenerationSettings {
        min_new_tokens: GRPO_COMPLETION,
        ..GenerationSettings::new(Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 }, GRPO_COMPLETION)
    };
    let clip = PpoClip { epsilon: 0.2, aggregation: Aggregation::TokenMean, importance_cap: None };
    let micro = MicroBatching::new(8192, false);
    let mut round = 0u64;
    move || {
        round += 1;
        let requests: Vec<GenerationRequest> = (0..GRPO_PROMPTS * GRPO_K)
            .map(|i| GenerationRequest {
                prompt_ids: prompts[i / GRPO_K].clone(),
                seed: round * 1000 + i as u64,
                adapter: None,
                images: None,
            })
            .collect();
        let t0 = Instant::now();
        let out = policy.generate(&requests, &settings).unwrap();
        let t_gen = t0.elapsed().as_secs_f64();
        let rewards: Vec<f64> =
            out.iter().map(|g| g.token_ids.iter().filter(|&&t| t % 64 == 3).count() as f64).collect();
        let advantages: Vec<Option<petting::algo::loss::Advantage>> = rewards
            .chunks(GRPO_K)
            .flat_map(|group| {
                let mean = group.iter().sum::<f64>() / group.len() as f64;
                let std = (group.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (group.len() - 1) as f64).sqrt();
                let advantage =
                    move |r: &f64| Some(petting::algo::loss::Advantage::Sequence((r - mean) / (std + 1e-4)));
                group.iter().map(advantage).collect::<Vec<_>>()
            })
            .collect();
        let batch: Vec<ScoreRequest> = requests
            .iter()
            .zip(&out)
            .map(|(r, g)| ScoreRequest {
                prompt_ids: r.prompt_ids.clone(),
                response_ids: g.token_ids.clone(),
                adapter: None,
                images: None,
            })
            .collect();
        // One mini-batch: its own forward gives the old logprobs, as in petting's update.
        let t1 = Instant::now();
        let totals = petting::model::Totals::of(&batch, &advantages);
        trainer.ppo_step(policy, &batch, None, &[], &advantages, totals, clip, micro, round, 1e-5).unwrap();
        eprintln!("generate {t_gen:.2} s, step {:.2} s", t1.elapsed().as_secs_f64());
    }
}
