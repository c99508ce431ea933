//! Parsing, overrides and validation of run configs.

use super::*;
use crate::algo::Algorithm;
use crate::envs::plan_path::PlanPathConfig;
use crate::model::Device;
use crate::play::OverlongPrompt;

const MINIMAL: &str = "
store: runs/x
iterations: 2
env: {name: plan_path}
workflow: {kind: tool_planner}
agents:
  tool: {policy: shared}
  planner: {policy: shared}
policies:
  shared: {model: ../models/tiny}
";

fn parse_str(text: &str) -> Result<RunConfig, Error> {
    parse(text, Path::new("it.yaml"))
}

fn error_of(text: &str) -> String {
    parse_str(text).unwrap_err().to_string()
}

fn overridden(overrides: &[&str]) -> Result<RunConfig, Error> {
    let overrides: Vec<Override> = overrides.iter().map(|o| o.parse().unwrap()).collect();
    parse_str(&apply_overrides(MINIMAL, &overrides, Path::new("it.yaml"))?)
}

#[test]
fn overrides_replace_nested_and_absent_keys() {
    let config =
        overridden(&["seed=7", "env.size=6", "algorithm.name=grpo", "store=s3://b/r", "policies.shared.lora.rank=4"])
            .unwrap();
    assert_eq!(config.seed, 7);
    assert!(matches!(config.env, EnvConfig::PlanPath(PlanPathConfig { size: 6, .. })));
    assert_eq!(config.algorithm.name, Algorithm::Grpo);
    assert_eq!(config.store, "s3://b/r");
    assert_eq!(config.policies["shared"].lora.as_ref().unwrap().rank, 4);
}

#[test]
fn a_fork_restarts_at_rollout_or_replays_it() {
    let fork: ForkConfig = "s3://b/runs/a@3".parse().unwrap();
    assert_eq!((fork.from.as_str(), fork.iteration, fork.replay), ("s3://b/runs/a", 3, false));
    let fork: ForkConfig = "runs/a@10:group".parse().unwrap();
    assert_eq!((fork.from.as_str(), fork.iteration, fork.replay), ("runs/a", 10, true));
    assert!("runs/a@1:advantage".parse::<ForkConfig>().unwrap_err().contains("URL@K:group"));
    assert!("runs/a".parse::<ForkConfig>().is_err() && "@1".parse::<ForkConfig>().is_err());
}

