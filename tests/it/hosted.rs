//! Hosted environments end to end: a real environment host (`python/petting_env`, a
//! Python process) holds the episodes, petting samples the agents' replies on the tiny
//! fixture model and trains on what the host's steps earned.

use std::path::Path;

use crate::pipeline::sql_rows;
use crate::support::{RunFile, fixture, run};

/// One iteration of `env` (a YAML mapping) played by `agents` on one shared policy, in
/// tree mode with two branches per node.
fn hosted_run(dir: &Path, env: &str, agents: &[&str]) -> RunFile {
    let agents: Vec<String> = agents.iter().map(|a| format!("{a}: {{policy: shared}}")).collect();
    RunFile::new(&format!(
        "store: {store}
seed: 3
iterations: 1
data: {{train_tasks: 4, test_tasks: 2}}
agents: {{{agents}}}
policies: {{shared: {{model: {model}, optimizer: {{lr: 1.0e-3}}}}}}
rollout: {{tasks_per_iteration: 2, branches: 2, sampling: {{temperature: 1.0, max_new_tokens: 6}}}}
evaluation: {{tasks: 2, modes: [multi_agent], sampling: {{max_new_tokens: 6}}}}
",
        store = dir.join("run").display(),
        agents = agents.join(", "),
        model = fixture("hf-tiny-qwen3").display(),
    ))
    .set("env", env)
}

const GUESS_NUMBER: &str = "{name: external, module: 'petting_env.examples.guess_number:GuessNumber', \
                            config: {high: 8, max_turns: 4}}";

