//! Sampling overlapped with training (`rollout.max_staleness`, `evaluation.beside`,
//! `pipeline run --lane`): rows within the bound, refused past it, and tables that do
//! not depend on timing, kills or which processes ran the lanes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use crate::pipeline::{content_at, kill_at_random_moments, pipeline, reference_run, run_file, sql_rows};
use crate::support::{RunFile, output_of, petting, run};

/// The pipeline tests' tiny run, three iterations, sampling one version behind.
fn stale_file(store: &Path, staleness: u32) -> RunFile {
    run_file(&store.display().to_string(), 5)
        .set("iterations", "3")
        .set("rollout.max_staleness", &staleness.to_string())
}

fn content(run: &Path) -> String {
    content_at(run.to_str().unwrap(), "response_logprobs, staleness,", "true")
}

/// The run with s = 1 as `pipeline run` overlaps it by itself, made once per test binary.
struct StaleRun {
    run: PathBuf,
    stdout: String,
}

fn stale_run() -> &'static StaleRun {
    static RUN: OnceLock<StaleRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stale-run");
        drop(std::fs::remove_dir_all(&dir));
        std::fs::create_dir_all(&dir).unwrap();
        let run = dir.join("run");
        let config = stale_file(&run, 1).write(&dir.join("stale.yaml"));
        StaleRun { stdout: pipeline(&config), run }
    })
}

#[test]
fn a_stale_run_samples_each_iteration_with_the_version_its_bound_gives() {
    let StaleRun { run: store, stdout } = stale_run();
    assert!(stdout.contains("lanes: train here, sample beside it"), "{stdout}");
    assert!(stdout.contains("iteration 2: reward"), "{stdout}");
    // Iteration k samples with max(k − 1, 0), and every token says how far behind it is.
    let versions =
        sql_rows(store, "select distinct iteration, policy_version, staleness from turns order by iteration");
    assert_eq!(versions, ["0,0,0", "1,0,1", "2,1,1"]);
    let gaps = sql_rows(store, "select distinct iteration, version, staleness from logprob_gaps order by 1");
    // Per sample, the trainer's version and how far behind it the sampler was.
    assert_eq!(gaps, ["0,0,0", "1,1,1", "2,2,1"]);
    // The update counts its stale sequences (importance-weighted); its drift check (the
    // trainer's logprobs of the sampled version against the sampler's) has the fresh ones.
    let updates = sql_rows(
        store,
        "select iteration, policy, sum(stale_sequences) > 0, count(stale_logprob_drift_mean) > 0 from updates \
         where mode = 'ppo' group by 1, 2 order by 1, 2",
    );
    let expected = ["0,coder,false,true", "0,pilot,false,true", "1,coder,true,true", "1,pilot,true,true"];
    assert_eq!(updates[..4], expected);
    assert_eq!(updates[4..], ["2,coder,true,true", "2,pilot,true,true"]);
    let (ok, stdout, stderr) = run(&["verify", store.to_str().unwrap()]);
    assert!(ok, "{stdout}{stderr}");
    // The report's time line says when each lane ran and how long they ran at once.
    let out = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run(&["report", store.to_str().unwrap(), "--output", out.path().to_str().unwrap()]);
    assert!(ok, "{stdout}{stderr}");
    let page = std::fs::read_to_string(out.path().join("index.html")).unwrap();
    assert!(page.contains("ran beside training (group, advantage, update) for"), "{page}");
    assert!(page.contains("<th>rollout_from</th>") && page.contains("<td>2</td>"), "{page}");
}

#[test]
fn lanes_run_by_hand_in_two_processes_write_the_tables_the_run_overlapped_by_itself_did() {
    let dir = tempfile::tempdir().unwrap();
    let by_hand = dir.path().join("by-hand");
    let config = stale_file(&by_hand, 1).write(&dir.path().join("by-hand.yaml"));
    // The sample lane starts first and waits for the train lane's initial checkpoints.
    let sample = petting()
        .args(["pipeline", "run", &config, "--lane", "sample"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, train_stdout, stderr) = run(&["pipeline", "run", &config, "--lane", "train"]);
    assert!(ok, "{train_stdout}{stderr}");
    let (ok, sample_stdout, stderr) = output_of(sample.wait_with_output().unwrap());
    assert!(ok, "{sample_stdout}{stderr}");
    assert!(train_stdout.contains("lane train") && sample_stdout.contains("lane sample"), "{train_stdout}");
    assert!(!train_stdout.contains("beside it"), "a lane starts no other lanes: {train_stdout}");
    assert_eq!(content(&stale_run().run), content(&by_hand));
}

#[test]
fn a_stale_run_killed_at_random_moments_resumes_to_the_same_tables() {
    let dir = tempfile::tempdir().unwrap();
    let killed = dir.path().join("killed");
    let config = stale_file(&killed, 1).write(&dir.path().join("killed.yaml"));
    let kills = kill_at_random_moments(&config, 8);
    pipeline(&config);
    assert!(kills >= 2, "the run should have been interrupted several times ({kills})");
    // No in-flight rollout is skipped or sampled again with another version: the same
    // rows, logprobs and staleness, and the same weights in every version.
    let reference = &stale_run().run;
    assert_eq!(content(reference), content(&killed), "killed {kills} times");
    let checkpoints = "select policy, version, weights_sha256, optimizer_sha256 from checkpoints order by 1, 2";
    assert_eq!(sql_rows(reference, checkpoints), sql_rows(&killed, checkpoints));
}

#[test]
fn a_row_staler_than_the_bound_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("run");
    // With s = 2, rollout 2 samples with v0; the bound is then lowered to 1 for update 2.
    let config = stale_file(&store, 2).write(&dir.path().join("s2.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--until", "update:2"]);
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(sql_rows(&store, "select distinct policy_version, staleness from turns where iteration = 2"), ["0,2"]);
    let lowered = stale_file(&store, 1).write(&dir.path().join("s1.yaml"));
    let output = petting().args(["pipeline", "run", &lowered, "--allow-config-change"]).output().unwrap();
    let status = output.status.code();
    let (_, stdout, stderr) = output_of(output);
    assert_eq!(status, Some(3), "refused, not failed: {stdout}{stderr}");
    assert!(
        stderr.contains("was sampled by v0, 2 versions behind the v2 this update trains, past rollout.max_staleness 1"),
        "{stderr}"
    );
    assert!(sql_rows(&store, "select count(*) from updates where iteration = 2") == ["0"], "nothing was written");
}

#[test]
fn evaluations_played_beside_the_rollouts_change_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let beside = dir.path().join("beside");
    let config = run_file(&beside.display().to_string(), 5)
        .set("evaluation.beside", "true")
        .write(&dir.path().join("beside.yaml"));
    let stdout = pipeline(&config);
    assert!(stdout.contains("lanes: train here, rollout and evaluate beside it"), "{stdout}");
    // Strictly on-policy, with the pipeline tests' reference run's seed: its very tables.
    let same = |run: &Path| content_at(run.to_str().unwrap(), "response_logprobs,", "true");
    assert_eq!(same(&reference_run()), same(&beside));
}

#[test]
fn strictly_on_policy_every_row_is_fresh_and_no_stale_column_is_filled() {
    let reference = reference_run();
    assert_eq!(sql_rows(&reference, "select distinct staleness from turns"), ["0"]);
    let stale = "select count(stale_sequences) + count(stale_logprob_drift_mean) + count(stale_mismatch_fraction) \
                 from updates";
    assert_eq!(sql_rows(&reference, stale), ["0"]);
}
