//! The update stage on tiny runs: v0 from the HF fixtures (full and LoRA), a rollout
//! whose logprobs come from scoring with the committed v0 (so drift is ~0), the real
//! group and advantage stages, then update; plus every refusal of the strict
//! on-policy check and the warm start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use petting::config::{self, RunConfig};
use petting::model::{
    AdamWState, ChatMessage, LanguageModel, LoadOptions, OPTIMIZER_FILE, SaveAs, ScoreRequest, TemplateOptions,
};
use petting::policies::{self, LoadedPolicies, Resident};
use petting::progress::Quiet;
use petting::schema::Table;
use petting::stages::{self, Session, advantage, group, update};
use petting::store::{CommitInfo, CommitMarker, Partition, RunStore, Split, Stage, StageId};
use petting::tables::{self, DemonstrationRow, SampleRow, TurnRow, UpdateRow};
use petting::workflows::Agent;
use tch::Kind;

use crate::support::synthetic::Mix;
use crate::support::{RunFile, block_on};

/// The update's own refusal inside a stage error.
fn refusal(err: &stages::Error) -> &update::Error {
    match err {
        stages::Error::Update(refusal) => refusal,
        other => panic!("expected an update refusal, got {other}"),
    }
}

fn fixture() -> PathBuf {
    crate::support::fixture("hf-tiny-qwen3")
}

/// Two policies on the tiny Qwen3: `tool_p` fine-tunes all weights, `plan_p` a LoRA adapter.
fn run_file(store: &Path) -> RunFile {
    let model = fixture().display().to_string();
    RunFile::new(&format!(
        "store: {store}
name: it
seed: 11
iterations: 2
env: {{name: plan_path}}
workflow: {{kind: tool_planner}}
agents: {{tool: {{policy: tool_p}}, planner: {{policy: plan_p}}}}
policies:
  tool_p: {{model: {model}, optimizer: {{lr: 0.001}}}}
  plan_p: {{model: {model}, optimizer: {{lr: 0.002}}, lora: {{rank: 4, alpha: 8.0}}}}
rollout: {{tasks_per_iteration: 3, branches: 4}}
evaluation: {{tasks: 2}}
data: {{train_tasks: 3, test_tasks: 2}}
update: {{mini_batch_sequences: 5, micro_batch_tokens: 64}}
",
        store = store.display()
    ))
}

pub(crate) struct Run {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    pub(crate) store: RunStore,
    pub(crate) config: RunConfig,
}

pub(crate) fn new_run() -> Run {
    new_run_with(|file| file)
}

/// `new_run` with keys of its run file set by `set`.
pub(crate) fn new_run_with(set: impl FnOnce(RunFile) -> RunFile) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run");
    std::fs::create_dir_all(&path).unwrap();
    let text = set(run_file(&path)).text();
    let config = config::parse(&text, Path::new("it.yaml")).unwrap();
    let store = RunStore::open(path.to_str().unwrap()).unwrap();
    block_on(store.init_config(&text)).unwrap();
    Run { _dir: dir, path, store, config }
}

/// How a synthetic rollout departs from an honest one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Tamper {
    None,
    /// The marker records other weights for tool_p than its latest checkpoint.
    WeightsHash,
    /// One turns row claims another version.
    RowVersion,
    /// One turns row names the right version but other weights (an engine's stale copy).
    RowWeights,
    /// The marker also names a turns part written under another iteration.
    ForeignPart,
    /// tool_p's sampled logprobs are 0.5 lower than its weights give.
    Logprobs,
    /// Every third row ran into max_new_tokens.
    Truncated,
    /// One row of a trainable policy is marked as a frozen agent's.
    Untrainable,
}

const TASKS: usize = 3;
const K: usize = 4;

/// Turns rows of `iteration` for every (task, agent, branch), each response scored by
/// the committed checkpoint of its policy, so they are what that checkpoint sampled.
fn turn_rows(loaded: &mut LoadedPolicies, config: &RunConfig, iteration: u32) -> Vec<TurnRow> {
    let mut mix = Mix::new(u64::from(iteration) + 5);
    let mut rows = Vec::new();
    for task in 0..TASKS {
        for (role, agent) in [(Agent::TOOL, "tool"), (Agent::PLANNER, "planner")] {
            let policy = config.agents[&role].policy.clone();
            let prompt: Vec<i32> = (0..6 + mix.below(6)).map(|_| 3 + mix.below(500) as i32).collect();
            for branch in 0..K {
                let response: Vec<i32> = (0..2 + mix.below(6)).map(|_| 3 + mix.below(500) as i32).collect();
                let reward = (mix.below(3) as f64) / 2.0;
                rows.push(turn(&policy, iteration, task, agent, branch, &prompt, &response, reward));
            }
        }
    }
    for name in config.policies.keys() {
        let digest = loaded.member(name).unwrap().weights_sha256.clone();
        rows.iter_mut().filter(|r| &r.policy == name).for_each(|r| r.weights_sha256 = digest.clone());
        let (policy, adapter) = loaded.model(name).unwrap();
        let mine: Vec<usize> = (0..rows.len()).filter(|&i| &rows[i].policy == name).collect();
        let requests: Vec<ScoreRequest> = mine
            .iter()
            .map(|&i| ScoreRequest {
                prompt_ids: rows[i].prompt_tokens.iter().map(|&t| i64::from(t)).collect(),
                response_ids: rows[i].response_tokens.iter().map(|&t| i64::from(t)).collect(),
                adapter: adapter.map(str::to_owned),
                images: None,
            })
            .collect();
        let scored = policy.score(&requests, 4096).unwrap();
        for (i, logprobs) in mine.into_iter().zip(scored) {
            rows[i].response_logprobs = logprobs;
        }
    }
    rows
}