fn run_ok(file: &RunFile, dir: &Path) -> String {
    let path = file.write(&dir.join("run.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path]);
    assert!(ok, "{stdout}\n{stderr}");
    stdout
}

fn run_err(file: &RunFile, dir: &Path) -> String {
    let path = file.write(&dir.join("run.yaml"));
    let (ok, stdout, stderr) = run(&["pipeline", "run", &path]);
    assert!(!ok, "{stdout}");
    stderr
}

/// Each (task, episode, agent)'s returns, walked back from its last row as
/// docs/environments.md writes the rule: rows are `task,episode,node,agent,local,team,…`
/// in node order, the team reward is the episode's last row's.
fn hand_returns(rows: &[Vec<f64>], agents: &[String], alpha: f64, gamma: f64) -> Vec<f64> {
    let mut returns = vec![0.0; rows.len()];
    let mut i = rows.len();
    while i > 0 {
        let end = i;
        let episode = (rows[end - 1][0], rows[end - 1][1]);
        while i > 0 && (rows[i - 1][0], rows[i - 1][1]) == episode {
            i -= 1;
        }
        let team = rows[end - 1][3];
        let mut later: std::collections::HashMap<&str, f64> = Default::default();
        for j in (i..end).rev() {
            let value = match later.get(agents[j].as_str()) {
                Some(next) => rows[j][2] + gamma * next,
                None => rows[j][2] + alpha * team,
            };
            later.insert(&agents[j], value);
            returns[j] = value;
        }
    }
    returns
}

#[test]
fn returns_carry_a_games_final_reward_back_to_every_move_and_a_replay_credits_its_own_way() {
    let dir = tempfile::tempdir().unwrap();
    let run_file = |store: &str| {
        hosted_run(dir.path(), GUESS_NUMBER, &["alice", "bob"])
            .set("store", store)
            .set("iterations", "2")
            .set("evaluation.every", "0")
            .set("evaluation.at_start", "false")
            .set("rollout", "{mode: independent, tasks_per_iteration: 2, episodes_per_task: 4, sampling: {temperature: 1.0, max_new_tokens: 6}}")
            .set("algorithm", "{name: grpo, credit: return, gamma: 0.5, alpha: 2.0}")
    };
    let store = dir.path().join("returns");
    run_ok(&run_file(&store.display().to_string()), dir.path());
    let query = "select dense_rank() over (order by task_id), episode, local_reward, team_reward, credited_reward, \
                 agent from turns where iteration = 1 order by task_id, episode, node_id";
    let read = |store: &Path| -> (Vec<Vec<f64>>, Vec<String>) {
        sql_rows(store, query)
            .iter()
            .map(|line| {
                let cells: Vec<&str> = line.split(',').collect();
                (cells[..5].iter().map(|c| c.parse().unwrap()).collect(), cells[5].to_string())
            })
            .unzip()
    };
    let (rows, agents) = read(&store);
    assert!(agents.contains(&"alice".to_string()) && agents.contains(&"bob".to_string()), "{agents:?}");
    let expected = hand_returns(&rows, &agents, 2.0, 0.5);
    let credited: Vec<f64> = rows.iter().map(|r| r[4]).collect();
    assert_eq!(credited, expected, "rows (task, episode, local, team, credited): {rows:?}");
    let per_turn = |rows: &[Vec<f64>]| rows.iter().map(|r| 2.0 * r[3] + r[2]).collect::<Vec<f64>>();
    assert_ne!(credited, per_turn(&rows), "later rewards reached earlier moves: {rows:?}");
    // The groups compare, and the update trains on, what the rows were credited with.
    let compared = "select count(*) from samples s join turns t using (candidate_id) \
                    where s.iteration = t.iteration and s.mixed_reward <> t.credited_reward";
    assert_eq!(sql_rows(&store, compared), ["0"]);

    // Replayed with turn credit, the same turns are each credited their own step.
    let replayed = dir.path().join("replayed");
    let file = run_file(&replayed.display().to_string()).set("algorithm", "{name: grpo, alpha: 2.0}");
    let path = file.write(&dir.path().join("replayed.yaml"));
    let (ok, stdout, stderr) =
        crate::support::run(&["pipeline", "run", &path, "--from", &format!("{}@1:group", store.display())]);
    assert!(ok, "{stdout}{stderr}");
    let (again, _) = read(&replayed);
    assert_eq!(again.iter().map(|r| r[4]).collect::<Vec<_>>(), per_turn(&again));
    assert_eq!(again.iter().map(|r| &r[..4]).collect::<Vec<_>>(), rows.iter().map(|r| &r[..4]).collect::<Vec<_>>());
}

#[test]
fn an_external_environment_is_played_in_its_own_turn_order_and_trained_on() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&hosted_run(dir.path(), GUESS_NUMBER, &["alice", "bob"]), dir.path());
    let store = dir.path().join("run");
    // The host made the tasks: a secret per task, reproducible from the run seed.
    let tasks = sql_rows(&store, "select instance from tasks order by task_id");
    assert_eq!(tasks.len(), 6);
    assert!(tasks.iter().all(|t| t.contains("secret")), "{tasks:?}");
    // alice opens every episode, bob answers; each (task, agent, turn) node has its two
    // branches, which saw one prompt.
    let nodes = sql_rows(
        &store,
        "select task_id, agent, turn, count(*), count(distinct prompt_message) from turns \
         where iteration = 0 group by 1, 2, 3 order by 1, 3, 2",
    );
    assert!(!nodes.is_empty());
    assert!(nodes.iter().all(|n| n.ends_with(",2,1")), "{nodes:?}");
    let openers = sql_rows(&store, "select distinct agent from turns where node_id < 2");
    assert_eq!(openers, ["alice"]);
    assert!(nodes.iter().all(|n| n.contains(",alice,") || n.contains(",bob,")), "{nodes:?}");
    // What the prompts show is the host's observation under the default template.
    let prompts = sql_rows(&store, "select prompt_message from turns where agent = 'bob' limit 1");
    assert!(prompts[0].contains("You are bob"), "{prompts:?}");
    // A reply without a number is the mover's invalid move (-0.1); a number earns 0 or 1.
    let rewards = sql_rows(&store, "select distinct local_reward from turns order by 1");
    assert!(rewards.iter().all(|r| ["-0.1", "0.0", "1.0"].contains(&r.as_str())), "{rewards:?}");
    // The update trained both agents' samples, and the evaluation played the team.
    assert_eq!(sql_rows(&store, "select count(distinct agent) from samples"), ["2"]);
    assert!(!sql_rows(&store, "select mode from evals where mode = 'multi_agent'").is_empty());
}

