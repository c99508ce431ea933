use std::sync::Mutex;

use super::*;
use crate::engine::Prompt;
use crate::envs::plan_path::PlanPathConfig;
use crate::envs::{PlanPath, TicTacToe};
use crate::progress::Quiet;
use crate::sandbox::SandboxConfig;

/// Tool agents cycle through greedy, bfs and no program by branch; planners copy the
/// tool's printed output.
struct Scripted;

impl Responder for Scripted {
    fn respond(&mut self, _policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
        let tool = ["```python\nprint(greedy(grid, S, G))\n```", "```python\nprint(bfs(grid, S, G))\n```", "no idea"];
        Ok(prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let text = if p.text.starts_with("You are the tool agent") {
                    tool[i % 3].to_string()
                } else {
                    let output = p.text.split("Its output:\n").nth(1).and_then(|o| o.lines().next()).unwrap_or("");
                    format!("#### {output}")
                };
                Reply {
                    prompt_text: p.text.clone(),
                    prompt_tokens: vec![1, 2],
                    tokens: vec![3; text.len()],
                    logprobs: vec![-0.5; text.len()],
                    text,
                    finish_reason: "eos".into(),
                    seconds: 0.0,
                    engine: crate::engine::EngineKind::Tch,
                    engine_model: "scripted".into(),
                }
            })
            .collect())
    }
}

/// [`Scripted`], except that the `too_long`-th prompt checked does not fit.
struct WithALongPrompt {
    checked: usize,
    too_long: usize,
}

impl Responder for WithALongPrompt {
    fn respond(&mut self, policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
        Scripted.respond(policy, prompts)
    }

    fn fits(&mut self, _policy: &str, _text: &str) -> Result<bool, crate::engine::Error> {
        self.checked += 1;
        Ok(self.checked != self.too_long)
    }
}

#[test]
fn a_task_with_an_overlong_prompt_is_skipped_whole_or_not_checked_at_all() {
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let skip = Setup { overlong_prompt: OverlongPrompt::Skip, ..setup(RolloutMode::Tree) };
    // Checked in track order: the second prompt of the first step is task 1's.
    let mut responder = WithALongPrompt { checked: 0, too_long: 2 };
    let played = play(Started::Local(&games()), &skip, &mut responder, &sandbox, &Quiet).unwrap();
    assert_eq!(played.skipped, [1]);
    assert!(played.candidates.iter().all(|c| c.task_index == 0) && !played.candidates.is_empty());
    assert_eq!(played.finished.iter().map(|f| f.task_index).collect::<Vec<_>>(), [0]);
    // Skipped at its planner's turn (the third check), task 0 loses its tool rows too.
    let mut responder = WithALongPrompt { checked: 0, too_long: 3 };
    let played = play(Started::Local(&games()), &skip, &mut responder, &sandbox, &Quiet).unwrap();
    assert_eq!(played.skipped, [0]);
    assert!(played.candidates.iter().all(|c| c.task_index == 1), "{:?}", played.candidates.len());
    // With overlong_prompt: error the responder itself refuses; nothing is checked.
    let mut responder = WithALongPrompt { checked: 0, too_long: 1 };
    let played = play(Started::Local(&games()), &setup(RolloutMode::Tree), &mut responder, &sandbox, &Quiet).unwrap();
    assert_eq!((responder.checked, played.skipped.len(), played.finished.len()), (0, 0, 2));
}

fn games() -> Vec<Game> {
    let config = PlanPathConfig::default();
    (0..2)
        .map(|i| Game { task_id: format!("t{i}"), env: AnyEnv::PlanPath(PlanPath::generate(&config, 40 + i)) })
        .collect()
}

fn setup(mode: RolloutMode) -> Setup {
    Setup {
        workflow: WorkflowKind::ToolPlanner,
        max_turns: 1,
        alone: false,
        opponent: None,
        policies: HashMap::from([(Agent::TOOL, "shared".into()), (Agent::PLANNER, "shared".into())]),
        league: HashMap::new(),
        branching: Branching::new(mode, 3, Selection::BestReward, 1.0),
        seed_keys: vec![7, 0],
        overlong_prompt: OverlongPrompt::Error,
    }
}

fn mixed(c: &Candidate) -> f64 {
    c.outcome.team_reward + c.outcome.local_reward
}