#[allow(clippy::too_many_arguments)]
fn turn(
    policy: &str,
    iteration: u32,
    task: usize,
    agent: &str,
    branch: usize,
    prompt: &[i32],
    response: &[i32],
    reward: f64,
) -> TurnRow {
    TurnRow {
        candidate_id: format!("task-{task}/e0/t0/{agent}/b{branch}"),
        run: "it".into(),
        task_id: format!("task-{task}"),
        episode: 0,
        turn: 0,
        agent: agent.into(),
        policy: policy.into(),
        policy_version: iteration,
        weights_sha256: String::new(),
        engine: "tch".into(),
        engine_model: "p".into(),
        branch: branch as u32,
        node_id: branch as u32,
        parent_id: None,
        selected: branch == 0,
        prompt_message: "p".into(),
        prompt_text: "p".into(),
        prompt_tokens: prompt.to_vec(),
        response_text: "r".into(),
        response_tokens: response.to_vec(),
        response_logprobs: Vec::new(),
        finish_reason: "eos".into(),
        action: None,
        parse_error: None,
        feedback: None,
        local_reward: reward,
        team_reward: 0.0,
        done: true,
        success: reward > 0.5,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        sampling_seed: 1,
        generation_seconds: 0.0,
        failure: None,
        credited_reward: None,
        staleness: Some(0),
        trainable: Some(true),
    }
}

/// Commits a rollout of `iteration` sampled (scored) by the latest checkpoints, then
/// runs the real group and advantage stages.
pub(crate) async fn rollout(run: &Run, iteration: u32, tamper: Tamper) -> Vec<TurnRow> {
    // The policies advance together: one latest version for all.
    let version = policies::latest(&run.store, "plan_p").await.unwrap().unwrap().version;
    let mut loaded = policies::load_all(&run.store, &run.config.policies, version).await.unwrap();
    for name in run.config.policies.keys() {
        let latest = policies::latest(&run.store, name).await.unwrap().unwrap();
        assert_eq!(loaded.member(name).unwrap().weights_sha256, latest.weights_sha256);
    }
    let mut used = loaded.refs();
    let mut rows = turn_rows(&mut loaded, &run.config, iteration);
    match tamper {
        Tamper::WeightsHash => used.iter_mut().find(|u| u.policy == "tool_p").unwrap().weights_sha256 = "0".repeat(64),
        Tamper::RowVersion => rows[5].policy_version = iteration + 1,
        Tamper::RowWeights => rows[6].weights_sha256 = "f".repeat(64),
        Tamper::Logprobs => rows
            .iter_mut()
            .filter(|r| r.policy == "tool_p")
            .for_each(|r| r.response_logprobs.iter_mut().for_each(|x| *x -= 0.5)),
        Tamper::Truncated => rows.iter_mut().step_by(3).for_each(|r| r.finish_reason = "length".into()),
        Tamper::Untrainable => rows[7].trainable = Some(false),
        Tamper::None | Tamper::ForeignPart => {}
    }
    let mut writer = run.store.begin(StageId::at(Stage::Rollout, iteration));
    let batch = tables::to_batch(&rows).unwrap();
    writer.write_table(Table::Turns, Partition::Iteration(iteration), &[batch]).await.unwrap();
    if tamper == Tamper::ForeignPart {
        let stray = tables::to_batch(&rows[..2]).unwrap();
        writer.write_table(Table::Turns, Partition::Iteration(iteration + 1), &[stray]).await.unwrap();
    }
    let info = CommitInfo {
        run: "it".into(),
        policies_used: used,
        seed: 11,
        config_sha256: run.config.sha256(),
        ..CommitInfo::default()
    };
    writer.finish().commit(info).await.unwrap();
    group::run(&run.store, &run.config, iteration).await.unwrap();
    advantage::run(&run.store, &run.config, iteration, &Session::default()).await.unwrap();
    rows
}

fn samples_of(run: &Run, iteration: u32) -> Vec<SampleRow> {
    block_on(async {
        let markers = run.store.committed(Stage::Advantage, Some(iteration)).await.unwrap().unwrap();
        run.store.read_rows(&[&markers[0].marker]).await.unwrap()
    })
}

fn update_rows(run: &Run, marker: &CommitMarker) -> Vec<UpdateRow> {
    block_on(run.store.read_rows(&[marker])).unwrap()
}

