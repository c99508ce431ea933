//! Workflows: who acts in which order, what each agent sees, and what its reply does.
//!
//! The API the rollout uses is one value, [`Episode`]: an environment plus the
//! workflow's memory (the other agents' last outputs, tool results, a history).
//!
//! ```text
//!  let mut episode = Episode::new(kind, env, max_turns)?;        // Clone + Send
//!  while let Some(agent) = episode.next_agent() {                // role, e.g. "tool"
//!      let prompt = episode.prompt();                            // identical for every clone
//!      let reply  = model.sample(&prompt);
//!      let outcome = episode.step(&reply, &sandbox);             // TurnOutcome
//!  }
//! ```
//!
//! Tree sampling clones the episode K times, steps each clone with its own reply (from
//! any thread: `Episode` is `Send`, `Sandbox` is `Sync`), keeps the best clone and copies
//! it back over the others. A clone never shares mutable state with another.
//!
//! Rewards (r_local per agent; r_team is the environment's team reward after the step):
//! * single agent: the environment's step reward; math and code answer once.
//! * tool agent + planner (Plan-Path, Sudoku, Sokoban): the tool agent's program runs
//!   in the sandbox with the instance predefined; the action list it prints is
//!   simulated on a copy of the state, whose reward is the tool agent's; the real state
//!   does not move. The planner's answer acts on the real state.
//! * tool agent + reasoner (math): tool 1 if its printed answer is right, else 0;
//!   reasoner 1 if right, else 0. Done when both answers agree.
//! * coder + tester (code): coder = pass rate of the hidden tests; tester = the share of
//!   its tests the reference program passes (when the task has one; otherwise the share
//!   the coder's program passes). Done when the coder's program passes all the tester's
//!   tests.
//! * two players (tic-tac-toe): the mover's reward from the game; an unreadable reply
//!   forfeits.
//! * alone (tool_planner, one turn): as above, but the planner sees nothing of the tool agent's
//!   turn and cannot adopt its answer; each agent plays as a single agent would.
//! * A reply that does not parse (no program, no answer) earns [`NO_ANSWER`] and changes
//!   nothing.

pub mod demos;
pub mod prompts;

use serde::Serialize;

use crate::config::WorkflowKind;
use crate::envs::AnyEnv;
use crate::envs::code::{TestCase, TestResult, extract_program, run_tests};
use crate::envs::math::extract_output_answer;
use crate::sandbox::{Program, RunOutput, Sandbox};

/// Local reward of a reply that yields no action.
pub const NO_ANSWER: f64 = -1.0;

/// Output of a tool program shown to the teammate, at most this many characters.
const TOOL_OUTPUT_SHOWN: usize = 600;

/// History lines kept in prompts.
const HISTORY_SHOWN: usize = 6;

/// A planner's answer that adopts the tool agent's answer as it stands (`#### tool`):
/// trusting the tool is one decision, not a copy the model must get right move by move.
pub const ADOPT_TOOL_ANSWER: &str = "tool";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("the {workflow:?} workflow cannot play {env}")]
    Unsupported { workflow: WorkflowKind, env: &'static str },
    #[error("only tool_planner's agents can act alone, not {workflow:?}'s")]
    NotAlone { workflow: WorkflowKind },
    #[error("agents act alone in one turn only, not {max_turns}: over more they would share the state")]
    AloneOverTurns { max_turns: u32 },
}

/// What one agent's reply did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnOutcome {
    pub turn: u32,
    pub agent: &'static str,
    /// The parsed action as JSON; None when the reply did not parse.
    pub action: Option<String>,
    /// Why the reply did not parse.
    pub parse_error: Option<String>,
    /// Tool output or environment feedback, as later prompts show it.
    pub feedback: Option<String>,
    pub local_reward: f64,
    pub team_reward: f64,
    pub done: bool,
    pub success: bool,
}

/// The latest tool run, as the teammate sees it.
#[derive(Debug, Clone, Default)]
struct Memory {
    history: Vec<String>,
    /// Program and output of the tool agent this turn (tool_planner, tool_reasoner).
    tool_report: Option<String>,
    tool_answer: Option<String>,
    reasoner_answer: Option<String>,
    /// The coder's latest program and the tester's latest tests (coder_tester).
    code: Option<String>,
    tests: Vec<TestCase>,
    test_report: Option<String>,
}

