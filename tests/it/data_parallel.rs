//! Updates as ranks on libtorch's c10d (Gloo on CPU), started by `--ranks N` and by the
//! launchers' environments: the weights and `updates` rows equal one process's, a rank
//! killed mid-update commits nothing and the rerun completes as an unbroken one, and a
//! rendezvous that never completes names the ranks that did not come.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use petting::model::SafetensorsSet;
use petting::progress::Quiet;
use petting::stages::update;
use petting::store::{CommitMarker, RunStore, Stage, StageId};
use petting::tables::UpdateRow;
use tch::Kind;

use crate::support::{block_on, free_port, output_of, petting};
use crate::update::{Run, Tamper, copy_dir, new_run, rollout};

/// A run whose update of iteration 0 is next: v0 committed, a rollout (every response
/// scored by v0, with rewards that give both policies non-zero advantages), group and
/// advantage.
fn prepared() -> Run {
    let run = new_run();
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    run
}

/// A copy of `run`'s store, in a folder of its own.
fn copy_of(run: &Run) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run");
    copy_dir(&run.path, &path);
    (dir, path)
}

fn update_at(path: &Path) -> Command {
    let mut command = petting();
    command.args(["stage", "update"]).arg(path).args(["--iteration", "0"]);
    command
}

/// Runs `command`, which must succeed.
fn succeeds(command: &mut Command) -> String {
    let (ok, stdout, stderr) = output_of(command.output().unwrap());
    assert!(ok, "{stdout}{stderr}");
    stdout
}

fn committed(path: &Path) -> Option<CommitMarker> {
    let store = RunStore::open(path.to_str().unwrap()).unwrap();
    block_on(store.marker(&StageId::at(Stage::Update, 0))).unwrap().map(|m| m.marker)
}

/// Every tensor of every checkpoint the update committed, by "policy/tensor".
fn weights(path: &Path) -> BTreeMap<String, Vec<f32>> {
    checkpoint_tensors(path, &committed(path).expect("the update is committed"))
}

/// v0's tensors, named as `weights` names v1's.
fn weights_of_v0(run: &Run) -> BTreeMap<String, Vec<f32>> {
    let marker = block_on(run.store.marker(&StageId::run_level(Stage::Update))).unwrap().unwrap().marker;
    checkpoint_tensors(&run.path, &marker)
}