/// Nothing committed for the update, and nothing but `orphans_under` left behind.
fn assert_nothing_committed(run: &Run, iteration: u32, orphans_under: Option<&str>) {
    block_on(async {
        assert!(run.store.marker(&StageId::at(Stage::Update, iteration)).await.unwrap().is_none());
        let report = run.store.gc(Duration::ZERO, true).await.unwrap();
        let stray: Vec<_> = report
            .deleted
            .iter()
            .filter(|(path, _)| orphans_under.is_none_or(|prefix| !path.starts_with(prefix)))
            .collect();
        assert!(stray.is_empty(), "the refused update left {stray:?}");
    });
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn update_trains_each_policy_on_its_own_samples_and_commits_the_next_version() {
    let run = new_run();
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    assert_eq!(v0.stage_id().marker_path(), "_commits/update.json");
    let versions: Vec<(String, u32)> = v0.checkpoints.iter().map(|c| (c.policy.clone(), c.version)).collect();
    assert_eq!(versions, vec![("plan_p".into(), 0), ("tool_p".into(), 0)]);
    // tool_p's v0 is the fixture's weights, byte for byte; plan_p's is an adapter over a committed base.
    let fixture_sha = petting::model::sha256_file(&fixture().join("model.safetensors")).unwrap();
    assert_eq!(v0.checkpoints[1].weights_sha256, fixture_sha);
    assert!(v0.files.iter().any(|f| f.path.starts_with("checkpoints/plan_p/base.") && f.sha256 == fixture_sha));
    let adapter = format!("checkpoints/plan_p/v000000.{}/adapter_model.safetensors", v0.attempt);
    assert!(v0.files.iter().any(|f| f.path == adapter), "no {adapter}");

    block_on(rollout(&run, 0, Tamper::None));
    // A copy of the run as it stands, to check that a rerun writes the same weights.
    let twin_dir = tempfile::tempdir().unwrap();
    copy_dir(&run.path, twin_dir.path());

    let marker = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap();
    let used: Vec<(String, u32)> = marker.policies_used.iter().map(|p| (p.policy.clone(), p.version)).collect();
    assert_eq!(used, vec![("plan_p".into(), 0), ("tool_p".into(), 0)]);
    let new: Vec<(String, u32, Option<u32>)> =
        marker.checkpoints.iter().map(|c| (c.policy.clone(), c.version, c.parent_version)).collect();
    assert_eq!(new, vec![("plan_p".into(), 1, Some(0)), ("tool_p".into(), 1, Some(0))]);
    for (old, new) in v0.checkpoints.iter().zip(&marker.checkpoints) {
        assert_ne!(old.weights_sha256, new.weights_sha256, "{} did not change", new.policy);
    }

    // One row per step; each policy saw exactly its own samples (1 epoch).
    let rows = update_rows(&run, &marker);
    let samples = samples_of(&run, 0);
    for policy in ["plan_p", "tool_p"] {
        let mine: Vec<&UpdateRow> = rows.iter().filter(|r| r.policy == policy).collect();
        let expected = samples.iter().filter(|s| s.policy == policy).count();
        assert!(expected > 5, "{policy}: too few samples ({expected}) to need two steps");
        assert_eq!(mine.iter().map(|r| r.sequences as usize).sum::<usize>(), expected, "{policy}");
        assert_eq!(mine.len(), expected.div_ceil(5), "{policy}");
        assert_eq!(mine.iter().map(|r| r.step).collect::<Vec<_>>(), (0..mine.len() as u32).collect::<Vec<_>>());
        for r in &mine {
            assert!(r.loss.is_finite() && r.grad_norm.is_finite() && r.grad_norm > 0.0, "{r:?}");
            assert_eq!((r.mode.as_str(), r.version_from, r.version_to), ("ppo", 0, 1));
            assert!(r.logprob_drift_max < 1e-4, "scored by the same weights: {r:?}");
            assert_eq!((r.skipped, r.mismatch_fraction), (Some(false), Some(0.0)), "{r:?}");
            assert!(r.mismatch_p95.is_some_and(|p| p < 1e-4), "{r:?}");
        }
        // The first step is on-policy: every ratio is 1.
        assert!((mine[0].ratio_mean - 1.0).abs() < 1e-6 && mine[0].clip_fraction == 0.0, "{:?}", mine[0]);
    }

    // v1 loads, and is now the latest.
    block_on(async {
        for policy in ["plan_p", "tool_p"] {
            let latest = policies::latest(&run.store, policy).await.unwrap().unwrap();
            assert_eq!(latest.version, 1);
            let mut loaded = policies::load(&run.store, &run.config.policies, policy, 1).await.unwrap();
            assert_eq!(loaded.member(policy).unwrap().weights_sha256, latest.weights_sha256);
            assert_eq!(loaded.model(policy).unwrap().1.is_some(), policy == "plan_p");
        }
    });
    let again = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    assert!(again.to_string().contains("already committed"), "{again}");

    // Bit-identical rerun on CPU.
    let twin = RunStore::open(twin_dir.path().to_str().unwrap()).unwrap();
    let twin_marker = block_on(update::run(&twin, &run.config, 0, &Quiet, &Session::default())).unwrap();
    let sha = |m: &CommitMarker| m.checkpoints.iter().map(|c| c.weights_sha256.clone()).collect::<Vec<_>>();
    assert_eq!(sha(&twin_marker), sha(&marker));
}

/// The optimiser state committed with `policy`'s checkpoint in `marker`.
fn optimizer_state(run: &Run, marker: &CommitMarker, policy: &str) -> Option<AdamWState> {
    let checkpoint = marker.checkpoints.iter().find(|c| c.policy == policy).unwrap();
    let path = run.path.join(&checkpoint.dir).join(OPTIMIZER_FILE);
    path.exists().then(|| AdamWState::load(&path).unwrap())
}

#[test]
fn the_optimiser_continues_from_the_version_it_trains() {
    let run = new_run();
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    assert!(optimizer_state(&run, &v0, "tool_p").is_none(), "v0 has not been optimised yet");
    let mut steps = [0u64; 2];
    for k in 0..2 {
        block_on(rollout(&run, k, Tamper::None));
        let marker = block_on(update::run(&run.store, &run.config, k, &Quiet, &Session::default())).unwrap();
        let rows = update_rows(&run, &marker);
        for (i, policy) in ["plan_p", "tool_p"].into_iter().enumerate() {
            let mine: Vec<&UpdateRow> = rows.iter().filter(|r| r.policy == policy).collect();
            steps[i] += mine.len() as u64;
            assert!(mine.iter().all(|r| r.weights_change.is_some_and(|c| c > 0.0)), "{policy}: {mine:?}");
            // Moments and the step count carry over: bias correction does not restart.
            let state = optimizer_state(&run, &marker, policy).unwrap();
            assert_eq!(state.step, steps[i], "{policy} after iteration {k}");
            let kinds: Vec<&str> = state.tensors.keys().map(|k| k.split('.').next().unwrap()).collect();
            assert!(kinds.contains(&"exp_avg") && kinds.contains(&"exp_avg_sq") && !kinds.contains(&"master"));
        }
    }
    let checkpoints =
        sql_rows(&run, "select version, optimizer_sha256 from checkpoints where policy = 'tool_p' order by version");
    assert!(checkpoints[0].ends_with(',') && checkpoints[1..].iter().all(|r| r.len() > 60), "{checkpoints:?}");
}

/// The CSV rows of a query over the run, without the header.
fn sql_rows(run: &Run, query: &str) -> Vec<String> {
    let (_, rows) = block_on(async {
        let sql = petting::sql::RunSql::open(&run.store).await.unwrap();
        sql.query(query).await.unwrap()
    });
    let mut csv = Vec::new();
    arrow::csv::WriterBuilder::new().with_header(false).build(&mut csv).write(&rows[0]).unwrap();
    String::from_utf8(csv).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn bf16_weights_learn_at_a_realistic_learning_rate_and_bf16_lora_trains_on_cpu() {
    let run = new_run_with(|file| {
        file.set("policies.tool_p.dtype", "bf16")
            .set("policies.tool_p.optimizer.lr", "1.0e-6")
            .set("policies.plan_p.dtype", "bf16")
    });
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    let marker = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap();
    let rows = update_rows(&run, &marker);
    // A 1e-6 step is below bf16's resolution: stepping the bf16 weights themselves (tch's
    // AdamW) moved nothing. The float32 masters move by about lr per step.
    let state = optimizer_state(&run, &marker, "tool_p").unwrap();
    let start = LanguageModel::load(
        &fixture(),
        &LoadOptions { dtype: Some(petting::model::DType::Bf16), ..Default::default() },
    )
    .unwrap();
    let weights = start.var_store().variables();
    let (mut moved, mut total, mut largest) = (0usize, 0usize, 0f64);
    for (name, weight) in &weights {
        let master = &state.tensors[&format!("master.{name}")];
        let delta = (master - weight.to_kind(Kind::Float)).abs();
        moved += i64::try_from(delta.gt(1e-7).sum(Kind::Int64)).unwrap() as usize;
        total += weight.numel();
        largest = largest.max(delta.max().double_value(&[]));
    }
    let steps = rows.iter().filter(|r| r.policy == "tool_p").count() as f64;
    assert!(moved * 2 > total, "only {moved} of {total} master weights moved");
    assert!(largest <= steps * 1.1e-6, "a step moves a weight by about lr at most: {largest}");
    // The LoRA adapter (float32 on a bf16 base) trained.
    let sha = |m: &CommitMarker, p: &str| m.checkpoints.iter().find(|c| c.policy == p).unwrap().weights_sha256.clone();
    assert_ne!(sha(&v0, "plan_p"), sha(&marker, "plan_p"));
    assert!(rows.iter().filter(|r| r.policy == "plan_p").all(|r| r.weights_change.unwrap() > 0.0), "{rows:?}");
}

#[test]
fn a_sharded_base_trains_a_lora_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let sharded = dir.path().join("sharded");
    let policy = LanguageModel::load(&fixture(), &LoadOptions::default()).unwrap();
    let save_as = SaveAs { policy: "base", version: 0, parent: None };
    policy.save_sharded(&sharded, &save_as, 100_000).unwrap();
    let shards = std::fs::read_dir(&sharded)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("model-"));
    assert!(shards.count() >= 5 && !sharded.join("model.safetensors").exists());
    let run = new_run_with(|file| file.set("policies.plan_p.model", &sharded.display().to_string()));
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let base_files = v0.files.iter().filter(|f| f.path.starts_with("checkpoints/plan_p/base.")).count();
    assert!(base_files >= 6, "the index and every shard are committed ({base_files})");
    // The sharded base scores as the single file does.
    let request = ScoreRequest { prompt_ids: vec![5, 6, 7], response_ids: vec![8, 9], adapter: None, images: None };
    let mut direct = LanguageModel::load(&fixture(), &LoadOptions::default()).unwrap();
    let mut loaded = block_on(policies::load(&run.store, &run.config.policies, "plan_p", 0)).unwrap();
    let (policy, adapter) = loaded.model("plan_p").unwrap();
    let on = ScoreRequest { adapter: adapter.map(str::to_owned), ..request.clone() };
    assert_eq!(policy.score(&[on], 64).unwrap(), direct.score(&[request], 64).unwrap());
    block_on(rollout(&run, 0, Tamper::None));
    let marker = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap();
    let sha = |m: &CommitMarker| m.checkpoints.iter().find(|c| c.policy == "plan_p").unwrap().weights_sha256.clone();
    assert_ne!(sha(&v0), sha(&marker), "the adapter trained");
    let mut v1 = block_on(policies::load(&run.store, &run.config.policies, "plan_p", 1)).unwrap();
    assert!(v1.model("plan_p").unwrap().1.is_some());
}