/// One episode of a workflow on an environment.
#[derive(Debug, Clone)]
pub struct Episode {
    kind: WorkflowKind,
    env: AnyEnv,
    roles: Vec<&'static str>,
    max_turns: u32,
    turn: u32,
    next: usize,
    done: bool,
    memory: Memory,
    /// Length of the history when this turn began.
    turn_start: usize,
    /// Each agent acts alone: the planner gets neither the tool agent's report nor its answer.
    alone: bool,
    /// The tool agent's latest answer solves the task (simulated on the state it saw).
    tool_solved: bool,
}

impl Episode {
    pub fn new(kind: WorkflowKind, env: AnyEnv, max_turns: u32) -> Result<Episode, Error> {
        let fits = match kind {
            WorkflowKind::SingleAgent => !matches!(env, AnyEnv::TicTacToe(_)),
            WorkflowKind::ToolPlanner => matches!(env, AnyEnv::PlanPath(_) | AnyEnv::Sudoku(_) | AnyEnv::Sokoban(_)),
            WorkflowKind::ToolReasoner => matches!(env, AnyEnv::Math(_)),
            WorkflowKind::CoderTester => matches!(env, AnyEnv::Code(_)),
            WorkflowKind::TwoPlayers => matches!(env, AnyEnv::TicTacToe(_)),
        };
        if !fits {
            return Err(Error::Unsupported { workflow: kind, env: env.name() });
        }
        let mut roles = kind.roles().to_vec();
        // The player whose mark moves first in the start position opens every turn.
        if let AnyEnv::TicTacToe(game) = &env
            && game.to_move() == crate::envs::tic_tac_toe::Mark::O
        {
            roles.reverse();
        }
        Ok(Episode {
            kind,
            env,
            roles,
            max_turns: max_turns.max(1),
            turn: 0,
            next: 0,
            done: false,
            memory: Memory::default(),
            turn_start: 0,
            alone: false,
            tool_solved: false,
        })
    }

    /// This episode with its agents acting alone (tool_planner, one turn: over more
    /// turns the planner's moves would reach the tool agent through the state).
    pub fn alone(self) -> Result<Episode, Error> {
        if !self.kind.can_act_alone() {
            return Err(Error::NotAlone { workflow: self.kind });
        }
        if self.max_turns != 1 {
            return Err(Error::AloneOverTurns { max_turns: self.max_turns });
        }
        Ok(Episode { alone: true, ..self })
    }

