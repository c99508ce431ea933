//! PPO with a learned critic, end to end on the tiny fixture: every turn valued by its
//! agent's head, GAE along each agent's turns, the heads fitted and committed with their
//! policy's checkpoint, and carried through a resume, a fork and a replay.

use std::collections::BTreeMap;
use std::path::Path;

use crate::pipeline::{run_file, sql_rows};
use crate::support::{RunFile, run};

fn ppo_run(store: &Path, sees: &str, lambda: &str) -> RunFile {
    run_file(&store.display().to_string(), 3)
        .set("workflow", "{kind: tool_planner, max_turns: 2}")
        .set(
            "rollout",
            "{mode: independent, tasks_per_iteration: 3, episodes_per_task: 2, \
             sampling: {temperature: 1.0, max_new_tokens: 8}}",
        )
        .set("algorithm", "{name: ppo, gamma: 0.9, alpha: 1.0}")
        .set(
            "critic",
            &format!(
                "{{sees: {sees}, lambda: {lambda}, epochs: 2, mini_batch_sequences: 4, \
             optimizer: {{warmup_steps: 100}}}}"
            ),
        )
        .set("update", "{mini_batch_sequences: 12}")
        .set("evaluation", "{every: 0, at_start: false, tasks: 2}")
}

/// One turn as GAE reads it.
#[derive(Debug, Clone, PartialEq)]
struct Turn {
    episode: String,
    agent: String,
    local: f64,
    team: f64,
    value: f64,
    target: f64,
}

/// Iteration `k`'s turns, in play order within each episode.
fn turns(store: &Path, k: u32) -> Vec<Turn> {
    let query = format!(
        "select concat(t.task_id, '/', cast(t.episode as varchar)), t.agent, t.local_reward, t.team_reward, \
         s.value, s.value_target from turns t join samples s using (candidate_id) \
         where t.iteration = {k} and s.iteration = {k} order by t.task_id, t.episode, t.node_id"
    );
    sql_rows(store, &query)
        .iter()
        .map(|line| {
            let c: Vec<&str> = line.split(',').collect();
            let f = |i: usize| c[i].parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
            Turn { episode: c[0].into(), agent: c[1].into(), local: f(2), team: f(3), value: f(4), target: f(5) }
        })
        .collect()
}

/// GAE's value targets, written out here from the definition: per episode, each agent's
/// turns walked back, its local rewards and the team's final reward at its last turn.
fn targets_by_hand(turns: &[Turn], gamma: f64, lambda: f64) -> Vec<f64> {
    let mut episodes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, t) in turns.iter().enumerate() {
        episodes.entry(&t.episode).or_default().push(i);
    }
    let mut targets = vec![f64::NAN; turns.len()];
    for rows in episodes.values() {
        let team = turns[*rows.last().unwrap()].team;
        let mut next: BTreeMap<&str, (f64, f64)> = BTreeMap::new(); // agent → (V, A) of its next turn
        for &i in rows.iter().rev() {
            let t = &turns[i];
            let (reward, (next_value, next_advantage)) = match next.get(t.agent.as_str()) {
                Some(&later) => (t.local, later),
                None => (t.local + team, (0.0, 0.0)),
            };
            let advantage = reward + gamma * next_value - t.value + gamma * lambda * next_advantage;
            targets[i] = advantage + t.value;
            next.insert(&t.agent, (t.value, advantage));
        }
    }
    targets
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