#[test]
fn update_refuses_a_rollout_sampled_with_other_weights() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::WeightsHash));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    assert!(matches!(refusal(&err), update::Error::WeightsMismatch { .. }), "{err}");
    let message = err.to_string();
    let latest = block_on(policies::latest(&run.store, "tool_p")).unwrap().unwrap();
    for part in ["\"tool_p\"", &"0".repeat(64), &latest.weights_sha256, "nothing was written"] {
        assert!(message.contains(part), "{message} lacks {part}");
    }
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_a_checkpoint_file_swapped_after_the_rollout() {
    let run = new_run();
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    // Same size, one byte different: only the sha256 tells.
    let weights = v0
        .files
        .iter()
        .find(|f| f.path.starts_with("checkpoints/tool_p/v000000.") && f.path.ends_with("/model.safetensors"))
        .unwrap();
    let file = run.path.join(&weights.path);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();

    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&weights.path) && message.contains("corrupt"), "{message}");
    // Every checkpoint is verified before the first write: not even an orphan.
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_a_row_of_another_version() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let rows = block_on(rollout(&run, 0, Tamper::RowVersion));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    assert!(matches!(refusal(&err), update::Error::RowVersion { found: 1, expected: 0, .. }), "{err}");
    assert!(err.to_string().contains(&rows[5].candidate_id), "{err}");
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_a_row_sampled_by_other_weights_than_its_version() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let rows = block_on(rollout(&run, 0, Tamper::RowWeights));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    match refusal(&err) {
        update::Error::RowWeights { candidate_id, version: 0, found, expected, .. } => {
            assert_eq!(candidate_id, &rows[6].candidate_id);
            assert_eq!(found, &"f".repeat(64));
            assert_eq!(expected.len(), 64);
        }
        _ => panic!("expected a weights refusal, got {err}"),
    }
    assert!(err.to_string().contains("nothing was written"), "{err}");
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_a_trainable_policys_row_marked_frozen() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let rows = block_on(rollout(&run, 0, Tamper::Untrainable));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&rows[7].candidate_id) && message.contains("turns.trainable is false"), "{message}");
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_a_turns_part_of_another_iteration() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::ForeignPart));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    assert!(matches!(refusal(&err), update::Error::ForeignPart { iteration: 0, .. }), "{err}");
    assert!(err.to_string().contains("turns/iteration=1/"), "{err}");
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn update_refuses_logprobs_the_weights_do_not_give() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::Logprobs));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    match refusal(&err) {
        update::Error::Drift { policy, mean, max, .. } => {
            assert_eq!(policy, "tool_p");
            assert!((mean - 0.5).abs() < 1e-3 && (max - 0.5).abs() < 1e-3, "{err}");
        }
        other => panic!("expected a drift error, got {other}"),
    }
    // plan_p (trained first) may leave its new adapter behind as an orphan.
    assert_nothing_committed(&run, 0, Some("checkpoints/plan_p/v000001."));
}