#[test]
fn a_script_that_serves_its_environment_is_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let script = "from petting_env import serve\n\
                  from petting_env.examples.guess_number import GuessNumber\n\
                  class Chatty(GuessNumber):\n\
                  \x20   def reset(self, task, seed):\n\
                  \x20       print('a print in the environment goes to stderr, not into the protocol')\n\
                  \x20       super().reset(task, seed)\n\
                  serve(Chatty)\n";
    std::fs::write(dir.path().join("guess.py"), script).unwrap();
    let env = "{name: external, command: [python, guess.py], config: {high: 8, max_turns: 2}}";
    run_ok(&hosted_run(dir.path(), env, &["alice", "bob"]), dir.path());
    let played = sql_rows(&dir.path().join("run"), "select count(*) > 0 from turns");
    assert_eq!(played, ["true"]);
}

#[test]
fn a_hosted_environment_asks_two_agents_at_once_and_judges_their_replies_together() {
    let dir = tempfile::tempdir().unwrap();
    // Left and right asked at once each round, each on its own prompt; the judge never acts.
    let class = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests_env/fixtures/pair_env.py");
    std::fs::copy(class, dir.path().join("pair_env.py")).unwrap();
    let env = "{name: external, module: 'pair_env.py:Pair'}";
    run_ok(&hosted_run(dir.path(), env, &["left", "right", "judge"]), dir.path());
    let store = dir.path().join("run");
    // Each round is one step of both agents: per (task, turn), both agents' rows, two
    // branches each, every branch of an agent on one prompt, its own.
    let rounds = sql_rows(
        &store,
        "select task_id, turn, agent, count(*), count(distinct prompt_message), \
         min(prompt_message like '%You are ' || agent || ', round ' || cast(turn as varchar) || '%') \
         from turns where iteration = 0 group by 1, 2, 3 order by 1, 2, 3",
    );
    assert_eq!(rounds.len(), 2 * 2 * 2, "2 tasks × 2 rounds × 2 agents: {rounds:?}");
    assert!(rounds.iter().all(|r| r.ends_with(",2,1,true")), "{rounds:?}");
    // The judge never acts; its reward from each step is credited, not sampled.
    assert_eq!(sql_rows(&store, "select count(*) from turns where agent = 'judge'"), ["0"]);
    // Both replies of a step share its team reward: 1 only where they were the same text.
    let team = sql_rows(
        &store,
        "select count(*) from turns l join turns r on l.iteration = r.iteration and l.task_id = r.task_id \
         and l.turn = r.turn and l.node_id = r.node_id and l.agent = 'left' and r.agent = 'right' \
         where l.team_reward <> r.team_reward",
    );
    assert_eq!(team, ["0"]);
    assert_eq!(sql_rows(&store, "select count(distinct agent) from samples"), ["2"]);
}

#[test]
fn an_agent_that_moved_alone_before_keeps_its_own_turn_count_in_a_step_of_two() {
    let dir = tempfile::tempdir().unwrap();
    let class = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests_env/fixtures/pair_env.py");
    std::fs::copy(class, dir.path().join("pair_env.py")).unwrap();
    let env = "{name: external, module: 'pair_env.py:Pair', config: {left_opens: true}}";
    run_ok(&hosted_run(dir.path(), env, &["left", "right", "judge"]), dir.path());
    // left opens alone, then both play two rounds: right's rounds are its turns 0 and 1.
    let turns = sql_rows(
        &dir.path().join("run"),
        "select distinct agent || ' ' || cast(turn as varchar) || ': ' || \
         case when prompt_message like '%opening%' then 'opening' \
         when prompt_message like '%round 0%' then 'round 0' else 'round 1' end from turns order by 1",
    );
    assert_eq!(
        turns,
        ["left 0: opening", "left 1: round 0", "left 2: round 1", "right 0: round 0", "right 1: round 1"]
    );
}

