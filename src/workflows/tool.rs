//! The tool agent of tool_planner and tool_reasoner: the program in its reply runs in
//! the sandbox with the instance predefined, and its teammate sees the program and what
//! it printed.

use crate::envs::AnyEnv;
use crate::envs::code::extract_program;
use crate::sandbox::{Program, RunOutput, Sandbox, Status};

use super::{Agent, NO_ANSWER, TurnOutcome, prompts, shorten};

/// Output of a tool program shown to the teammate, at most this many characters.
const TOOL_OUTPUT_SHOWN: usize = 600;

/// What the team keeps of the tool agent's latest turn.
#[derive(Debug, Clone, Default)]
pub(super) struct ToolMemory {
    /// Its program and output, as the teammate's prompt shows them.
    pub(super) report: Option<String>,
    /// Its printed answer, which the teammate may adopt.
    pub(super) answer: Option<String>,
    /// The answer solves the task on its own (simulated on the state the tool agent saw).
    pub(super) solved: bool,
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

/// The program a tool agent's reply asks the sandbox to run, if it holds one. Math
/// programs get the env's `tool_timeout_seconds`; the others the sandbox's limit (their
/// envs have no such key).
pub(super) fn program(env: &AnyEnv, reply: &str) -> Option<Program> {
    let code = extract_program(reply)?;
    let program = Program::new(format!("{}\n{}\n", tool_preamble(env), code));
    Some(match env {
        AnyEnv::Math(math) => program.with_timeout(math.tool_timeout()),
        _ => program,
    })
}

/// Runs a program; a sandbox that cannot run it is reported as the program's failure,
/// which is what the agents see of it.
pub fn run_program(program: &Program, sandbox: &Sandbox) -> RunOutput {
    sandbox.run(program).unwrap_or_else(|e| RunOutput {
        status: Status::Exited(-1),
        stdout: String::new(),
        stderr: format!("the sandbox could not run the program: {e}"),
        stdout_truncated: false,
        stderr_truncated: false,
        elapsed: std::time::Duration::ZERO,
    })
}

/// Reads a tool agent's turn into `memory`: the report its teammate sees, with the
/// outcome so far (the output as feedback) and the run whose answer the workflow scores.
/// A reply without a program (or a program that did not run) ends the turn: `Err`.
// Both sides are the turn's outcome, which is not an error value to keep small.
#[allow(clippy::result_large_err)]
pub(super) fn read(
    memory: &mut ToolMemory,
    reply: &str,
    run: Option<RunOutput>,
) -> Result<(TurnOutcome, RunOutput), TurnOutcome> {
    let mut outcome = TurnOutcome::blank(Agent::TOOL);
    memory.answer = None;
    memory.solved = false;
    let (Some(code), Some(run)) = (extract_program(reply), run) else {
        outcome.parse_error = Some("no program found; put it in a ```python block".into());
        outcome.local_reward = NO_ANSWER;
        memory.report = Some("The tool agent wrote no program.".into());
        return Err(outcome);
    };
    let mut shown = shorten(run.stdout.trim_end(), TOOL_OUTPUT_SHOWN);
    if !run.ok() {
        shown = format!("{shown}\nThe program failed: {}", run.error_line()).trim_start().to_string();
    }
    if shown.is_empty() {
        shown = "(nothing)".into();
    }
    memory.report = Some(prompts::tool_report(&code, &shown));
    outcome.feedback = Some(shown);
    Ok((outcome, run))
}