#[test]
fn a_bad_override_names_its_key() {
    let message = overridden(&["iterations=many"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: iterations: "), "{message}");
    let message = overridden(&["iterations.low=1"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: iterations.low: --set cannot set `low`"), "{message}");
    assert!("seed".parse::<Override>().is_err() && "a..b=1".parse::<Override>().is_err());
}

#[test]
fn a_minimal_config_gets_the_documented_defaults() {
    let config = parse_str(MINIMAL).unwrap();
    assert_eq!(config.rollout.group_size(), 4);
    assert_eq!(config.algorithm.name, Algorithm::AtGrpo);
    assert_eq!(config.algorithm.alpha, 1.0);
    assert_eq!(config.evaluation.sampling.temperature, 0.0);
    assert_eq!(config.env, EnvConfig::PlanPath(PlanPathConfig::default()));
    assert_eq!(config.policies["shared"].device, Device::Cpu);
    assert_eq!(config.run_name(), "x");
}

#[test]
fn the_group_size_is_read_from_the_key_of_the_rollout_mode() {
    let tree = parse_str(&MINIMAL.replace("iterations: 2", "iterations: 2\nrollout: {branches: 8}")).unwrap();
    assert_eq!(tree.rollout.group_size(), 8);
    let independent = "iterations: 2\nalgorithm: {name: grpo}\nrollout: {mode: independent, episodes_per_task: 3}";
    let independent = parse_str(&MINIMAL.replace("iterations: 2", independent)).unwrap();
    assert_eq!(independent.rollout.group_size(), 3);
    let message = error_of(&MINIMAL.replace("iterations: 2", "iterations: 2\nrollout: {episodes_per_task: 3}"));
    assert!(
        message.starts_with(
            "it.yaml: rollout.episodes_per_task: is not read by rollout.mode: tree; its group size is rollout.branches"
        ),
        "{message}"
    );
}

#[test]
fn an_old_key_name_parses_as_its_new_one() {
    let old =
        MINIMAL.replace("iterations: 2", "iterations: 2\nrollout: {k: 6}\nupdate: {gradient_checkpointing: true}");
    let config = parse_str(&old).unwrap();
    assert_eq!(config.rollout.branches, Some(6));
    assert_eq!(config.update.recompute_activations, Recompute::On);
}

#[test]
fn an_unknown_key_names_its_path_and_the_allowed_keys() {
    let message = error_of(&MINIMAL.replace("iterations: 2", "iterations: 2\nrollout: {kk: 3}"));
    assert!(message.starts_with("it.yaml: rollout"), "{message}");
    assert!(
        message.contains("unknown field `kk`, expected one of tasks_per_iteration, branches, episodes_per_task, "),
        "{message}"
    );
    assert!(message.contains("line 4 column 11"), "{message}");
}

#[test]
fn a_wrong_type_names_its_path_and_the_expected_type() {
    let message = error_of(&MINIMAL.replace("iterations: 2", "iterations: two"));
    assert!(message.starts_with("it.yaml: iterations: "), "{message}");
    assert!(message.contains("u32") || message.contains("integer"), "{message}");
}

#[test]
fn a_nested_wrong_type_names_the_full_path() {
    let message = error_of(&MINIMAL.replace("{model: ../models/tiny}", "{model: m, lora: {rank: big}}"));
    assert!(message.starts_with("it.yaml: policies.shared.lora.rank: "), "{message}");
}

#[test]
fn an_unknown_env_lists_the_environments() {
    let message = error_of(&MINIMAL.replace("name: plan_path", "name: chess"));
    assert!(message.contains("chess") && message.contains("plan_path") && message.contains("sokoban"), "{message}");
}

#[test]
fn an_unknown_env_parameter_is_refused() {
    let message = error_of(&MINIMAL.replace("name: plan_path", "name: plan_path, sise: 6"));
    assert!(message.contains("unknown field `sise`, expected one of size, "), "{message}");
}

#[test]
fn malformed_yaml_is_a_parse_error_with_a_location() {
    let message = error_of("store: [unclosed\niterations: 2\n");
    assert!(message.starts_with("it.yaml: "), "{message}");
    assert!(message.contains("line"), "{message}");
}

#[test]
fn an_agent_must_name_an_existing_policy() {
    let message = error_of(&MINIMAL.replace("planner: {policy: shared}", "planner: {policy: other}"));
    assert_eq!(message, "it.yaml: agents.planner.policy: names no policy `other`; the policies are [\"shared\"]");
}

#[test]
fn every_role_of_the_workflow_needs_an_agent() {
    let message = error_of(&MINIMAL.replace("  planner: {policy: shared}\n", ""));
    assert!(message.contains("agents: the ToolPlanner workflow needs an agent `planner`"), "{message}");
}

#[test]
fn a_workflow_must_fit_the_environment() {
    let message = error_of(&MINIMAL.replace("kind: tool_planner", "kind: coder_tester"));
    assert!(message.contains("workflow.kind: CoderTester cannot play plan_path"), "{message}");
}

#[test]
fn only_tool_and_planner_play_alone_and_in_one_turn() {
    let modes = "evaluation.modes=[multi_agent, alone, tool_alone]";
    let config = overridden(&["workflow.alone=true", "workflow.max_turns=1", modes]).unwrap();
    assert!(config.workflow.alone);
    assert_eq!(config.evaluation.modes, [EvalMode::MultiAgent, EvalMode::Alone, EvalMode::ToolAlone]);
    let single = MINIMAL.replace("kind: tool_planner", "kind: single_agent").replace(
        "agents:\n  tool: {policy: shared}\n  planner: {policy: shared}",
        "agents:\n  agent: {policy: shared}",
    );
    let message = error_of(&single.replace("kind: single_agent", "kind: single_agent, alone: true"));
    assert!(message.contains("workflow.alone: only tool_planner's agents can act alone"), "{message}");
    for mode in ["alone", "tool_alone"] {
        let message = error_of(&format!("{single}evaluation: {{modes: [{mode}]}}\n"));
        assert!(message.contains("evaluation.modes: alone and tool_alone need the tool_planner"), "{message}");
    }
    for (set, key) in [("workflow.alone=true", "workflow.alone"), ("evaluation.modes=[tool_alone]", "evaluation.modes")]
    {
        let message = overridden(&[set, "workflow.max_turns=2"]).unwrap_err().to_string();
        assert!(message.contains(&format!("{key}: acting alone needs workflow.max_turns: 1")), "{message}");
    }
}

#[test]
fn devices_parse_and_bad_ones_are_named() {
    let config = parse_str(&MINIMAL.replace("{model: ../models/tiny}", "{model: m, device: \"cuda:1\"}")).unwrap();
    assert_eq!(config.policies["shared"].device, Device::Cuda(1));
    let message = error_of(&MINIMAL.replace("{model: ../models/tiny}", "{model: m, device: tpu}"));
    assert!(message.contains("policies.shared.device") && message.contains("cpu, cuda or cuda:N"), "{message}");
}

#[test]
fn demonstration_shares_must_sum_to_one() {
    let message = error_of(&MINIMAL.replace("name: plan_path", "name: plan_path, demonstrations: {tool_bfs: 0.5}"));
    assert!(message.contains("env.demonstrations: the tool_* shares sum to 1.35"), "{message}");
}

#[test]
fn the_frozen_config_parses_back_with_absolute_paths() {
    let loaded = LoadedConfig {
        config: parse_str(MINIMAL).unwrap(),
        text: MINIMAL.into(),
        file: "/etc/petting/it.yaml".into(),
        renamed: Vec::new(),
    };
    let frozen = parse(&loaded.frozen_yaml(), Path::new("run.yaml")).unwrap();
    assert_eq!(frozen.store, "/etc/petting/runs/x");
    assert_eq!(frozen.policies["shared"].model, Path::new("/etc/models/tiny"));
    assert_eq!(frozen.rollout, loaded.config.rollout);
    assert_eq!(frozen, loaded.resolved());
}

#[test]
fn the_hash_ignores_formatting_but_not_settings() {
    let a = parse_str(MINIMAL).unwrap();
    let b = parse_str(&format!("# a comment\n{MINIMAL}")).unwrap();
    let c = parse_str(&MINIMAL.replace("iterations: 2", "iterations: 3")).unwrap();
    assert_eq!(a.sha256(), b.sha256());
    assert_ne!(a.sha256(), c.sha256());
}

#[test]
fn overlap_settings_at_their_defaults_leave_the_hash_of_an_existing_run_unchanged() {
    // A run committed before rollout.max_staleness and evaluation.beside existed must
    // resume without a config change: their defaults are not serialised.
    let before = parse_str(MINIMAL).unwrap();
    let defaults =
        parse_str(&format!("{MINIMAL}rollout: {{max_staleness: 0}}\nevaluation: {{beside: false}}\n")).unwrap();
    assert_eq!(before.sha256(), defaults.sha256());
    let json = serde_json::to_string(&before).unwrap();
    assert!(!json.contains("max_staleness") && !json.contains("beside"), "{json}");
    let stale = parse_str(&format!("{MINIMAL}rollout: {{max_staleness: 1}}\n")).unwrap();
    assert_ne!(before.sha256(), stale.sha256());
    assert_eq!((stale.sampled_version(0), stale.sampled_version(1), stale.sampled_version(3)), (0, 0, 2));
    assert_eq!(stale.importance_cap(), Some(STALE_IMPORTANCE_CAP), "stale samples are importance-weighted");
    assert_eq!(before.importance_cap(), None);
}

#[test]
fn retention_keeps_every_version_a_stale_rollout_may_sample_with() {
    let with = |keep_last: u32| {
        format!("{MINIMAL}rollout: {{max_staleness: 2}}\nretention: {{keep_last: {keep_last}, weights: true}}\n")
    };
    let message = parse_str(&with(2)).unwrap_err().to_string();
    assert!(message.contains("retention.keep_last") && message.contains("keep at least 3"), "{message}");
    parse_str(&with(3)).unwrap();
}

#[test]
fn recompute_activations_is_true_false_or_auto() {
    assert_eq!(parse_str(MINIMAL).unwrap().update.recompute_activations, Recompute::Auto);
    for (written, expected) in [("true", Recompute::On), ("false", Recompute::Off), ("auto", Recompute::Auto)] {
        let config = overridden(&[&format!("update.recompute_activations={written}")]).unwrap();
        assert_eq!(config.update.recompute_activations, expected);
        let frozen = parse_str(&serde_saphyr::to_string(&config).unwrap()).unwrap();
        assert_eq!(frozen.update.recompute_activations, expected, "{written} round-trips");
    }
    let message = overridden(&["update.recompute_activations=maybe"]).unwrap_err().to_string();
    assert!(message.contains("update.recompute_activations") && message.contains("true, false or auto"), "{message}");
}

#[test]
fn independent_episodes_are_refused_for_per_turn_groups_after_the_first_prompt() {
    let message = overridden(&["rollout.mode=independent"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: rollout.mode: independent episodes with AT-GRPO"), "{message}");
    assert!(message.contains("rollout.mode: tree"), "{message}");
    // Grouping by task compares whole independent episodes, as GRPO means to.
    assert!(overridden(&["rollout.mode=independent", "algorithm.name=grpo"]).is_ok());
}

#[test]
fn returns_need_independent_episodes_and_gamma_needs_returns() {
    let message = overridden(&["algorithm.credit=return"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: algorithm.credit: return credits each candidate"), "{message}");
    let independent = ["rollout.mode=independent", "algorithm.name=grpo", "algorithm.credit=return"];
    assert_eq!(overridden(&independent).unwrap().algorithm.credit, crate::algo::Credit::Return);
    let discounted = overridden(&[&independent[..], &["algorithm.gamma=0.9"]].concat()).unwrap();
    assert_eq!(discounted.algorithm.gamma, 0.9);
    let message = overridden(&["algorithm.gamma=0.9"]).unwrap_err().to_string();
    assert!(message.contains("algorithm.gamma: discounts returns only"), "{message}");
    let message = overridden(&[&independent[..], &["algorithm.gamma=0"]].concat()).unwrap_err().to_string();
    assert!(message.contains("algorithm.gamma: must be in (0, 1]"), "{message}");
    let self_play = MINIMAL
        .replace("plan_path", "tic_tac_toe")
        .replace("tool_planner", "two_players")
        .replace("tool:", "player_x:")
        .replace("planner:", "player_o:")
        .replace("iterations: 2", "iterations: 2\nrollout: {mode: independent}");
    let returns = "algorithm: {name: grpo, credit: return}";
    let message = error_of(&format!("{self_play}{returns}\n"));
    assert!(message.contains("algorithm.alpha: two_players records each mover's own result"), "{message}");
    assert!(parse_str(&format!("{self_play}algorithm: {{name: grpo, credit: return, alpha: 0}}\n")).is_ok());
    // Turn credit, the default, leaves the frozen config (and its digest) as before.
    let frozen = serde_saphyr::to_string(&parse_str(MINIMAL).unwrap()).unwrap();
    assert!(!frozen.contains("credit") && !frozen.contains("gamma"), "{frozen}");
}

#[test]
fn ppo_takes_a_critic_over_independent_episodes_and_the_group_estimators_none() {
    let message = overridden(&["algorithm.name=ppo"]).unwrap_err().to_string();
    assert!(message.contains("algorithm.name: ppo needs a critic: section"), "{message}");
    let ppo = ["algorithm.name=ppo", "critic={}"];
    let message = overridden(&ppo).unwrap_err().to_string();
    assert!(message.contains("rollout.mode: ppo runs GAE along each episode"), "{message}");
    let independent = [&ppo[..], &["rollout.mode=independent"]].concat();
    let config = overridden(&independent).unwrap();
    let critic = config.critic.as_ref().unwrap();
    assert_eq!((critic.sees, critic.lambda, critic.epochs), (crate::critic::Sees::Own, 0.95, 4));
    // GAE discounts by γ without credit: return.
    assert!(overridden(&[&independent[..], &["algorithm.gamma=0.9"]].concat()).is_ok());
    let message = overridden(&[&independent[..], &["critic.lambda=1.5"]].concat()).unwrap_err().to_string();
    assert!(message.contains("critic.lambda: must be in [0, 1]"), "{message}");
    let message = overridden(&[&independent[..], &["algorithm.credit=return"]].concat()).unwrap_err().to_string();
    assert!(message.contains("algorithm.credit: ppo's GAE already carries"), "{message}");
    // A partial optimiser keeps the head's learning rate.
    let warmed = overridden(&[&independent[..], &["critic.optimizer={warmup_steps: 5}"]].concat()).unwrap();
    let optimizer = &warmed.critic.unwrap().optimizer;
    assert_eq!((optimizer.lr, optimizer.weight_decay, optimizer.warmup_steps), (1e-3, 0.0, 5));
    let message =
        overridden(&[&independent[..], &["critic.optimizer={learning_rate: 1}"]].concat()).unwrap_err().to_string();
    assert!(message.contains("learning_rate"), "{message}");
    let message = overridden(&["critic={}"]).unwrap_err().to_string();
    assert!(message.contains("critic: is the critic of algorithm.name: ppo"), "{message}");
    let message = overridden(&[&independent[..], &["critic.lora={rank: 4}"]].concat()).unwrap_err().to_string();
    assert!(message.contains("critic.lora: trains a separate critic model's trunk: set critic.model"), "{message}");
    let message = overridden(&[&independent[..], &["critic.sees=everyone"]].concat()).unwrap_err().to_string();
    assert!(message.contains("critic.sees"), "{message}");
    // The critic's settings are part of the frozen config; a run without one has no key.
    assert!(serde_saphyr::to_string(&config).unwrap().contains("lambda: 0.95"));
    assert!(!serde_saphyr::to_string(&parse_str(MINIMAL).unwrap()).unwrap().contains("critic"));
}

#[test]
fn a_training_rollout_refuses_top_p_and_top_k() {
    for set in ["rollout.sampling.top_p=0.9", "rollout.sampling.top_k=20"] {
        let message = overridden(&[set]).unwrap_err().to_string();
        assert!(message.starts_with("it.yaml: rollout.sampling: top_p and top_k are for evaluation"), "{message}");
    }
    assert!(overridden(&["evaluation.sampling.top_p=0.9", "evaluation.sampling.top_k=20"]).is_ok());
}

#[test]
fn f16_training_is_refused_on_every_device() {
    for device in ["cpu", "cuda"] {
        let message = overridden(&["policies.shared.dtype=f16", &format!("policies.shared.device={device}")])
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("it.yaml: policies.shared.dtype: f16 training needs dynamic loss scaling"),
            "{message}"
        );
    }
    assert!(overridden(&["policies.shared.dtype=bf16"]).is_ok());
}

#[test]
fn the_vllm_probe_has_a_tolerance_of_its_own() {
    let vllm = ["vllm.url=http://127.0.0.1:8000", "rollout.engine=vllm"];
    let config = overridden(&vllm).unwrap();
    assert_eq!(config.vllm.as_ref().map(|v| v.probe_tolerance), Some(0.05));
    let loose = overridden(&[vllm[0], vllm[1], "vllm.probe_tolerance=0.5", "update.max_logprob_drift=0.01"]).unwrap();
    assert_eq!((loose.vllm.unwrap().probe_tolerance, loose.update.max_logprob_drift), (0.5, 0.01));
    let message = overridden(&[vllm[0], vllm[1], "vllm.probe_tolerance=0"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: vllm.probe_tolerance: must be a positive"), "{message}");
}

#[test]
fn evaluation_and_the_warm_start_have_prompt_limits_of_their_own() {
    let config =
        overridden(&["rollout.max_prompt_tokens=512", "rollout.overlong_prompt=skip", "warm_start.steps=10"]).unwrap();
    assert_eq!((config.rollout.max_prompt_tokens, config.evaluation.max_prompt_tokens), (512, 4096));
    assert_eq!(config.warm_start.unwrap().max_prompt_tokens, 4096);
    assert_eq!(
        (config.rollout.overlong_prompt, config.evaluation.overlong_prompt),
        (OverlongPrompt::Skip, OverlongPrompt::Error)
    );
    let message = overridden(&["evaluation.max_prompt_tokens=0"]).unwrap_err().to_string();
    assert!(message.starts_with("it.yaml: evaluation.max_prompt_tokens: must be at least 1"), "{message}");
}

#[test]
fn the_math_tool_timeout_must_be_a_positive_number_of_seconds() {
    let math = |timeout: &str| {
        format!(
            "store: runs/x\niterations: 2\nenv: {{name: math, tool_timeout_seconds: {timeout}}}\n\
             data: {{train_file: {{path: a.jsonl}}, test_file: {{path: b.jsonl}}}}\n\
             workflow: {{kind: tool_reasoner}}\nagents:\n  tool: {{policy: shared}}\n  reasoner: {{policy: shared}}\n\
             policies:\n  shared: {{model: ../models/tiny}}\n"
        )
    };
    assert!(parse_str(&math("2.5")).is_ok(), "{}", error_of(&math("2.5")));
    for bad in ["0", "-1"] {
        let message = error_of(&math(bad));
        assert!(message.starts_with("it.yaml: env.tool_timeout_seconds: must be a positive"), "{bad}: {message}");
    }
}

#[test]
fn settings_name_each_leaf_by_its_path_and_leave_unset_keys_out() {
    let config = serde_json::json!({
        "seed": 7,
        "rollout": {"branches": 8, "sampling": {"temperature": 0.7}},
        "evaluation": {"modes": ["multi_agent", "single_agent"], "beside": null},
        "store": "runs/x",
    });
    let expected = [
        ("evaluation.modes", r#"["multi_agent","single_agent"]"#),
        ("rollout.branches", "8"),
        ("rollout.sampling.temperature", "0.7"),
        ("seed", "7"),
        ("store", "runs/x"),
    ];
    assert_eq!(settings(&config), expected.map(|(k, v)| (k.to_string(), v.to_string())).into());
}

#[test]
fn a_frozen_policy_takes_no_optimiser_or_adapter_and_something_must_train() {
    const TWO: &str = "
store: runs/x
iterations: 2
env: {name: plan_path}
workflow: {kind: tool_planner}
agents:
  tool: {policy: grader}
  planner: {policy: pilot}
policies:
  grader: {model: ../models/tiny, trainable: false}
  pilot: {model: ../models/tiny}
";
    let config = parse_str(TWO).unwrap();
    assert_eq!((config.policies["grader"].version_at(7), config.policies["pilot"].version_at(7)), (0, 7));
    let with = |key: &str| TWO.replace("trainable: false}", &format!("trainable: false, {key}}}"));
    let message = error_of(&with("optimizer: {lr: 1.0e-3}"));
    assert!(message.contains("policies.grader.optimizer: is set, but the policy is frozen"), "{message}");
    let message = error_of(&with("lora: {rank: 4}"));
    assert!(message.contains("policies.grader.lora: is set, but the policy is frozen"), "{message}");
    let message =
        error_of(&TWO.replace("pilot: {model: ../models/tiny}", "pilot: {model: ../models/tiny, trainable: false}"));
    assert!(message.contains("policies: are all frozen") && message.contains("nothing would train"), "{message}");
    let ppo = format!("{TWO}algorithm: {{name: ppo}}\ncritic: {{}}\nrollout: {{mode: independent}}\n");
    let message = error_of(&ppo);
    assert!(message.contains("grader is frozen"), "{message}");
}

#[test]
fn a_league_plays_stored_versions_of_a_trained_policy_on_the_tch_engine_and_something_still_trains() {
    const LEAGUE: &str = "
store: runs/x
iterations: 10
env: {name: tic_tac_toe}
workflow: {kind: two_players}
agents:
  player_x: {policy: shared}
  player_o: {policy: shared, league: {uniform: 3}}
policies:
  shared: {model: ../models/tiny}
evaluation: {against: [0, 5, 10]}
";
    let config = parse_str(LEAGUE).unwrap();
    let rule = config.agents[&Agent::PLAYER_O].league.map(|l| l.rule());
    assert_eq!(rule, Some(crate::policies::LeagueRule::Uniform(3)));
    let league = |rule: &str| LEAGUE.replace("{uniform: 3}", rule);
    let message = error_of(&league("{version: 3}"));
    assert!(message.contains("agents.player_o.league: plays version 3, which is not stored"), "{message}");
    let message = error_of(&league("{uniform: 0}"));
    assert!(message.contains("agents.player_o.league: must draw from at least 1"), "{message}");
    let message = error_of(&league("{sometimes: 3}"));
    assert!(message.contains("sometimes"), "{message}");
    let message = error_of(&league("{uniform: 3, behind: 1}"));
    assert!(message.contains("agents.player_o.league: names 2 rules; give exactly one"), "{message}");
    let message =
        error_of(&LEAGUE.replace("player_x: {policy: shared}", "player_x: {policy: shared, league: {behind: 1}}"));
    assert!(message.contains("agents: every role") && message.contains("nothing would train"), "{message}");
    let message = error_of(&LEAGUE.replace("[0, 5, 10]", "[0, 11]"));
    assert!(message.contains("evaluation.against: names version 11; this run stores versions 0 to 10"), "{message}");
    let message = error_of(&LEAGUE.replace(", league: {uniform: 3}", ""));
    assert!(
        message.contains("evaluation.against: plays past versions in the league's roles, and no agent"),
        "{message}"
    );
    let pruned = format!("{LEAGUE}retention: {{keep_last: 2, weights: true}}\n");
    let message = error_of(&pruned);
    assert!(message.contains("retention.keep_last: must be more than 3"), "{message}");
    let vllm = format!("{LEAGUE}rollout: {{engine: vllm}}\nvllm: {{url: 'http://127.0.0.1:8000'}}\n");
    let message = error_of(&vllm);
    assert!(message.contains("rollout.engine: is vllm, which serves only the current version"), "{message}");
    let frozen = LEAGUE
        .replace(
            "shared: {model: ../models/tiny}",
            "shared: {model: ../models/tiny}\n  old: {model: ../models/tiny, trainable: false}",
        )
        .replace("player_o: {policy: shared,", "player_o: {policy: old,");
    let message = error_of(&frozen);
    assert!(message.contains("agents.player_o.league: plays past versions of old, which is frozen"), "{message}");
}
