//! `petting pipeline run` end to end on a tiny config, checked by SQL on the store.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::support::{RunFile, output_of, petting, repo_root, run};

/// Two iterations of Plan-Path with a tool agent and a planner on separate policies, so
/// routing is visible, both starting from the tiny Qwen3 fixture made by transformers.
pub(crate) fn write_config(dir: &Path, name: &str, run_dir: &Path, seed: u64) -> String {
    write_config_for(dir, name, &run_dir.display().to_string(), seed)
}

/// `write_config` with any store URL (`s3://…`).
pub(crate) fn write_config_for(dir: &Path, name: &str, store: &str, seed: u64) -> String {
    run_file(store, seed).write(&dir.join(format!("{name}.yaml")))
}

/// The run file of `write_config`, for a test to set keys in.
pub(crate) fn run_file(store: &str, seed: u64) -> RunFile {
    let model = crate::support::fixture("hf-tiny-qwen3");
    RunFile::new(&format!(
        r#"store: {store}
seed: {seed}
iterations: 2
env: {{name: plan_path, size: 5}}
data: {{train_tasks: 16, test_tasks: 4}}
workflow: {{kind: tool_planner, max_turns: 1}}
agents: {{tool: {{policy: coder}}, planner: {{policy: pilot}}}}
policies:
  coder: {{model: {model}, optimizer: {{lr: 1.0e-3}}}}
  pilot: {{model: {model}, optimizer: {{lr: 1.0e-3}}}}
rollout: {{tasks_per_iteration: 3, branches: 3, sampling: {{temperature: 1.0, max_new_tokens: 12}}}}
algorithm: {{name: at_grpo}}
update: {{mini_batch_sequences: 9}}
evaluation: {{every: 1, tasks: 4, modes: [multi_agent, single_agent], sampling: {{temperature: 0.0, max_new_tokens: 12}}}}
"#,
        model = model.display(),
    ))
}

fn sql(run_dir: &Path, query: &str) -> String {
    sql_as(run_dir, query, "csv")
}

fn sql_as(run_dir: &Path, query: &str, format: &str) -> String {
    sql_at(run_dir.to_str().unwrap(), query, format)
}

/// The rows of `query` over the run at `run`, as CSV lines without the header.
pub(crate) fn sql_rows(run: &Path, query: &str) -> Vec<String> {
    sql_at(run.to_str().unwrap(), query, "csv").lines().skip(1).map(str::to_owned).collect()
}

/// `petting sql` on a run at any URL, with the S3 test server's credentials for `s3://`.
pub(crate) fn sql_at(run: &str, query: &str, format: &str) -> String {
    let mut command = petting();
    if run.starts_with("s3://") {
        let (endpoint, _) = crate::support::s3_server().unwrap();
        command.envs(crate::support::s3_env(&endpoint));
    }
    let (ok, csv, stderr) = output_of(command.args(["sql", run, query, "--format", format]).output().unwrap());
    assert!(ok, "{query}\n{stderr}");
    csv
}

/// The tiny config with seed 5, run once per test binary: the run most tests check, the
/// source of the forks and the twin of the runs that must write the same tables. Tests
/// read it, never write to it.
pub(crate) struct Reference {
    pub run: PathBuf,
    /// Its config file, and what `pipeline run` printed while making it.
    pub config: String,
    pub stdout: String,
}

pub(crate) fn reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reference-run");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let run = dir.join("a");
        let config = write_config(&dir, "a", &run, 5);
        let stdout = pipeline(&config);
        Reference { run, config, stdout }
    })
}

pub(crate) fn reference_run() -> PathBuf {
    reference().run.clone()
}

pub(crate) fn pipeline(config: &str) -> String {
    let (ok, stdout, stderr) = run(&["pipeline", "run", config]);
    assert!(ok, "{stdout}\n{stderr}");
    stdout
}

const LOGPROBS: &str = "response_logprobs";

/// Rows of the tables that must not depend on timing, in a fixed order.
fn content(run_dir: &Path) -> String {
    content_with(run_dir, &format!("{LOGPROBS},"), "true")
}

/// `content` with extra turns columns (`logprobs`), of the rows `filter` keeps.
fn content_with(run_dir: &Path, logprobs: &str, filter: &str) -> String {
    content_at(run_dir.to_str().unwrap(), logprobs, filter)
}

/// `content_with` of a run at any URL, with its evaluations.
pub(crate) fn content_at(run: &str, logprobs: &str, filter: &str) -> String {
    let turns = sql_at(
        run,
        &format!(
            "select candidate_id, policy, policy_version, node_id, parent_id, selected, prompt_tokens, \
             response_tokens, {logprobs} action, local_reward, team_reward, sampling_seed from turns \
             where {filter} order by iteration, candidate_id"
        ),
        "json",
    );
    let samples =
        sql_at(run, &format!("select * from samples where {filter} order by iteration, candidate_id"), "json");
    let evals = sql_at(
        run,
        &format!(
            "select iteration, mode, task_id, sample, success, reward, turns, tokens from evals where {filter} \
             order by iteration, mode, task_id, sample"
        ),
        "json",
    );
    format!("{turns}\n{samples}\n{evals}")
}

#[test]
fn two_iterations_run_and_say_their_rewards() {
    let stdout = &reference().stdout;
    assert!(stdout.contains("iteration 1: reward"), "{stdout}");
}

#[test]
fn every_at_grpo_group_has_k_members_with_one_prompt() {
    let groups = sql(
        &reference_run(),
        "select count(*) as n from (select task_id, agent, turn, iteration, count(*) as k, \
         count(distinct prompt_text) as prompts from turns group by task_id, agent, turn, iteration) \
         where k <> 3 or prompts <> 1",
    );
    assert_eq!(groups, "n\n0\n");
}

#[test]
fn iteration_k_samples_with_version_k() {
    assert_eq!(sql(&reference_run(), "select count(*) as n from turns where policy_version <> iteration"), "n\n0\n");
}

#[test]
fn each_step_selects_one_candidate_which_the_next_step_continues() {
    let run_dir = reference_run();
    assert_eq!(
        sql(
            &run_dir,
            "select count(*) as n from (select task_id, iteration, turn, agent, sum(case when selected then 1 else 0 end) as s \
             from turns group by task_id, iteration, turn, agent) where s <> 1"
        ),
        "n\n0\n"
    );
    assert_eq!(
        sql(
            &run_dir,
            "select count(*) as n from turns t where t.agent = 'planner' and not exists (select 1 from turns p \
             where p.iteration = t.iteration and p.task_id = t.task_id and p.selected and p.agent = 'tool' \
             and p.node_id = t.parent_id)"
        ),
        "n\n0\n"
    );
}