#[test]
fn masked_truncated_replies_are_counted_and_left_out_of_the_loss() {
    let run = new_run_with(|file| file.set("algorithm.truncated", "mask"));
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let turns = block_on(rollout(&run, 0, Tamper::Truncated));
    let marker = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap();
    let rows = update_rows(&run, &marker);
    let samples = samples_of(&run, 0);
    let cut: std::collections::HashSet<&str> =
        turns.iter().filter(|t| t.finish_reason == "length").map(|t| t.candidate_id.as_str()).collect();
    for policy in ["plan_p", "tool_p"] {
        let mine: Vec<&UpdateRow> = rows.iter().filter(|r| r.policy == policy).collect();
        let all = samples.iter().filter(|s| s.policy == policy);
        let truncated = all.clone().filter(|s| cut.contains(s.candidate_id.as_str())).count();
        assert!(truncated > 0, "{policy}: the data must have truncated samples");
        let counted: u32 = mine.iter().map(|r| r.truncated.unwrap()).sum();
        let trained: u32 = mine.iter().map(|r| r.sequences).sum();
        assert_eq!((counted as usize, trained as usize), (truncated, all.count() - truncated), "{policy}");
    }
}

#[test]
fn update_refuses_to_commit_weights_a_step_made_non_finite() {
    // lr 1e39 is beyond float32: the first AdamW step writes infinities into tool_p.
    let run = new_run_with(|file| file.set("policies.tool_p.optimizer.lr", "1.0e39"));
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    match refusal(&err) {
        update::Error::NonFiniteWeights { policy, .. } => assert_eq!(policy, "tool_p"),
        other => panic!("expected non-finite weights, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains("policies.tool_p.optimizer.lr") && message.contains("update.grad_clip"), "{message}");
    assert_nothing_committed(&run, 0, Some("checkpoints/plan_p/v000001."));
}

#[test]
fn update_refuses_to_commit_a_step_too_large_to_measure() {
    // lr 1e20 keeps every weight finite, but the change's norm overflows float32.
    let run = new_run_with(|file| file.set("policies.tool_p.optimizer.lr", "1.0e20"));
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    match refusal(&err) {
        update::Error::WeightsOverflow { policy, .. } => assert_eq!(policy, "tool_p"),
        other => panic!("expected a step too large to measure, got {other}"),
    }
    assert!(err.to_string().contains("policies.tool_p.optimizer.lr"), "{err}");
    assert_nothing_committed(&run, 0, Some("checkpoints/plan_p/v000001."));
}

#[test]
fn update_refuses_a_checkpoint_whose_weights_give_non_finite_logprobs() {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    // The rollout's rows are sound, but the copy of plan_p (trained first) that the
    // update finds in memory computes a NaN: its base's final norm is poisoned.
    let session = Session::default();
    let mut loaded = block_on(policies::load_all(&run.store, &run.config.policies, 0)).unwrap();
    let (policy, _) = loaded.model("plan_p").unwrap();
    tch::no_grad(|| {
        let norm = policy.var_store().variables().into_iter().find(|(n, _)| n.ends_with("model.norm.weight")).unwrap();
        let _ = norm.1.shallow_clone().fill_(f64::NAN);
    });
    session.policies.give_back(loaded);
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &session)).unwrap_err();
    match refusal(&err) {
        update::Error::NonFiniteLogprobs { policy, .. } | update::Error::NoFiniteStep { policy, .. } => {
            assert_eq!(policy, "plan_p", "{err}")
        }
        other => panic!("expected non-finite logprobs, got {other}"),
    }
    assert_nothing_committed(&run, 0, None);
}

