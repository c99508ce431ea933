//! The shipped math, code and tic-tac-toe pipelines on the real pretrained instruct
//! models they name (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct, imported from
//! their GGUFs), shrunk to a minute or two each, so these workflows cannot rot. What the
//! toy model cannot show: real prompts of hundreds of tokens, 49k and 152k vocabularies,
//! a tied lm_head, chat models following the answer formats.

use std::path::{Path, PathBuf};

use crate::pipeline::sql_rows;
use crate::support::{repo_root, run};

/// SmolLM2-135M-Instruct as a Hugging Face folder, as scripts/install/models.sh makes it.
pub(crate) fn smollm2() -> PathBuf {
    let dir = repo_root().join("models/smollm2-135m-instruct");
    assert!(dir.join("model.safetensors").exists(), "run scripts/install/models.sh smollm2");
    dir
}

/// The math environment on 8 shipped GSM-symbolic training tasks and 2 CHAMP test
/// tasks, one turn of the tool agent and the reasoner: the real-model tests' workload.
pub(crate) fn math_tasks() -> String {
    let data = repo_root().join("datasets/math");
    format!(
        r#"env: {{name: math, tool_timeout_seconds: 10}}
data:
  train_tasks: 8
  test_tasks: 2
  train_file: {{path: {data}/gsm_symbolic.jsonl, columns: {{problem: problem, answer: answer}}}}
  test_file: {{path: {data}/champ.jsonl, columns: {{problem: problem, answer: answer}}}}
workflow: {{kind: tool_reasoner, max_turns: 1}}"#,
        data = data.display()
    )
}

/// Runs a shipped pipeline shrunk to a minute or two, so the shipped configs, data files
/// and model folders keep working together: a few tasks, K = 2, one turn, short
/// replies, every group kept (the untrained model's rewards may all be equal), then
/// `settings`. Returns the run's folder.
fn run_shipped(dir: &Path, pipeline: &str, settings: &[&str]) -> PathBuf {
    let store = dir.join("run");
    let config = repo_root().join("pipelines").join(pipeline);
    let shrunk = [
        &format!("store={}", store.display()),
        "seed=7",
        "data.train_tasks=8",
        "data.test_tasks=2",
        "rollout.tasks_per_iteration=2",
        "rollout.branches=2",
        "workflow.max_turns=1",
        "algorithm.filter.drop_degenerate=false",
        "evaluation.tasks=2",
        "evaluation.samples=1",
    ];
    let mut args = vec!["pipeline", "run", config.to_str().unwrap()];
    for setting in shrunk.into_iter().chain(settings.iter().copied()) {
        args.extend(["--set", setting]);
    }
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "{pipeline}: {stdout}\n{stderr}");
    store
}

/// Each row of iteration k sampled by version k of its role's policy, and each update
/// moved the weights it trained while staying on-policy.
fn assert_on_policy_and_trained(store: &Path, iterations: u32, roles: &[(&str, &str)]) {
    let mut expected_turns = Vec::new();
    let mut expected_updates = Vec::new();
    for k in 0..iterations {
        for (agent, policy) in roles {
            expected_turns.push(format!("{k},{agent},{policy},{k},{k}"));
        }
        let mut policies: Vec<&str> = roles.iter().map(|(_, policy)| *policy).collect();
        policies.dedup();
        expected_updates.extend(policies.iter().map(|policy| format!("{k},{policy},true,true")));
    }
    let turns = sql_rows(
        store,
        "SELECT iteration, agent, policy, min(policy_version), max(policy_version) FROM turns \
         GROUP BY 1, 2, 3 ORDER BY 1, 2",
    );
    assert_eq!(turns, expected_turns);
    let updates = sql_rows(
        store,
        "SELECT iteration, policy, weights_change > 0, logprob_drift_max < 0.05 FROM updates ORDER BY 1, 2",
    );
    assert_eq!(updates, expected_updates);
}

#[test]
fn shipped_math_lora_pipeline_trains_an_adapter_per_role_of_smollm2() {
    if !crate::support::full_suite("shipped_math_lora_pipeline_trains_an_adapter_per_role_of_smollm2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = run_shipped(
        dir.path(),
        "math-lora.yaml",
        &["iterations=2", "rollout.sampling.max_new_tokens=24", "evaluation.sampling.max_new_tokens=24"],
    );
    // One copy of the base for both roles; later versions add only adapters.
    let mut bases = Vec::new();
    for policy in std::fs::read_dir(store.join("checkpoints")).unwrap() {
        for entry in std::fs::read_dir(policy.unwrap().path()).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            bases.extend(name.starts_with("base.").then_some(name));
        }
    }
    assert_eq!(bases.len(), 1, "{bases:?}");
    assert_on_policy_and_trained(&store, 2, &[("reasoner", "reasoner"), ("tool", "tool")]);
    let evaluated = sql_rows(&store, "SELECT DISTINCT iteration FROM evals ORDER BY 1");
    assert_eq!(evaluated, ["0", "2"]);
}