#[test]
fn tree_sampling_branches_k_ways_and_continues_the_best() {
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let Played { candidates, finished, .. } =
        play(Started::Local(&games()), &setup(RolloutMode::Tree), &mut Scripted, &sandbox, &Quiet).unwrap();
    assert_eq!(candidates.len(), 2 * (3 + 3));
    for group in candidates.chunks(3) {
        assert!(group.iter().all(|c| c.reply.prompt_text == group[0].reply.prompt_text && c.agent == group[0].agent));
        assert_eq!(group.iter().map(|c| c.branch).collect::<Vec<_>>(), [0, 1, 2]);
        let selected: Vec<&Candidate> = group.iter().filter(|c| c.selected).collect();
        assert_eq!(selected.len(), 1);
        let best = group.iter().map(mixed).fold(f64::NEG_INFINITY, f64::max);
        let first_best = group.iter().find(|c| mixed(c) == best).unwrap();
        assert_eq!(selected[0].branch, first_best.branch, "ties go to the lowest branch");
    }
    // Step order: both tool groups, then both planner groups.
    let (tools, planners) = candidates.split_at(6);
    assert!(tools.iter().all(|c| c.agent == Agent::TOOL && c.parent_id.is_none()));
    for task in 0..2 {
        let chosen = tools.iter().find(|c| c.task_index == task && c.selected).unwrap();
        assert_eq!(chosen.branch, 1, "bfs beats greedy and no program on these grids");
        let children: Vec<&Candidate> = planners.iter().filter(|c| c.task_index == task).collect();
        assert!(children.iter().all(|c| c.parent_id == Some(chosen.node_id) && c.node_id >= 3));
        assert!(children.iter().all(|c| c.reply.prompt_text.contains("print(bfs(grid, S, G))")));
    }
    assert!(finished.iter().all(|f| f.success && f.turns == 1), "{finished:?}");
    let again = play(Started::Local(&games()), &setup(RolloutMode::Tree), &mut Scripted, &sandbox, &Quiet).unwrap();
    assert_eq!(again.candidates, candidates);
}

/// Keeps every advance it is told of: (units, tokens).
#[derive(Default)]
struct Tally(Mutex<Vec<(f64, u64)>>);