#[test]
fn advantages_sum_to_zero_in_every_non_degenerate_group() {
    assert_eq!(
        sql(
            &reference_run(),
            "select count(*) as n from (select s.group_id, sum(s.advantage) as a from samples s join groups g \
             on s.group_id = g.group_id and s.iteration = g.iteration where not g.degenerate group by s.group_id) \
             where abs(a) > 1e-6"
        ),
        "n\n0\n"
    );
}

#[test]
fn each_policy_trains_on_its_own_agents_samples_only() {
    let run_dir = reference_run();
    assert_eq!(
        sql(&run_dir, "select distinct agent, policy from samples order by agent"),
        "agent,policy\nplanner,pilot\ntool,coder\n"
    );
    let trained = sql(
        &run_dir,
        "select u.policy, u.iteration, sum(u.sequences) as n from updates u where u.mode = 'ppo' \
         group by u.policy, u.iteration order by 1, 2",
    );
    let routed =
        sql(&run_dir, "select policy, iteration, count(*) as n from samples group by policy, iteration order by 1, 2");
    assert_eq!(trained, routed);
}

#[test]
fn both_modes_are_evaluated_for_every_version() {
    assert_eq!(
        sql(
            &reference_run(),
            "select iteration, mode, count(*) as n from evals group by iteration, mode order by 1, 2"
        ),
        "iteration,mode,n\n0,multi_agent,4\n0,single_agent,4\n1,multi_agent,4\n1,single_agent,4\n\
         2,multi_agent,4\n2,single_agent,4\n"
    );
}

#[test]
fn model_and_sandbox_time_are_parts_of_each_stages_wall_time() {
    assert!(reference().stdout.contains("s in stages: model "), "{}", reference().stdout);
    assert_eq!(
        sql(
            &reference_run(),
            "select count(*) as n from commits where iteration is not null and stage in ('rollout', 'update', 'evaluate') \
             and (model_seconds <= 0 or sandbox_seconds < 0 or model_seconds + sandbox_seconds > seconds)"
        ),
        "n\n0\n"
    );
}

#[test]
fn show_renders_the_tree_of_a_task() {
    shows_the_tree_of_a_task(&reference_run());
}

#[test]
fn the_documented_queries_run_on_a_real_run() {
    the_documented_queries_run(&reference_run());
}

#[test]
fn status_runs_and_verify_speak_json() {
    speak_json(&reference_run());
}

#[test]
fn export_writes_the_selected_turns_as_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    exports_the_selected_turns_as_transcripts(&reference_run(), dir.path());
}

#[test]
fn report_draws_the_run() {
    let dir = tempfile::tempdir().unwrap();
    reports_the_run(&reference_run(), &dir.path().join("report"));
}

#[test]
fn compare_tabulates_the_run() {
    let dir = tempfile::tempdir().unwrap();
    compares_the_run(&reference_run(), &dir.path().join("comparison"));
}

#[test]
fn running_a_finished_run_again_changes_nothing() {
    let reference = reference();
    let before = content(&reference.run);
    let again = pipeline(&reference.config);
    assert!(again.contains("resuming"), "{again}");
    assert_eq!(content(&reference.run), before);
}