/// A host of petting's protocol written by hand, in another program than petting_env.
/// `old`: protocol 1 alone, as before agents could act at once: it checks `protocol` is
/// 1, answers hello without a version, and takes `reply` per step. `joint`: protocol 2,
/// asking `left` and `right` at once, and wrongly marking `judge`'s reply invalid.
const HAND_WRITTEN_HOST: &str = r#"import json, sys
joint = sys.argv[1] == "joint"
games = {}
def turn(k):
    if joint:
        return {"acting": [{"agent": "left", "observation": "Say anything."},
                           {"agent": "right", "observation": "Say anything."}], "done": False}
    return {"agent": "solo", "observation": "Say anything." if k == 0 else "Again.", "done": False}
def answer(request):
    op = request["op"]
    if op == "hello":
        if joint:
            return {"protocol": 2, "agents": ["left", "right", "judge"], "turn_order": "env"}
        assert request["protocol"] == 1, request
        return {"agents": ["solo"], "turn_order": "env"}
    if op == "tasks":
        return {"tasks": [{"split": request["split"], "k": i} for i in range(request["count"])]}
    if op == "make":
        for item in request["items"]:
            games[item["id"]] = 0
        return {"items": [turn(0) for _ in request["items"]]}
    if op == "fork":
        for item in request["items"]:
            games[item["new"]] = games[item["id"]]
        return {"items": [{} for _ in request["items"]]}
    if op == "step":
        steps = []
        for item in request["items"]:
            games[item["id"]] += 1
            done = games[item["id"]] == 2
            steps.append({"rewards": {"solo": float(len(item.get("reply", "")) % 2)}, "team_reward": 0.0,
                          "done": done, "success": done, "feedback": "", "invalid": ["judge"] if joint else False,
                          "next": None if done else turn(games[item["id"]])})
        return {"items": steps}
    return {}
for line in sys.stdin:
    print(json.dumps({"ok": True, **answer(json.loads(line))}), flush=True)
"#;

#[test]
fn a_host_that_speaks_only_protocol_1_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.py"), HAND_WRITTEN_HOST).unwrap();
    let env = "{name: external, command: [python, host.py, old]}";
    run_ok(&hosted_run(dir.path(), env, &["solo"]), dir.path());
    let turns = sql_rows(&dir.path().join("run"), "select count(distinct turn), count(*) > 0 from turns");
    assert_eq!(turns, ["2,true"]);
}

#[test]
fn a_host_marking_an_agent_it_did_not_ask_is_an_error_naming_the_episode() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.py"), HAND_WRITTEN_HOST).unwrap();
    let env = "{name: external, command: [python, host.py, joint]}";
    let stderr = run_err(&hosted_run(dir.path(), env, &["left", "right", "judge"]), dir.path());
    assert!(stderr.contains("the host marked judge's reply invalid, but asked only [\"left\", \"right\"]"), "{stderr}");
    assert!(stderr.contains("episode e"), "{stderr}");
}

#[test]
fn an_environment_file_edited_between_iterations_is_refused_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let class = |reward: &str| {
        format!(
            "from petting_env.examples.guess_number import GuessNumber\n\
             class Game(GuessNumber):\n\
             \x20   reward = {reward}\n"
        )
    };
    std::fs::write(dir.path().join("game.py"), class("1.0")).unwrap();
    let file = hosted_run(dir.path(), "{name: external, module: 'game.py:Game', config: {high: 8}}", &["alice", "bob"]);
    let path = file.write(&dir.path().join("run.yaml"));
    let (ok, _, stderr) = run(&["pipeline", "run", &path, "--until", "rollout:0"]);
    assert!(ok, "{stderr}");
    // Its rewards changed: the run would go on training on another environment.
    std::fs::write(dir.path().join("game.py"), class("10.0")).unwrap();
    let output = crate::support::petting().args(["pipeline", "run", &path, "--until", "group:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("game.py of sha256") && stderr.contains("--allow-config-change"), "{stderr}");
    let (ok, _, stderr) = run(&["pipeline", "run", &path, "--until", "group:0", "--allow-config-change"]);
    assert!(ok, "the change, once allowed, is recorded and the run goes on: {stderr}");
    let history = std::fs::read_dir(dir.path().join("run/_config_history")).unwrap().count();
    assert_eq!(history, 1, "the digests replaced are kept");
}

#[test]
fn an_error_inside_the_users_environment_names_the_episode_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let broken = "from petting_env import Env\n\
                  class Broken(Env):\n\
                  \x20   agents = ('solo',)\n\
                  \x20   @classmethod\n\
                  \x20   def tasks(cls, config, split, count, seed):\n\
                  \x20       return [{'n': i, 'split': split} for i in range(count)]\n\
                  \x20   def reset(self, task, seed):\n\
                  \x20       raise ValueError('the board would not set up')\n";
    std::fs::write(dir.path().join("broken.py"), broken).unwrap();
    let env = "{name: external, module: 'broken.py:Broken'}";
    let stderr = run_err(&hosted_run(dir.path(), env, &["solo"]), dir.path());
    assert!(stderr.contains("the board would not set up") && stderr.contains("broken.py"), "{stderr}");
    assert!(stderr.contains("`make`") && stderr.contains("episode e"), "{stderr}");
}

