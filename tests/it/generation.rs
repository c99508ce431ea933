//! The sampler's batching: a key/value budget far below the batch, one prefill shared by
//! a prompt's branches, slots refilled as rows finish, all giving what each row computes
//! alone, each row told of as it finishes; and a GPU asked for where there is none.

use petting::model::{
    Generation, GenerationRequest, GenerationSettings, GenerationStats, KvBudget, LanguageModel, LoadOptions, Sampling,
};

use crate::support::fixture;
use crate::support::run;

fn llama() -> LanguageModel {
    let dir = fixture("hf-tiny-llama");
    LanguageModel::load(&dir, &LoadOptions::default()).unwrap()
}

/// Prompts of different lengths (3 to 40 tokens) from the fixture's vocabulary.
fn prompt(i: usize) -> Vec<i64> {
    (0..3 + (i * 7) % 38).map(|t| 5 + ((i * 31 + t * 17) % 200) as i64).collect()
}

fn sampled(max_new_tokens: usize) -> GenerationSettings {
    let sampling = Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 };
    GenerationSettings { eos_token_ids: Some(Vec::new()), ..GenerationSettings::new(sampling, max_new_tokens) }
}

/// Budget for `slots` sequences of up to `longest` prompt tokens.
fn budget_for(policy: &LanguageModel, slots: u64, longest: usize, settings: &GenerationSettings) -> KvBudget {
    let c = policy.config();
    let per_position = (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4) as u64;
    KvBudget::Bytes(slots * per_position * (longest + settings.max_new_tokens) as u64)
}

fn generate(
    policy: &mut LanguageModel,
    requests: &[GenerationRequest],
    settings: &GenerationSettings,
) -> (Vec<Generation>, GenerationStats) {
    policy.generate_with_stats(requests, settings).unwrap()
}

fn assert_same(a: &[Generation], b: &[Generation]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.token_ids, y.token_ids, "row {i}");
        assert_eq!(x.finish_reason, y.finish_reason, "row {i}");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() <= 1e-4, "row {i}: logprob {p} vs {q}");
        }
    }
}

#[test]
fn a_batch_far_over_the_budget_runs_in_bounded_memory_with_the_tokens_of_one_batch() {
    let mut policy = llama();
    let settings = GenerationSettings { sampling: Sampling::Greedy, ..sampled(10) };
    let requests: Vec<GenerationRequest> = (0..24)
        .map(|i| GenerationRequest { prompt_ids: prompt(i), seed: i as u64, adapter: None, images: None })
        .collect();
    let longest = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap();
    let (one_batch, wide) = generate(&mut policy, &requests, &settings);
    assert_eq!(wide.slots, 24);

    let budget = budget_for(&policy, 3, longest, &settings);
    let tight = GenerationSettings { kv_budget: budget, ..settings.clone() };
    let (bounded, stats) = generate(&mut policy, &requests, &tight);
    assert_eq!(stats.slots, 3);
    let KvBudget::Bytes(bytes) = budget else { unreachable!() };
    assert!(0 < stats.kv_cache_bytes && stats.kv_cache_bytes <= bytes, "{} > {bytes}", stats.kv_cache_bytes);
    assert_same(&bounded, &one_batch);
    assert_eq!(stats.generated_tokens, 24 * 10);

    // Less than one sequence's worth is an error that says what to change.
    let none = GenerationSettings { kv_budget: KvBudget::Bytes(1024), ..settings };
    let err = policy.generate(&requests, &none).unwrap_err().to_string();
    assert!(err.contains("holds no sequence") && err.contains("kv_cache_gib"), "{err}");
}

#[test]
fn branches_sampled_from_one_shared_prefill_match_separate_prefills() {
    let mut policy = llama();
    for settings in [sampled(12), GenerationSettings { sampling: Sampling::Greedy, ..sampled(12) }] {
        // Two nodes of K = 4 branches each, interleaved as a rollout sends them.
        let requests: Vec<GenerationRequest> = (0..8)
            .map(|i| GenerationRequest {
                prompt_ids: prompt(3 + i % 2),
                seed: 100 + i as u64,
                adapter: None,
                images: None,
            })
            .collect();
        let (shared, stats) = generate(&mut policy, &requests, &settings);
        assert_eq!((stats.shared_prefills, stats.prefill_tokens), (6, prompt(3).len() + prompt(4).len()));
        let separate: Vec<Generation> =
            requests.iter().flat_map(|r| policy.generate(std::slice::from_ref(r), &settings).unwrap()).collect();
        assert_same(&shared, &separate);
        if settings.sampling != Sampling::Greedy {
            assert_ne!(shared[0].token_ids, shared[2].token_ids, "branches of one prompt differ by seed");
        }
    }
}