/// A process running a stage keeps `_running/<stage>.json` fresh until the stage ends:
/// `status` marks that stage as running and opens with "running"; a file whose heartbeat
/// went stale (its process died) is no running stage.
#[test]
fn status_marks_the_stage_a_live_process_runs_as_running() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let config = run_file(run_dir.to_str().unwrap(), 5).write(&dir.path().join("it.yaml"));
    let mut child = petting()
        .args(["pipeline", "run", &config, "--until", "rollout:1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let running_dir = run_dir.join("_running");
    let mut seen = std::collections::BTreeSet::new();
    while child.try_wait().unwrap().is_none() {
        for entry in std::fs::read_dir(&running_dir).into_iter().flatten() {
            seen.insert(entry.unwrap().file_name().to_string_lossy().into_owned());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(child.wait().unwrap().success());
    assert!(seen.contains("rollout-0.json"), "{seen:?}");
    let left = std::fs::read_dir(&running_dir).map_or(0, Iterator::count);
    assert_eq!(left, 0, "each file goes with its stage");
    std::fs::create_dir_all(&running_dir).unwrap();

    let status_with = |heartbeat_age: i64| {
        let now = chrono::Utc::now();
        let file = serde_json::json!({"stage": "rollout", "iteration": 1, "shard": null, "host": "h", "pid": 1,
            "started_at": now, "heartbeat_at": now - chrono::Duration::seconds(heartbeat_age)});
        std::fs::write(running_dir.join("rollout-1.json"), file.to_string()).unwrap();
        let (ok, text, stderr) = run(&["status", run_dir.to_str().unwrap()]);
        let (_, json, _) = run(&["status", run_dir.to_str().unwrap(), "--format", "json"]);
        assert!(ok, "{stderr}");
        (text, serde_json::from_str::<serde_json::Value>(&json).unwrap()["headline"].clone())
    };
    let (text, headline) = status_with(1);
    assert_eq!(headline["state"], "running", "{headline}");
    assert_eq!(headline["running"], serde_json::json!(["rollout of iteration 1"]), "{headline}");
    assert!(text.lines().next().unwrap().contains("running · 1/2 iterations"), "{text}");
    assert!(text.contains("running: rollout of iteration 1"), "{text}");
    let rollout_1 = text.lines().find(|l| l.trim_start().starts_with('1') && l.contains("rollout")).unwrap();
    assert!(rollout_1.contains("running"), "{text}");

    let (text, headline) = status_with(600);
    assert_eq!(
        (headline["state"].as_str(), headline["next"].as_str()),
        (Some("incomplete"), Some("rollout of iteration 1"))
    );
    assert!(!text.contains("running"), "{text}");
}

/// Flips one byte in the middle of the first committed train tasks part: same size,
/// other content. Returns its file name.
fn damage_tasks(run_dir: &Path) -> String {
    let part = crate::support::files_under(&run_dir.join("tasks/split=train")).remove(0);
    let mut bytes = std::fs::read(&part).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&part, bytes).unwrap();
    part.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_damaged_file_is_refused_with_status_3_on_resume_and_on_a_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let config = run_file(run_dir.to_str().unwrap(), 5).write(&dir.path().join("it.yaml"));
    let (ok, _, stderr) = run(&["pipeline", "run", &config, "--until", "rollout:0"]);
    assert!(ok, "{stderr}");
    let name = damage_tasks(&run_dir);
    for (what, args) in
        [("resumed", vec!["pipeline", "run", &config]), ("sql", vec!["sql", run_dir.to_str().unwrap(), "select 1"])]
    {
        let output = petting().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{what}: {stderr}");
        assert!(stderr.contains(&name) && stderr.contains("corrupt"), "{what}: {stderr}");
    }

    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let config = run_file(run_dir.to_str().unwrap(), 5).set("iterations", "0").write(&dir.path().join("it.yaml"));
    pipeline(&config);
    let name = damage_tasks(&run_dir);
    let output = petting().args(["pipeline", "run", &config]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "a finished run checks its files: {stderr}");
    assert!(stderr.contains(&name) && stderr.contains("corrupt"), "{stderr}");
}

/// Every query of docs/sql.md (its ```sql blocks) and every `petting sql runs/plan-path
/// "…"` example of the README runs on a real run.
fn the_documented_queries_run(run_dir: &Path) {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut queries: Vec<String> = readme
        .split("petting sql runs/plan-path \"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 2, "{queries:?}");
    let cookbook = std::fs::read_to_string(repo_root().join("docs/sql.md")).unwrap();
    let blocks: Vec<String> =
        cookbook.split("```sql\n").skip(1).map(|rest| rest.split("```").next().unwrap().trim().to_string()).collect();
    assert!(blocks.len() >= 12, "a dozen queries: {}", blocks.len());
    queries.extend(blocks);
    for query in queries {
        let (ok, _, stderr) = run(&["sql", run_dir.to_str().unwrap(), &query]);
        assert!(ok, "{query}\n{stderr}");
    }
}

/// `--format json` of status, verify and runs: documents a program can read.
fn speak_json(run_dir: &Path) {
    let url = run_dir.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let (ok, stdout, stderr) = run(args);
        assert!(ok, "{args:?}: {stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
    };
    let status = json(&["status", url, "--format", "json"]);
    let headline = &status["headline"];
    assert!(headline["state"] == "complete" && headline["stages_done"] == headline["stages"], "{status}");
    assert!(headline["iterations_done"] == headline["iterations"] && headline["eta_seconds"].is_null(), "{status}");
    let stages = status["stages"].as_array().unwrap();
    assert!(stages.iter().all(|s| s["state"] == "committed" || s["state"] == "missing"), "{status}");
    assert!(stages.iter().any(|s| s["stage"] == "rollout" && s["iteration"] == 1 && s["rows"].as_u64() > Some(0)));
    let schema = json(&["schema", "turns", "--format", "json"]);
    assert!(schema[0]["columns"].as_array().unwrap().iter().any(|c| c["name"] == "response_logprobs"), "{schema}");
    let verified = json(&["verify", url, "--format", "json"]);
    assert!(verified["checked"].as_u64() > Some(10) && verified["pruned"] == 0, "{verified}");
    let parent = run_dir.parent().unwrap().to_str().unwrap();
    let runs = json(&["runs", parent, "--format", "json"]);
    let this = runs.as_array().unwrap().iter().find(|r| r["run"].as_str().unwrap().ends_with(url)).unwrap();
    assert_eq!(this["state"], "finished", "{runs}");
    assert_eq!(this["trained"], this["iterations"], "{runs}");
}

/// `petting show` renders both steps of a task: K candidates each, one selected, with advantages.
fn shows_the_tree_of_a_task(run_dir: &Path) {
    let task = sql(run_dir, "select min(task_id) as t from turns where iteration = 1");
    let task = task.lines().nth(1).unwrap();
    let (ok, stdout, stderr) = run(&["show", run_dir.to_str().unwrap(), "--iteration", "1", "--task", task]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.matches(" · 3 candidates").count(), 2, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("▶ b")).count(), 2, "{stdout}");
    assert_eq!(stdout.matches("  A ").count(), 6, "every candidate has its advantage: {stdout}");
    let (ok, _, stderr) = run(&["show", run_dir.to_str().unwrap(), "--iteration", "1", "--task", "nope"]);
    assert!(!ok && stderr.contains("has no task \"nope\"; its tasks include"), "{stderr}");
}

/// `petting export`: one transcript per selected turn, with the prompt before the chat template.
fn exports_the_selected_turns_as_transcripts(run_dir: &Path, out: &Path) {
    let run_dir = run_dir.to_str().unwrap();
    let (ok, stdout, stderr) = run(&["export", run_dir, "--iteration", "1"]);
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3 * 2, "3 tasks, a tool turn and a planner turn each");
    for line in &lines {
        let prompt = line["messages"][0]["content"].as_str().unwrap();
        assert!(prompt.starts_with("You are the ") && !prompt.contains("<|im_start|>"), "{prompt}");
        assert_eq!(line["messages"][1]["role"], "assistant");
        assert_eq!(line["iteration"], 1);
    }
    let file = out.join("it1.parquet");
    let file_arg = file.to_str().unwrap();
    let (ok, _, stderr) = run(&["export", run_dir, "--iteration", "1", "--format", "parquet", "--output", file_arg]);
    assert!(ok && stderr.contains("wrote 6 transcripts"), "{stderr}");
    assert!(std::fs::read(&file).unwrap().starts_with(b"PAR1"));
    let usage = petting().args(["export", run_dir, "--iteration", "1", "--format", "parquet"]).output().unwrap();
    assert_eq!(usage.status.code(), Some(2), "Parquet without --output is a usage error");
    let (ok, _, stderr) = run(&["export", run_dir, "--iteration", "7"]);
    assert!(!ok && stderr.contains("no committed rollout for iteration 7"), "{stderr}");
}

/// `petting report`: a page that names only local files that exist, and charts that are
/// real PNGs with something drawn on them.
fn reports_the_run(run_dir: &Path, out: &Path) {
    let (ok, stdout, stderr) = run(&["report", run_dir.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(14 charts, "), "{stdout}");
    let index = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        index.contains("with the widest reward spread") && index.contains("run.yaml</summary><pre># Frozen by petting"),
        "{index}"
    );
    let links = local_links(out, &index);
    let trees: Vec<_> = links.iter().filter(|l| l.extension().is_some_and(|e| e == "html")).collect();
    assert!(!trees.is_empty(), "the groups whose rewards spread link to their trees");
    for tree in trees {
        let page = std::fs::read_to_string(tree).unwrap();
        assert!(page.contains("<pre>episode 0 · turn 0 · "), "{page}");
        local_links(tree.parent().unwrap(), &page);
    }
    let charts: Vec<_> = links.iter().filter(|l| l.extension().is_some_and(|e| e == "png")).collect();
    assert_eq!(charts.len(), 14, "{links:?}");
    for chart in charts {
        let image = image::open(chart).unwrap_or_else(|e| panic!("{}: {e}", chart.display())).to_rgb8();
        assert_eq!(image.dimensions(), (960, 480));
        // Series are drawn in saturated colours, axes, grid and text in greys: a chart
        // without its lines has only the legend's few hundred coloured pixels.
        let coloured = image.pixels().filter(|p| p.0.iter().max().unwrap() - p.0.iter().min().unwrap() > 100).count();
        assert!(coloured > 1000, "{}: {coloured} coloured pixels", chart.display());
    }
}

fn compares_the_run(run_dir: &Path, out: &Path) {
    let (ok, stdout, stderr) = run(&["compare", run_dir.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    // Version 0 is the untrained team, version 2 (the last iteration) the trained one.
    let table: Vec<&str> = stdout.lines().collect();
    assert!(table[0].starts_with("method") && table[0].contains("plan_path"), "{stdout}");
    for row in ["MAS (per-role)", "MAS (per-role), first role alone", "MAS + AT-GRPO (per-role)"] {
        assert!(table.iter().any(|l| l.starts_with(&format!("{row}  "))), "no row {row}:\n{stdout}");
    }
    let csv = std::fs::read_to_string(out.join("compare.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    for chart in ["compare.png", "curves-plan_path.png", "rewards-plan_path.png"] {
        let image = image::open(out.join(chart)).unwrap().to_rgb8();
        assert_eq!(image.dimensions(), (960, 480), "{chart}");
    }
}

/// Every `src` and `href` of `page`: relative, and naming a file that exists.
fn local_links(dir: &Path, page: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for rest in page.split(" src=\"").skip(1).chain(page.split(" href=\"").skip(1)) {
        let target = rest.split('"').next().unwrap();
        assert!(!target.contains(':') && !target.starts_with('/'), "not a local relative link: {target}");
        let file = dir.join(target);
        assert!(file.is_file(), "{target} does not exist");
        files.push(file);
    }
    files
}

#[test]
fn runs_killed_at_random_moments_resume_to_the_same_tables() {
    let dir = tempfile::tempdir().unwrap();
    let a = reference_run();
    let d = dir.path().join("d");
    let config_d = write_config(dir.path(), "d", &d, 5);
    let kills = kill_at_random_moments(&config_d, 12);
    pipeline(&config_d);
    assert!(kills >= 2, "the run should have been interrupted several times ({kills})");
    assert_eq!(content(&a), content(&d), "same seed, same tables, however often it was killed");
    // The same weights and the same optimiser state in every version, too.
    let checkpoints =
        "select policy, version, weights_sha256, optimizer_sha256 from checkpoints order by policy, version";
    assert_eq!(sql(&a, checkpoints), sql(&d, checkpoints));
    assert_eq!(sql(&a, "select count(optimizer_sha256) as n from checkpoints"), "n\n4\n", "v1 and v2 of two policies");
    let (ok, stdout, _) = run(&["verify", d.to_str().unwrap()]);
    assert!(ok, "{stdout}");
}

/// Starts `pipeline run config` and kills it (SIGKILL) at pseudo-random moments, up to
/// `most` times or until a run finishes first; returns how often it was killed.
pub(crate) fn kill_at_random_moments(config: &str, most: u32) -> u32 {
    let mut delay_ms = 150u64;
    let mut kills = 0;
    while kills < most {
        let mut child = crate::support::petting()
            .args(["pipeline", "run", config])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        delay_ms = 150 + (delay_ms * 7919 + 104_729) % 2500;
    }
    kills
}

#[test]
fn sharding_a_rollout_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, c) = (reference_run(), dir.path().join("c"));
    // The second run stops before iteration 0's rollout, which runs by hand in two shards.
    let config_c = write_config(dir.path(), "c", &c, 5);
    let (ok, _, stderr) = run(&["pipeline", "run", &config_c, "--until", "rollout:0"]);
    assert!(ok, "{stderr}");
    let shard = |which: &str| run(&["stage", "rollout", c.to_str().unwrap(), "--iteration", "0", "--shard", which]);
    let (ok, stdout, stderr) = shard("0/2");
    assert!(ok, "{stdout}{stderr}");
    let (ok, status, stderr) = run(&["status", c.to_str().unwrap()]);
    let headline = status.lines().next().unwrap_or_default();
    assert!(ok && headline.contains(": incomplete · 0/"), "{status}{stderr}");
    assert!(headline.contains("next: rollout of iteration 0") && status.contains("1/2 shards"), "{status}");
    // Half a sharded rollout is not committed, and running it whole would commit rows twice.
    let (ok, _, stderr) = run(&["pipeline", "run", &config_c]);
    assert!(!ok && stderr.contains("another shard count"), "{stderr}");
    let (ok, stdout, stderr) = shard("1/2");
    assert!(ok, "{stdout}{stderr}");
    pipeline(&config_c);
    // A shard batches fewer prompts per forward, and CPU kernels are not batch-invariant:
    // logprobs may differ in the last bits; tokens, rewards, trees and samples may not.
    assert_eq!(content_with(&a, "", "true"), content_with(&c, "", "true"));
    let (logprobs_a, logprobs_c) = (logprobs(&a), logprobs(&c));
    assert_eq!(logprobs_a.len(), logprobs_c.len());
    for (x, y) in logprobs_a.iter().zip(&logprobs_c) {
        assert!((x - y).abs() < 1e-4, "logprob {x} vs {y}");
    }
}

fn logprobs(run_dir: &Path) -> Vec<f64> {
    let json = sql_as(run_dir, &format!("select {LOGPROBS} from turns order by iteration, candidate_id"), "json");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    rows.iter().flat_map(|r| r[LOGPROBS].as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect()
}

#[test]
fn a_fork_of_iteration_1_replays_it_and_resumes_without_from() {
    let dir = tempfile::tempdir().unwrap();
    let (a, f) = (reference_run(), dir.path().join("f"));
    let config_f = write_config(dir.path(), "f", &f, 5);
    let source = |k: u32| format!("{}@{k}", a.display());

    let (ok, _, stderr) = run(&["pipeline", "run", &config_f, "--from", &source(7)]);
    assert!(!ok && stderr.contains("no committed checkpoint of policy"), "{stderr}");
    let (ok, stdout, stderr) = run(&["pipeline", "run", &config_f, "--from", &source(1)]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("iteration 1: reward") && !stdout.contains("iteration 0"), "{stdout}");

    // Same seed, same v1 weights: iteration 1 is sampled and scored exactly as in the source.
    let iteration_1 = |run_dir: &Path| content_with(run_dir, &format!("{LOGPROBS},"), "iteration = 1");
    assert_eq!(iteration_1(&a), iteration_1(&f));
    assert_eq!(sql(&f, "select count(*) as n from turns where iteration <> 1"), "n\n0\n");
    assert_eq!(sql(&f, "select distinct iteration from evals order by 1"), "iteration\n1\n2\n");
    let (ok, run_yaml, _) = run(&["status", f.to_str().unwrap()]);
    assert!(ok, "{run_yaml}");

    // Resuming needs no --from: the origin is in run.yaml.
    let again = pipeline(&config_f);
    assert!(again.contains("resuming"), "{again}");
    let (ok, _, stderr) = run(&["pipeline", "run", &config_f, "--from", &source(0)]);
    assert!(!ok && stderr.contains("different config"), "{stderr}");
}

#[test]
fn a_replay_fork_regroups_the_same_turns_with_another_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let (a, r, m) = (reference_run(), dir.path().join("r"), dir.path().join("m"));
    let with_grpo = |name: &str, run_dir: &Path, seed: u64| {
        run_file(&run_dir.display().to_string(), seed)
            .set("algorithm.name", "grpo")
            .write(&dir.path().join(format!("{name}.yaml")))
    };
    let replay = format!("{}@1:group", a.display());

    let (ok, _, stderr) = run(&["pipeline", "run", &with_grpo("m", &m, 6), "--from", &replay]);
    assert!(!ok && stderr.contains("cannot replay iteration 1") && stderr.contains("seed differ"), "{stderr}");
    let (ok, _, stderr) =
        run(&["pipeline", "run", &with_grpo("m", &m, 6), "--from", &format!("{}@1:update", a.display())]);
    assert!(!ok && stderr.contains("restarts at rollout"), "{stderr}");

    let (ok, stdout, stderr) = run(&["pipeline", "run", &with_grpo("r", &r, 5), "--from", &replay]);
    assert!(ok, "{stdout}{stderr}");
    let turns = |run_dir: &Path| {
        sql_as(run_dir, "select * except (run) from turns where iteration = 1 order by candidate_id", "json")
    };
    assert_eq!(turns(&a), turns(&r), "the replayed turns are the source's, logprobs and timings included");
    let reused = sql(&r, "select stage, model_seconds, reused_from from commits where reused_from is not null");
    let source_marker = format!("{}/_commits/iteration=1/rollout.json", url_of(&a));
    assert!(
        reused.starts_with("stage,model_seconds,reused_from\nrollout,0.0,") && reused.contains(&source_marker),
        "{reused}"
    );
    // GRPO groups whole tasks; AT-GRPO groups (task, agent, turn).
    let agents = "select count(*) as n from groups where iteration = 1 and agent is not null";
    assert_eq!(sql(&r, agents), "n\n0\n");
    assert_ne!(sql(&a, agents), "n\n0\n");
    let updates = "select count(*) as n from updates where iteration = 1";
    assert_eq!(sql(&r, updates), sql(&a, updates), "the update trains on the replayed turns");
}

fn url_of(run_dir: &Path) -> String {
    format!("file://{}", run_dir.display())
}

#[test]
fn a_fork_into_lora_policies_puts_fresh_adapters_on_the_forked_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (a, l) = (reference_run(), dir.path().join("l"));
    let config = run_file(&l.display().to_string(), 5)
        .set("policies.coder.lora", "{rank: 4}")
        .set("policies.pilot.lora", "{rank: 4}")
        .write(&dir.path().join("l.yaml"));
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(text.matches("lora").count(), 2, "{text}");

    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--from", &format!("{}@1", a.display())]);
    assert!(ok, "{stdout}{stderr}");
    // A fresh adapter is zero: iteration 1 samples exactly what the source sampled.
    let turns = "select candidate_id, response_tokens, response_logprobs, local_reward from turns \
                 where iteration = 1 order by 1";
    assert_eq!(sql_as(&a, turns, "json"), sql_as(&l, turns, "json"));
    // Every checkpoint of the fork is an adapter over its own copy of the forked weights.
    let paths = sql(&l, "select path from checkpoints order by policy, version");
    let dirs: Vec<&str> = paths.lines().skip(1).collect();
    assert_eq!(dirs.len(), 4, "v1 and v2 of two policies: {paths}");
    for checkpoint in dirs {
        assert!(l.join(checkpoint).join("adapter_config.json").is_file(), "{checkpoint} is not an adapter");
    }
}

#[test]
fn a_fork_whose_agents_act_alone_trains_them_apart_and_evaluates_them_together() {
    let dir = tempfile::tempdir().unwrap();
    let (a, s) = (reference_run(), dir.path().join("s"));
    let config = run_file(&s.display().to_string(), 5)
        .set("workflow.alone", "true")
        .set("evaluation.modes", "[multi_agent, alone, tool_alone]")
        .write(&dir.path().join("s.yaml"));

    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--from", &format!("{}@1", a.display())]);
    assert!(ok, "{stdout}{stderr}");
    let reports = "select count(*) as n from turns where agent = 'planner' \
                   and (prompt_message like '%tool agent wrote no program%' or prompt_message like '%Its output:%')";
    assert_ne!(sql(&a, reports), "n\n0\n", "the team's planner reads the tool agent's report");
    assert_eq!(sql(&s, reports), "n\n0\n", "alone, it never does");
    let modes = "select iteration, mode, count(*) as n from evals group by 1, 2 order by 1, 2";
    let evaluated = "iteration,mode,n\n1,alone,4\n1,multi_agent,4\n1,tool_alone,4\n\
                     2,alone,4\n2,multi_agent,4\n2,tool_alone,4\n";
    assert_eq!(sql(&s, modes), evaluated);
}

/// `trainable: false`: a fork freezes the tool agent's policy at the source's v1, which
/// becomes its only version; its turns are sampled and stored, flagged, and never grouped
/// or trained, while the planner trains on.
#[test]
fn a_frozen_agent_is_sampled_and_stored_but_never_grouped_or_trained() {
    let dir = tempfile::tempdir().unwrap();
    let (a, z) = (reference_run(), dir.path().join("z"));
    let model = crate::support::fixture("hf-tiny-qwen3");
    let config = run_file(&z.display().to_string(), 5)
        .set("policies.coder", &format!("{{model: {}, trainable: false}}", model.display()))
        .set("iterations", "3")
        .write(&dir.path().join("z.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--from", &format!("{}@1", a.display())]);
    assert!(ok, "{stdout}{stderr}");

    // The frozen tool agent samples with the source's v1 weights, as its v0, in every iteration.
    let tool = "select candidate_id, response_tokens, response_logprobs from turns \
                where iteration = 1 and agent = 'tool' order by 1";
    assert_eq!(sql_as(&a, tool, "json"), sql_as(&z, tool, "json"));
    let versions = "select iteration, policy, policy_version, trainable, count(*) > 0 as sampled from turns \
                    group by 1, 2, 3, 4 order by 1, 2";
    let expected = "iteration,policy,policy_version,trainable,sampled\n1,coder,0,false,true\n1,pilot,1,true,true\n\
                    2,coder,0,false,true\n2,pilot,2,true,true\n";
    assert_eq!(sql(&z, versions), expected);
    // Only the planner's turns are grouped, given advantages and trained.
    assert_eq!(sql(&z, "select distinct agent from groups order by 1"), "agent\nplanner\n");
    assert_eq!(sql(&z, "select distinct policy from samples order by 1"), "policy\npilot\n");
    assert_eq!(sql(&z, "select distinct policy from updates order by 1"), "policy\npilot\n");
    let checkpoints = sql(&z, "select policy, version from checkpoints order by 1, 2");
    assert_eq!(checkpoints, "policy,version\ncoder,0\npilot,1\npilot,2\npilot,3\n");
    let digest = |run: &Path, version: u32| {
        sql(run, &format!("select weights_sha256 from checkpoints where policy = 'coder' and version = {version}"))
    };
    assert_eq!(digest(&a, 1), digest(&z, 0), "frozen at the source's v1");
}

#[test]
fn a_retention_prunes_older_checkpoints_on_the_record_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (a, f) = (dir.path().join("a"), dir.path().join("f"));
    let config = write_config(dir.path(), "a", &a, 5);
    let text = std::fs::read_to_string(&config).unwrap() + "retention: {keep_last: 1, weights: true}\n";
    std::fs::write(&config, text).unwrap();
    let stdout = pipeline(&config);
    assert!(stdout.contains("retention: pruned 14 checkpoint files"), "{stdout}");

    // Version 0 and the newest stay whole; version 1 keeps only meta.json.
    let files = |version: &str| {
        let mut names: Vec<String> = std::fs::read_dir(a.join("checkpoints/coder"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(version))
            .flat_map(|p| std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names.join(" ")
    };
    assert_eq!(files("v000001"), "meta.json");
    assert!(files("v000002").contains("optimizer.safetensors") && files("v000000").contains("model.safetensors"));
    let (ok, stdout, stderr) = run(&["verify", a.to_str().unwrap()]);
    assert!(ok && stdout.contains("14 committed files were pruned on purpose"), "{stdout}{stderr}");

    // A fork from a pruned version says so (with an empty cache: another test may have
    // cached the same verified bytes); the run itself trains on from the newest.
    let fork = ["pipeline", "run", &write_config(dir.path(), "f", &f, 5), "--from", &format!("{}@1", a.display())];
    let (ok, _, stderr) = output_of(petting().env("XDG_CACHE_HOME", dir.path()).args(fork).output().unwrap());
    assert!(!ok && stderr.contains("was pruned"), "{stderr}");
    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--set", "iterations=3", "--allow-config-change"]);
    assert!(ok && stdout.contains("iteration 2: reward"), "{stdout}{stderr}");
    assert_eq!(files("v000002"), "meta.json");
}

/// `tracking.mlflow`: a real MLflow tracking server (`mlflow server`, from PyPI, in
/// scripts/install/mlflow.sh's venv) holds one run per petting run, also across a resume,
/// with the config as parameters and every committed stage's metrics by the names the
/// TensorBoard files carry, read back by MLflow's own client.
#[test]
fn mlflow_receives_each_stages_metrics_and_the_config_in_one_run_across_a_resume() {
    let Some(python) = std::env::var_os("PETTING_MLFLOW_PYTHON") else {
        eprintln!("PETTING_MLFLOW_PYTHON is not set (scripts/test.sh sets it): MLflow check skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = MlflowServer::start(&python, dir.path());
    let run_dir = dir.path().join("run");
    let config = run_file(run_dir.to_str().unwrap(), 5)
        .set("tracking.mlflow.tracking_uri", &server.uri)
        .write(&dir.path().join("it.yaml"));
    for until in [&["--until", "rollout:1"][..], &[]] {
        let (ok, stdout, stderr) = run(&[&["pipeline", "run", &config][..], until].concat());
        assert!(ok && !stderr.contains("warning: tracking"), "{stdout}{stderr}");
    }
    let script = r#"
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
runs = client.search_runs([client.get_experiment_by_name("run").experiment_id])
run = runs[0]
history = {key: [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics}
print(json.dumps({"runs": len(runs), "name": run.info.run_name, "status": run.info.status,
                  "params": run.data.params, "tags": run.data.tags, "history": history}))
"#;
    let output = std::process::Command::new(&python).args(["-c", script, &server.uri]).output().unwrap();
    assert!(output.status.success(), "mlflow: {}", String::from_utf8_lossy(&output.stderr));
    let logged: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!((logged["runs"].as_u64(), logged["name"].as_str()), (Some(1), Some("run")), "{logged}");
    assert_eq!(logged["status"], "FINISHED", "{logged}");
    assert_eq!(logged["tags"]["petting.store"], url_of(&run_dir), "{logged}");
    assert_eq!(logged["params"]["rollout.branches"], "3", "{logged}");
    assert_eq!(logged["params"]["agents.planner.policy"], "pilot", "{logged}");
    let steps =
        |key: &str| logged["history"][key].as_array().map(|p| p.iter().map(|p| p[0].clone()).collect::<Vec<_>>());
    assert_eq!(steps("evaluate/success/multi_agent"), Some(vec![0.into(), 1.into(), 2.into()]), "{logged}");
    for key in ["rollout/reward/planner", "ppo/coder/loss", "time/update_seconds"] {
        assert_eq!(steps(key), Some(vec![0.into(), 1.into()]), "{key}: {logged}");
    }
    let reward = sql_rows(
        &run_dir,
        "SELECT avg(team_reward + local_reward) FROM turns WHERE iteration = 1 AND agent = 'planner'",
    );
    let value = logged["history"]["rollout/reward/planner"][1][1].as_f64().unwrap();
    assert!((value - reward[0].parse::<f64>().unwrap()).abs() < 1e-5, "{value} vs {reward:?}");
}

/// `tracking.wandb`: the offline run petting writes under the store, read back by W&B's
/// own client (PyPI's wandb, its datastore reader and record protobufs): the run with its
/// project and config, one history row per iteration with the metric names the other
/// trackers use, across a resume, and the exit once the run is done.
#[test]
fn wandb_reads_the_offline_run_with_each_iterations_metrics_and_the_config_across_a_resume() {
    let Some(python) = std::env::var_os("PETTING_WANDB_PYTHON") else {
        eprintln!("PETTING_WANDB_PYTHON is not set (scripts/test.sh sets it): W&B check skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let config = run_file(run_dir.to_str().unwrap(), 5)
        .set("tracking.wandb.project", "petting-test")
        .write(&dir.path().join("it.yaml"));
    for until in [&["--until", "rollout:1"][..], &[]] {
        let (ok, stdout, stderr) = run(&[&["pipeline", "run", &config][..], until].concat());
        assert!(ok && !stderr.contains("warning: tracking"), "{stdout}{stderr}");
    }
    let files: Vec<PathBuf> = crate::support::files_under(&run_dir.join("_wandb"))
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "wandb"))
        .collect();
    assert_eq!(files.len(), 1, "one offline run across the resume: {files:?}");
    // wandb 0.31 writes and syncs offline runs in Go (wandb-core) and ships no Python
    // reader, so the script reads the datastore framing itself and parses each record with
    // W&B's own protobufs; it first reads an offline run W&B's own writer made, which
    // checks that reader and shows which records W&B writes.
    let script = r#"
import json, os, struct, sys, tempfile, zlib
import wandb
from wandb.proto import wandb_internal_pb2

def records(path):
    data = open(path, "rb").read()
    assert data[:7] == struct.pack("<4sHB", b":W&B", 0xBEE1, 0), data[:7]
    at, whole, out = 7, b"", []
    while at < len(data):
        if 32768 - at % 32768 < 7:
            at += 32768 - at % 32768
            continue
        checksum, length, kind = struct.unpack("<IHB", data[at:at + 7])
        piece = data[at + 7:at + 7 + length]
        assert checksum == zlib.crc32(bytes([kind]) + piece), "checksum"
        assert at // 32768 == (at + 7 + max(length, 1) - 1) // 32768, "a piece crosses a block"
        at += 7 + length
        whole = piece if kind in (1, 2) else whole + piece
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(whole)
            out.append(record)
    return out

def summary(path):
    rs = records(path)
    run = next(r.run for r in rs if r.HasField("run"))
    return {
        "kinds": [r.WhichOneof("record_type") for r in rs],
        "nums": [r.num for r in rs],
        "run": {"id": run.run_id, "project": run.project, "name": run.display_name},
        "config": {i.key: json.loads(i.value_json) for i in run.config.update},
        "history": [{(i.key or ".".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                    for r in rs if r.HasField("history")],
    }

with tempfile.TemporaryDirectory() as scratch:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=scratch)
    run = wandb.init(project="w", config={"a": 1}, settings=wandb.Settings(x_disable_stats=True, console="off"))
    run.log({"m": 0.5}, step=0)
    run.finish()
    (own,) = [os.path.join(d, f) for d, _, fs in os.walk(scratch) for f in fs if f.endswith(".wandb")]
    print(json.dumps({"wandb": summary(own), "petting": summary(sys.argv[1])}))
"#;
    let output = std::process::Command::new(&python).args(["-c", script]).arg(&files[0]).output().unwrap();
    assert!(output.status.success(), "wandb: {}", String::from_utf8_lossy(&output.stderr));
    let both: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let own = &both["wandb"];
    assert_eq!(own["history"][0]["m"], 0.5, "the reader reads W&B's own file: {own}");
    assert_eq!(own["config"]["a"], 1, "{own}");
    let read = &both["petting"];
    // Only kinds of record W&B's own writer writes, opened and closed as it does.
    let kinds_of = |v: &serde_json::Value| -> Vec<String> {
        v["kinds"].as_array().unwrap().iter().map(|k| k.as_str().unwrap_or("").to_string()).collect()
    };
    let (own_kinds, kinds) = (kinds_of(own), kinds_of(read));
    assert!(kinds.iter().all(|k| own_kinds.contains(k)), "{kinds:?} against W&B's {own_kinds:?}");
    assert_eq!(own_kinds[..2], kinds[..2], "{kinds:?} against W&B's {own_kinds:?}");
    assert_eq!((kinds.first().map(String::as_str), kinds.last().map(String::as_str)), (Some("header"), Some("exit")));
    assert_eq!(kinds[1], "run");
    let history = read["history"].as_array().unwrap();
    let steps: Vec<&serde_json::Value> = history.iter().map(|row| &row["_step"]).collect();
    assert_eq!(steps, [0, 1, 2], "{read}");
    let reward = sql_rows(
        &run_dir,
        "SELECT avg(team_reward + local_reward) FROM turns WHERE iteration = 1 AND agent = 'planner'",
    );
    let logged = history[1]["rollout/reward/planner"].as_f64().unwrap();
    assert!((logged - reward[0].parse::<f64>().unwrap()).abs() < 1e-9, "{logged} vs {reward:?}");
    assert!(history[2]["evaluate/success/multi_agent"].is_number(), "{read}");
}

/// `mlflow server` on a free loopback port with a SQLite store in `dir`, stopped on drop.
struct MlflowServer {
    uri: String,
    process: std::process::Child,
}

impl MlflowServer {
    fn start(python: &std::ffi::OsStr, dir: &Path) -> MlflowServer {
        let port = crate::support::free_port().to_string();
        let log = std::fs::File::create(dir.join("mlflow.log")).unwrap();
        let process = std::process::Command::new(python)
            .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--port", &port, "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("PETTING_PYTHON runs mlflow");
        let server = MlflowServer { uri: format!("http://127.0.0.1:{port}"), process };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while !crate::support::healthy(&server.uri) {
            let log = std::fs::read_to_string(dir.join("mlflow.log")).unwrap_or_default();
            assert!(std::time::Instant::now() < deadline, "mlflow server did not start:\n{log}");
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        server
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// `tracking.tensorboard`: every committed stage's metrics in event files under the store
/// that TensorBoard's own reader (its EventAccumulator, from PyPI) reads, by the names
/// docs/concepts.md gives ("Trackers").
#[test]
fn tensorboard_reads_each_stages_metrics_from_the_store() {
    let Some(python) = std::env::var_os("PETTING_PYTHON") else {
        eprintln!("PETTING_PYTHON is not set (scripts/test.sh sets it): TensorBoard check skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let config =
        run_file(run_dir.to_str().unwrap(), 5).set("tracking.tensorboard", "true").write(&dir.path().join("it.yaml"));
    pipeline(&config);
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
events.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}))
"#;
    let output = std::process::Command::new(python)
        .args(["-c", script, run_dir.join("_tensorboard").to_str().unwrap()])
        .output()
        .expect("PETTING_PYTHON runs");
    assert!(output.status.success(), "tensorboard: {}", String::from_utf8_lossy(&output.stderr));
    let scalars: std::collections::BTreeMap<String, Vec<(i64, f64)>> = serde_json::from_slice(&output.stdout).unwrap();
    let steps = |tag: &str| scalars.get(tag).map(|points| points.iter().map(|p| p.0).collect::<Vec<_>>());
    assert_eq!(steps("evaluate/success/multi_agent"), Some(vec![0, 1, 2]), "{scalars:?}");
    for tag in [
        "rollout/reward/planner",
        "rollout/reward/tool",
        "ppo/coder/loss",
        "ppo/pilot/grad_norm",
        "time/update_seconds",
    ] {
        assert_eq!(steps(tag), Some(vec![0, 1]), "{tag}: {scalars:?}");
    }
    // The values are the tables': iteration 1's mean planner reward, as SQL computes it.
    let reward = sql_rows(
        &run_dir,
        "SELECT avg(team_reward + local_reward) FROM turns WHERE iteration = 1 AND agent = 'planner'",
    );
    let logged = scalars["rollout/reward/planner"][1].1;
    assert!((logged - reward[0].parse::<f64>().unwrap()).abs() < 1e-5, "{logged} vs {reward:?}");
    // gc never takes the event files for an attempt's debris.
    let (ok, stdout, stderr) = run(&["gc", run_dir.to_str().unwrap(), "--grace", "0s"]);
    assert!(ok && stdout.contains("deleted 0 uncommitted files"), "{stdout}{stderr}");
}

/// pipelines/tic-tac-toe-smollm2-league.yaml, shrunk, on the tiny fixture: O plays past
/// versions of the shared adapter, each stored with its game's turns and never trained;
/// evaluation plays X against chosen past versions; a run stopped and resumed draws the
/// same opponents as one that ran through.
#[test]
fn a_league_role_plays_stored_past_versions_and_a_resumed_run_draws_the_same_ones() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::support::fixture("hf-tiny-qwen3");
    let league = |store: &Path, until: Option<&str>| {
        let config = repo_root().join("pipelines/tic-tac-toe-smollm2-league.yaml");
        let mut args = vec!["pipeline".to_string(), "run".into(), config.display().to_string()];
        for setting in [
            format!("store={}", store.display()),
            format!("policies.shared.model={}", model.display()),
            "seed=7".into(),
            "iterations=3".into(),
            "data.train_tasks=8".into(),
            "data.test_tasks=2".into(),
            "workflow.max_turns=2".into(),
            "rollout.tasks_per_iteration=4".into(),
            "rollout.branches=2".into(),
            "rollout.sampling.max_new_tokens=6".into(),
            "algorithm.filter.drop_degenerate=false".into(),
            "evaluation.every=1".into(),
            "evaluation.tasks=2".into(),
            "evaluation.against=[0, 2]".into(),
            "evaluation.sampling.max_new_tokens=6".into(),
        ] {
            args.extend(["--set".into(), setting]);
        }
        args.extend(until.map(|stage| format!("--until={stage}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = run(&args);
        assert!(ok, "{stdout}{stderr}");
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    league(&a, None);

    // X trains on the current version; O's turns are past versions, within the last 4.
    let players = "select iteration, agent, trainable, min(policy_version) as lo, max(policy_version) as hi \
                   from turns group by 1, 2, 3 order by 1, 2";
    let rows = sql_rows(&a, players);
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in &rows {
        let cells: Vec<&str> = row.split(',').collect();
        let (k, lo, hi): (u32, u32, u32) =
            (cells[0].parse().unwrap(), cells[3].parse().unwrap(), cells[4].parse().unwrap());
        match cells[1] {
            "player_x" => assert_eq!((cells[2], lo, hi), ("true", k, k), "{row}"),
            _ => assert!(cells[2] == "false" && hi <= k.saturating_sub(1) && lo + 4 >= k, "{row}"),
        }
    }
    assert_eq!(sql(&a, "select distinct agent from groups"), "agent\nplayer_x\n");
    assert_eq!(sql(&a, "select distinct agent from samples"), "agent\nplayer_x\n");
    assert_eq!(sql(&a, "select count(*) as n from turns where agent = 'player_o' and staleness is not null"), "n\n0\n");

    // X against minimax, and against each listed version once it is stored.
    let evaluated =
        "select iteration, mode, opponent_version, count(*) as n from evals group by 1, 2, 3 order by 1, 2, 3";
    let expected = "iteration,mode,opponent_version,n\n0,league,0,2\n0,multi_agent,,2\n1,league,0,2\n1,multi_agent,,2\n\
                    2,league,0,2\n2,league,2,2\n2,multi_agent,,2\n3,league,0,2\n3,league,2,2\n3,multi_agent,,2\n";
    assert_eq!(sql(&a, evaluated), expected);
    let played = "select distinct policies from evals where iteration = 3 and mode = 'league' order by 1";
    assert_eq!(
        sql_rows(&a, played),
        [r#""player_o=shared@v0,player_x=shared@v3""#, r#""player_o=shared@v2,player_x=shared@v3""#]
    );
    // docs/sql.md's win matrix: one cell per evaluated version and past version stored by then.
    let cookbook = std::fs::read_to_string(repo_root().join("docs/sql.md")).unwrap();
    let matrix = cookbook.split("**Win matrix").nth(1).unwrap().split("```sql\n").nth(1).unwrap();
    let cells: Vec<String> = sql_rows(&a, matrix.split("```").next().unwrap())
        .iter()
        .map(|row| row.split(',').take(3).collect::<Vec<_>>().join(","))
        .collect();
    assert_eq!(cells, ["0,0,2", "1,0,2", "2,0,2", "2,2,2", "3,0,2", "3,2,2"]);
    let report = dir.path().join("report");
    let (ok, _, stderr) = run(&["report", a.to_str().unwrap(), "--output", report.to_str().unwrap()]);
    assert!(ok && report.join("charts/league.png").is_file(), "the report charts the win matrix: {stderr}");

    // Stopped after the first update and resumed: the same opponents in every game.
    league(&b, Some("update:1"));
    league(&b, None);
    let opponents = "select iteration, task_id, episode, node_id, policy_version from turns \
                     where agent = 'player_o' order by 1, 2, 3, 4";
    assert_eq!(sql(&a, opponents), sql(&b, opponents));
    let rows =
        sql(&a, "select count(distinct policy_version) as n from turns where agent = 'player_o' and iteration = 2");
    assert!(rows == "n\n1\n" || rows == "n\n2\n", "{rows}");
}
