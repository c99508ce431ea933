//! `petting sql`, `status`, `gc` and `verify` on a committed run, good input and bad.

use std::io::Write;
use std::process::Stdio;

use petting::schema::Table;
use petting::store::{Partition, RunStore, Stage, StageId};
use petting::tables;

use crate::support::{block_on, output_of, petting, run, synthetic};

/// `petting sql URL` at its prompt, fed `input`, its history kept under `state`.
fn at_the_prompt(url: &str, state: &std::path::Path, input: &[u8]) -> (bool, String, String) {
    let mut child = petting()
        .args(["sql", url])
        .env("XDG_STATE_HOME", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    output_of(child.wait_with_output().unwrap())
}

/// A run with 3 committed iterations of 64 turns each, plus one orphan part.
fn fixture_run() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("run").to_string_lossy().into_owned();
    let store = RunStore::open(&url).unwrap();
    block_on(async {
        synthetic::commit_turns(&store, 3, 64, 64).await;
        let mut orphan = store.begin(StageId::at(Stage::Rollout, 3));
        let rows = synthetic::turn_rows(3, 10, 1);
        orphan.write_table(Table::Turns, Partition::Iteration(3), &[tables::to_batch(&rows).unwrap()]).await.unwrap();
        let _ = orphan.finish();
    });
    (dir, url)
}

const BY_AGENT: &str = "select iteration, agent, count(*) as n from turns where turn = 0 group by iteration, agent order by iteration, agent";

#[test]
fn a_group_by_prints_an_aligned_table() {
    let (_dir, url) = fixture_run();
    let (ok, stdout, stderr) = run(&["sql", &url, BY_AGENT]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("| iteration | agent   | n |"), "{stdout}");
    assert!(stdout.contains("| 2         | tool    | 8 |"), "{stdout}");
    assert!(stdout.ends_with("(6 rows)\n"), "iteration 3 is not committed: {stdout}");
}

