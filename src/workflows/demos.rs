//! Warm-start demonstrations: whole episodes played by a scripted demonstrator through
//! the real workflow, so every prompt is exactly what the workflow builds.
//!
//! The demonstrator is imperfect in its *choices*, never by noise in an answer (a
//! measured prototype showed that noise is erased by greedy decoding and leaves RL
//! nothing to fix, while choice-level imperfection lets AT-GRPO lift a weak team):
//!
//! | env | tool agent program | planner / player |
//! |---|---|---|
//! | Plan-Path | `bfs` / `greedy` / `random_walk` / broken, shares from `env.demonstrations` (default 15/45/30/10) | adopts the tool's answer (`#### tool`) with `planner_copies_tool` (0.45), else its own path: BFS 30%, a corrupted BFS path 70% (one move inserted, truncated, one move replaced, or a random walk, as in the prototype) |
//! | Sudoku | `solve` 15%, `first_fit` 45%, prints the grid unchanged 30%, broken 10% | adopts 45%, else the solution 30% or `first_fit`'s grid 70% |
//! | Sokoban | `solve` 30%, prints a guessed move string 60%, broken 10% | adopts 45%, else the solution 30% or random moves 70% |
//! | Tic-tac-toe | — | each player: the minimax move 30%, the first free cell 70% |
//!
//! Broken programs either swap arguments (a valid but wrong output) or fail (the
//! error the sandbox reports, captured once by running them).
//! Tool outputs of the helpers are computed by their Rust twins (tests keep them equal
//! to the Python helpers), so generating thousands of demonstrations needs no sandbox.

use std::collections::HashMap;

use crate::envs::moves::{Move, format_moves};
use crate::envs::plan_path::PlanPathDemonstrations;
use crate::envs::{AnyEnv, Env, plan_path, sudoku};
use crate::rng::SplitMix64;
use crate::sandbox::{Program, RunOutput, Sandbox, Status};

use super::{ADOPT_TOOL_ANSWER, Agent, Episode, tool_preamble};

/// One demonstrated reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Demo {
    pub turn: u32,
    pub agent: Agent,
    pub prompt: String,
    pub response: String,
    pub choice: &'static str,
    pub local_reward: f64,
}

/// Programs that fail whatever the instance; their output is captured once.
const FAILING: [(&str, &str); 6] = [
    ("plan_path", "print(bfs(grid, S))"),
    ("plan_path", "print(path)"),
    ("sudoku", "print(solve(grid, N))"),
    ("sudoku", "print(solution)"),
    ("sokoban", "print(solve())"),
    ("sokoban", "print(moves)"),
];

/// The demonstrator: choice shares plus the captured outputs of failing programs.
#[derive(Debug, Clone)]
pub struct Demonstrator {
    plan_path: PlanPathDemonstrations,
    failing: HashMap<&'static str, RunOutput>,
}

fn fenced(program: &str) -> String {
    format!("```python\n{program}\n```")
}

fn printed(text: String) -> RunOutput {
    RunOutput {
        status: Status::Exited(0),
        stdout: format!("{text}\n"),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        elapsed: std::time::Duration::ZERO,
    }
}

/// Picks an index by shares (which sum to 1).
fn pick(rng: &mut SplitMix64, shares: &[f64]) -> usize {
    let x = rng.unit();
    let mut total = 0.0;
    for (i, share) in shares.iter().enumerate() {
        total += share;
        if x < total {
            return i;
        }
    }
    shares.len() - 1
}

impl Demonstrator {
    /// Runs the failing programs once on `env`'s instance to capture their errors.
    pub fn new(
        plan_path: PlanPathDemonstrations,
        env: &AnyEnv,
        sandbox: &Sandbox,
    ) -> Result<Demonstrator, crate::sandbox::Error> {
        let mut failing = HashMap::new();
        for (_, program) in FAILING.iter().filter(|(name, _)| *name == env.name()) {
            let run = sandbox.run(&Program::new(format!("{}\n{program}\n", tool_preamble(env))))?;
            failing.insert(*program, run);
        }
        Ok(Demonstrator { plan_path, failing })
    }

