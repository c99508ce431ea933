//! `petting config` and `petting pipeline run` on good and bad iteration.yaml files.

use std::path::Path;

use crate::support::{repo_root, run};

/// Valid, with its data files and model folders (scripts/install/models.sh makes those).
#[test]
fn every_shipped_pipeline_is_valid() {
    if !crate::support::full_suite("every_shipped_pipeline_is_valid") {
        return;
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(repo_root().join("pipelines")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let (ok, stdout, stderr) = run(&["config", "check", path.to_str().unwrap()]);
            assert!(ok && stdout.contains(": ok: "), "{}: {stderr}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 6, "one example per task family, found {checked}");
}

#[test]
fn config_check_checks_the_variant_its_set_keys_make() {
    if !crate::support::full_suite("config_check_checks_the_variant_its_set_keys_make") {
        return;
    }
    let path = repo_root().join("pipelines/math.yaml");
    let path = path.to_str().unwrap();
    let (ok, stdout, stderr) = run(&["config", "check", path, "--set", "iterations=3"]);
    assert!(ok && stdout.contains(" 3 iterations of "), "{stdout}{stderr}");
    let (ok, _, stderr) = run(&["config", "check", path, "--set", "rollout.kk=2"]);
    assert!(!ok && stderr.contains("unknown field `kk`"), "{stderr}");
}

#[test]
fn an_old_key_name_still_works_and_config_check_says_what_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let models = repo_root().join("models");
    let text = std::fs::read_to_string(repo_root().join("pipelines/plan-path.yaml")).unwrap();
    let old = text.replace("branches: 8", "k: 6").replace("../models", models.to_str().unwrap());
    let path = dir.path().join("old.yaml");
    std::fs::write(&path, old).unwrap();
    let (ok, stdout, stderr) = run(&["config", "check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("warning: `rollout.k` is deprecated: write `rollout.branches`"), "{stdout}");
    assert!(stdout.contains(" x K=6, "), "{stdout}");
}

#[test]
fn config_show_fills_in_the_defaults() {
    let path = repo_root().join("pipelines/plan-path.yaml");
    let (ok, stdout, stderr) = run(&["config", "show", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("clip_epsilon: 0.2") && stdout.contains("std_epsilon:"), "{stdout}");
}

#[test]
fn pipeline_plan_prints_every_step_with_what_it_waits_for() {
    let path = repo_root().join("pipelines/plan-path.yaml");
    let (ok, stdout, stderr) = run(&["pipeline", "plan", path.to_str().unwrap(), "--shards", "2", "--json"]);
    assert!(ok, "{stderr}");
    let steps: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // create, prepare-data, init; 30 iterations of 2 rollout shards, group, advantage,
    // update; evaluations of v0, v10, v20, v30 in 2 shards each.
    assert_eq!(steps.len(), 3 + 30 * 5 + 4 * 2);
    assert_eq!(steps[2]["step"], "init");
    assert_eq!(steps[2]["after"], serde_json::json!(["prepare-data"]));
    let rollout = steps.iter().find(|s| s["step"] == "rollout:10#1").unwrap();
    assert_eq!(rollout["after"], serde_json::json!(["update:9"]));
    let command = rollout["command"].as_str().unwrap();
    assert!(command.starts_with("petting stage rollout file://") && command.ends_with("--iteration 10 --shard 1/2"));
    let group = steps.iter().find(|s| s["step"] == "group:10").unwrap();
    assert_eq!(group["after"], serde_json::json!(["rollout:10"]));
    // Every step waits for one that comes before it.
    for (at, step) in steps.iter().enumerate().skip(1) {
        let after = step["after"][0].as_str().unwrap();
        assert!(steps[..at].iter().any(|s| s["step"].as_str().unwrap().split('#').next() == Some(after)), "{step}");
    }
}

#[test]
fn the_plan_of_a_stale_run_lets_each_rollout_wait_only_for_the_version_it_samples_with() {
    let dir = tempfile::tempdir().unwrap();
    let text = GOOD
        .replace("iterations: 1", "iterations: 4")
        .replace("tasks_per_iteration: 4", "tasks_per_iteration: 4, max_staleness: 2");
    let path = write(dir.path(), "stale.yaml", &text);
    let (ok, stdout, stderr) = run(&["pipeline", "plan", &path, "--json"]);
    assert!(ok, "{stderr}");
    let steps: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let step = |name: &str| steps.iter().find(|s| s["step"] == name).unwrap_or_else(|| panic!("{name}: {stdout}"));
    // Rollouts 0–2 sample with v0, rollout 3 with v1 (update 0); evaluations stay on-policy.
    for (rollout, after) in [("rollout:0", "init"), ("rollout:2", "init"), ("rollout:3", "update:0")] {
        assert_eq!(step(rollout)["after"], serde_json::json!([after]), "{rollout}");
        assert_eq!(step(rollout)["lane"], "sample");
    }
    assert_eq!(step("evaluate:4")["after"], serde_json::json!(["update:3"]));
    assert_eq!(step("update:3")["lane"], "train");
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

const GOOD: &str = "store: run
iterations: 1
env: {name: sudoku}
workflow: {kind: single_agent}
agents: {agent: {policy: p}}
policies: {p: {model: m}}
data: {train_tasks: 20, test_tasks: 10}
rollout: {tasks_per_iteration: 4}
evaluation: {tasks: 10}
";

#[test]
fn bad_configs_name_the_file_the_key_and_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("malformed.yaml", "store: [run\niterations: 1\n", vec!["malformed.yaml: ", "line"]),
        (
            "unknown.yaml",
            &GOOD.replace("iterations: 1", "iterations: 1\niteration: 2"),
            vec![
                "unknown.yaml: iteration: line 3 column 1: unknown field `iteration`, expected one of store, name, seed, iterations",
            ],
        ),
        ("type.yaml", &GOOD.replace("iterations: 1", "iterations: many"), vec!["type.yaml: iterations: "]),
        (
            "nested.yaml",
            &GOOD.replace("{tasks_per_iteration: 4}", "{tasks_per_iteration: 4, sampling: {top_p: high}}"),
            vec!["nested.yaml: rollout.sampling.top_p: "],
        ),
        (
            "enum.yaml",
            &GOOD.replace("single_agent", "committee"),
            vec!["enum.yaml: workflow.kind: ", "committee", "tool_planner"],
        ),
        (
            "range.yaml",
            &GOOD.replace("{tasks_per_iteration: 4}", "{tasks_per_iteration: 40}"),
            vec!["range.yaml: rollout.tasks_per_iteration: 40 is more than data.train_tasks (20)"],
        ),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, text);
        let (ok, _, stderr) = run(&["config", "check", &path]);
        assert!(!ok, "{name} was accepted");
        for needle in expected {
            assert!(stderr.contains(needle), "{name}: expected {needle:?} in: {stderr}");
        }
        assert_eq!(stderr.matches("error: ").count(), 1, "one error paragraph: {stderr}");
    }
    let (ok, _, stderr) = run(&["config", "check", dir.path().join("absent.yaml").to_str().unwrap()]);
    assert!(!ok && stderr.contains("cannot read") && stderr.contains("absent.yaml"), "{stderr}");
}

#[test]
fn a_missing_model_folder_or_data_file_is_named_before_a_run_exists() {
    let dir = tempfile::tempdir().unwrap();
    let no_model = write(dir.path(), "no-model.yaml", GOOD);
    let math = repo_root().join("pipelines/math.yaml");
    let math = std::fs::read_to_string(math).unwrap().replace("../datasets/math/", "absent/");
    let no_data = write(dir.path(), "no-data.yaml", &math.replace("../runs/math", "run"));
    let cases = [
        (no_model, vec!["no-model.yaml: policies.p.model: no model folder at ", "scripts/install/models.sh"]),
        (no_data, vec!["no-data.yaml: data: ", "absent/", "No such file"]),
    ];
    for (path, expected) in cases {
        for command in [&["config", "check", &path][..], &["pipeline", "run", &path]] {
            let output = crate::support::petting().args(command).output().unwrap();
            let (ok, _, stderr) = crate::support::output_of(output.clone());
            assert!(!ok, "{command:?} was accepted");
            assert_eq!(output.status.code(), Some(3), "{command:?} is refused before anything is changed: {stderr}");
            for needle in &expected {
                assert!(stderr.contains(needle), "{command:?}: expected {needle:?} in: {stderr}");
            }
            assert!(!dir.path().join("run").exists(), "{command:?} left a run behind");
        }
    }
}

#[test]
fn a_bad_config_leaves_no_run_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.yaml", &GOOD.replace("iterations: 1", "iterations: -1"));
    let (ok, _, _) = run(&["pipeline", "run", &path]);
    assert!(!ok);
    assert!(!dir.path().join("run").exists());
}

#[test]
fn a_run_freezes_its_resolved_config_and_refuses_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "it.yaml", GOOD);
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path, "--until", "update"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("run file://"), "{stdout}");
    let frozen = std::fs::read_to_string(dir.path().join("run/run.yaml")).unwrap();
    let model = dir.path().join("m");
    assert!(frozen.contains(&format!("model: {}", model.display())), "paths become absolute: {frozen}");
    assert!(frozen.contains("clip_epsilon: 0.2"), "defaults are filled in: {frozen}");

    // Comments and formatting are not a change.
    write(dir.path(), "it.yaml", &format!("# same settings\n{GOOD}"));
    let (ok, _, stderr) = run(&["pipeline", "run", &path, "--until", "update"]);
    assert!(ok, "{stderr}");

    write(dir.path(), "it.yaml", &GOOD.replace("iterations: 1", "iterations: 2"));
    let (ok, _, stderr) = run(&["pipeline", "run", &path]);
    assert!(
        !ok && stderr.contains("was started with a different config") && stderr.contains("--allow-config-change"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("run/run.yaml")).unwrap(),
        frozen,
        "the frozen config is untouched"
    );
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path, "--allow-config-change", "--until", "update"]);
    assert!(ok && stdout.contains("recorded as _config_history/"), "{stdout}{stderr}");
    let history = std::fs::read_dir(dir.path().join("run/_config_history")).unwrap().count();
    assert_eq!(history, 1, "the old config is kept");
}

/// The README's main command: a config in `pipelines/` with `store: ../runs/…`.
#[test]
fn a_store_path_that_climbs_out_of_the_config_folder_works() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    let path = write(&dir.path().join("pipelines"), "it.yaml", &GOOD.replace("store: run", "store: ../runs/it"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path, "--until", "update"]);
    assert!(ok, "{stderr}");
    let store = dir.path().join("runs/it");
    assert!(stdout.contains(&format!("run file://{} ", store.display())), "{stdout}");
    let frozen = std::fs::read_to_string(store.join("run.yaml")).unwrap();
    assert!(frozen.contains(&format!("store: {}\n", store.display())), "{frozen}");
}