#[test]
fn a_hosts_tasks_are_checked_as_generated_ones_are() {
    for (rows, expected) in [
        ("[{'n': 0} for i in range(count)]", "it repeats external/train/000000: tasks() must return distinct tasks"),
        ("[{'n': i} for i in range(count)]", "it is also a training task (external/train/000000)"),
        ("[{'n': i, 's': split} for i in range(count + 1)]", "tasks(\"train\", 4) returned 5 rows"),
        (
            "[{'n': i, 's': split, 'text': 'x' * 5000} for i in range(count)]",
            "it is over limits.task_bytes (4096 bytes)",
        ),
        ("[{'text': 'x' * 40000}]", "a message over limits.host_message_bytes (32768 bytes)"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let class = format!(
            "from petting_env import Env\n\
             class Tasks(Env):\n\
             \x20   agents = ('solo',)\n\
             \x20   @classmethod\n\
             \x20   def tasks(cls, config, split, count, seed):\n\
             \x20       return {rows}\n"
        );
        std::fs::write(dir.path().join("tasks.py"), class).unwrap();
        let file = hosted_run(dir.path(), "{name: external, module: 'tasks.py:Tasks'}", &["solo"])
            .set("limits", "{task_bytes: 4096, host_message_bytes: 32768}");
        let stderr = run_err(&file, dir.path());
        assert!(stderr.contains(expected), "{rows}: {stderr}");
    }
}

#[test]
fn agents_the_environment_does_not_have_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = run_err(&hosted_run(dir.path(), GUESS_NUMBER, &["alice", "carol"]), dir.path());
    assert!(stderr.contains("[alice, bob]") && stderr.contains("[alice, carol]"), "{stderr}");
}

