//! A short run on a real pretrained instruct model: SmolLM2-135M-Instruct imported from
//! its GGUF, two LoRA roles on one base, two iterations of math. What the toy model
//! cannot show: real prompts of ~200 tokens, a 49k vocabulary, a tied lm_head.

use std::path::{Path, PathBuf};

use crate::pipeline::pipeline;
use crate::support::repo_root;

/// SmolLM2-135M-Instruct as a Hugging Face folder, as scripts/install-models.sh makes it.
pub(crate) fn smollm2() -> PathBuf {
    let dir = repo_root().join("checkpoints/smollm2-135m-instruct");
    assert!(dir.join("model.safetensors").exists(), "run scripts/install-models.sh smollm2");
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

fn sql(run: &Path, query: &str) -> Vec<String> {
    let csv = crate::pipeline::sql_at(run.to_str().unwrap(), query, "csv");
    csv.lines().skip(1).map(str::to_owned).collect()
}

#[test]
fn smollm2_trains_a_lora_adapter_per_role_for_two_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("run");
    let config = dir.path().join("smollm2.yaml");
    let model = smollm2();
    let model = model.display();
    std::fs::write(
        &config,
        format!(
            r#"store: {store}
seed: 7
iterations: 2
{math}
agents: {{tool: {{policy: tool_p}}, reasoner: {{policy: reasoner_p}}}}
policies:
  tool_p: {{model: {model}, lora: {{rank: 8, alpha: 16.0}}, optimizer: {{lr: 1.0e-4}}}}
  reasoner_p: {{model: {model}, lora: {{rank: 8, alpha: 16.0}}, optimizer: {{lr: 1.0e-4}}}}
rollout: {{tasks_per_iteration: 2, k: 2, sampling: {{temperature: 1.0, max_new_tokens: 24}}}}
evaluation: {{tasks: 2, samples: 1, sampling: {{max_new_tokens: 24}}}}
"#,
            store = store.display(),
            math = math_tasks(),
        ),
    )
    .unwrap();
    pipeline(config.to_str().unwrap());

    // One copy of the base for both roles; later versions add only adapters.
    let mut bases = Vec::new();
    for policy in std::fs::read_dir(store.join("checkpoints")).unwrap() {
        for entry in std::fs::read_dir(policy.unwrap().path()).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            bases.extend(name.starts_with("base.").then_some(name));
        }
    }
    assert_eq!(bases.len(), 1, "{bases:?}");
    // Every row of iteration k was sampled by version k of its role's policy.
    let versions = sql(
        &store,
        "SELECT iteration, agent, policy, min(policy_version), max(policy_version), count(*) FROM turns \
         GROUP BY 1, 2, 3 ORDER BY 1, 2",
    );
    assert_eq!(
        versions,
        ["0,reasoner,reasoner_p,0,0,4", "0,tool,tool_p,0,0,4", "1,reasoner,reasoner_p,1,1,4", "1,tool,tool_p,1,1,4"]
    );
    // Each update moved the adapter it trained, and stayed on-policy.
    let updates = sql(
        &store,
        "SELECT iteration, policy, weights_change > 0, logprob_drift_max < 0.05 FROM updates ORDER BY 1, 2",
    );
    assert_eq!(
        updates,
        ["0,reasoner_p,true,true", "0,tool_p,true,true", "1,reasoner_p,true,true", "1,tool_p,true,true"]
    );
    let evaluated = sql(&store, "SELECT DISTINCT iteration FROM evals ORDER BY 1");
    assert_eq!(evaluated, ["0", "2"]);
}