/// Qwen2.5-Coder with a LoRA adapter per role, against the sandbox: code-collab's main
/// agent and helper, sampled at once (code-lora's coder and tester share every piece of it
/// but the workflow, and the suite has room for one Qwen run).
#[test]
fn shipped_code_collab_pipeline_samples_main_and_helper_at_once_and_tests_their_joint_program() {
    if !crate::support::full_suite(
        "shipped_code_collab_pipeline_samples_main_and_helper_at_once_and_tests_their_joint_program",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = run_shipped(
        dir.path(),
        "code-collab.yaml",
        &[
            "iterations=1",
            "evaluation.at_start=false",
            "evaluation.modes=[multi_agent]",
            "rollout.sampling.max_new_tokens=96",
            "evaluation.sampling.max_new_tokens=96",
        ],
    );
    assert_on_policy_and_trained(&store, 1, &[("helper", "helper"), ("main", "main")]);
    // Each branch is one joint program: both agents' rows of a branch carry its verdict.
    let joint = sql_rows(
        &store,
        "SELECT count(*), count(DISTINCT team_reward) FROM turns GROUP BY iteration, task_id, branch \
         HAVING count(DISTINCT team_reward) > 1 OR count(*) <> 2",
    );
    assert!(joint.is_empty(), "{joint:?}");
    let judged = sql_rows(&store, "SELECT count(*) FROM turns WHERE feedback LIKE 'Passed % hidden tests.'");
    assert_eq!(judged, ["8"]);
}

#[test]
fn shipped_textarena_pipeline_plays_tic_tac_toe_through_its_host_on_smollm2() {
    if !crate::support::full_suite("shipped_textarena_pipeline_plays_tic_tac_toe_through_its_host_on_smollm2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = run_shipped(dir.path(), "textarena-tic-tac-toe.yaml", &["iterations=1"]);
    let agents = sql_rows(&store, "SELECT DISTINCT agent, policy FROM turns ORDER BY 1");
    assert!(agents.contains(&"player_0,shared".into()), "{agents:?}");
    assert!(agents.iter().all(|a| a.starts_with("player_") && a.ends_with(",shared")), "{agents:?}");
    let updates = sql_rows(&store, "SELECT weights_change > 0, logprob_drift_max < 0.05 FROM updates");
    assert!(!updates.is_empty() && updates.iter().all(|u| u == "true,true"), "{updates:?}");
}

#[test]
fn shipped_hanabi_pipeline_self_plays_textarenas_game_on_smollm2() {
    if !crate::support::full_suite("shipped_hanabi_pipeline_self_plays_textarenas_game_on_smollm2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The shipped file's mechanics on the suite's smallest real model (its own,
    // Qwen2.5-Coder-0.5B, writes valid moves but takes minutes here).
    let smollm2 = "policies.shared.model=../models/smollm2-135m-instruct";
    let store = run_shipped(dir.path(), "hanabi.yaml", &["iterations=1", "workflow.max_turns=2", smollm2]);
    assert_on_policy_and_trained(&store, 1, &[("player_0", "shared"), ("player_1", "shared")]);
    // history: latest: a second move's prompt holds the rules and the state once, not the
    // whole game so far.
    let second_moves = sql_rows(
        &store,
        "SELECT count(*), sum(CASE WHEN prompt_text LIKE '%Current game state%Current game state%' \
         THEN 1 ELSE 0 END) FROM turns WHERE turn = 1 AND agent = 'player_0'",
    );
    assert!(second_moves[0] != "0,0" && second_moves[0].ends_with(",0"), "{second_moves:?}");
    // reward: score: the team reward is the fireworks played so far, 0 to 25.
    let scores = sql_rows(&store, "SELECT count(*) FROM turns WHERE team_reward < 0 OR team_reward > 25");
    assert_eq!(scores, ["0"]);
}

#[test]
fn shipped_reasoning_gym_pipeline_scores_answers_with_the_dataset_on_smollm2() {
    if !crate::support::full_suite("shipped_reasoning_gym_pipeline_scores_answers_with_the_dataset_on_smollm2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = run_shipped(dir.path(), "reasoning-gym-arithmetic.yaml", &["iterations=1"]);
    assert_on_policy_and_trained(&store, 1, &[("reasoner", "shared"), ("tool", "shared")]);
    let tasks = sql_rows(&store, "SELECT count(*) FROM tasks WHERE instance LIKE '%\"entry\":%'");
    assert_ne!(tasks, ["0"], "each task keeps its reasoning-gym entry");
}

#[test]
fn shipped_tic_tac_toe_pipeline_self_plays_smollm2_and_meets_minimax() {
    if !crate::support::full_suite("shipped_tic_tac_toe_pipeline_self_plays_smollm2_and_meets_minimax") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = run_shipped(dir.path(), "tic-tac-toe-smollm2.yaml", &["iterations=1"]);
    // Both sides are the one shared adapter, trained once on both sides' turns.
    assert_on_policy_and_trained(&store, 1, &[("player_o", "shared"), ("player_x", "shared")]);
    let evaluated = sql_rows(&store, "SELECT iteration, count(*) FROM evals GROUP BY 1 ORDER BY 1");
    assert_eq!(evaluated, ["0,2", "1,2"]);
    // The trained policy plays X only; O is the perfect player.
    let players = sql_rows(&store, "SELECT DISTINCT policies FROM evals ORDER BY 1");
    assert_eq!(players, [r#""player_o=minimax,player_x=shared@v0""#, r#""player_o=minimax,player_x=shared@v1""#]);
}