#[test]
fn ppo_fits_each_agents_critic_and_carries_it_through_resume_fork_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("ppo");
    let file = ppo_run(&store, "joint", "0.8").write(&dir.path().join("ppo.yaml"));
    // Stopped before iteration 1's advantage, then resumed by a new process: the critic
    // of v1 comes back from the committed checkpoint.
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file, "--until", "advantage:1"]);
    assert!(ok, "{stdout}{stderr}");
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file]);
    assert!(ok, "{stdout}{stderr}");

    for k in [0, 1] {
        let rows = turns(&store, k);
        assert!(rows.len() >= 6, "{rows:?}");
        assert!(rows.iter().any(|t| t.agent == "tool") && rows.iter().any(|t| t.agent == "planner"));
        let targets: Vec<f64> = rows.iter().map(|t| t.target).collect();
        assert!(close(&targets, &targets_by_hand(&rows, 0.9, 0.8)), "iteration {k}: {rows:?}");
    }
    // Whitened advantages per policy.
    let spread = "select policy, avg(advantage), var_pop(advantage) from samples where iteration = 1 group by 1";
    for line in sql_rows(&store, spread) {
        let c: Vec<f64> = line.split(',').skip(1).map(|x| x.parse().unwrap()).collect();
        assert!(c[0].abs() < 1e-9 && (c[1] - 1.0).abs() < 1e-3, "{line}");
    }
    // Each agent's head took its steps (2 epochs of 4-sample mini-batches) and moved.
    let steps = sql_rows(
        &store,
        "select iteration, policy, agent, count(*), min(weights_change) > 0, count(explained_variance) >= 0 \
         from updates where mode = 'critic' group by 1, 2, 3 order by 1, 2, 3",
    );
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(steps.iter().all(|s| s.ends_with(",true,true")), "{steps:?}");
    assert!(steps[0].starts_with("0,coder,tool,") && steps[1].starts_with("0,pilot,planner,"), "{steps:?}");
    // Iteration 1's fit continues iteration 0's optimiser, loaded with v1's heads: its
    // warm-up goes on where it stopped.
    let learning_rates = sql_rows(
        &store,
        "select iteration, agent, min(learning_rate), max(learning_rate) from updates where mode = 'critic' \
         group by 1, 2 order by 2, 1",
    );
    for pair in learning_rates.chunks(2) {
        let bound = |line: &str, i: usize| line.split(',').nth(i).unwrap().parse::<f64>().unwrap();
        assert!(bound(&pair[1], 2) > bound(&pair[0], 3), "{learning_rates:?}");
    }
    // The heads are part of each trained version's checkpoint, not of v0.
    let heads = |version: &str| -> Vec<String> {
        let mut found: Vec<String> = crate::support::files_under(&store.join("checkpoints"))
            .iter()
            .map(|p| p.strip_prefix(&store).unwrap().display().to_string())
            .filter(|p| p.contains(&format!("/{version}.")) && p.contains("/critic/"))
            .map(|p| {
                let parts: Vec<&str> = p.split('/').collect();
                format!("{}/{}", parts[1], parts[parts.len() - 1])
            })
            .collect();
        found.sort();
        found
    };
    assert!(heads("v000000").is_empty());
    assert_eq!(
        heads("v000002"),
        [
            "coder/tool.optimizer.safetensors",
            "coder/tool.value_head.safetensors",
            "pilot/planner.optimizer.safetensors",
            "pilot/planner.value_head.safetensors"
        ],
        "policy/file of every head and its optimiser"
    );

    // A replay fork of iteration 1 with another λ: the same turns, valued by the very
    // critic v1 it forked (values equal), and GAE'd its own way (targets differ).
    let replayed = dir.path().join("replayed");
    let file = ppo_run(&replayed, "joint", "0.3").write(&dir.path().join("replayed.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file, "--from", &format!("{}@1:group", store.display())]);
    assert!(ok, "{stdout}{stderr}");
    let (source, again) = (turns(&store, 1), turns(&replayed, 1));
    let values = |rows: &[Turn]| rows.iter().map(|t| t.value).collect::<Vec<f64>>();
    assert!(close(&values(&source), &values(&again)), "{source:?}\n{again:?}");
    let targets: Vec<f64> = again.iter().map(|t| t.target).collect();
    assert!(close(&targets, &targets_by_hand(&again, 0.9, 0.3)));
    assert!(!close(&targets, &source.iter().map(|t| t.target).collect::<Vec<_>>()), "λ changes the targets");
}

#[test]
fn a_critic_that_sees_its_own_prompt_values_otherwise_than_one_that_sees_the_joint_history() {
    let dir = tempfile::tempdir().unwrap();
    let (own, joint) = (dir.path().join("own"), dir.path().join("joint"));
    for (store, sees) in [(&own, "own"), (&joint, "joint")] {
        let file = ppo_run(store, sees, "0.8").set("iterations", "1").write(&dir.path().join(format!("{sees}.yaml")));
        let (ok, stdout, stderr) = run(&["pipeline", "run", &file]);
        assert!(ok, "{stdout}{stderr}");
    }
    // Same turns (same seed, same weights), the same fresh heads: the first turn of an
    // episode sees only its prompt either way; later turns see more with a joint critic.
    let (a, b) = (turns(&own, 0), turns(&joint, 0));
    assert_eq!(
        a.iter().map(|t| (&t.episode, t.local)).collect::<Vec<_>>(),
        b.iter().map(|t| (&t.episode, t.local)).collect::<Vec<_>>()
    );
    let first = |rows: &[Turn]| {
        let mut seen = std::collections::BTreeSet::new();
        rows.iter().map(|t| seen.insert(t.episode.clone())).collect::<Vec<bool>>()
    };
    for ((x, y), first) in a.iter().zip(&b).zip(first(&a)) {
        if first {
            assert!((x.value - y.value).abs() < 1e-5, "{x:?} vs {y:?}");
        }
    }
    assert!(a.iter().zip(&b).any(|(x, y)| (x.value - y.value).abs() > 1e-6), "a joint critic sees more");
}

#[test]
fn a_fork_warm_starts_its_critics_on_the_returns_of_the_sources_stored_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    // The source: GRPO with returns on independent episodes, no critic of its own.
    let source = dir.path().join("grpo");
    let file = ppo_run(&source, "own", "0.8")
        .set("algorithm", "{name: grpo, credit: return, gamma: 0.9}")
        .set("critic", "null")
        .write(&dir.path().join("grpo.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file]);
    assert!(ok, "{stdout}{stderr}");
    let warm = "{sees: joint, epochs: 1, mini_batch_sequences: 4, warm_start: {iterations: 2, epochs: 12}}";
    let fork = dir.path().join("warm");
    let file =
        ppo_run(&fork, "joint", "0.8").set("critic", warm).set("iterations", "3").write(&dir.path().join("warm.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file, "--from", &format!("{}@2", source.display())]);
    assert!(ok, "{stdout}{stderr}");
    // The heads were fitted on both source iterations' turns before iteration 2: version 2
    // to 2, twelve passes, and the loss fell.
    let fitted = sql_rows(
        &fork,
        "select agent, count(*), min(version_from), max(version_to), sum(sequences) from updates \
         where mode = 'critic' and iteration = 2 and version_to = 2 group by 1 order by 1",
    );
    let turns = sql_rows(&source, "select agent, count(*) from turns group by 1 order by 1");
    assert_eq!(fitted.len(), 2, "{fitted:?}");
    for (fit, turns) in fitted.iter().zip(&turns) {
        let (f, t): (Vec<&str>, Vec<&str>) = (fit.split(',').collect(), turns.split(',').collect());
        let sequences: u32 = f[4].parse().unwrap();
        assert_eq!((f[0], f[2], f[3], sequences), (t[0], "2", "2", 12 * t[1].parse::<u32>().unwrap()), "{fit}");
    }
    let losses = |agent: &str| -> Vec<f64> {
        let query = format!(
            "select loss from updates where mode = 'critic' and version_to = 2 and agent = '{agent}' order by step"
        );
        sql_rows(&fork, &query).iter().map(|l| l.parse().unwrap()).collect()
    };
    for agent in ["planner", "tool"] {
        let l = losses(agent);
        let (head, tail) = (&l[..4], &l[l.len() - 4..]);
        assert!(tail.iter().sum::<f64>() < head.iter().sum::<f64>(), "{agent}: {l:?}");
    }
    // A run that starts afresh has no rollouts to fit to; a tree has no trajectories.
    let fresh =
        ppo_run(&dir.path().join("fresh"), "own", "0.8").set("critic", warm).write(&dir.path().join("fresh.yaml"));
    let (ok, _, stderr) = run(&["pipeline", "run", &fresh]);
    assert!(!ok && stderr.contains("this run starts afresh and has none: start it with --from RUN@K"), "{stderr}");
    let tree = dir.path().join("tree");
    let file = run_file(&tree.display().to_string(), 3).set("iterations", "1").write(&dir.path().join("tree.yaml"));
    assert!(run(&["pipeline", "run", &file]).0);
    let from_tree =
        ppo_run(&dir.path().join("from-tree"), "own", "0.8").set("critic", warm).write(&dir.path().join("ft.yaml"));
    let (ok, _, stderr) = run(&["pipeline", "run", &from_tree, "--from", &format!("{}@1", tree.display())]);
    assert!(!ok && stderr.contains("its rollouts are trees"), "{stderr}");
}

#[test]
fn a_separate_critic_model_values_the_turns_on_its_own_trunk_trains_it_and_its_heads_go_with_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let critic_model = crate::support::fixture("hf-tiny-llama");
    let critic = |model: &Path| {
        format!(
            "{{sees: own, lambda: 0.8, epochs: 2, mini_batch_sequences: 4, model: {}, lora: {{rank: 4}}}}",
            model.display()
        )
    };
    let (shared, separate) = (dir.path().join("shared"), dir.path().join("separate"));
    let file = ppo_run(&shared, "own", "0.8").set("iterations", "1").write(&dir.path().join("shared.yaml"));
    assert!(run(&["pipeline", "run", &file]).0);
    let file = ppo_run(&separate, "own", "0.8").set("critic", &critic(&critic_model)).write(&dir.path().join("s.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file]);
    assert!(ok, "{stdout}{stderr}");

    // The same turns (same seed, same policy), valued on another trunk by the same fresh
    // heads: other values, and GAE's targets by the definition all the same.
    let (a, b) = (turns(&shared, 0), turns(&separate, 0));
    let locals = |rows: &[Turn]| rows.iter().map(|t| (t.episode.clone(), t.local)).collect::<Vec<_>>();
    assert_eq!(locals(&a), locals(&b));
    assert!(a.iter().zip(&b).all(|(x, y)| (x.value - y.value).abs() > 1e-6), "{a:?}\n{b:?}");
    for k in [0, 1] {
        let rows = turns(&separate, k);
        let targets: Vec<f64> = rows.iter().map(|t| t.target).collect();
        assert!(close(&targets, &targets_by_hand(&rows, 0.9, 0.8)), "iteration {k}: {rows:?}");
    }
    // The heads were fitted and are committed with their policy's version, as on a shared trunk.
    let fits = "select iteration, agent, count(*) from updates where mode = 'critic' group by 1, 2 order by 1, 2";
    assert_eq!(sql_rows(&separate, fits).len(), 4);
    let heads: Vec<_> = crate::support::files_under(&separate.join("checkpoints"))
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("/v000002.") && p.to_string_lossy().ends_with("value_head.safetensors")
        })
        .collect();
    assert_eq!(heads.len(), 2, "{heads:?}");
    // With critic.lora the critic model's trunk trains with the heads: an adapter per
    // agent beside its head, and the next iteration's values read it.
    let adapters = crate::support::files_under(&separate.join("checkpoints"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/v000002.") && p.to_string_lossy().ends_with(".lora.safetensors"))
        .count();
    assert_eq!(adapters, 2);

    // A critic model that tokenizes otherwise (here: the same tokenizer written out
    // differently) is refused before a forward; the committed rollout stays.
    let other = dir.path().join("other-tokenizer");
    std::fs::create_dir(&other).unwrap();
    for entry in std::fs::read_dir(&critic_model).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, other.join(path.file_name().unwrap())).unwrap();
    }
    let tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(other.join("tokenizer.json")).unwrap()).unwrap();
    std::fs::write(other.join("tokenizer.json"), serde_json::to_vec_pretty(&tokenizer).unwrap()).unwrap();
    let refused = dir.path().join("refused");
    let file = ppo_run(&refused, "own", "0.8").set("critic", &critic(&other)).write(&dir.path().join("r.yaml"));
    let (ok, _, stderr) = run(&["pipeline", "run", &file]);
    assert!(!ok && stderr.contains("tokenizes otherwise than policy"), "{stderr}");
    assert!(stderr.contains(&format!("critic.model {}", other.display())), "{stderr}");
    assert!(!sql_rows(&refused, "select count(*) from turns where iteration = 0")[0].starts_with('0'));
}

/// A sample's per-token columns.
struct TokenColumns {
    tokens: usize,
    values: Vec<f64>,
    targets: Vec<f64>,
    advantages: Vec<f64>,
}

#[test]
fn token_values_credit_every_reply_token_and_agree_with_turn_values_at_the_turns_state() {
    let dir = tempfile::tempdir().unwrap();
    let (by_turn, by_token) = (dir.path().join("turn"), dir.path().join("token"));
    let file = ppo_run(&by_turn, "own", "0.8").set("iterations", "1").write(&dir.path().join("turn.yaml"));
    assert!(run(&["pipeline", "run", &file]).0);
    let token_critic = "{sees: own, values: token, lambda: 0.8, epochs: 2, mini_batch_sequences: 4}";
    let file = ppo_run(&by_token, "own", "0.8").set("critic", token_critic).write(&dir.path().join("token.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &file]);
    assert!(ok, "{stdout}{stderr}");

    // The same turns and fresh heads: a token critic's first value is the state the turn
    // critic values, the prompt's last token.
    let (a, b) = (turns(&by_turn, 0), turns(&by_token, 0));
    assert!(close(&a.iter().map(|t| t.value).collect::<Vec<_>>(), &b.iter().map(|t| t.value).collect::<Vec<_>>()));
    let lists = |k: u32| -> Vec<TokenColumns> {
        let query = format!(
            "select s.response_token_count, array_to_string(s.token_values, ';'), \
             array_to_string(s.token_value_targets, ';'), array_to_string(s.token_advantages, ';') \
             from turns t join samples s using (candidate_id) \
             where t.iteration = {k} and s.iteration = {k} order by t.task_id, t.episode, t.node_id"
        );
        let floats = |c: &str| c.split(';').map(|x| x.parse::<f64>().unwrap()).collect::<Vec<f64>>();
        sql_rows(&by_token, &query)
            .iter()
            .map(|line| {
                let c: Vec<&str> = line.split(',').collect();
                TokenColumns {
                    tokens: c[0].parse().unwrap(),
                    values: floats(c[1]),
                    targets: floats(c[2]),
                    advantages: floats(c[3]),
                }
            })
            .collect()
    };
    for k in [0, 1] {
        let rows = turns(&by_token, k);
        let tokens = lists(k);
        // λ = 1 within a reply: the turn-level GAE of the first values, at every token.
        let by_hand = targets_by_hand(&rows, 0.9, 0.8);
        let mut raw: BTreeMap<&str, Vec<f64>> = BTreeMap::new(); // by agent: its own policy here
        for ((turn, TokenColumns { tokens: n, values, targets, .. }), target) in rows.iter().zip(&tokens).zip(&by_hand)
        {
            assert_eq!((values.len(), targets.len()), (*n, *n), "one per reply token");
            assert!((values[0] - turn.value).abs() < 1e-5 && (turn.target - target).abs() < 1e-5, "{turn:?}");
            assert!(targets.iter().all(|t| (t - target).abs() < 1e-5), "{targets:?} vs {target}");
            raw.entry(&turn.agent).or_default().extend(targets.iter().zip(values).map(|(r, v)| r - v));
        }
        // The advantages are target − value per token, whitened over all the policy's tokens.
        let whitening: BTreeMap<&str, (f64, f64)> = raw
            .iter()
            .map(|(agent, raw)| {
                let mean = raw.iter().sum::<f64>() / raw.len() as f64;
                let variance = raw.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / raw.len() as f64;
                (*agent, (mean, (variance + 1e-8).sqrt()))
            })
            .collect();
        for (turn, TokenColumns { values, targets, advantages: stored, .. }) in rows.iter().zip(&tokens) {
            let (mean, std) = whitening[turn.agent.as_str()];
            let whitened = targets.iter().zip(values).map(|(r, v)| (r - v - mean) / std);
            assert!(stored.iter().zip(whitened).all(|(s, w)| (s - w).abs() < 1e-4), "{turn:?}: {stored:?}");
        }
        assert!(
            tokens.iter().any(|t| t.values.windows(2).any(|w| (w[0] - w[1]).abs() > 1e-6)),
            "values move in a reply"
        );
    }
    // The heads were fitted on every token, a mini-batch of samples at a time: 2 epochs
    // over each agent's samples, as with turn values.
    let fits = sql_rows(
        &by_token,
        "select u.agent, sum(u.sequences), (select count(*) from samples s where s.iteration = 0 and \
         s.agent = u.agent and s.response_token_count > 0) from updates u \
         where u.mode = 'critic' and u.iteration = 0 group by 1 order by 1",
    );
    assert_eq!(fits.len(), 2, "{fits:?}");
    for fit in &fits {
        let c: Vec<u64> = fit.split(',').skip(1).map(|x| x.parse().unwrap()).collect();
        assert_eq!(c[0], 2 * c[1], "{fit}");
    }
}
