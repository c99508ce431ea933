//! Every workflow plays whole episodes with scripted replies.

use super::WorkflowKind as W;
use super::*;
use crate::envs::code::{Instance as CodeInstance, TestCase};
use crate::envs::{
    Code, CodeConfig, Math, MathConfig, PlanPath, PlanPathConfig, Sokoban, SokobanConfig, Sudoku, TicTacToe,
};
use crate::sandbox::SandboxConfig;

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig::default()).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// S . G / . # . / . . .
fn plan_path() -> AnyEnv {
    let json = r#"{"grid": ["...", ".#.", "..."], "start": [0, 0], "goal": [0, 2]}"#;
    AnyEnv::PlanPath(PlanPath::from_instance(&PlanPathConfig::default(), json).unwrap())
}

fn python(code: &str) -> String {
    format!("Here is my program.\n```python\n{code}\n```")
}

#[test]
fn tool_and_planner_play_plan_path_to_the_goal() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolPlanner, plan_path(), 2).unwrap();
    assert_eq!((episode.next_agent(), episode.turn()), (Some(Agent::TOOL), 0));
    let prompt = episode.prompt();
    assert!(prompt.starts_with("You are the tool agent of a team of two."), "{prompt}");
    assert!(prompt.contains("Current state:\nS.G\n.#.\n...\nS = (0, 0) (you), G = (0, 2)"), "{prompt}");
    assert!(prompt.contains("bfs(grid, S, G): the moves of a shortest path"), "{prompt}");

    let tool = episode.step(&python("print(bfs(grid, S, G))"), &sb);
    assert_eq!(tool.agent, Agent::TOOL);
    assert_eq!(tool.action.as_deref(), Some(r#"["R","R"]"#));
    assert!(close(tool.local_reward, 3.49), "simulated on a copy: {}", tool.local_reward);
    assert_eq!((tool.team_reward, tool.done, tool.success), (0.0, false, false), "the real state did not move");
    assert_eq!(tool.feedback.as_deref(), Some("RR"));

    assert_eq!(episode.next_agent(), Some(Agent::PLANNER));
    let prompt = episode.prompt();
    assert!(prompt.starts_with("You are the planner of a team of two."), "{prompt}");
    assert!(prompt.contains("S = (0, 0) (you)"), "{prompt}");
    assert!(
        prompt.contains("Tool agent's program:\n```python\nprint(bfs(grid, S, G))\n```\nIts output:\nRR"),
        "{prompt}"
    );
    assert!(!prompt.contains("So far"), "the tool's turn is shown in full, not repeated as history: {prompt}");
    assert!(prompt.contains("End your reply with the moves after ####, for example: #### RRDL"), "{prompt}");
    assert!(prompt.ends_with("end your reply with: #### tool"), "{prompt}");

    // `#### tool` adopts the tool's answer, RR.
    let planner = episode.step("The tool is right.\n#### tool", &sb);
    assert_eq!(planner.action.as_deref(), Some(r#"["R","R"]"#));
    assert!(close(planner.local_reward, 3.49));
    assert_eq!((planner.team_reward, planner.done, planner.success), (1.0, true, true));
    assert_eq!(episode.next_agent(), None);
}

#[test]
fn agents_alone_keep_their_rewards_but_not_each_others_output() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolPlanner, plan_path(), 1).unwrap().alone().unwrap();
    let tool = episode.step(&python("print(bfs(grid, S, G))"), &sb);
    assert!(close(tool.local_reward, 3.49), "the tool agent is still scored on a copy");
    assert!(episode.tool_success() && !episode.success(), "its answer solves the task, but only on the copy");

    let prompt = episode.prompt();
    assert!(prompt.starts_with("You are the planner of a team of two."), "{prompt}");
    assert!(!prompt.contains("Its output") && !prompt.contains("Turn 1, tool"), "{prompt}");
    let planner = episode.step("#### tool", &sb);
    assert_ne!(planner.action.as_deref(), Some(r#"["R","R"]"#), "there is no tool answer to adopt");
    assert!(planner.done && !planner.success);

    let single = Episode::new(W::SingleAgent, plan_path(), 1).unwrap();
    assert!(matches!(single.alone(), Err(Error::NotAlone { workflow: W::SingleAgent })));
    let two_turns = Episode::new(W::ToolPlanner, plan_path(), 2).unwrap();
    assert!(matches!(two_turns.alone(), Err(Error::AloneOverTurns { max_turns: 2 })));
}

#[test]
fn a_wrong_tool_and_a_failing_program_are_shown_and_penalised() {
    let sb = sandbox();
    // S . # / . # G / . . .   greedy stops after one move; the planner finds its own way.
    let json = r#"{"grid": ["..#", ".#.", "..."], "start": [0, 0], "goal": [1, 2]}"#;
    let env = AnyEnv::PlanPath(PlanPath::from_instance(&PlanPathConfig::default(), json).unwrap());
    let mut episode = Episode::new(W::ToolPlanner, env, 2).unwrap();
    let tool = episode.step(&python("print(greedy(grid, S, G))"), &sb);
    assert_eq!(tool.action.as_deref(), Some(r#"["R"]"#));
    assert!(!episode.tool_success());
    let planner = episode.step("#### D", &sb);
    assert!(!planner.done);
    assert_eq!(episode.turn(), 1);

    // Turn 2: the program crashes; its error line reaches the planner.
    let tool = episode.step(&python("print(bfs(grid, S))"), &sb);
    assert_eq!(tool.local_reward, NO_ANSWER);
    assert!(tool.parse_error.unwrap().starts_with("the program's output holds no answer"));
    let prompt = episode.prompt();
    assert!(
        prompt.contains("The program failed: TypeError: bfs() missing 1 required positional argument: 'g'"),
        "{prompt}"
    );
    assert!(prompt.contains("S = (1, 0) (you)"), "the planner sees the current position: {prompt}");
    let planner = episode.step("No tool help.\n#### DRRU", &sb);
    assert!(planner.success && planner.done);

    // A tool reply without a program.
    let mut episode = Episode::new(W::ToolPlanner, plan_path(), 1).unwrap();
    let tool = episode.step("I would go right twice.", &sb);
    assert_eq!((tool.local_reward, tool.action.as_deref()), (NO_ANSWER, None));
    assert!(episode.prompt().contains("The tool agent wrote no program."));
    let planner = episode.step("no idea", &sb);
    assert_eq!(planner.local_reward, NO_ANSWER);
    assert!(planner.done && !planner.success, "max_turns = 1 ends the episode");
}

#[test]
fn a_real_llm_may_write_its_own_search_code() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolPlanner, plan_path(), 1).unwrap();
    let own = "from collections import deque\n\
               q = deque([(S, '')]); seen = {S}\n\
               while q:\n\
               \x20   (r, c), p = q.popleft()\n\
               \x20   if (r, c) == G:\n\
               \x20       print('**Actions List**:', list(p)); break\n\
               \x20   for m, (dr, dc) in MOVES.items():\n\
               \x20       n = (r + dr, c + dc)\n\
               \x20       if 0 <= n[0] < len(grid) and 0 <= n[1] < len(grid) and grid[n[0]][n[1]] != '#' and n not in seen:\n\
               \x20           seen.add(n); q.append((n, p + m))";
    let tool = episode.step(&python(own), &sb);
    assert_eq!(tool.action.as_deref(), Some(r#"["R","R"]"#), "{:?}", tool.feedback);
}

#[test]
fn single_agent_plays_until_the_turns_run_out() {
    let sb = sandbox();
    let mut episode = Episode::new(W::SingleAgent, plan_path(), 2).unwrap();
    assert!(episode.prompt().starts_with("You solve the task on your own."));
    let first = episode.step("#### D", &sb);
    assert!(!first.done && episode.turn() == 1);
    assert!(episode.prompt().contains("So far:\nTurn 1, agent: [\"D\"] -> Executed 1 of 1 moves; now at (1, 0)."));
    let second = episode.step("#### L", &sb);
    assert!(second.done && !second.success);
    assert_eq!(episode.next_agent(), None);
}

#[test]
fn tool_and_planner_play_sudoku_and_sokoban() {
    let sb = sandbox();
    let sudoku = Sudoku::from_instance(r#"{"puzzle": [[1,0,3,4],[3,4,0,2],[2,1,4,0],[0,3,2,1]]}"#).unwrap();
    let mut episode = Episode::new(W::ToolPlanner, AnyEnv::Sudoku(sudoku), 1).unwrap();
    let tool = episode.step(&python("print(solve(grid))"), &sb);
    assert!(close(tool.local_reward, 4.0 * 0.09 + 2.0), "{}", tool.local_reward);
    assert_eq!(tool.feedback.as_deref(), Some("[[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]"));
    let planner = episode.step("#### [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]", &sb);
    assert!(planner.success && planner.done);

    let json = serde_json::json!({"room": ["######", "#@$ .#", "#    #", "#    #", "#    #", "######"]}).to_string();
    let sokoban = Sokoban::from_instance(&SokobanConfig::default(), &json).unwrap();
    let mut episode = Episode::new(W::ToolPlanner, AnyEnv::Sokoban(sokoban), 1).unwrap();
    let tool = episode.step(&python("print(solve(room))"), &sb);
    assert_eq!(tool.action.as_deref(), Some(r#"["R","R"]"#));
    let planner = episode.step("#### RR", &sb);
    assert!(planner.success);
}

fn math() -> AnyEnv {
    let instance = crate::envs::math::Instance {
        problem: "What is 1/4 + 1/4?".into(),
        answer: "\\frac{1}{2}".into(),
        entry: None,
    };
    AnyEnv::Math(Math::new(&MathConfig::default(), instance))
}

/// `env.tool_timeout_seconds` is the tool program's limit: a program that would finish
/// in 3 s under the sandbox's 20 s default is stopped at 1 s.
#[test]
fn a_math_tool_program_stops_at_the_envs_tool_timeout() {
    let sb = sandbox();
    let instance = crate::envs::math::Instance { problem: "1 + 1?".into(), answer: "2".into(), entry: None };
    let config = MathConfig { tool_timeout_seconds: 1.0, ..MathConfig::default() };
    let mut episode = Episode::new(W::ToolReasoner, AnyEnv::Math(Math::new(&config, instance)), 4).unwrap();
    let reply = python("import time\ntime.sleep(3)\nprint(2)");
    let program = episode.tool_program(&reply).unwrap();
    assert_eq!(program.timeout, Some(std::time::Duration::from_secs(1)));
    let tool = episode.step(&reply, &sb);
    assert_eq!(tool.feedback.as_deref(), Some("The program failed: timeout"));
    assert_eq!(tool.action, None, "a program stopped before printing gives no answer");
}

#[test]
fn tool_and_reasoner_stop_when_they_agree() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolReasoner, math(), 4).unwrap();
    assert!(episode.prompt().contains("Problem: What is 1/4 + 1/4?"));
    let tool = episode.step(&python("print(1/4 + 1/4)"), &sb);
    assert_eq!((tool.local_reward, tool.action.as_deref()), (1.0, Some("\"0.5\"")));
    assert!(episode.prompt().contains("Its output:\n0.5"));
    // The reasoner disagrees: the episode goes on.
    let reasoner = episode.step("It is \\boxed{1}", &sb);
    assert_eq!((reasoner.local_reward, reasoner.done, reasoner.success), (0.0, false, false));
    // Next turn: the tool repeats itself and the reasoner now agrees.
    episode.step(&python("print(0.5)"), &sb);
    let reasoner = episode.step("So \\boxed{\\frac12}", &sb);
    assert_eq!((reasoner.local_reward, reasoner.done, reasoner.success, reasoner.team_reward), (1.0, true, true, 1.0));
    assert_eq!(reasoner.turn, 1);
}

#[test]
fn agreeing_on_a_wrong_answer_also_ends_the_episode() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolReasoner, math(), 4).unwrap();
    let tool = episode.step(&python("print(2)"), &sb);
    assert_eq!(tool.local_reward, 0.0);
    let reasoner = episode.step("#### 2", &sb);
    assert_eq!((reasoner.done, reasoner.success), (true, false));

    let mut single = Episode::new(W::SingleAgent, math(), 4).unwrap();
    let answer = single.step("\\boxed{0.5}", &sb);
    assert!(answer.done && answer.success, "a single agent answers once");
}

fn code() -> AnyEnv {
    let test = |i: &str, o: &str| TestCase { input: i.into(), output: o.into() };
    let instance = CodeInstance {
        problem: "Read two integers and print their sum.".into(),
        public_tests: vec![test("1 2\n", "3\n")],
        tests: vec![test("1 2\n", "3\n"), test("-4 9\n", "5\n")],
        solution: Some("a, b = map(int, input().split())\nprint(a + b)".into()),
        entry_point: None,
    };
    AnyEnv::Code(Code::new(&CodeConfig { test_timeout_seconds: 10.0, ..CodeConfig::default() }, instance))
}

const SUM: &str = "a, b = map(int, input().split())\nprint(a + b)";

#[test]
fn coder_and_tester_stop_when_the_code_passes_the_tests() {
    let sb = sandbox();
    let mut episode = Episode::new(W::CoderTester, code(), 3).unwrap();
    // A wrong program (it subtracts), then a tester with one good and one wrong test.
    let coder = episode.step(&python("a, b = map(int, input().split())\nprint(a - b)"), &sb);
    assert_eq!((coder.local_reward, coder.done), (0.0, false));
    let prompt = episode.prompt();
    assert!(prompt.starts_with("You are the tester") && prompt.contains("print(a - b)"), "{prompt}");
    let tests = "**Test Input:**\n```\n2 2\n```\n**Test Output:**\n```\n4\n```\n**Test Input:**\n```\n1 1\n```\n**Test Output:**\n```\n3\n```";
    let tester = episode.step(tests, &sb);
    assert_eq!(tester.local_reward, 0.5, "the reference program passes one of its two tests");
    assert!(!tester.done);
    let prompt = episode.prompt();
    assert!(
        prompt.contains("The tester's tests on it:\n- input \"2 2\": expected \"4\", got \"0\": FAILED"),
        "{prompt}"
    );

    // The right program passes the hidden tests but not the tester's wrong test.
    let coder = episode.step(&python(SUM), &sb);
    assert_eq!((coder.local_reward, coder.done, coder.team_reward), (1.0, false, 1.0));
    let tester = episode.step("**Test Input:**\n```\n5 6\n```\n**Test Output:**\n```\n11\n```", &sb);
    assert_eq!((tester.local_reward, tester.done, tester.success), (1.0, true, true));
}

#[test]
fn a_function_task_tester_writes_asserts_judged_by_their_values() {
    let sb = sandbox();
    let test = |i: &str, o: &str| TestCase { input: i.into(), output: o.into() };
    let instance = CodeInstance {
        problem: "def join(a, b): return a + b".into(),
        public_tests: vec![test("('a', 'b')\n", "'ab'\n")],
        tests: vec![test("('a', 'b')\n", "'ab'\n")],
        solution: Some("def join(a, b):\n    return a + b".into()),
        entry_point: Some("join".into()),
    };
    let env = AnyEnv::Code(Code::new(&CodeConfig { test_timeout_seconds: 10.0, ..CodeConfig::default() }, instance));
    let mut episode = Episode::new(W::CoderTester, env, 2).unwrap();
    episode.step(&python("def join(a, b):\n    return b + a"), &sb);
    assert!(episode.prompt().contains("assert join(<arguments>) == <expected result>"));
    // Written as a model would: double quotes and spacing unlike repr's, a comment, one
    // wrong test and one whose argument is not a literal (skipped).
    let tests = "```python\nassert join(\"x\", 'y') == \"xy\"  # joins\nassert join([1],[2]) == [1,2]\n\
                 assert join('a', 'b') == 'ba'\nassert join(list(), []) == []\n```";
    let tester = episode.step(tests, &sb);
    assert_eq!(tester.local_reward, 2.0 / 3.0, "the reference passes two of the three literal tests");
    let action: Vec<TestCase> = serde_json::from_str(tester.action.as_deref().unwrap()).unwrap();
    assert_eq!(action[0], test("('x', 'y')\n", "'xy'\n"));
    assert_eq!(action[1], test("([1], [2])\n", "[1, 2]\n"));
    let prompt = episode.prompt();
    assert!(prompt.contains("- input \"([1], [2])\": expected \"[1, 2]\", got \"[2, 1]\": FAILED"), "{prompt}");
    assert!(
        prompt.contains("Turn 1, tester: assert join('x', 'y') == 'xy'; assert join([1], [2]) == [1, 2];"),
        "{prompt}"
    );
    let mut stdin_task = Episode::new(W::CoderTester, code(), 2).unwrap();
    stdin_task.step(&python(SUM), &sb);
    assert!(stdin_task.prompt().contains("**Test Input:**"), "a stdin task keeps the Input/Output blocks");
}

#[test]
fn a_single_coder_answers_once() {
    let sb = sandbox();
    let mut episode = Episode::new(W::SingleAgent, code(), 4).unwrap();
    let outcome = episode.step(&python(SUM), &sb);
    assert_eq!((outcome.local_reward, outcome.done, outcome.success), (1.0, true, true));
    assert_eq!(outcome.feedback.as_deref(), Some("Passed 2 of 2 hidden tests."));
}

#[test]
fn two_players_alternate_and_an_unreadable_reply_forfeits() {
    let sb = sandbox();
    let game = || AnyEnv::TicTacToe(TicTacToe::from_instance(r#"{"board": ["...", "...", "..."]}"#).unwrap());
    let mut episode = Episode::new(W::TwoPlayers, game(), 5).unwrap();
    for (reply, agent) in [
        ("#### 0,0", Agent::PLAYER_X),
        ("#### 1,1", Agent::PLAYER_O),
        ("#### 0,1", Agent::PLAYER_X),
        ("#### 2,2", Agent::PLAYER_O),
    ] {
        assert_eq!(episode.next_agent(), Some(agent));
        assert!(episode.prompt().contains(if agent == Agent::PLAYER_X { "You play X." } else { "You play O." }));
        episode.step(reply, &sb);
    }
    let prompt = episode.prompt();
    assert!(
        prompt.contains("Turn 2, player_x: 0,1 -> X played 0,1."),
        "moves show as the players write them: {prompt}"
    );
    let win = episode.step("#### 0,2", &sb);
    assert_eq!(
        (win.agent, win.local_reward, win.done, win.success, win.team_reward),
        (Agent::PLAYER_X, 1.0, true, true, 1.0)
    );

    let mut episode = Episode::new(W::TwoPlayers, game(), 5).unwrap();
    let forfeit = episode.step("hmm", &sb);
    assert_eq!((forfeit.local_reward, forfeit.done, forfeit.team_reward), (NO_ANSWER, true, 0.0));

    // Each player's team reward is its own result: O's forfeit is X's win, not O's.
    let mut episode = Episode::new(W::TwoPlayers, game(), 5).unwrap();
    episode.step("#### 0,0", &sb);
    let forfeit = episode.step("hmm", &sb);
    assert_eq!((forfeit.agent, forfeit.local_reward, forfeit.team_reward), (Agent::PLAYER_O, NO_ANSWER, 0.0));
    assert_eq!((forfeit.success, episode.env().team_reward()), (true, 1.0), "scored from X's side");

    // O opens when the start position has O to move.
    let start = TicTacToe::from_instance(r#"{"board": ["X..", "...", "..."]}"#).unwrap();
    let episode = Episode::new(W::TwoPlayers, AnyEnv::TicTacToe(start), 5).unwrap();
    assert_eq!(episode.next_agent(), Some(Agent::PLAYER_O));
    assert_eq!(episode.oracle_reply().as_deref(), Some("#### 1,1"));
    // The example is the only taken cell, said to be taken: copying it is not a move.
    let prompt = episode.prompt();
    assert!(prompt.ends_with("for example: #### 0,0 (0,0 is taken here: choose an empty cell)"), "{prompt}");
}

#[test]
fn clones_step_independently_and_share_the_prompt() {
    let sb = sandbox();
    let mut episode = Episode::new(W::ToolPlanner, plan_path(), 2).unwrap();
    episode.step(&python("print(bfs(grid, S, G))"), &sb);
    let branches: Vec<Episode> = (0..3).map(|_| episode.clone()).collect();
    let prompts: Vec<String> = branches.iter().map(Episode::prompt).collect();
    assert!(prompts.iter().all(|p| *p == prompts[0]));
    let mut moved = branches[0].clone();
    moved.step("#### RR", &sb);
    assert!(moved.is_done());
    assert!(!branches[1].is_done());
    assert_eq!(branches[1].prompt(), prompts[0]);
    // Clones step on worker threads.
    let outcomes: Vec<TurnOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = branches
            .into_iter()
            .zip(["#### RR", "#### D", "#### X"])
            .map(|(mut b, reply)| {
                let sb = &sb;
                s.spawn(move || b.step(reply, sb))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().map(|o| o.success).collect::<Vec<_>>(), [true, false, false]);
}

#[test]
fn a_workflow_must_fit_its_environment() {
    let err = Episode::new(W::CoderTester, plan_path(), 1).unwrap_err();
    assert_eq!(err.to_string(), "the CoderTester workflow cannot play plan_path");
}