#[test]
fn results_export_as_csv_json_and_parquet() {
    let (dir, url) = fixture_run();
    let (ok, csv, stderr) = run(&["sql", &url, BY_AGENT, "--format", "csv"]);
    assert!(ok, "{stderr}");
    assert_eq!(csv.lines().take(3).collect::<Vec<_>>(), ["iteration,agent,n", "0,planner,8", "0,tool,8"]);

    let (ok, json, stderr) = run(&["sql", &url, BY_AGENT, "--format", "json"]);
    assert!(ok, "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[5], serde_json::json!({"iteration": 2, "agent": "tool", "n": 8}));

    let out = dir.path().join("result.parquet");
    let (ok, _, stderr) = run(&["sql", &url, BY_AGENT, "--format", "parquet", "--output", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let file = std::fs::File::open(&out).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 6);

    let (ok, _, stderr) = run(&["sql", &url, BY_AGENT, "--format", "parquet"]);
    assert!(!ok && stderr.contains("--format parquet needs --output FILE"), "{stderr}");
}

#[test]
fn every_table_is_registered_with_iteration_as_a_column() {
    let (_dir, url) = fixture_run();
    let query = "select table_name from information_schema.tables where table_schema = 'public' order by table_name";
    let (ok, csv, stderr) = run(&["sql", &url, query, "--format", "csv"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        csv,
        "table_name\ncheckpoints\ncommits\ndemonstrations\nevals\ngroups\nlogprob_gaps\nsamples\ntasks\nturns\nupdates\n"
    );
    let (ok, csv, stderr) = run(&["sql", &url, "select count(*) as n from evals", "--format", "csv"]);
    assert!(ok && csv == "n\n0\n", "an empty table answers: {csv}{stderr}");
    let (ok, csv, _) = run(&["sql", &url, "select max(iteration) as k from turns", "--format", "csv"]);
    assert!(ok && csv == "k\n2\n", "{csv}");
}

#[test]
fn a_sql_syntax_error_is_reported_and_fails() {
    let (_dir, url) = fixture_run();
    let (ok, stdout, stderr) = run(&["sql", &url, "selec agent from turns"]);
    assert!(!ok && stdout.is_empty());
    assert!(stderr.starts_with("error: SQL error") && stderr.contains("selec"), "{stderr}");
}

#[test]
fn sql_only_reads_copy_and_external_tables_are_refused() {
    let (dir, url) = fixture_run();
    let before = crate::support::files_under(dir.path());
    let into_the_run = std::path::Path::new(&url).join("turns/iteration=0/part-9.parquet");
    let copy = format!("COPY (SELECT * FROM turns) TO '{}' STORED AS PARQUET", into_the_run.display());
    let (ok, _, stderr) = run(&["sql", &url, &copy]);
    assert!(!ok && stderr.contains("DML not supported: COPY") && stderr.contains("only reads"), "{stderr}");
    let outside = dir.path().join("copied.csv");
    let (ok, _, stderr) = run(&["sql", &url, &format!("COPY turns TO '{}'", outside.display())]);
    assert!(!ok && stderr.contains("only reads"), "{stderr}");
    let external = "CREATE EXTERNAL TABLE secrets (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'";
    let (ok, _, stderr) = run(&["sql", &url, external]);
    assert!(!ok && stderr.contains("DDL not supported"), "{stderr}");
    for statement in
        ["CREATE TABLE t AS SELECT 1", "CREATE VIEW v AS SELECT 1", "SET datafusion.execution.batch_size = 1"]
    {
        let (ok, _, stderr) = run(&["sql", &url, statement]);
        assert!(!ok && stderr.contains("only reads"), "{statement}: {stderr}");
    }
    // At the prompt as well.
    let input = format!("{external};\nselect secrets.line from secrets;\n");
    let history = tempfile::tempdir().unwrap();
    let (_, stdout, stderr) = at_the_prompt(&url, history.path(), input.as_bytes());
    assert!(stderr.contains("DDL not supported") && !stdout.contains("root:"), "{stdout}{stderr}");
    assert_eq!(crate::support::files_under(dir.path()), before, "nothing was written");
}

#[test]
fn a_long_table_result_streams_as_aligned_blocks() {
    let (_dir, url) = fixture_run();
    let (ok, stdout, stderr) = run(&["sql", &url, "select value from generate_series(1, 2500)"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.matches("| value |").count(), 3, "three blocks of at most 1000 rows");
    assert!(stdout.contains("| 2500  |") && stdout.ends_with("(2500 rows)\n"), "{stdout}");
    let (ok, stdout, _) = run(&["sql", &url, "select agent from turns where false"]);
    assert!(
        ok && stdout.contains("| agent |") && stdout.ends_with("(0 rows)\n"),
        "an empty result has its header: {stdout}"
    );
}

#[test]
fn an_unknown_table_lists_the_tables_of_the_run() {
    let (_dir, url) = fixture_run();
    let (ok, _, stderr) = run(&["sql", &url, "select * from trajectories"]);
    assert!(!ok);
    assert!(
        stderr.contains("trajectories") && stderr.contains("the run's tables are tasks, turns, groups"),
        "{stderr}"
    );
}

#[test]
fn a_missing_run_or_an_unknown_scheme_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("nothing-here");
    let (ok, _, stderr) = run(&["sql", nowhere.to_str().unwrap(), "select 1"]);
    assert!(!ok && stderr.contains("no run at file://") && stderr.contains("nothing-here"), "{stderr}");
    assert!(!nowhere.exists(), "reading must not create the run");

    let (ok, _, stderr) = run(&["status", "ftp://host/run"]);
    assert!(!ok && stderr.contains("unsupported run URL \"ftp://host/run\""), "{stderr}");
}

#[test]
fn an_unreachable_s3_endpoint_fails_quickly_with_the_cause() {
    let started = std::time::Instant::now();
    let output = petting()
        .args(["status", "s3://bucket/run"])
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let (ok, _, stderr) = output_of(output);
    assert!(!ok);
    assert!(stderr.contains("s3://bucket/run") && stderr.contains("_commits"), "{stderr}");
    assert!(stderr.to_lowercase().contains("connect") || stderr.contains("error sending request"), "{stderr}");
    assert!(started.elapsed().as_secs() < 120, "gave up after {:?}", started.elapsed());
}

#[test]
fn s3_without_credentials_is_refused_before_any_request() {
    let mut command = petting();
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("AWS_")) {
        command.env_remove(name);
    }
    let (ok, _, stderr) = output_of(command.args(["status", "s3://bucket/run"]).output().unwrap());
    assert!(!ok);
    assert!(
        stderr.contains("cannot open run \"s3://bucket/run\": no credentials are configured; set AWS_ACCESS_KEY_ID"),
        "{stderr}"
    );
}

#[test]
fn the_interactive_prompt_runs_multi_line_statements() {
    let (dir, url) = fixture_run();
    let input = b"select count(*) as n\n  from turns;\nselec oops;\n\\d\nselect 41 + 1 as answer;\n\\q\n";
    let (ok, stdout, stderr) = at_the_prompt(&url, dir.path(), input);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("| 192 |"), "{stdout}");
    assert!(stdout.contains("| 42     |"), "the prompt goes on after an error: {stdout}");
    assert!(stderr.contains("error: SQL error"), "{stderr}");
    assert!(stdout.contains("turns        One row per sampled candidate"), "{stdout}");
    let history = std::fs::read_to_string(dir.path().join("petting/sql_history")).unwrap();
    assert!(history.contains("select 41 + 1 as answer;"), "{history}");
}

#[test]
fn status_shows_committed_stages_per_iteration() {
    let (_dir, url) = fixture_run();
    let (ok, stdout, stderr) = run(&["status", &url]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("run file://"), "{stdout}");
    let rollout_2 = lines.iter().find(|l| l.trim_start().starts_with("2") && l.contains("rollout")).unwrap();
    assert!(rollout_2.contains("committed") && rollout_2.contains(" 64 "), "{rollout_2}");
    let group_2 = lines.iter().find(|l| l.trim_start().starts_with("2") && l.contains("group")).unwrap();
    assert!(!group_2.contains("committed"), "{group_2}");
    assert!(!stdout.contains("\n 3 "), "iteration 3 has no marker: {stdout}");
}

#[test]
fn gc_removes_the_orphan_and_verify_then_passes() {
    let (_dir, url) = fixture_run();
    let (ok, stdout, stderr) = run(&["gc", &url]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("deleted 0 uncommitted files") && stdout.contains("spared 1"), "{stdout}");
    let (ok, stdout, stderr) = run(&["gc", &url, "--grace", "0s"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("deleted turns/iteration=3/part-0-") && stdout.contains("deleted 1 uncommitted files"),
        "{stdout}"
    );
    assert!(!std::path::Path::new(&url).join("turns/iteration=3").exists(), "empty folders go too");
    let (ok, stdout, _) = run(&["verify", &url]);
    assert!(ok && stdout.contains("3 committed files match"), "{stdout}");
}

#[test]
fn gc_refuses_a_folder_that_is_not_a_store_and_keeps_what_is_not_a_stage_output() {
    // The layout a user (and these tests) make: run.yaml beside the store it names.
    let (dir, url) = fixture_run();
    let config = dir.path().join("run.yaml");
    std::fs::write(&config, "store: run\n").unwrap();
    let before = crate::support::files_under(dir.path());
    let (ok, _, stderr) = run(&["gc", dir.path().to_str().unwrap(), "--grace", "0s"]);
    assert!(!ok && stderr.contains("is not a run store: it has no commit markers"), "{stderr}");
    assert_eq!(crate::support::files_under(dir.path()), before, "a refused gc deletes nothing");

    // Inside the store, only the orphaned part is a stage's output.
    let run_dir = std::path::Path::new(&url);
    let users = [run_dir.join("notes.txt"), run_dir.join("turns/mine.parquet"), run_dir.join("checkpoints/README")];
    for file in &users {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, "the user's").unwrap();
    }
    let (ok, stdout, stderr) = run(&["gc", &url, "--grace", "0s"]);
    assert!(ok && stdout.contains("deleted 1 uncommitted files"), "{stdout}{stderr}");
    for file in &users {
        assert!(file.exists(), "{} is not a stage's output and stays", file.display());
    }
    assert!(config.exists());
}

#[test]
fn a_store_inside_another_is_refused_by_gc_and_by_pipeline_run() {
    let (dir, url) = fixture_run();
    let inner = format!("{url}/inner");
    block_on(synthetic::commit_turns(&RunStore::open(&inner).unwrap(), 1, 64, 64));
    let before = crate::support::files_under(dir.path());
    let (ok, _, stderr) = run(&["gc", &url, "--grace", "0s"]);
    assert!(!ok && stderr.contains("inner is a run store inside the run store"), "{stderr}");
    let (ok, _, stderr) = run(&["gc", &inner, "--grace", "0s"]);
    assert!(!ok && stderr.contains("is a run store inside the run store"), "{stderr}");
    assert_eq!(crate::support::files_under(dir.path()), before, "a refused gc deletes nothing");

    let config = dir.path().join("nested.yaml");
    std::fs::write(
        &config,
        "store: run/turns/nested\niterations: 1\nenv: {name: plan_path}\nworkflow: {kind: tool_planner}\n\
         agents: {tool: {policy: shared}, planner: {policy: shared}}\npolicies: {shared: {model: m}}\n",
    )
    .unwrap();
    let output = petting().args(["pipeline", "run", config.to_str().unwrap(), "--until", "update"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("nested is a run store inside the run store"), "{stderr}");
    assert!(!std::path::Path::new(&url).join("turns/nested").exists(), "nothing is created");
}

#[test]
fn verify_and_sql_name_a_truncated_file() {
    let (_dir, url) = fixture_run();
    let part = std::fs::read_dir(std::path::Path::new(&url).join("turns/iteration=1"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() - 100]).unwrap();
    let name = part.file_name().unwrap().to_string_lossy().into_owned();
    let (ok, _, stderr) = run(&["verify", &url]);
    assert!(!ok && stderr.contains(&name) && stderr.contains("corrupt"), "{stderr}");
    let (ok, _, stderr) = run(&["sql", &url, "select count(*) from turns"]);
    assert!(!ok && stderr.contains(&name), "{stderr}");
    // The tables are small: every query checks their sha256 first, so none answers
    // from a damaged run, even one that would not read the damaged file.
    let (ok, _, stderr) = run(&["sql", &url, "select count(*) from turns where iteration = 2"]);
    assert!(!ok && stderr.contains(&name) && stderr.contains("corrupt"), "{stderr}");
}

/// A Plan-Path run in `dir/run` with only prepare-data committed, for stages run by hand.
fn prepared_run(dir: &std::path::Path) -> String {
    let config = dir.join("it.yaml");
    std::fs::write(
        &config,
        "store: run\niterations: 1\nenv: {name: plan_path}\nworkflow: {kind: tool_planner}\n\
         agents: {tool: {policy: shared}, planner: {policy: shared}}\npolicies: {shared: {model: m}}\n",
    )
    .unwrap();
    let (ok, _, stderr) = run(&["pipeline", "run", config.to_str().unwrap(), "--until", "update"]);
    assert!(ok, "{stderr}");
    dir.join("run").to_string_lossy().into_owned()
}

#[test]
fn stages_run_alone_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = prepared_run(dir.path());
    block_on(synthetic::commit_turns(&RunStore::open(&url).unwrap(), 1, 128, 128));

    let (ok, _, stderr) = run(&["stage", "advantage", &url, "--iteration", "0"]);
    assert!(!ok && stderr.contains("advantage of iteration 0 needs group of iteration 0 committed first"), "{stderr}");
    let (ok, stdout, stderr) = run(&["stage", "group", &url, "--iteration", "0"]);
    assert!(ok && stdout.starts_with("committed group of iteration 0: 16 rows in 1 files"), "{stdout}{stderr}");
    let (ok, stdout, stderr) = run(&["stage", "advantage", &url, "--iteration", "0"]);
    assert!(ok && stdout.starts_with("committed advantage of iteration 0: 128 rows"), "{stdout}{stderr}");
    let files_before = crate::support::files_under(dir.path()).len();
    let (ok, _, stderr) = run(&["stage", "group", &url, "--iteration", "0"]);
    assert!(!ok && stderr.contains("group of iteration 0 is already committed"), "{stderr}");
    assert_eq!(crate::support::files_under(dir.path()).len(), files_before, "a refused stage writes nothing");
    let (ok, _, stderr) = run(&["stage", "group", &url]);
    assert!(!ok && stderr.contains("give --iteration K"), "{stderr}");
}

#[test]
fn a_reward_past_float_range_is_refused_before_a_group_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let url = prepared_run(dir.path());
    // Rows as a rollout without a bound on rewards would commit them: each finite, their
    // sum (the mixed reward) and so the group's mean and std not.
    let mut rows = synthetic::turn_rows(0, 128, 7);
    for row in &mut rows {
        (row.local_reward, row.team_reward) = (1.7e308, 1.7e308);
    }
    block_on(synthetic::commit_rows(&RunStore::open(&url).unwrap(), 0, &rows, 128));
    let output = petting().args(["stage", "group", &url, "--iteration", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("group of iteration 0 computed") && stderr.contains("not a finite number"), "{stderr}");
    let store = RunStore::open(&url).unwrap();
    assert!(block_on(store.marker(&StageId::at(Stage::Group, 0))).unwrap().is_none(), "nothing is committed");
}

#[test]
fn a_run_on_s3_is_created_queried_and_collected_through_the_cli() {
    let Some((endpoint, bucket)) = crate::support::s3_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let parent = format!("s3://{bucket}/cli-{}", uuid::Uuid::new_v4().simple());
    let url = format!("{parent}/run");
    let config = dir.path().join("it.yaml");
    std::fs::write(
        &config,
        format!(
            "store: {url}\niterations: 1\nenv: {{name: plan_path}}\nworkflow: {{kind: tool_planner}}\n\
             agents: {{tool: {{policy: shared}}, planner: {{policy: shared}}}}\npolicies: {{shared: {{model: m}}}}\n"
        ),
    )
    .unwrap();
    let cli = |args: &[&str]| output_of(petting().args(args).envs(crate::support::s3_env(&endpoint)).output().unwrap());
    let (ok, stdout, stderr) = cli(&["pipeline", "run", config.to_str().unwrap(), "--until", "update"]);
    assert!(ok && stdout.contains(&format!("run {url}")), "{stdout}{stderr}");

    let store = crate::support::s3_run_store().unwrap();
    let store = RunStore::from_object_store(
        store.object_store().clone(),
        url.split_once(&bucket).unwrap().1.trim_start_matches('/'),
        &url,
    );
    block_on(synthetic::commit_turns(&store, 2, 64, 64));
    let (ok, csv, stderr) = cli(&[
        "sql",
        &url,
        "select iteration, count(*) as n from turns group by iteration order by 1",
        "--format",
        "csv",
    ]);
    assert!(ok && csv == "iteration,n\n0,64\n1,64\n", "{csv}{stderr}");
    let (ok, stdout, stderr) = cli(&["stage", "group", "--run", &url, "--iteration", "1"]);
    assert!(ok && stdout.contains("committed group of iteration 1"), "{stdout}{stderr}");
    let (ok, stdout, _) = cli(&["verify", &url]);
    // prepare-data's two task splits, two turns parts and one groups part.
    assert!(ok && stdout.contains("5 committed files match"), "{stdout}");
    let (ok, stdout, stderr) = cli(&["runs", &parent, "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    assert!(ok && runs[0]["run"] == url.as_str() && runs[0]["last_committed"] == "rollout:0", "{runs}");
    assert_eq!(runs[0]["state"], "next: update", "the run-level update was never run: {runs}");
    let (ok, stdout, _) = cli(&["gc", &url, "--grace", "0s"]);
    assert!(ok && stdout.contains("deleted 0 uncommitted files"), "{stdout}");
}
