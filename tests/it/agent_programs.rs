//! Agent programs end to end: petting runs a user's program per episode (a real Python
//! process), the program calls petting's OpenAI-compatible endpoint with a role as its
//! `model`, each call is sampled by that role's policy and becomes a `turns` row, and the
//! program's verdict is the episode's reward.

use std::path::{Path, PathBuf};

use crate::pipeline::sql_rows;
use crate::support::{RunFile, fixture, full_suite, repo_root, run};

fn examples() -> PathBuf {
    repo_root().join("examples/agent_programs")
}

/// One iteration of `program` (a file of examples/agent_programs) as a solver and a
/// checker, each with its own policy on `model`: 2 arithmetic tasks × 2 episodes.
fn team_run(dir: &Path, program: &str, model: &Path) -> RunFile {
    let data = examples().join("arithmetic.jsonl");
    RunFile::new(&format!(
        "store: {store}
seed: 5
iterations: 1
env: {{name: agent_program, command: [python, {program}], workdir: {examples}}}
data: {{train_tasks: 4, test_tasks: 2, train_file: {{path: {data}}}, test_file: {{path: {data}}}}}
agents: {{solver: {{policy: solver}}, checker: {{policy: checker}}}}
policies:
  solver: {{model: {model}, optimizer: {{lr: 1.0e-3}}}}
  checker: {{model: {model}, optimizer: {{lr: 1.0e-3}}}}
rollout: {{mode: independent, episodes_per_task: 2, tasks_per_iteration: 2, sampling: {{temperature: 1.0, max_new_tokens: 8}}}}
algorithm: {{name: at_grpo, filter: {{drop_degenerate: false}}}}
evaluation: {{tasks: 2, modes: [multi_agent], at_start: false, sampling: {{max_new_tokens: 8}}}}
",
        store = dir.join("run").display(),
        examples = examples().display(),
        data = data.display(),
        model = model.display(),
    ))
}

fn run_ok(file: &RunFile, dir: &Path, until: Option<&str>) {
    let path = file.write(&dir.join("run.yaml"));
    let mut args = vec!["pipeline", "run", &path];
    args.extend(until.iter().flat_map(|stage| ["--until", stage]));
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "{stdout}\n{stderr}");
}

/// The solver's second call resends its first call and the reply: its prompt ids must
/// begin with that call's prompt ids and sampled ids. Returns (rows, rows that do).
fn continued_prompts(store: &Path) -> (usize, usize) {
    let rows = sql_rows(
        store,
        "SELECT array_slice(b.prompt_tokens, 1, CAST(array_length(a.prompt_tokens) + array_length(a.response_tokens) AS BIGINT)) \
                = array_concat(a.prompt_tokens, a.response_tokens) \
         FROM turns a JOIN turns b ON a.task_id = b.task_id AND a.episode = b.episode AND a.iteration = b.iteration \
         WHERE a.agent = 'solver' AND b.agent = 'solver' AND a.turn = 0 AND b.turn = 1",
    );
    (rows.len(), rows.iter().filter(|r| *r == "true").count())
}

/// Every call a row of its role: per episode the solver's two calls, then the checker's
/// one, with a logprob per sampled token, rewarded by the verdict.
fn assert_each_call_is_a_row_of_its_role(store: &Path) {
    let calls = sql_rows(
        store,
        "SELECT task_id, episode, string_agg(agent || ':' || turn, ' ' ORDER BY node_id) FROM turns \
         WHERE iteration = 0 GROUP BY 1, 2 ORDER BY 1, 2",
    );
    assert_eq!(calls.len(), 4, "2 tasks × 2 episodes: {calls:?}");
    assert!(calls.iter().all(|c| c.ends_with(",solver:0 solver:1 checker:0")), "{calls:?}");
    let exact = sql_rows(
        store,
        "SELECT count(*) FROM turns WHERE array_length(response_logprobs) = array_length(response_tokens) \
         AND array_length(response_tokens) > 0 AND failure IS NULL",
    );
    assert_eq!(exact, ["12"]);
    // The checker's local reward is the team's; the policies each trained their role.
    let checkers =
        sql_rows(store, "SELECT count(*) FROM turns WHERE agent = 'checker' AND local_reward != team_reward");
    assert_eq!(checkers, ["0"]);
    let trained = sql_rows(store, "SELECT policy, weights_change > 0 FROM updates ORDER BY 1");
    assert_eq!(trained, ["checker,true", "solver,true"]);
}