    /// The role that acts next, or None when the episode is over.
    pub fn next_agent(&self) -> Option<&'static str> {
        (!self.done).then(|| self.roles[self.next])
    }

    /// The turn the next agent acts in, from 0.
    pub fn turn(&self) -> u32 {
        self.turn
    }

    pub fn env(&self) -> &AnyEnv {
        &self.env
    }

    pub fn kind(&self) -> WorkflowKind {
        self.kind
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn success(&self) -> bool {
        self.env.success()
    }

    /// Whether the tool agent's latest answer, on its own, solves the task: what it is
    /// worth as a single agent, whatever the teammate makes of it.
    pub fn tool_success(&self) -> bool {
        self.tool_solved
    }

    /// The history lines a prompt shows. Where the workflow hands this turn's earlier
    /// replies over in full (the tool report, the coder's program, the tests), their
    /// history lines would only repeat them, so only earlier turns are shown.
    fn history(&self) -> &[String] {
        let shown_in_full =
            matches!(self.kind, WorkflowKind::ToolPlanner | WorkflowKind::ToolReasoner | WorkflowKind::CoderTester);
        let h = &self.memory.history;
        let h = if shown_in_full { &h[..self.turn_start] } else { &h[..] };
        &h[h.len().saturating_sub(HISTORY_SHOWN)..]
    }

    /// The next agent's prompt (plain text).
    pub fn prompt(&self) -> String {
        let env = &self.env;
        let history = self.history();
        let tool = self.memory.tool_report.as_deref();
        match (self.kind, self.roles[self.next]) {
            (WorkflowKind::SingleAgent, _) => prompts::single_agent(env, history),
            (WorkflowKind::ToolPlanner | WorkflowKind::ToolReasoner, "tool") => prompts::tool_agent(env, history),
            (WorkflowKind::ToolPlanner, _) => prompts::planner(env, tool, history),
            (WorkflowKind::ToolReasoner, _) => prompts::reasoner(env, tool, history),
            (WorkflowKind::CoderTester, "coder") => {
                prompts::coder(env, self.memory.code.as_deref(), self.memory.test_report.as_deref(), history)
            }
            (WorkflowKind::CoderTester, _) => prompts::tester(env, self.memory.code.as_deref(), history),
            (WorkflowKind::TwoPlayers, _) => prompts::player(env, history),
        }
    }

    /// The program the sandbox runs for a tool agent's reply, if the next agent is a
    /// tool agent and the reply holds one. [`Episode::step`] runs it itself; callers
    /// that already know a program's output (demonstrations) use [`Episode::step_with`].
    pub fn tool_program(&self, reply: &str) -> Option<Program> {
        if self.next_agent() != Some("tool") {
            return None;
        }
        let code = extract_program(reply)?;
        Some(Program::new(format!("{}\n{}\n", tool_preamble(&self.env), code)))
    }

    /// Applies the next agent's reply: runs its program if it is a tool agent, steps the
    /// environment, and moves on to the next agent.
    pub fn step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let run = self.tool_program(reply).map(|program| {
            sandbox.run(&program).unwrap_or_else(|e| RunOutput {
                status: crate::sandbox::Status::Exited(-1),
                stdout: String::new(),
                stderr: format!("the sandbox could not run the program: {e}"),
                stdout_truncated: false,
                stderr_truncated: false,
                elapsed: std::time::Duration::ZERO,
            })
        });
        self.step_with(reply, run, sandbox)
    }

    /// [`Episode::step`] with the tool program's output given (None: it has none).
    pub fn step_with(&mut self, reply: &str, tool_run: Option<RunOutput>, sandbox: &Sandbox) -> TurnOutcome {
        let agent = self.next_agent().expect("step called on a finished episode");
        let turn = self.turn;
        let mut outcome = match (self.kind, agent) {
            (WorkflowKind::ToolPlanner | WorkflowKind::ToolReasoner, "tool") => {
                self.tool_step(reply, tool_run, sandbox)
            }
            (WorkflowKind::CoderTester, "coder") => self.coder_step(reply, sandbox),
            (WorkflowKind::CoderTester, _) => self.tester_step(reply, sandbox),
            (WorkflowKind::TwoPlayers, _) => self.player_step(reply, sandbox),
            (WorkflowKind::ToolPlanner, _) => self.planner_step(reply, sandbox),
            _ => self.env_step(reply, sandbox),
        };
        outcome.turn = turn;
        outcome.agent = agent;
        let summary = match (&outcome.action, &outcome.parse_error) {
            (Some(action), _) => action.clone(),
            (None, Some(error)) => format!("no answer ({error})"),
            (None, None) => "no answer".into(),
        };
        let feedback = outcome.feedback.as_deref().map(|f| f.lines().last().unwrap_or("")).unwrap_or("");
        if self.alone && agent == "tool" {
            self.memory.tool_report = None;
            self.memory.tool_answer = None;
        }
        self.memory.history.push(format!("Turn {}, {agent}: {} -> {feedback}", turn + 1, shorten(&summary, 120)));

        // Advance; the episode ends when the env or workflow says so, or after max_turns.
        self.done = outcome.done || self.env.done();
        self.next += 1;
        if self.next == self.roles.len() {
            self.next = 0;
            self.turn += 1;
            self.turn_start = self.memory.history.len();
            if self.turn >= self.max_turns {
                self.done = true;
            }
        }
        outcome.done = self.done;
        outcome.team_reward = self.env.team_reward();
        outcome.success = self.env.success();
        outcome
    }

    /// Planner: acts like [`Self::env_step`], with `#### tool` standing for the tool
    /// agent's printed answer.
    fn planner_step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let adopts = reply.rsplit_once("####").is_some_and(|(_, answer)| answer.trim() == ADOPT_TOOL_ANSWER);
        let reply = match &self.memory.tool_answer {
            Some(tool) if adopts => format!("#### {tool}"),
            _ => reply.to_string(),
        };
        self.env_step(&reply, sandbox)
    }

    /// Single agent, planner, reasoner: the reply acts on the real environment.
    fn env_step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let acted = self.env.act(reply, sandbox);
        let mut outcome = blank();
        match (acted.action, acted.step) {
            (Ok(action), Some(step)) => {
                outcome.action = Some(action);
                outcome.local_reward = step.reward;
                outcome.feedback = Some(step.feedback);
                outcome.done = step.done;
            }
            (Err(error), _) => {
                outcome.parse_error = Some(error);
                outcome.local_reward = NO_ANSWER;
            }
            (Ok(_), None) => unreachable!("a parsed action is always stepped"),
        }
        match (&self.env, self.kind) {
            (AnyEnv::Math(math), WorkflowKind::ToolReasoner) => {
                self.memory.reasoner_answer = outcome.action.as_ref().and_then(|a| serde_json::from_str(a).ok());
                outcome.done |= self.answers_agree(math);
                self.memory.tool_report = None;
            }
            (AnyEnv::Math(_) | AnyEnv::Code(_), WorkflowKind::SingleAgent) => outcome.done = true,
            (_, WorkflowKind::ToolPlanner) => self.memory.tool_report = None,
            _ => {}
        }
        outcome
    }

    fn answers_agree(&self, math: &crate::envs::Math) -> bool {
        match (&self.memory.tool_answer, &self.memory.reasoner_answer) {
            (Some(a), Some(b)) => math.same_answer(a, b),
            _ => false,
        }
    }

    /// Tool agent: run the program (already done by the caller), read its printed
    /// answer, score it on a copy of the state.
    fn tool_step(&mut self, reply: &str, run: Option<RunOutput>, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = blank();
        self.memory.tool_answer = None;
        self.tool_solved = false;
        let (Some(code), Some(run)) = (extract_program(reply), run) else {
            outcome.parse_error = Some("no program found; put it in a ```python block".into());
            outcome.local_reward = NO_ANSWER;
            self.memory.tool_report = Some("The tool agent wrote no program.".into());
            return outcome;
        };
        let mut shown = shorten(run.stdout.trim_end(), TOOL_OUTPUT_SHOWN);
        if !run.ok() {
            shown = format!("{shown}\nThe program failed: {}", run.error_line()).trim_start().to_string();
        }
        if shown.is_empty() {
            shown = "(nothing)".into();
        }
        let report = prompts::tool_report(&code, &shown);
        outcome.feedback = Some(shown.clone());
        self.memory.tool_report = Some(report);
        match &self.env {
            AnyEnv::Math(math) => {
                let answer = if run.ok() { extract_output_answer(&run.stdout) } else { None };
                self.tool_solved = answer.as_ref().is_some_and(|a| math.is_correct(a));
                outcome.local_reward = match &answer {
                    Some(_) if self.tool_solved => 1.0,
                    Some(_) => 0.0,
                    None => NO_ANSWER,
                };
                outcome.action = answer.as_ref().map(|a| serde_json::to_string(a).expect("strings serialise"));
                if answer.is_none() {
                    outcome.parse_error = Some("the program printed no answer".into());
                }
                self.memory.tool_answer = answer;
                outcome.done = self.answers_agree(math);
            }
            env => {
                // Simulated on a copy: the real state does not move.
                let mut copy = env.clone();
                let acted = copy.act(&run.stdout, sandbox);
                match (acted.action, acted.step) {
                    (Ok(action), Some(step)) => {
                        outcome.action = Some(action);
                        outcome.local_reward = step.reward;
                        self.tool_solved = copy.success();
                        self.memory.tool_answer = Some(run.stdout.trim().to_string());
                    }
                    (Err(error), _) => {
                        outcome.parse_error = Some(format!("the program's output holds no answer: {error}"));
                        outcome.local_reward = NO_ANSWER;
                    }
                    (Ok(_), None) => unreachable!("a parsed action is always stepped"),
                }
            }
        }
        outcome
    }

    fn coder_step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = self.env_step(reply, sandbox);
        if let Some(code) = extract_program(reply) {
            self.memory.code = Some(code);
            outcome.done |= self.coder_passes_tests(sandbox);
        }
        outcome
    }

    /// Runs the coder's latest program on the tester's latest tests; true when it
    /// passes them all (and there is at least one).
    fn coder_passes_tests(&mut self, sandbox: &Sandbox) -> bool {
        let (Some(code), AnyEnv::Code(env)) = (&self.memory.code, &self.env) else { return false };
        if self.memory.tests.is_empty() {
            return false;
        }
        let results = run_tests(sandbox, code, &self.memory.tests, env.timeout());
        self.memory.test_report = Some(test_report(&self.memory.tests, &results));
        results.iter().all(|r| r.passed)
    }

    fn tester_step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = blank();
        let tests = parse_tests(reply);
        if tests.is_empty() {
            outcome.parse_error = Some("no test found; write **Test Input:** and **Test Output:** blocks".into());
            outcome.local_reward = NO_ANSWER;
            return outcome;
        }
        outcome.action = Some(serde_json::to_string(&tests).expect("tests serialise"));
        let AnyEnv::Code(env) = &self.env else { unreachable!("checked in Episode::new") };
        let judge = env.instance().solution.clone().or_else(|| self.memory.code.clone());
        if let Some(program) = judge {
            let results = run_tests(sandbox, &program, &tests, env.timeout());
            outcome.local_reward = results.iter().filter(|r| r.passed).count() as f64 / tests.len() as f64;
        }
        self.memory.tests = tests;
        outcome.done = self.coder_passes_tests(sandbox);
        outcome.feedback = self.memory.test_report.clone();
        outcome
    }

    fn player_step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let mut outcome = self.env_step(reply, sandbox);
        if outcome.action.is_none()
            && let AnyEnv::TicTacToe(game) = &mut self.env
        {
            game.forfeit();
            outcome.feedback = Some("The reply held no move: forfeit.".into());
        }
        outcome
    }

    /// The oracle's reply for the next agent (the minimax opponent, the solver's answer),
    /// written in the reply format; None when the environment has no solver.
    pub fn oracle_reply(&self) -> Option<String> {
        let answer = self.env.solution_text()?;
        Some(match self.env {
            AnyEnv::Math(_) => answer,
            AnyEnv::Code(_) => answer,
            _ => format!("#### {answer}"),
        })
    }
}