    /// Plays one episode; `rng` drives every choice.
    pub fn play(&self, mut episode: Episode, rng: &mut SplitMix64, sandbox: &Sandbox) -> Vec<Demo> {
        let mut demos = Vec::new();
        let mut tool_output: Option<String> = None;
        while let Some(agent) = episode.next_agent() {
            let prompt = episode.prompt();
            let turn = episode.turn();
            let (response, choice, run) = if agent == Agent::TOOL {
                let (program, choice, run) = self.tool(episode.env(), rng);
                tool_output = run.ok().then(|| run.stdout.trim().to_string());
                (fenced(&program), choice, Some(run))
            } else {
                let (answer, choice) = self.answer(episode.env(), tool_output.take(), rng);
                (format!("#### {answer}"), choice, None)
            };
            let outcome = episode.step_with(&response, run, sandbox);
            demos.push(Demo { turn, agent, prompt, response, choice, local_reward: outcome.local_reward });
        }
        demos
    }

    fn failing(&self, program: &'static str) -> (String, &'static str, RunOutput) {
        (program.to_string(), "tool_broken", self.failing[program].clone())
    }

    fn tool(&self, env: &AnyEnv, rng: &mut SplitMix64) -> (String, &'static str, RunOutput) {
        match env {
            AnyEnv::PlanPath(e) => {
                let (grid, s, g) = (e.grid(), e.position(), e.goal());
                let d = &self.plan_path;
                let moves = |m: Option<Vec<Move>>| printed(m.map_or("None".to_string(), |m| format_moves(&m)));
                match pick(rng, &[d.tool_bfs, d.tool_greedy, d.tool_random_walk, d.tool_broken]) {
                    0 => ("print(bfs(grid, S, G))".into(), "tool_bfs", moves(plan_path::bfs(grid, s, g))),
                    1 => {
                        ("print(greedy(grid, S, G))".into(), "tool_greedy", moves(Some(plan_path::greedy(grid, s, g))))
                    }
                    2 => (
                        "print(random_walk(grid, S, G))".into(),
                        "tool_random_walk",
                        moves(Some(plan_path::random_walk(grid, s, g, 0))),
                    ),
                    _ => match rng.below(4) {
                        0 => ("print(bfs(grid, G, S))".into(), "tool_broken", moves(plan_path::bfs(grid, g, s))),
                        1 => (
                            "print(greedy(grid, G, S))".into(),
                            "tool_broken",
                            moves(Some(plan_path::greedy(grid, g, s))),
                        ),
                        2 => self.failing("print(bfs(grid, S))"),
                        _ => self.failing("print(path)"),
                    },
                }
            }
            AnyEnv::Sudoku(e) => match pick(rng, &[0.15, 0.45, 0.30, 0.10]) {
                0 => (
                    "print(solve(grid))".into(),
                    "tool_solve",
                    printed(format!("{:?}", sudoku::solve(e.board()).unwrap_or_default())),
                ),
                1 => (
                    "print(first_fit(grid))".into(),
                    "tool_first_fit",
                    printed(format!("{:?}", sudoku::first_fit(e.board()))),
                ),
                2 => ("print(grid)".into(), "tool_echo", printed(format!("{:?}", e.board()))),
                _ => self.failing(if rng.chance(0.5) { "print(solve(grid, N))" } else { "print(solution)" }),
            },
            AnyEnv::Sokoban(e) => match pick(rng, &[0.30, 0.60, 0.10]) {
                0 => (
                    "print(solve(room))".into(),
                    "tool_solve",
                    printed(e.solve().map_or("None".into(), |m| format_moves(&m))),
                ),
                1 => {
                    let guess = random_moves(rng, e.solve().map_or(4, |m| m.len()));
                    (format!("print('{guess}')"), "tool_guess", printed(guess))
                }
                _ => self.failing(if rng.chance(0.5) { "print(solve())" } else { "print(moves)" }),
            },
            AnyEnv::TicTacToe(_) | AnyEnv::Math(_) | AnyEnv::Code(_) => {
                unreachable!("no tool agent demonstrations for {}", env.name())
            }
        }
    }