#[test]
fn an_agent_program_trains_through_the_endpoint_each_call_a_row_of_its_role() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&team_run(dir.path(), "plain_http.py", &fixture("hf-tiny-qwen3")), dir.path(), None);
    let store = dir.path().join("run");
    assert_each_call_is_a_row_of_its_role(&store);
    let (rows, continued) = continued_prompts(&store);
    assert_eq!(rows, 4);
    // The toy model's replies may be cut by Qwen3's template (it strips leading newlines
    // of earlier replies), which is not a continuation: most are.
    assert!(continued >= 2, "{continued} of {rows}");
    let tasks = sql_rows(&store, "SELECT instance FROM tasks WHERE task_id LIKE '%/train/%' LIMIT 1");
    assert!(tasks[0].contains("answer") && tasks[0].contains("What is"), "the whole row is the task: {tasks:?}");
    assert!(!sql_rows(&store, "SELECT mode FROM evals WHERE mode = 'multi_agent'").is_empty());
}

/// A program that misbehaves as its task says.
const MISBEHAVING: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
task = json.loads(os.environ["PETTING_TASK"])
def chat(role, text):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": role, "messages": [{"role": "user", "content": text}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        with urllib.request.urlopen(request) as response:
            return json.load(response)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        print(e.read().decode(), file=sys.stderr)
        return ""
mode = task["mode"]
chat("solver", "What is 2 + 2?")
if mode == "crash":
    raise RuntimeError("the framework fell over")
if mode == "hang":
    time.sleep(60)
if mode == "unknown_role":
    chat("critic", "hello")
if mode == "long_prompt":
    chat("checker", "many words " * 2000)
if mode == "silent":
    sys.exit(0)
if mode == "huge_reward":
    print(json.dumps({"reward": 1.7e308}))
    sys.exit(0)
print("the answer is 4" if mode == "malformed" else json.dumps({"reward": 1.0}))
"#;

#[test]
fn failing_programs_are_recorded_with_their_reason_and_the_others_train() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("misbehaving.py"), MISBEHAVING).unwrap();
    let modes = ["ok", "crash", "hang", "silent", "malformed", "unknown_role", "long_prompt", "huge_reward"];
    let rows: Vec<String> = modes.iter().map(|m| format!("{{\"id\": \"{m}\", \"mode\": \"{m}\"}}")).collect();
    std::fs::write(dir.path().join("train.jsonl"), rows.join("\n")).unwrap();
    std::fs::write(dir.path().join("test.jsonl"), "{\"id\": \"t\", \"mode\": \"ok\"}\n").unwrap();
    let file = team_run(dir.path(), "misbehaving.py", &fixture("hf-tiny-qwen3"))
        .set(
            "env",
            &format!(
                "{{name: agent_program, command: [python, misbehaving.py], workdir: {}, timeout_seconds: 8}}",
                dir.path().display()
            ),
        )
        .set("data", "{train_tasks: 8, test_tasks: 1, train_file: {path: train.jsonl}, test_file: {path: test.jsonl}}")
        .set("rollout.tasks_per_iteration", "8")
        .set("rollout.episodes_per_task", "1")
        .set("rollout.max_prompt_tokens", "512")
        .set("evaluation.tasks", "1");
    run_ok(&file, dir.path(), None);
    let store = dir.path().join("run");
    let failed =
        sql_rows(&store, "SELECT replace(failed_episodes, chr(10), ' | ') FROM commits WHERE stage = 'rollout'");
    let failed: Vec<&str> = failed[0].trim_matches('"').split(" | ").collect();
    let expected = [
        ("crash", "the program failed (exit status: 1)"),
        ("hang", "ran past env.timeout_seconds (8 s) and was killed"),
        ("silent", "printed no verdict"),
        ("malformed", "the program's last line is not a verdict"),
        ("unknown_role", "critic"),
        ("unknown_role", "`model` must be one of the agents (checker, solver)"),
        ("long_prompt", "over the limit of 512 (max_prompt_tokens)"),
        ("huge_reward", "not a finite number within ±1000000 (limits.reward)"),
    ];
    assert_eq!(failed.len(), 7, "{failed:?}");
    for (mode, reason) in expected {
        assert!(
            failed.iter().any(|f| f.contains(&format!("-{mode}/e0: ")) && f.contains(reason)),
            "{mode}: {failed:?}"
        );
    }
    // The crash's reason keeps the end of its stderr; its call is a row with no reward.
    let crash = sql_rows(&store, "SELECT failure, team_reward FROM turns WHERE task_id LIKE '%-crash'").join("\n");
    assert!(crash.contains("RuntimeError: the framework fell over") && crash.ends_with(",0.0"), "{crash}");
    let ok = sql_rows(&store, "SELECT team_reward, failure IS NULL FROM turns WHERE task_id LIKE '%-ok'");
    assert_eq!(ok, ["1.0,true"]);
    assert_eq!(sql_rows(&store, "SELECT count(*) FROM updates WHERE policy = 'solver'"), ["1"]);
}