#[test]
fn lora_policies_on_one_base_share_it_in_memory_and_in_the_store() {
    let run = new_run_with(|file| file.set("policies.tool_p.lora", "{rank: 4, alpha: 8.0}"));
    let v0 = block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    let bases: std::collections::BTreeSet<&str> =
        v0.files.iter().filter(|f| f.path.contains("/base.")).map(|f| f.path.rsplit_once('/').unwrap().0).collect();
    assert_eq!(bases.len(), 1, "one copy of the base: {bases:?}");
    let loaded = block_on(policies::load_all(&run.store, &run.config.policies, 0)).unwrap();
    assert_eq!(loaded.model_count(), 1, "both adapters on one base model");
    drop(loaded);

    block_on(rollout(&run, 0, Tamper::None));
    let session = Session::default();
    let v1 = block_on(update::run(&run.store, &run.config, 0, &Quiet, &session)).unwrap();
    assert!(!v1.files.iter().any(|f| f.path.contains("/base.")), "v1 refers to v0's base");

    // The trained versions stay in memory: the next stage takes them without reading
    // their files, once their digests match the markers.
    for f in v1.files.iter().filter(|f| f.path.starts_with("checkpoints/")) {
        std::fs::remove_file(run.path.join(&f.path)).unwrap();
    }
    let mut kept = block_on(session.policies.take(&run.store, &run.config.policies, 1)).unwrap();
    assert_eq!(kept.refs().len(), 2);
    let missing = block_on(Resident::default().take(&run.store, &run.config.policies, 1)).unwrap_err();
    assert!(missing.to_string().contains("adapter"), "{missing}");
    // A member whose digest is not the committed one is not trusted: it loads from the store.
    kept.advance("tool_p", 1, "0".repeat(64));
    session.policies.give_back(kept);
    assert!(block_on(session.policies.take(&run.store, &run.config.policies, 1)).is_err());
}