#[test]
fn a_host_that_writes_no_protocol_or_does_not_answer_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let chatty = "{name: external, command: [python, -c, \"print('hello'); import time; time.sleep(30)\"]}";
    let stderr = run_err(&hosted_run(dir.path(), chatty, &["agent"]), dir.path());
    assert!(stderr.contains("not JSON") && stderr.contains("hello"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let silent = "{name: external, command: [python, -c, \"import time; time.sleep(30)\"], \
                  host: {timeout_seconds: 1}}";
    let stderr = run_err(&hosted_run(dir.path(), silent, &["agent"]), dir.path());
    assert!(stderr.contains("did not answer `hello` within 1 s (env.host.timeout_seconds)"), "{stderr}");
}

#[test]
fn a_textarena_game_is_played_by_its_players() {
    if !crate::support::full_suite("a_textarena_game_is_played_by_its_players") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let env = "{name: textarena, game: TicTacToe-v0, players: 2}";
    run_ok(&hosted_run(dir.path(), env, &["player_0", "player_1"]), dir.path());
    let store = dir.path().join("run");
    let agents = sql_rows(&store, "select distinct agent from turns order by 1");
    assert!(agents.iter().all(|a| a.starts_with("player_")) && agents.contains(&"player_0".into()), "{agents:?}");
    // The tiny model writes no valid move: TextArena's invalid-move penalty lands on the
    // mover, a game lost by invalid moves costs its final -1 besides.
    let penalised = sql_rows(&store, "select count(*) from turns where local_reward <= -1.0");
    assert_ne!(penalised, ["0"]);
    let prompts = sql_rows(&store, "select prompt_message from turns where agent = 'player_0' limit 1");
    assert!(prompts[0].contains("Tic Tac Toe") || prompts[0].contains("Player 0"), "{prompts:?}");
}

/// A reply of `text` to `prompt`, as a sampler would give it.
fn scripted(prompt: &petting::engine::Prompt, text: String) -> petting::engine::Reply {
    petting::engine::Reply {
        prompt_text: prompt.text.clone(),
        prompt_tokens: vec![1],
        tokens: vec![2; 3],
        logprobs: vec![-0.5; 3],
        text,
        finish_reason: "eos".into(),
        seconds: 0.0,
        engine: petting::engine::EngineKind::Tch,
        engine_model: "scripted".into(),
    }
}

/// `tasks` played by the single-agent workflow, two episodes each, with `responder`'s replies.
fn play_alone(
    config: &petting::config::RunConfig,
    tasks: &[petting::tables::TaskRow],
    responder: &mut dyn petting::engine::Responder,
) -> petting::play::Played {
    use petting::play::{Branching, Setup, games, play};
    use petting::workflows::{Agent, WorkflowKind};
    let setup = Setup {
        workflow: WorkflowKind::SingleAgent,
        max_turns: 1,
        alone: false,
        opponent: None,
        policies: [(Agent::SINGLE, "shared".to_string())].into(),
        league: Default::default(),
        branching: Branching::Independent { episodes: 2 },
        seed_keys: vec![3],
        overlong_prompt: petting::play::OverlongPrompt::Error,
    };
    let sandbox = petting::sandbox::Sandbox::new(Default::default()).unwrap();
    let games = games(&config.env, &config.team(), &config.limits, tasks).unwrap();
    play(games.start(&setup).unwrap(), &setup, responder, &sandbox, &petting::progress::Quiet).unwrap()
}

/// Replies `reply(prompt, first)` to each prompt, `first` for the first of each pair.
struct Pairs<F>(F);

impl<F: FnMut(&petting::engine::Prompt, bool) -> String> petting::engine::Responder for Pairs<F> {
    fn respond(
        &mut self,
        _policy: &str,
        prompts: &[petting::engine::Prompt],
    ) -> Result<Vec<petting::engine::Reply>, petting::engine::Error> {
        Ok(prompts.iter().enumerate().map(|(i, p)| scripted(p, (self.0)(p, i % 2 == 0))).collect())
    }
}

/// `#### <the reference answer>` to the first prompt of each pair, a wrong answer to the
/// second.
fn answering(questions: Vec<(String, String)>) -> Pairs<impl FnMut(&petting::engine::Prompt, bool) -> String> {
    Pairs(move |p: &petting::engine::Prompt, first| {
        let (_, answer) = questions.iter().find(|(question, _)| p.text.contains(question.as_str())).unwrap();
        if first { format!("#### {answer}") } else { "#### 0.123".into() }
    })
}

#[test]
fn reasoning_gym_tasks_are_math_episodes_scored_by_the_datasets_own_scorer() {
    if !crate::support::full_suite("reasoning_gym_tasks_are_math_episodes_scored_by_the_datasets_own_scorer") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = hosted_run(
        dir.path(),
        "{name: reasoning_gym, dataset: basic_arithmetic, config: {min_terms: 2, max_terms: 3}}",
        &["agent"],
    )
    .set("workflow", "{kind: single_agent, max_turns: 1}")
    .text();
    let config = petting::config::parse(&text, dir.path().join("run.yaml").as_path()).unwrap();
    let (train, test) = petting::stages::prepare_data::tasks(&config).unwrap();
    assert_eq!((train.len(), test.len()), (4, 2));
    let (again, _) = petting::stages::prepare_data::tasks(&config).unwrap();
    assert_eq!(train, again, "the host makes the same tasks from the same seed");
    assert_ne!(train[0].instance, test[0].instance);
    let questions: Vec<(String, String)> = train
        .iter()
        .map(|t| {
            let instance: serde_json::Value = serde_json::from_str(&t.instance).unwrap();
            (instance["problem"].as_str().unwrap().to_string(), instance["answer"].as_str().unwrap().to_string())
        })
        .collect();
    let played = play_alone(&config, &train, &mut answering(questions));
    assert_eq!(played.candidates.len(), 8);
    for candidate in &played.candidates {
        let right = !candidate.reply.text.contains("0.123");
        assert_eq!(candidate.outcome.local_reward, if right { 1.0 } else { 0.0 }, "{}", candidate.reply.text);
        assert_eq!(candidate.outcome.success, right);
    }
}

#[test]
fn a_python_reward_function_scores_a_math_datasets_answers() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<String> =
        (0..4).map(|i| format!("{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}", 2 * i)).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows.join("\n")).unwrap();
    // Rewards the wrong answer: only the function, not the reference, can say so.
    std::fs::write(dir.path().join("rewards.py"), "def contrary(task, reply):\n    return '0.123' in reply\n").unwrap();
    let file = format!("{{path: {}/tasks.jsonl}}", dir.path().display());
    let text = hosted_run(dir.path(), "{name: math, reward: {python: 'rewards.py:contrary'}}", &["agent"])
        .set("workflow", "{kind: single_agent, max_turns: 1}")
        .set("data", &format!("{{train_tasks: 2, test_tasks: 2, train_file: {file}, test_file: {file}}}"))
        .text();
    let path = dir.path().join("run.yaml");
    std::fs::write(&path, &text).unwrap();
    let config = petting::config::load(&path).unwrap().resolved();
    let (train, _) = petting::stages::prepare_data::tasks(&config).unwrap();
    let questions: Vec<(String, String)> = train
        .iter()
        .map(|t| {
            let instance: serde_json::Value = serde_json::from_str(&t.instance).unwrap();
            (instance["problem"].as_str().unwrap().to_string(), instance["answer"].as_str().unwrap().to_string())
        })
        .collect();
    let played = play_alone(&config, &train, &mut answering(questions));
    assert_eq!(played.candidates.len(), 4);
    for candidate in &played.candidates {
        let contrary = candidate.reply.text.contains("0.123");
        assert_eq!(candidate.outcome.local_reward, if contrary { 1.0 } else { 0.0 }, "{}", candidate.reply.text);
    }
}