/// `source` as the program `name` in `dir`, one episode of it per row of `train`
/// (`test` the held-out row), with `env_extra` added to the `env` section.
fn one_episode_per_task(
    dir: &Path,
    name: &str,
    source: &str,
    train: &[String],
    test: &str,
    env_extra: &str,
) -> RunFile {
    std::fs::write(dir.join(name), source).unwrap();
    std::fs::write(dir.join("train.jsonl"), train.join("\n")).unwrap();
    std::fs::write(dir.join("test.jsonl"), format!("{test}\n")).unwrap();
    let env = format!("{{name: agent_program, command: [python, {name}], workdir: {}{env_extra}}}", dir.display());
    let data = format!(
        "{{train_tasks: {}, test_tasks: 1, train_file: {{path: train.jsonl}}, test_file: {{path: test.jsonl}}}}",
        train.len()
    );
    team_run(dir, name, &fixture("hf-tiny-qwen3"))
        .set("env", &env)
        .set("data", &data)
        .set("rollout.tasks_per_iteration", &train.len().to_string())
        .set("rollout.episodes_per_task", "1")
        .set("evaluation.tasks", "1")
}

/// A program that, as a hostile one would, calls with its own key on other episodes'
/// paths and with a guessed key; the honest ones call once for their own episode.
const TRESPASSING: &str = r#"
import json, os, urllib.request, urllib.error
task = json.load(open(os.environ["PETTING_TASK_FILE"]))
base = os.environ["OPENAI_BASE_URL"]
def post(url, key, role):
    request = urllib.request.Request(url + "/chat/completions",
        data=json.dumps({"model": role, "messages": [{"role": "user", "content": "2 + 2?"}]}).encode(),
        headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
key = os.environ["OPENAI_API_KEY"]
if task["mode"] == "hostile":
    root = base[: -len("/v1")]
    others = [post(f"{root}/e/{n}/v1", key, role) for n in range(8) for role in ["solver", "critic"]]
    guessed = post(base, "petting-" + "0" * 32, "solver")
    json.dump({"others": others, "guessed": guessed}, open(f"statuses-{task['id']}.json", "w"))
post(base, key, "solver")
print(json.dumps({"reward": 1.0 if task["mode"] == "honest" else 0.0}))
"#;

#[test]
fn an_episode_key_calls_for_its_own_episode_only() {
    let dir = tempfile::tempdir().unwrap();
    let modes = ["honest", "honest", "hostile", "honest"];
    let rows: Vec<String> =
        modes.iter().enumerate().map(|(i, m)| format!("{{\"id\": \"{m}{i}\", \"mode\": \"{m}\"}}")).collect();
    let test = "{\"id\": \"t\", \"mode\": \"honest\"}";
    let file = one_episode_per_task(dir.path(), "trespassing.py", TRESPASSING, &rows, test, "");
    run_ok(&file, dir.path(), Some("group:0"));
    let statuses: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("statuses-hostile2.json")).unwrap()).unwrap();
    let others: Vec<u64> = statuses["others"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    // Its own episode's path (one n of eight) is its own; every other is refused.
    assert!(others.iter().filter(|&&s| s == 403).count() >= 14, "{others:?}");
    assert_eq!(statuses["guessed"], 401);
    let store = dir.path().join("run");
    let honest = sql_rows(
        &store,
        "SELECT task_id, count(*), min(team_reward), max(failure) FROM turns WHERE task_id LIKE '%honest%' \
         GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(honest.len(), 3, "{honest:?}");
    for row in &honest {
        assert!(row.ends_with(",1,1.0,"), "each honest episode has its one call, its reward, no failure: {honest:?}");
    }
}

/// A program given a 200 KB task that sends a body past `limits.request_bytes`, then a
/// plain call; its verdict says whether each went as it should.
const OVERSIZED: &str = r#"
import json, os, time, urllib.request, urllib.error
task = json.load(open(os.environ["PETTING_TASK_FILE"]))
def post(text):
    body = json.dumps({"model": "solver", "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (ConnectionError, urllib.error.URLError):
        # The 413 came while the body was still being sent, and the connection closed.
        return 413, "limits.request_bytes"
started = time.monotonic()
status, message = post("x" * (20 << 20))
refused = status == 413 and "limits.request_bytes" in message and time.monotonic() - started < 30
whole = len(task["text"]) == 200_000 and "PETTING_TASK" not in os.environ
ok, _ = post("2 + 2?")
print(json.dumps({"reward": float(refused and whole and ok == 200)}))
"#;

#[test]
fn a_large_task_reaches_the_program_and_a_body_past_the_limit_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let row = format!("{{\"id\": \"big\", \"text\": \"{}\"}}", "y".repeat(200_000));
    let test = "{\"id\": \"t\", \"text\": \"\"}";
    let file = one_episode_per_task(dir.path(), "oversized.py", OVERSIZED, &[row], test, "");
    run_ok(&file, dir.path(), Some("group:0"));
    let rows = sql_rows(&dir.path().join("run"), "SELECT count(*), min(team_reward), max(failure) FROM turns");
    assert_eq!(rows, ["1,1.0,"], "one call answered, the oversized one refused, the task whole");
}

/// A program that leaves processes behind: one in a session of its own that holds its
/// stdout, one in its group; then it works past its episode's deadline.
const LINGERING: &str = r#"
import os, subprocess, sys, time
subprocess.Popen(["sleep", "419.1234"], start_new_session=True)
subprocess.Popen(["sleep", "419.1234"], stdout=subprocess.DEVNULL)
if os.environ["PETTING_TASK_ID"].endswith("quick"):
    print('{"reward": 1.0}')
    sys.exit(0)
time.sleep(400)
"#;

/// Whether a live process has `marker` in its command line.
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(entry.path().join("cmdline")).unwrap_or_default()).into_owned();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        cmdline.contains(marker) && !stat.contains(") Z ")
    })
}