    /// The planner's (or a player's or single agent's) final answer.
    fn answer(&self, env: &AnyEnv, tool_output: Option<String>, rng: &mut SplitMix64) -> (String, &'static str) {
        let copies = match env {
            AnyEnv::PlanPath(_) => self.plan_path.planner_copies_tool,
            _ => 0.45,
        };
        // Copy only an output that parses as an answer (an error message is not one).
        let parses = |text: &str| match env {
            AnyEnv::PlanPath(e) => e.parse(text).is_ok(),
            AnyEnv::Sudoku(e) => e.parse(text).is_ok(),
            AnyEnv::Sokoban(e) => e.parse(text).is_ok(),
            _ => false,
        };
        if tool_output.is_some_and(|o| !o.is_empty() && parses(&o)) && rng.chance(copies) {
            return (ADOPT_TOOL_ANSWER.to_string(), "planner_copy");
        }
        let own_right = rng.chance(0.3);
        match env {
            AnyEnv::PlanPath(e) => {
                let path = e.solve().unwrap_or_default();
                if own_right {
                    (format_moves(&path), "planner_own_bfs")
                } else {
                    (format_moves(&corrupt(&path, rng)), "planner_own_corrupt")
                }
            }
            AnyEnv::Sudoku(e) => {
                if own_right {
                    (format!("{:?}", sudoku::solve(e.board()).unwrap_or_default()), "planner_own_solve")
                } else {
                    (format!("{:?}", sudoku::first_fit(e.board())), "planner_own_first_fit")
                }
            }
            AnyEnv::Sokoban(e) => {
                let solution = e.solve().unwrap_or_default();
                if own_right {
                    (format_moves(&solution), "planner_own_solve")
                } else {
                    (random_moves(rng, solution.len().max(2)), "planner_own_random")
                }
            }
            AnyEnv::TicTacToe(game) => {
                let cell = if own_right {
                    game.best_move().unwrap_or(0)
                } else {
                    game.cells().iter().position(Option::is_none).unwrap_or(0)
                };
                let choice = if own_right { "player_minimax" } else { "player_first_free" };
                (game.format_action(&cell), choice)
            }
            AnyEnv::Math(_) | AnyEnv::Code(_) => {
                unreachable!("no demonstrations for {}", env.name())
            }
        }
    }
}

fn random_moves(rng: &mut SplitMix64, n: usize) -> String {
    (0..n).map(|_| ["U", "D", "L", "R"][rng.below(4)]).collect()
}