#[test]
fn an_update_holds_one_model_at_a_time_and_the_next_stage_loads_the_others() {
    // tool_p is a full model and plan_p an adapter on a base of its own: two models.
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    assert_eq!(block_on(policies::load_all(&run.store, &run.config.policies, 0)).unwrap().model_count(), 2);
    block_on(rollout(&run, 0, Tamper::None));
    let twin_dir = tempfile::tempdir().unwrap();
    copy_dir(&run.path, twin_dir.path());
    let twin = RunStore::open(twin_dir.path().to_str().unwrap()).unwrap();
    let remove_v1 = |root: &Path, marker: &CommitMarker, policy: &str| {
        let prefix = format!("checkpoints/{policy}/v000001.");
        for f in marker.files.iter().filter(|f| f.path.starts_with(&prefix)) {
            std::fs::remove_file(root.join(&f.path)).unwrap();
        }
    };

    // plan_p trains first, then its model is dropped for tool_p's: only tool_p's
    // trained model is given back, and the next stage loads plan_p's v1 from the store.
    let session = Session::default();
    let v1 = block_on(update::run(&run.store, &run.config, 0, &Quiet, &session)).unwrap();
    remove_v1(&run.path, &v1, "tool_p");
    let taken = block_on(session.policies.take(&run.store, &run.config.policies, 1)).unwrap();
    assert_eq!(taken.model_count(), 2);
    let versions: Vec<(String, u32)> = taken.refs().into_iter().map(|r| (r.policy, r.version)).collect();
    assert_eq!(versions, vec![("plan_p".into(), 1), ("tool_p".into(), 1)]);

    let session = Session::default();
    let twin_v1 = block_on(update::run(&twin, &run.config, 0, &Quiet, &session)).unwrap();
    remove_v1(twin_dir.path(), &twin_v1, "plan_p");
    let dropped = block_on(session.policies.take(&twin, &run.config.policies, 1)).unwrap_err();
    assert!(dropped.to_string().contains("plan_p"), "{dropped}");
}

#[test]
fn checkpoints_of_a_non_local_run_load_through_the_cache() {
    let text = run_file(Path::new("memory-run")).text();
    let config = config::parse(&text, Path::new("it.yaml")).unwrap();
    let store =
        RunStore::from_object_store(std::sync::Arc::new(object_store::memory::InMemory::new()), "r", "memory://r");
    let v0 = block_on(update::initialise(&store, &config, &Quiet)).unwrap();
    let mut direct = LanguageModel::load(&fixture(), &LoadOptions::default()).unwrap();
    let request = ScoreRequest { prompt_ids: vec![5, 6, 7], response_ids: vec![8, 9], adapter: None, images: None };
    let expected = direct.score(std::slice::from_ref(&request), 64).unwrap();
    for name in ["tool_p", "plan_p"] {
        let mut loaded = block_on(policies::load(&store, &config.policies, name, 0)).unwrap();
        let (policy, adapter) = loaded.model(name).unwrap();
        let on = ScoreRequest { adapter: adapter.map(str::to_owned), ..request.clone() };
        // v0 of both is the fixture's function: the copied weights, or an adapter with B = 0.
        assert_eq!(policy.score(&[on], 64).unwrap(), expected, "{name}");
    }
    let missing = block_on(policies::load(&store, &config.policies, "tool_p", 3)).unwrap_err().to_string();
    assert!(missing.contains("latest committed: v0"), "{missing}");
    assert_eq!(v0.checkpoints.len(), 2);
}

#[test]
fn update_refuses_without_v0_or_out_of_step() {
    let run = new_run();
    // No v0 committed: nothing to train from.
    block_on(async {
        let mut writer = run.store.begin(StageId::at(Stage::Rollout, 0));
        let info = CommitInfo { run: "it".into(), ..CommitInfo::default() };
        writer.write_table(Table::Turns, Partition::Iteration(0), &[]).await.unwrap();
        writer.finish().commit(info).await.unwrap();
        group::run(&run.store, &run.config, 0).await.unwrap();
        advantage::run(&run.store, &run.config, 0, &Session::default()).await.unwrap();
    });
    let err = block_on(update::run(&run.store, &run.config, 0, &Quiet, &Session::default())).unwrap_err();
    assert!(matches!(refusal(&err), update::Error::NoCheckpoint { .. }), "{err}");
    // With v0 but asked for iteration 1: v1 is not the latest.
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 1, Tamper::None));
    let err = block_on(update::run(&run.store, &run.config, 1, &Quiet, &Session::default())).unwrap_err();
    assert!(matches!(refusal(&err), update::Error::NotAligned { latest: 0, iteration: 1, .. }), "{err}");
}