fn blank() -> TurnOutcome {
    TurnOutcome {
        turn: 0,
        agent: "",
        action: None,
        parse_error: None,
        feedback: None,
        local_reward: 0.0,
        team_reward: 0.0,
        done: false,
        success: false,
    }
}

/// Python defining the instance and helpers for a tool program (empty for math).
pub fn tool_preamble(env: &AnyEnv) -> String {
    match env {
        AnyEnv::PlanPath(e) => e.tool_preamble(),
        AnyEnv::Sudoku(e) => e.tool_preamble(),
        AnyEnv::Sokoban(e) => e.tool_preamble(),
        AnyEnv::TicTacToe(_) | AnyEnv::Math(_) | AnyEnv::Code(_) => String::new(),
    }
}

fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(limit).collect::<String>())
    }
}

/// Test cases of a tester's reply: `**Test Input:**` and `**Test Output:**` fenced
/// blocks, paired in order (up to the shorter list).
pub fn parse_tests(reply: &str) -> Vec<TestCase> {
    let blocks_after = |label: &str| -> Vec<String> {
        reply
            .match_indices(label)
            .filter_map(|(i, _)| {
                let rest = &reply[i + label.len()..];
                let open = rest.find("```")?;
                let body = &rest[open + 3..];
                let body = body.split_once('\n').map_or("", |(_, b)| b);
                let close = body.find("```")?;
                Some(body[..close].to_string())
            })
            .collect()
    };
    let inputs = blocks_after("**Test Input:**");
    let outputs = blocks_after("**Test Output:**");
    inputs.into_iter().zip(outputs).map(|(input, output)| TestCase { input, output }).collect()
}

fn test_report(tests: &[TestCase], results: &[TestResult]) -> String {
    let lines: Vec<String> = tests
        .iter()
        .zip(results)
        .map(|(t, r)| {
            let verdict = if r.passed { "passed" } else { "FAILED" };
            format!(
                "- input {:?}: expected {:?}, got {:?}: {verdict}",
                shorten(t.input.trim_end(), 80),
                shorten(t.output.trim_end(), 80),
                shorten(r.got.trim_end(), 80)
            )
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests;