impl Progress for Tally {
    fn start(&self, _label: &str, _total: u64, _unit: &'static str) {}
    fn advance(&self, units: f64, tokens: u64) {
        self.0.lock().unwrap().push((units, tokens));
    }
    fn finish(&self) {}
}

#[test]
fn progress_moves_with_every_reply_and_counts_each_episode_and_token_once() {
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let tally = Tally::default();
    let played =
        play(Started::Local(&games()), &setup(RolloutMode::Independent), &mut Scripted, &sandbox, &tally).unwrap();
    let advances = tally.0.into_inner().unwrap();
    let units: f64 = advances.iter().map(|a| a.0).sum();
    assert!(
        (units - played.finished.len() as f64).abs() < 1e-9,
        "{units} units for {} episodes",
        played.finished.len()
    );
    let tokens: u64 = advances.iter().map(|a| a.1).sum();
    assert_eq!(tokens, played.candidates.iter().map(|c| c.reply.tokens.len() as u64).sum::<u64>());
    let replies: Vec<f64> = advances.iter().filter(|a| a.1 > 0).map(|a| a.0).collect();
    assert_eq!(replies.len(), played.candidates.len(), "each reply moves the bar as it comes");
    // One turn of two roles: every tool agent's reply is half an episode.
    let tool_step: f64 = replies[..replies.len() / 2].iter().sum();
    assert!((tool_step - played.finished.len() as f64 / 2.0).abs() < 1e-9, "{tool_step}");
    assert!(played.sandbox_seconds > 0.0, "the tool programs ran in the sandbox");
}

#[test]
fn an_episode_ending_early_counts_what_its_unplayed_steps_were_worth() {
    let mut shares = steps::EpisodeShares::new(2, 4);
    assert_eq!(shares.take_step(0), 0.25);
    assert_eq!(shares.take_step(0), 0.25);
    assert_eq!(shares.take_rest(0), 0.5, "ended after two of four steps");
    assert_eq!(shares.take_rest(0), 0.0, "counted once");
    let past_the_bound: f64 = (0..6).map(|_| shares.take_step(1)).sum();
    assert_eq!(past_the_bound + shares.take_rest(1), 1.0, "an episode longer than the bound is still one");
}

#[test]
fn alone_the_tool_agent_keeps_its_success_and_the_planner_has_nothing_to_copy() {
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let together = setup(RolloutMode::Independent);
    let apart = Setup { alone: true, ..together.clone() };
    let team = play(Started::Local(&games()), &together, &mut Scripted, &sandbox, &Quiet).unwrap().finished;
    let alone = play(Started::Local(&games()), &apart, &mut Scripted, &sandbox, &Quiet).unwrap().finished;
    let successes = |f: &[Finished], tool: bool| -> Vec<bool> {
        f.iter().map(|f| if tool { f.tool_success } else { f.success }).collect()
    };
    assert!(successes(&team, false).contains(&true), "{team:?}");
    assert_eq!(successes(&team, true), successes(&team, false), "the planner copies the tool's answer");
    assert_eq!(successes(&alone, true), successes(&team, true), "the same tool replies");
    assert!(!successes(&alone, false).contains(&true), "{alone:?}");
}

/// Players always take the first cell the prompt lists as empty.
struct FirstEmptyCell;

impl Responder for FirstEmptyCell {
    fn respond(&mut self, _policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
        let mut replies = Scripted.respond("", prompts)?;
        for (reply, prompt) in replies.iter_mut().zip(prompts) {
            let listed = prompt.text.lines().rev().find_map(|l| l.strip_prefix("Empty cells: ")).unwrap();
            reply.text = format!("#### {}", listed.split_whitespace().next().unwrap());
        }
        Ok(replies)
    }
}

#[test]
fn the_minimax_opponent_plays_o_unsampled_and_denies_the_win_self_play_gives_x() {
    let empty = AnyEnv::TicTacToe(TicTacToe::from_instance(r#"{"board": ["...", "...", "..."]}"#).unwrap());
    let games = vec![Game { task_id: "empty".into(), env: empty }];
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let self_play = Setup {
        workflow: WorkflowKind::TwoPlayers,
        max_turns: 5,
        alone: false,
        opponent: None,
        policies: HashMap::from([(Agent::PLAYER_X, "shared".into()), (Agent::PLAYER_O, "shared".into())]),
        league: HashMap::new(),
        branching: Branching::Independent { episodes: 1 },
        seed_keys: vec![1],
        overlong_prompt: OverlongPrompt::Error,
    };
    let played = play(Started::Local(&games), &self_play, &mut FirstEmptyCell, &sandbox, &Quiet).unwrap();
    assert!(played.finished[0].success, "first-free-cell O lets X complete the diagonal");

    let policies = HashMap::from([(Agent::PLAYER_X, "shared".into())]);
    let minimax = Setup { opponent: Some(Agent::PLAYER_O), policies, ..self_play };
    let played = play(Started::Local(&games), &minimax, &mut FirstEmptyCell, &sandbox, &Quiet).unwrap();
    assert!(!played.finished[0].success, "{:?}", played.finished);
    assert!(played.candidates.iter().all(|c| c.agent == Agent::PLAYER_X));
    assert!(played.candidates.len() >= 2, "X moved more than once: O answered in between");
}

#[test]
fn independent_mode_plays_k_separate_episodes() {
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let Played { candidates, finished, .. } =
        play(Started::Local(&games()), &setup(RolloutMode::Independent), &mut Scripted, &sandbox, &Quiet).unwrap();
    assert_eq!(finished.len(), 2 * 3);
    assert_eq!(candidates.len(), 2 * 3 * 2);
    assert!(candidates.iter().all(|c| c.selected && c.branch == 0));
    let seeds: std::collections::HashSet<u64> = candidates.iter().map(|c| c.seed).collect();
    assert_eq!(seeds.len(), candidates.len(), "every reply has its own stream");
    // Episode e of each task got the e-th tool reply of its batch.
    let bfs = finished.iter().filter(|f| f.success).count();
    assert!(bfs >= 2, "{finished:?}");
}

/// The main agent calls `aux`; the helper writes no function at first, then, once shown
/// its team's failed program, a right `aux` on even branches. Counts its calls per policy.
#[derive(Default)]
struct Collaborators {
    calls: Vec<(String, usize)>,
}

impl Responder for Collaborators {
    fn respond(&mut self, policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::engine::Error> {
        self.calls.push((policy.to_string(), prompts.len()));
        let mut replies = Scripted.respond(policy, prompts)?;
        for (i, (reply, prompt)) in replies.iter_mut().zip(prompts).enumerate() {
            reply.text = if prompt.text.starts_with("Create a helper function") {
                let shown = prompt.text.contains("Your team's previous program");
                if shown && i % 2 == 0 {
                    "```python\ndef aux(x):\n    return 2 * x\n```".into()
                } else {
                    "no idea".into()
                }
            } else {
                assert!(prompt.text.starts_with("Solve this coding problem"), "{}", prompt.text);
                assert!(prompt.text.contains("def f(x: int):"), "the main agent is shown its function's parameters");
                "```python\ndef aux(x):\n    return 0\n\ndef f(x: int):\n    return aux(x) + 1\n```".into()
            };
        }
        Ok(replies)
    }
}

#[test]
fn agents_that_answer_at_once_are_sampled_together_and_judged_as_one_program() {
    let test = |x: i32| crate::envs::code::TestCase { input: format!("({x},)\n"), output: format!("{}\n", 2 * x + 1) };
    let instance = crate::envs::code::Instance {
        problem: "Complete this Python function:\n\nimport math\n\ndef f(x: int):\n    \"\"\"2x + 1\"\"\"\n".into(),
        public_tests: vec![],
        tests: vec![test(1), test(5)],
        solution: None,
        entry_point: Some("f".into()),
    };
    let code = crate::envs::code::Code::new(&crate::envs::code::CodeConfig::default(), instance);
    let games = vec![Game { task_id: "c".into(), env: AnyEnv::Code(code) }];
    let setup = Setup {
        workflow: WorkflowKind::CodeCollab,
        max_turns: 2,
        policies: HashMap::from([(Agent::MAIN, "main_p".into()), (Agent::HELPER, "helper_p".into())]),
        league: HashMap::new(),
        branching: Branching::new(RolloutMode::Tree, 2, Selection::BestReward, 1.0),
        ..setup(RolloutMode::Tree)
    };
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let mut responder = Collaborators::default();
    let Played { candidates, finished, .. } =
        play(Started::Local(&games), &setup, &mut responder, &sandbox, &Quiet).unwrap();
    // Each step: both agents' two branches, in one call per policy.
    let call = |policy: &str| (policy.to_string(), 2);
    assert_eq!(responder.calls, [call("main_p"), call("helper_p"), call("main_p"), call("helper_p")]);
    let rows: Vec<(u32, Agent, u32, u32, bool, f64, f64)> = candidates
        .iter()
        .map(|c| (c.turn, c.agent, c.branch, c.node_id, c.selected, c.outcome.team_reward, c.outcome.local_reward))
        .collect();
    let none = crate::workflows::NO_ANSWER;
    assert_eq!(
        rows,
        [
            (0, Agent::MAIN, 0, 0, true, 0.0, 0.0),
            (0, Agent::HELPER, 0, 1, true, 0.0, none),
            (0, Agent::MAIN, 1, 2, false, 0.0, 0.0),
            (0, Agent::HELPER, 1, 3, false, 0.0, none),
            (1, Agent::MAIN, 0, 4, true, 1.0, 0.0),
            (1, Agent::HELPER, 0, 5, true, 1.0, 0.0),
            (1, Agent::MAIN, 1, 6, false, 0.0, 0.0),
            (1, Agent::HELPER, 1, 7, false, 0.0, none),
        ],
        "the main agent's own aux is dropped: the joint program calls the helper's"
    );
    let (first, second) = candidates.split_at(4);
    assert!(first.iter().all(|c| c.parent_id.is_none() && !c.outcome.done));
    assert!(second.iter().all(|c| c.parent_id == Some(0) && c.outcome.done), "the last turn ends every branch");
    assert!(second.iter().all(|c| c.message.contains("Passed 0 of 2 hidden tests.")), "{}", second[0].message);
    assert_ne!(candidates[0].seed, candidates[1].seed, "each agent has its own stream");
    assert!(finished[0].success && finished[0].turns == 2, "{finished:?}");
}