fn gone_within(marker: &str, seconds: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while running(marker) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    true
}

fn lingering_run(dir: &Path, mode: &str) -> String {
    let train = [format!("{{\"id\": \"{mode}\"}}")];
    let file = one_episode_per_task(
        dir,
        "lingering.py",
        LINGERING,
        &train,
        "{\"id\": \"quick-test\"}",
        ", timeout_seconds: 60",
    );
    file.write(&dir.join("run.yaml"))
}

#[test]
fn nothing_a_program_starts_outlives_its_episode_or_petting() {
    // The episode ends by its verdict; what it started, in its group or in a session of
    // its own holding its stdout, ends with it, and the stage does not wait for them.
    let dir = tempfile::tempdir().unwrap();
    let config = lingering_run(dir.path(), "quick");
    let started = std::time::Instant::now();
    let (ok, stdout, stderr) = run(&["pipeline", "run", &config, "--until", "group:0"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(started.elapsed().as_secs() < 300, "the rollout waited for a process holding the program's stdout");
    assert!(gone_within("419.1234", 10), "a process the program started outlived its episode");

    // kill -9 of petting mid-episode: the program and all it started end too.
    let dir = tempfile::tempdir().unwrap();
    let config = lingering_run(dir.path(), "slow");
    let mut petting = crate::support::petting().args(["pipeline", "run", &config]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !running("419.1234") {
        assert!(std::time::Instant::now() < deadline, "the program never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    petting.kill().unwrap();
    petting.wait().unwrap();
    assert!(gone_within("419.1234", 10), "processes outlived petting's kill -9");
    assert!(gone_within("lingering.py", 10), "the program outlived petting's kill -9");
}

#[test]
fn a_stage_whose_every_program_fails_commits_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("crash.py"), "raise SystemExit('no framework here')\n").unwrap();
    let file = team_run(dir.path(), "crash.py", &fixture("hf-tiny-qwen3")).set(
        "env",
        &format!("{{name: agent_program, command: [python, crash.py], workdir: {}}}", dir.path().display()),
    );
    let path = file.write(&dir.path().join("run.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("episodes of the agent program failed; the first, of task"), "{stderr}");
    assert!(stderr.contains("no framework here"), "{stderr}");
    let played =
        sql_rows(&dir.path().join("run"), "SELECT count(*) FROM commits WHERE stage IN ('rollout', 'evaluate')");
    assert_eq!(played, ["0"], "nothing of the failed stage is committed");
}

#[test]
fn tree_sampling_is_refused_for_an_agent_program() {
    let dir = tempfile::tempdir().unwrap();
    let file = team_run(dir.path(), "plain_http.py", &fixture("hf-tiny-qwen3"))
        .set("rollout", "{mode: tree, branches: 2, tasks_per_iteration: 2}");
    let path = file.write(&dir.path().join("run.yaml"));
    let (ok, stdout, stderr) = run(&["config", "check", &path]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("an agent program cannot be forked mid-episode"), "{stderr}");
}

/// SmolLM2-135M-Instruct with a LoRA adapter per role, as examples/agent_programs/team.yaml,
/// run `until` a stage (or to the end).
fn smollm2_team(dir: &Path, program: &str, until: Option<&str>) -> PathBuf {
    let file = team_run(dir, program, &crate::real_model::smollm2())
        .set("policies.solver.lora", "{rank: 8, alpha: 16}")
        .set("policies.checker.lora", "{rank: 8, alpha: 16}")
        .set("rollout.sampling", "{temperature: 0.7, max_new_tokens: 16}")
        .set("evaluation.sampling", "{temperature: 0.0, max_new_tokens: 16}");
    run_ok(&file, dir, until);
    dir.join("run")
}

#[test]
fn a_plain_http_team_trains_smollm2_with_the_exact_tokens_it_sampled() {
    if !full_suite("a_plain_http_team_trains_smollm2_with_the_exact_tokens_it_sampled") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = smollm2_team(dir.path(), "plain_http.py", None);
    assert_each_call_is_a_row_of_its_role(&store);
    // SmolLM2's template renders earlier replies as they were: every continued
    // conversation reuses the sampled ids.
    assert_eq!(continued_prompts(&store), (4, 4));
}

#[test]
fn teams_written_in_agent_frameworks_train_through_the_endpoint() {
    if !full_suite("teams_written_in_agent_frameworks_train_through_the_endpoint") {
        return;
    }
    // The plain HTTP team above trains end to end; these play one rollout each.
    for program in ["openai_client.py", "openai_agents_team.py", "langgraph_team.py", "autogen_team.py"] {
        let dir = tempfile::tempdir().unwrap();
        let store = smollm2_team(dir.path(), program, Some("group:0"));
        let roles = sql_rows(&store, "SELECT agent, count(*) FROM turns GROUP BY 1 ORDER BY 1");
        assert_eq!(roles, ["checker,4", "solver,8"], "{program}");
        let failed = sql_rows(&store, "SELECT count(*) FROM turns WHERE failure IS NOT NULL");
        assert_eq!(failed, ["0"], "{program}");
    }
}