#[test]
fn prompts_that_share_prefixes_compute_them_once_with_what_each_prompt_gets_alone() {
    let mut policy = llama();
    // Every prompt starts with a 24-token "system" text; two tasks of 18 tokens each follow,
    // then three tails per task; one prompt is the system and the first task alone (a
    // prefix of three others), and one shares only 5 tokens of the system text.
    let system: Vec<i64> = (0..24).map(|t| 7 + t).collect();
    let task = |k: i64| -> Vec<i64> { (0..18).map(|t| 100 + 40 * k + t).collect() };
    let tails: [&[i64]; 3] = [&[300, 301, 302], &[310, 311], &[300, 301, 302, 303, 304]];
    let mut prompts: Vec<Vec<i64>> = Vec::new();
    for k in 0..2 {
        for tail in tails {
            prompts.push([system.clone(), task(k), tail.to_vec()].concat());
        }
    }
    prompts.push([system.clone(), task(0)].concat());
    prompts.push([&system[..5], &[450, 451, 452]].concat());
    for settings in [sampled(8), GenerationSettings { sampling: Sampling::Greedy, ..sampled(8) }] {
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| GenerationRequest { prompt_ids: p.clone(), seed: 7 + i as u64, adapter: None, images: None })
            .collect();
        let (shared, stats) = generate(&mut policy, &requests, &settings);
        // The system text once; the first task once but for its last token, which each of
        // its four prompts computes with its tail (tails share under 16 tokens); the
        // second task once, then its tails; the prompt that shares 5 tokens whole.
        assert_eq!(stats.prefill_tokens, 24 + (17 + 4 + 3 + 6 + 1) + (18 + 3 + 2 + 5) + 8);
        let separate: Vec<Generation> =
            requests.iter().flat_map(|r| policy.generate(std::slice::from_ref(r), &settings).unwrap()).collect();
        assert_same(&shared, &separate);
    }
}

#[test]
fn continuous_batching_gives_the_per_row_results_of_static_batching() {
    let mut policy = llama();
    // Common tokens as EOS, so that rows finish at different steps and free their slots.
    let settings = GenerationSettings { eos_token_ids: Some((5..25).collect()), ..sampled(16) };
    let requests: Vec<GenerationRequest> = (0..20)
        .map(|i| GenerationRequest { prompt_ids: prompt(i % 7), seed: i as u64, adapter: None, images: None })
        .collect();
    let (mut heard, mut told) = (Vec::new(), 0);
    let (static_batch, one) = policy
        .generate_watched(&requests, &settings, &mut |index, tokens, last| {
            told += 1;
            if last {
                heard.push((index, tokens))
            }
        })
        .unwrap();
    assert_eq!(one.slots, 20);
    let lengths: Vec<usize> = static_batch.iter().map(|g| g.token_ids.len()).collect();
    assert!(lengths.iter().min() < lengths.iter().max(), "rows finish at different steps: {lengths:?}");
    // Each row's last token is told of once: all started together, the shorter first.
    assert_eq!(heard.len(), 20);
    assert_eq!(told, lengths.iter().sum::<usize>(), "every token is told of");
    assert!(heard.iter().all(|&(i, tokens)| tokens == lengths[i]), "{heard:?}");
    assert!(heard.windows(2).all(|w| w[0].1 <= w[1].1), "{heard:?}");

    let longest = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap();
    let few = GenerationSettings { kv_budget: budget_for(&policy, 5, longest, &settings), ..settings };
    let (continuous, stats) = generate(&mut policy, &requests, &few);
    assert_eq!(stats.slots, 5);
    assert_same(&continuous, &static_batch);
}

#[test]
fn branches_outlive_the_row_whose_prompt_columns_they_read() {
    let mut policy = llama();
    // Common tokens as EOS, so that a row's length depends on its seed.
    let settings = GenerationSettings { eos_token_ids: Some((5..45).collect()), ..sampled(16) };
    let request = |p: usize, seed: u64| GenerationRequest { prompt_ids: prompt(p), seed, adapter: None, images: None };
    let alone = |policy: &mut LanguageModel, r: &GenerationRequest| {
        policy.generate(std::slice::from_ref(r), &settings).unwrap()
    };
    // Of 40 seeds of prompt A, the one that finishes first, and two that run longest.
    let (a, b) = (30, 5);
    let mut by_length: Vec<(usize, u64)> =
        (0..40).map(|seed| (alone(&mut policy, &request(a, seed))[0].token_ids.len(), seed)).collect();
    by_length.sort();
    let (short, long) = (by_length[0], &by_length[38..]);
    assert!(short.0 < long[0].0, "seeds of different lengths: {by_length:?}");
    // A's first branch is prefilled; the others read its prompt columns from its slot.
    // It finishes first, and B's second branch (the last row) moves into its slot.
    let requests =
        vec![request(a, short.1), request(a, long[0].1), request(a, long[1].1), request(b, 1), request(b, 2)];
    let (together, stats) = generate(&mut policy, &requests, &settings);
    assert_eq!(stats.shared_prefills, 3);
    let b_lengths: Vec<usize> = together[3..].iter().map(|g| g.token_ids.len()).collect();
    assert!(b_lengths.iter().all(|&l| l > short.0), "B outlives A's first branch: {b_lengths:?} vs {short:?}");
    let separate: Vec<Generation> = requests.iter().flat_map(|r| alone(&mut policy, r)).collect();
    assert_same(&together, &separate);
}

#[test]
fn a_gpu_asked_for_where_there_is_none_is_one_clear_line() {
    if tch::Cuda::is_available() {
        return;
    }
    let dir = fixture("hf-tiny-llama");
    let (ok, stdout, stderr) = run(&[
        "model",
        "generate",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "--device",
        "cuda",
        "--max-new-tokens",
        "2",
    ]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("device cuda:0") && stderr.contains("cpu"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