fn checkpoint_tensors(path: &Path, marker: &CommitMarker) -> BTreeMap<String, Vec<f32>> {
    let mut all = BTreeMap::new();
    for checkpoint in &marker.checkpoints {
        let files: Vec<PathBuf> = std::fs::read_dir(path.join(&checkpoint.dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && !p.ends_with("optimizer.safetensors"))
            .collect();
        let set = SafetensorsSet::open_files(&files).unwrap();
        for name in set.names() {
            let (shape, _) = set.info(name).unwrap();
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let tensor = set.tensor(name, &shape, Kind::Float, tch::Device::Cpu).unwrap();
            all.insert(format!("{}/{name}", checkpoint.policy), Vec::<f32>::try_from(tensor.reshape([-1])).unwrap());
        }
    }
    all
}

fn rows(path: &Path) -> Vec<UpdateRow> {
    let store = RunStore::open(path.to_str().unwrap()).unwrap();
    let marker = committed(path).unwrap();
    let mut rows: Vec<UpdateRow> = block_on(store.read_rows(&[&marker])).unwrap();
    rows.sort_by(|a, b| (&a.policy, a.step).cmp(&(&b.policy, b.step)));
    rows
}

/// The largest difference between two sets of weights, which must name the same
/// tensors, and the L2 norm of their difference.
fn difference(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> (f64, f64) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let diffs = || a.iter().flat_map(|(name, x)| x.iter().zip(&b[name]).map(|(x, y)| f64::from(x - y).abs()));
    (diffs().fold(0.0, f64::max), diffs().map(|d| d * d).sum::<f64>().sqrt())
}

/// Same steps, sequences and tokens; loss, gradient norm and ratios equal up to the order
/// the ranks' sums are taken in.
fn assert_same_rows(one: &[UpdateRow], other: &[UpdateRow]) {
    assert_eq!(one.len(), other.len());
    for (a, b) in one.iter().zip(other) {
        let key = |r: &UpdateRow| (r.policy.clone(), r.step, r.sequences, r.tokens, r.skipped, r.truncated);
        assert_eq!(key(a), key(b));
        for (what, x, y) in [
            ("loss", a.loss, b.loss),
            ("grad_norm", a.grad_norm, b.grad_norm),
            ("ratio_mean", a.ratio_mean, b.ratio_mean),
            ("learning_rate", a.learning_rate, b.learning_rate),
        ] {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{} step {}: {what} {x} vs {y}", a.policy, a.step);
        }
    }
}

#[test]
fn two_and_four_ranks_train_the_weights_one_process_trains() {
    let run = prepared();
    let (_two_dir, two) = copy_of(&run);
    let (_four_dir, four) = copy_of(&run);
    let v0 = weights_of_v0(&run);
    succeeds(&mut update_at(&run.path));
    let stdout = succeeds(update_at(&two).args(["--ranks", "2"]));
    assert_eq!(stdout.matches("committed update of iteration 0").count(), 1, "rank 0 speaks for all: {stdout}");
    succeeds(update_at(&four).args(["--ranks", "4"]));

    let one = weights(&run.path);
    let (_, moved) = difference(&one, &v0);
    for (ranks, path) in [(2, &two), (4, &four)] {
        let (largest, norm) = difference(&one, &weights(path));
        eprintln!("{ranks} ranks: largest difference {largest:e}, norm {norm:e}, moved {moved:e}");
        // Summed in another order, the gradients differ in their last bits; AdamW's first
        // steps, which divide each gradient by its own size, carry that to the weights
        // of the gradients that nearly cancel, by a small part of one step (lr 1e-3).
        assert!(largest < 1e-4 && norm < 1e-2 * moved, "{ranks} ranks: {largest} {norm} (moved {moved})");
        assert_same_rows(&rows(&run.path), &rows(path));
    }
}

#[test]
fn a_rank_killed_mid_update_stops_every_rank_commits_nothing_and_the_rerun_completes() {
    let run = prepared();
    let (_clean_dir, clean) = copy_of(&run);
    let started = Instant::now();
    let output = update_at(&run.path).args(["--ranks", "2"]).env("PETTING_KILL_RANK_AT_STEP", "1:1").output().unwrap();
    let (ok, stdout, stderr) = output_of(output);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stderr.contains("rank 1 of 2 failed: killed by signal 9"), "{stderr}");
    assert!(
        stderr.contains("rank 0:") && stderr.contains("(rank 1 stopped answering)"),
        "rank 0's own error: {stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
    assert!(committed(&run.path).is_none(), "a half-finished update commits nothing");

    succeeds(update_at(&run.path).args(["--ranks", "2"]));
    succeeds(update_at(&clean).args(["--ranks", "2"]));
    assert_eq!(weights(&run.path), weights(&clean), "the rerun writes what an unbroken update writes, bit for bit");
    let sha = |m: CommitMarker| m.checkpoints.into_iter().map(|c| c.weights_sha256).collect::<Vec<_>>();
    assert_eq!(sha(committed(&run.path).unwrap()), sha(committed(&clean).unwrap()));
}

#[test]
fn a_rendezvous_that_never_completes_names_the_ranks_that_did_not_come() {
    let run = prepared();
    let port = free_port().to_string();
    let output = update_at(&run.path)
        .args(["--rendezvous-timeout", "2"])
        .envs([("RANK", "0"), ("WORLD_SIZE", "3"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", &port)])
        .output()
        .unwrap();
    let (ok, stdout, stderr) = output_of(output);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stderr.contains("timed out after 2 s: rank 1, 2 of a world of 3 never joined"), "{stderr}");
    assert!(committed(&run.path).is_none());
}

#[test]
fn ranks_of_different_runs_are_refused() {
    let run = prepared();
    let other = new_run();
    block_on(update::initialise(&other.store, &other.config, &Quiet)).unwrap();
    block_on(rollout(&other, 0, Tamper::Truncated));
    let port = free_port().to_string();
    let rank = |rank: &str, path: &Path| {
        let mut command = update_at(path);
        command
            .args(["--rendezvous-timeout", "20"])
            .envs([("RANK", rank), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", &port)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command.spawn().unwrap()
    };
    let ranks = [rank("0", &run.path), rank("1", &other.path)];
    for (rank, child) in ranks.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "rank {rank} is refused before anything is written: {stderr}");
        assert!(stderr.contains("every rank must run the same run config and inputs"), "{stderr}");
    }
    assert!(committed(&run.path).is_none() && committed(&other.path).is_none());
}

/// The tests' tiny run file (tests/it/pipeline.rs) at a new store in `dir`: its path and
/// the store's.
fn tiny_run(dir: &Path) -> (String, String) {
    let store = dir.join("run").display().to_string();
    (crate::pipeline::write_config_for(dir, "ranks", &store, 5), store)
}

/// Stops a pipeline after the first update: the iteration the ranks' run shares
/// exactly with one process's (later ones sample from weights equal to a few ulps).
const UNTIL: [&str; 2] = ["--until", "evaluate:1"];

/// What `ranks` ranks wrote up to the first update is what one process writes (the
/// reference run's), logprobs aside: the rollouts and evaluations were played in
/// `ranks` shards, and the update run data-parallel.
fn assert_like_one_process(store: &str, ranks: u32) {
    let reference = crate::pipeline::reference_run().display().to_string();
    let iteration_0 = "iteration = 0";
    assert_eq!(
        crate::pipeline::content_at(store, "", iteration_0),
        crate::pipeline::content_at(&reference, "", iteration_0)
    );
    let updates = "select policy, step, sequences, tokens from updates where iteration = 0 order by 1, 2";
    assert_eq!(crate::pipeline::sql_at(store, updates, "csv"), crate::pipeline::sql_at(&reference, updates, "csv"));
    let shards = "select stage, count(*) from commits where iteration = 0 group by stage, shards order by 1";
    let commits = crate::pipeline::sql_at(store, shards, "csv");
    let expected = format!("stage,count(*)\nadvantage,1\nevaluate,{ranks}\ngroup,1\nrollout,{ranks}\nupdate,1\n");
    assert_eq!(commits, expected);
}

#[test]
fn pipeline_run_with_ranks_writes_what_one_process_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (config, store) = tiny_run(dir.path());
    let stdout = succeeds(petting().args(["pipeline", "run", &config, "--ranks", "2"]).args(UNTIL));
    assert!(stdout.contains("2 ranks: each update data-parallel over all"), "{stdout}");
    assert_eq!(stdout.matches("update of iteration 0:").count(), 1, "rank 0 speaks for all: {stdout}");
    assert_like_one_process(&store, 2);
}

#[test]
fn torchrun_starts_the_ranks_of_a_pipeline_run() {
    if !crate::support::full_suite("torchrun_starts_the_ranks_of_a_pipeline_run") {
        return;
    }
    // The torchrun of the PyPI torch wheel, which scripts/install/vllm.sh installs.
    let torchrun = crate::support::repo_root().join(".vllm/bin/torchrun");
    let dir = tempfile::tempdir().unwrap();
    let (config, store) = tiny_run(dir.path());
    // docs/cluster.md's single-node recipe.
    succeeds(
        Command::new(torchrun)
            .args(["--standalone", "--nproc-per-node", "2", "--no-python", env!("CARGO_BIN_EXE_petting")])
            .args(["pipeline", "run", &config])
            .args(UNTIL),
    );
    assert_like_one_process(&store, 2);
}

#[test]
fn the_sbatch_script_starts_its_tasks_as_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (config, store) = tiny_run(dir.path());
    // Slurm's srun and scontrol as the script meets them inside an allocation: srun
    // starts SLURM_NTASKS tasks of its command with the variables Slurm gives each task.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = |name: &str, text: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        "srun",
        "#!/usr/bin/env bash\npids=()\nfor ((i = 0; i < SLURM_NTASKS; i++)); do\n  \
         SLURM_PROCID=$i SLURM_LOCALID=$((i % 2)) SLURM_NODEID=$((i / 2)) \"$@\" &\n  pids+=($!)\ndone\n\
         status=0\nfor p in \"${pids[@]}\"; do wait \"$p\" || status=1; done\nexit $status\n",
    );
    script(
        "scontrol",
        "#!/usr/bin/env bash\n[[ \"$1 $2\" == \"show hostnames\" ]] && printf '127.0.0.1\\n127.0.0.2\\n'\n",
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    // The file's allocation: --nodes=2 --ntasks-per-node=2.
    succeeds(
        Command::new("bash")
            .arg(crate::support::repo_root().join("deploy/slurm/petting-ranks.sbatch"))
            .arg(&config)
            .args(UNTIL)
            .env("PATH", path)
            .env("PETTING", env!("CARGO_BIN_EXE_petting"))
            .env("SLURM_SUBMIT_DIR", crate::support::repo_root())
            .env("SLURM_NTASKS", "4")
            .env("SLURM_JOB_NODELIST", "node[0-1]")
            .env("MASTER_PORT", free_port().to_string()),
    );
    assert_like_one_process(&store, 4);
}

#[test]
fn a_pytorchjob_starts_its_pods_as_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (config, store) = tiny_run(dir.path());
    let manifest =
        std::fs::read_to_string(crate::support::repo_root().join("deploy/kubernetes/petting-pytorchjob.yaml"));
    let manifest: serde_json::Value = serde_saphyr::from_str(&manifest.unwrap()).unwrap();
    let replicas = &manifest["spec"]["pytorchReplicaSpecs"];
    let container = &replicas["Master"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "pytorch", "the training operator looks for this name");
    let command: Vec<String> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| match a.as_str().unwrap() {
            "/opt/petting/petting" => env!("CARGO_BIN_EXE_petting").to_string(),
            "/etc/petting/iteration.yaml" => config.clone(),
            other => other.to_string(),
        })
        .collect();
    let world = 1 + replicas["Worker"]["replicas"].as_u64().unwrap();
    assert_eq!(replicas["Worker"]["template"]["spec"]["containers"][0], *container, "every pod runs the same");
    // The operator's environment: RANK 0 for the Master, 1… for the Workers, and the
    // Master's service as MASTER_ADDR (here the loopback it would resolve to).
    let port = free_port().to_string();
    let pods: Vec<std::process::Child> = (0..world)
        .map(|rank| {
            Command::new(&command[0])
                .args(&command[1..])
                .args(UNTIL)
                .envs([
                    ("RANK", rank.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("PYTHONUNBUFFERED", "1".into()),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for pod in pods {
        let (ok, stdout, stderr) = output_of(pod.wait_with_output().unwrap());
        assert!(ok, "{stdout}{stderr}");
    }
    assert_like_one_process(&store, world as u32);
}

/// `prepared`, with tool_p (all weights) in pool `tool` and plan_p (LoRA) in pool
/// `planner`, of `tool` and `planner` ranks.
fn prepared_in_pools(tool: u32, planner: u32) -> Run {
    let run = crate::update::new_run_with(|file| {
        file.set("pools", &format!("{{tool: {{ranks: {tool}}}, planner: {{ranks: {planner}}}}}"))
            .set("policies.tool_p.pool", "tool")
            .set("policies.plan_p.pool", "planner")
    });
    block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
    block_on(rollout(&run, 0, Tamper::None));
    run
}

#[test]
fn two_policies_in_two_pools_update_side_by_side_as_one_process_updates_them() {
    let run = prepared_in_pools(1, 1);
    let (_pools_dir, pools) = copy_of(&run);
    let wide = prepared_in_pools(2, 2);
    // One process trains both policies in turn (pools place ranks; alone there are none),
    // on one thread as each of the two ranks does.
    succeeds(update_at(&run.path).env("OMP_NUM_THREADS", "1"));
    // Rank 0 trains planner's plan_p while rank 1 trains tool's tool_p.
    succeeds(update_at(&pools).args(["--ranks", "2"]).env("OMP_NUM_THREADS", "1"));
    let (largest, _) = difference(&weights(&pools), &weights(&run.path));
    assert_eq!(largest, 0.0, "a pool of one rank trains as one process does, bit for bit");
    let (one, side_by_side) = (rows(&run.path), rows(&pools));
    assert_eq!(
        side_by_side.iter().map(|r| (&r.policy, r.step)).collect::<Vec<_>>(),
        one.iter().map(|r| (&r.policy, r.step)).collect::<Vec<_>>()
    );
    assert_same_rows(&one, &side_by_side);
    let policies: Vec<String> = committed(&pools).unwrap().checkpoints.into_iter().map(|c| c.policy).collect();
    assert_eq!(policies, ["plan_p", "tool_p"], "one marker commits both pools' checkpoints");

    // Pools of two ranks each: every policy data-parallel over its own two.
    succeeds(update_at(&wide.path).args(["--ranks", "4"]));
    let (largest, _) = difference(&weights(&run.path), &weights(&wide.path));
    assert!(largest < 1e-4, "{largest}");
}

#[test]
fn pools_that_do_not_add_up_to_the_ranks_are_refused() {
    let run = prepared_in_pools(1, 2);
    let config = run.path.join("run.yaml");
    let (ok, stdout, stderr) =
        output_of(petting().args(["config", "check"]).arg(&config).args(["--ranks", "2"]).output().unwrap());
    assert!(
        !ok && stderr.contains("pools: name 3 ranks in all (planner: 2, tool: 1), but the run has 2"),
        "{stdout}{stderr}"
    );
    let output = update_at(&run.path).args(["--ranks", "2"]).output().unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("but the run has 2"));
    assert!(committed(&run.path).is_none());
    succeeds(petting().args(["config", "check"]).arg(&config).args(["--ranks", "3"]));
}

/// Iteration `iteration`'s update of `run` by `ranks` ranks (one process for 1).
fn update_iteration(run: &Run, iteration: u32, ranks: u32) {
    let mut command = petting();
    command.args(["stage", "update"]).arg(&run.path).args(["--iteration", &iteration.to_string()]);
    if ranks > 1 {
        command.args(["--ranks", &ranks.to_string()]);
    }
    succeeds(&mut command);
}

#[test]
fn a_sharded_optimiser_state_is_saved_whole_and_resumed_by_another_number_of_ranks() {
    let runs: Vec<Run> = (0..2)
        .map(|_| {
            let run = crate::update::new_run_with(|file| file.set("update.shard_optimizer_state", "true"));
            block_on(update::initialise(&run.store, &run.config, &Quiet)).unwrap();
            block_on(rollout(&run, 0, Tamper::None));
            run
        })
        .collect();
    let (one, sharded) = (&runs[0], &runs[1]);
    // One process (nothing to shard), against 2 ranks keeping half the state each, then
    // 3 ranks resuming from what the 2 saved.
    for (run, ranks) in [(one, [1, 1]), (sharded, [2, 3])] {
        update_iteration(run, 0, ranks[0]);
        block_on(rollout(run, 1, Tamper::None));
        update_iteration(run, 1, ranks[1]);
    }
    let v2 = |run: &Run| {
        let marker = block_on(run.store.marker(&StageId::at(Stage::Update, 1))).unwrap().unwrap().marker;
        checkpoint_tensors(&run.path, &marker)
    };
    let (largest, _) = difference(&v2(one), &v2(sharded));
    assert!(largest < 1e-4, "{largest}");
    // The saved state is one file with every weight's moments, as one process saves it.
    let state = |run: &Run| {
        let marker = block_on(run.store.marker(&StageId::at(Stage::Update, 1))).unwrap().unwrap().marker;
        let checkpoint = marker.checkpoints.iter().find(|c| c.policy == "tool_p").unwrap();
        petting::model::AdamWState::load(&run.path.join(&checkpoint.dir).join("optimizer.safetensors")).unwrap()
    };
    let (a, b) = (state(one), state(sharded));
    assert_eq!((a.step, a.tensors.keys().collect::<Vec<_>>()), (b.step, b.tensors.keys().collect::<Vec<_>>()));
}