/// A prepare-data commit as the embedded default makes it: the tokenizer files and a
/// few demonstrations.
async fn prepare_data(store: &RunStore, demos: &[DemonstrationRow]) {
    let mut writer = store.begin(StageId::run_level(Stage::PrepareData));
    let dir = format!("tokenizer.{}", writer.attempt());
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        let bytes = std::fs::read(fixture().join(name)).unwrap();
        writer.write_file(format!("{dir}/{name}"), bytes.into()).await.unwrap();
    }
    let batch = tables::to_batch(demos).unwrap();
    writer.write_table(Table::Demonstrations, Partition::Split(Split::Train), &[batch]).await.unwrap();
    writer.finish().commit(CommitInfo { run: "it".into(), ..CommitInfo::default() }).await.unwrap();
}

fn demo(i: usize, agent: &str, prompt: &str, response: &str) -> DemonstrationRow {
    DemonstrationRow {
        demo_id: format!("t{i}/d0/t0/{agent}"),
        task_id: format!("t{i}"),
        turn: 0,
        agent: agent.into(),
        prompt: prompt.into(),
        response: response.into(),
        choice: "tool_bfs".into(),
        local_reward: 1.0,
    }
}

#[test]
fn warm_start_sft_lowers_the_demonstration_loss() {
    let model = fixture().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "store: {store}
name: warm
iterations: 1
env: {{name: plan_path}}
workflow: {{kind: tool_planner}}
agents: {{tool: {{policy: shared}}, planner: {{policy: shared}}}}
policies: {{shared: {{model: {model}, init: scratch}}}}
rollout: {{tasks_per_iteration: 2}}
evaluation: {{tasks: 2}}
data: {{train_tasks: 3, test_tasks: 2}}
warm_start: {{demonstrations: 4, steps: 25, batch_size: 4, optimizer: {{lr: 0.01, warmup_steps: 3, schedule: cosine}}}}
",
        store = dir.path().display()
    );
    let config = config::parse(&text, Path::new("warm.yaml")).unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let demos = vec![
        demo(0, "tool", "Grid 1: go from S to G.", "print(bfs(grid))"),
        demo(1, "planner", "Tool said RRD. Your path?", "RRD"),
        demo(2, "tool", "Grid 2: go from S to G.", "print(bfs(grid))"),
        demo(3, "planner", "Tool said DDL. Your path?", "DDL"),
    ];
    block_on(async {
        store.init_config(&text).await.unwrap();
        prepare_data(&store, &demos).await;
    });
    let marker = block_on(update::initialise(&store, &config, &Quiet)).unwrap();
    let rows: Vec<UpdateRow> = block_on(store.read_rows(&[&marker])).unwrap();
    assert_eq!(rows.len(), 25);
    assert!(rows.iter().all(|r| r.mode == "sft" && r.sequences == 4 && r.loss.is_finite()));
    // The checkpoint is a complete HF folder: the tokenizer travels with it.
    let dir_of = &marker.checkpoints[0].dir;
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "meta.json"] {
        assert!(marker.files.iter().any(|f| f.path == format!("{dir_of}/{name}")), "no {name}");
    }

    // Independently: the demonstrations' mean NLL under v0 vs the first step's (pre-update) loss.
    let mut loaded = block_on(policies::load(&store, &config.policies, "shared", 0)).unwrap();
    let nll = mean_nll(loaded.model("shared").unwrap().0, &demos);
    assert!(rows[0].loss > 3.0, "a scratch model should start near ln(512): {}", rows[0].loss);
    assert!(nll < 0.5 * rows[0].loss, "SFT did not lower the loss: {} -> {nll}", rows[0].loss);
    assert!(rows[24].loss < rows[0].loss);
    // A fresh scratch model of the same config is as bad as the first step says.
    let fresh_config = petting::model::ModelConfig::from_dir(&fixture()).unwrap();
    let mut fresh = LanguageModel::scratch(fresh_config, 1, &LoadOptions::default()).unwrap();
    fresh.attach_tokenizer_files(&fixture()).unwrap();
    assert!(mean_nll(&mut fresh, &demos) > 2.0 * nll);
}

fn mean_nll(policy: &mut LanguageModel, demos: &[DemonstrationRow]) -> f64 {
    let options = TemplateOptions { add_generation_prompt: true, enable_thinking: Some(false) };
    let eos = policy.config().eos_token_ids[0];
    let requests: Vec<ScoreRequest> = demos
        .iter()
        .map(|d| {
            let (_, prompt_ids) = policy.encode_chat(&[ChatMessage::new("user", &d.prompt)], &options).unwrap();
            let mut response_ids = policy.require_tokenizer().unwrap().encode(&d.response, false).unwrap();
            response_ids.push(eos);
            ScoreRequest { prompt_ids, response_ids, adapter: None, images: None }
        })
        .collect();
    let scored = policy.score(&requests, 4096).unwrap();
    let tokens: usize = scored.iter().map(Vec::len).sum();
    -scored.iter().flatten().map(|&x| f64::from(x)).sum::<f64>() / tokens as f64
}