/// A program marked good to the first prompt of each pair, bad to the second.
fn coding() -> Pairs<impl FnMut(&petting::engine::Prompt, bool) -> String> {
    Pairs(|_: &petting::engine::Prompt, first| {
        let mark = if first { "good" } else { "bad" };
        format!("```python\nprint('{mark}')\n```")
    })
}

#[test]
fn a_python_reward_function_scores_a_code_datasets_programs_instead_of_its_tests() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rewards.py"), "def marked(task, reply):\n    return 'good' in reply\n").unwrap();
    let data = crate::support::repo_root().join("datasets/code");
    let text = hosted_run(dir.path(), "{name: code, reward: {python: 'rewards.py:marked'}}", &["agent"])
        .set("workflow", "{kind: single_agent, max_turns: 1}")
        .set(
            "data",
            &format!(
                "{{train_tasks: 2, test_tasks: 2, train_file: {{path: {d}/humaneval_train.jsonl}}, \
                 test_file: {{path: {d}/humaneval_test.jsonl}}}}",
                d = data.display()
            ),
        )
        .text();
    let path = dir.path().join("run.yaml");
    std::fs::write(&path, &text).unwrap();
    let config = petting::config::load(&path).unwrap().resolved();
    let (train, _) = petting::stages::prepare_data::tasks(&config).unwrap();
    let played = play_alone(&config, &train, &mut coding());
    assert_eq!(played.candidates.len(), 4);
    for candidate in &played.candidates {
        // Neither program passes a HumanEval test: only the function can score one 1.
        let good = candidate.reply.text.contains("good");
        assert_eq!(candidate.outcome.local_reward, if good { 1.0 } else { 0.0 }, "{}", candidate.reply.text);
        assert_eq!(candidate.outcome.success, good);
    }
}