/// The prototype's corruption of a path: insert a move (35%), truncate (25%), replace
/// a move (20%), or a random walk as long as the path plus up to 3 (20%).
fn corrupt(path: &[Move], rng: &mut SplitMix64) -> Vec<Move> {
    let mut p = path.to_vec();
    let x = rng.unit();
    if x < 0.35 || p.is_empty() {
        let at = rng.below(p.len() + 1);
        p.insert(at, Move::ALL[rng.below(4)].clone());
    } else if x < 0.6 {
        p.truncate(rng.below(p.len()));
    } else if x < 0.8 {
        let at = rng.below(p.len());
        let others: Vec<Move> = Move::ALL.iter().filter(|m| **m != p[at]).cloned().collect();
        p[at] = others[rng.below(3)].clone();
    } else {
        let n = 1 + rng.below(path.len() + 3);
        p = (0..n).map(|_| Move::ALL[rng.below(4)].clone()).collect();
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::{PlanPath, Sokoban, Sudoku, TicTacToe};
    use crate::envs::{PlanPathConfig, SokobanConfig, SudokuConfig};
    use crate::sandbox::SandboxConfig;
    use crate::workflows::WorkflowKind;

    #[test]
    fn plan_path_demonstrations_follow_the_configured_choice_mix() {
        let sb = Sandbox::new(SandboxConfig::default()).unwrap();
        let config = PlanPathConfig::default();
        let first = AnyEnv::PlanPath(PlanPath::generate(&config, 0));
        let demonstrator = Demonstrator::new(config.demonstrations.clone(), &first, &sb).unwrap();
        let mut rng = SplitMix64::new(1);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut copies_right = 0;
        for i in 0..2000 {
            let env = AnyEnv::PlanPath(PlanPath::generate(&config, i));
            let episode = Episode::new(WorkflowKind::ToolPlanner, env, 1).unwrap();
            let demos = demonstrator.play(episode.clone(), &mut rng, &sb);
            assert_eq!(demos.len(), 2);
            assert_eq!((demos[0].agent, demos[1].agent), (Agent::TOOL, Agent::PLANNER));
            assert_eq!(demos[0].prompt, episode.prompt(), "the exact prompt the workflow builds");
            for d in &demos {
                *counts.entry(d.choice).or_default() += 1;
            }
            if demos[0].choice == "tool_bfs" && demos[1].choice == "planner_copy" {
                copies_right += 1;
                assert!(demos[1].local_reward > 1.0, "copying bfs reaches the goal");
            }
        }
        let share = |c: &str| counts.get(c).copied().unwrap_or(0) as f64 / 2000.0;
        assert!((share("tool_bfs") - 0.15).abs() < 0.03, "{counts:?}");
        assert!((share("tool_greedy") - 0.45).abs() < 0.03, "{counts:?}");
        assert!((share("tool_random_walk") - 0.30).abs() < 0.03, "{counts:?}");
        assert!((share("tool_broken") - 0.10).abs() < 0.03, "{counts:?}");
        // Copies happen when the output parses (not after a failing program): ≈ 0.45 · 0.95.
        assert!((share("planner_copy") - 0.43).abs() < 0.04, "{counts:?}");
        assert!(copies_right > 0);
    }

    #[test]
    fn a_failing_program_shows_its_captured_error_to_the_planner() {
        let sb = Sandbox::new(SandboxConfig::default()).unwrap();
        let config = PlanPathConfig::default();
        let env = AnyEnv::PlanPath(PlanPath::generate(&config, 0));
        let all_broken = PlanPathDemonstrations {
            tool_bfs: 0.0,
            tool_greedy: 0.0,
            tool_random_walk: 0.0,
            tool_broken: 1.0,
            planner_copies_tool: 1.0,
        };
        let demonstrator = Demonstrator::new(all_broken, &env, &sb).unwrap();
        let mut rng = SplitMix64::new(3);
        let mut seen_error = false;
        for _ in 0..20 {
            let episode = Episode::new(WorkflowKind::ToolPlanner, env.clone(), 1).unwrap();
            let demos = demonstrator.play(episode, &mut rng, &sb);
            if demos[0].response.contains("print(path)") {
                assert!(
                    demos[1].prompt.contains("The program failed: NameError: name 'path' is not defined"),
                    "{}",
                    demos[1].prompt
                );
                assert_ne!(demos[1].choice, "planner_copy");
                seen_error = true;
            }
        }
        assert!(seen_error);
    }

    #[test]
    fn other_games_get_demonstrations_too() {
        let sb = Sandbox::new(SandboxConfig::default()).unwrap();
        let mut rng = SplitMix64::new(5);
        let envs = [
            (AnyEnv::Sudoku(Sudoku::generate(&SudokuConfig::default(), 1)), WorkflowKind::ToolPlanner),
            (AnyEnv::Sokoban(Sokoban::generate(&SokobanConfig::default(), 1)), WorkflowKind::ToolPlanner),
            (AnyEnv::TicTacToe(TicTacToe::generate(1)), WorkflowKind::TwoPlayers),
        ];
        for (env, kind) in envs {
            let demonstrator = Demonstrator::new(PlanPathDemonstrations::default(), &env, &sb).unwrap();
            let mut solved = 0;
            for _ in 0..50 {
                let demos = demonstrator.play(Episode::new(kind, env.clone(), 4).unwrap(), &mut rng, &sb);
                assert!(!demos.is_empty());
                solved += demos.iter().any(|d| d.choice == "tool_solve" || d.choice == "player_minimax") as usize;
            }
            assert!(solved > 0 && solved < 50, "{}: {solved}", env.name());
        }
    }

    #[test]
    fn corruption_changes_the_path() {
        let mut rng = SplitMix64::new(9);
        let path = vec![Move::Right, Move::Right, Move::Down];
        let changed = (0..100).filter(|_| corrupt(&path, &mut rng) != path).count();
        assert!(changed > 90, "{changed}");
    }
}
