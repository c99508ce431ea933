//! The prompt texts: plain text for a chat model (the chat template is applied by the
//! model layer), the same for tiny and real models. Each prompt says who the agent is,
//! the task and its current state, what the other agent did, a short history, and the
//! exact answer format.

use super::ADOPT_TOOL_ANSWER;
use crate::envs::{AnyEnv, Env};

/// What a tool agent's program finds predefined, per environment.
pub fn tool_help(env: &AnyEnv) -> &'static str {
    match env {
        AnyEnv::PlanPath(_) => {
            "Predefined in your program: grid (a list of row strings), S (your position as (row, column)), G (the goal) and\n\
             - bfs(grid, S, G): the moves of a shortest path as a string such as 'RRD'\n\
             - greedy(grid, S, G): walks straight towards G and stops at the first wall\n\
             - random_walk(grid, S, G, seed=0): random moves, a third of them towards G\n\
             Print the moves, for example:\n```python\nprint(bfs(grid, S, G))\n```"
        }
        AnyEnv::Sudoku(_) => {
            "Predefined in your program: N (the side), grid (a list of rows, 0 for an empty cell) and\n\
             - solve(grid): the solved grid by backtracking\n\
             - first_fit(grid): fills each empty cell with the smallest digit that fits, without backtracking\n\
             Print the completed grid as a list of rows, for example:\n```python\nprint(solve(grid))\n```"
        }
        AnyEnv::Sokoban(_) => {
            "Predefined in your program: room (a list of row strings) and\n\
             - parse_room(room): (walls, goals, boxes, player) as sets of (row, column)\n\
             - solve(room): the moves of a shortest solution as a string such as 'RRUL'\n\
             Print the moves, for example:\n```python\nprint(solve(room))\n```"
        }
        // No example program: small chat models copy one verbatim instead of the problem.
        AnyEnv::Math(_) => {
            "Write a Python program that computes the answer from the numbers in the problem and prints only the \
             final answer with print() on the last line."
        }
        AnyEnv::TicTacToe(_) | AnyEnv::Code(_) => "",
    }
}

/// How the final answer is written, per environment.
pub fn answer_format(env: &AnyEnv) -> String {
    let format = match env {
        AnyEnv::PlanPath(_) | AnyEnv::Sokoban(_) => "End your reply with the moves after ####, for example: #### RRDL",
        AnyEnv::Sudoku(_) => {
            "End your reply with the completed grid after ####, for example: #### [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]"
        }
        AnyEnv::TicTacToe(game) => {
            let cell = game.example_cell();
            let example = game.format_action(&cell);
            let format = format!("End your reply with your cell after ####, for example: #### {example}");
            return if game.cells()[cell].is_some() {
                format!("{format} ({example} is taken here: choose an empty cell)")
            } else {
                format
            };
        }
        AnyEnv::Math(_) => "Think step by step, then give the final answer in \\boxed{}.",
        AnyEnv::Code(code) if code.is_function_task() => "Reply with the function in one ```python block.",
        AnyEnv::Code(_) => "Reply with the complete program in one ```python block.",
    };
    format.to_string()
}

fn state(env: &AnyEnv) -> String {
    let observation = env.observation();
    if observation.is_empty() { String::new() } else { format!("\n\nCurrent state:\n{observation}") }
}

fn history_block(history: &[String]) -> String {
    if history.is_empty() { String::new() } else { format!("\n\nSo far:\n{}", history.join("\n")) }
}

pub fn single_agent(env: &AnyEnv, history: &[String]) -> String {
    format!(
        "You solve the task on your own.\n\n{}{}{}\n\n{}",
        env.rules(),
        state(env),
        history_block(history),
        answer_format(env)
    )
}

pub fn tool_agent(env: &AnyEnv, history: &[String]) -> String {
    format!(
        "You are the tool agent of a team of two. Write a short Python program whose printed output answers the task; \
         your teammate reads your program and its output before answering.\n\n{}{}{}\n\n{}\nReply with one ```python block.",
        env.rules(),
        state(env),
        history_block(history),
        tool_help(env)
    )
}

/// What the teammate sees of a tool run.
pub fn tool_report(code: &str, output: &str) -> String {
    format!("Tool agent's program:\n```python\n{}\n```\nIts output:\n{}", code.trim_end(), output)
}

pub fn planner(env: &AnyEnv, tool: Option<&str>, history: &[String]) -> String {
    let tool = tool.map(|t| format!("\n\n{t}")).unwrap_or_default();
    format!(
        "You are the planner of a team of two. Read the task and the tool agent's program and output, then decide: \
         adopt its answer if it is right, or write your own.\n\n{}{}{}{}\n\n{}\nTo adopt the tool agent's answer \
         as it is, end your reply with: #### {ADOPT_TOOL_ANSWER}",
        env.rules(),
        state(env),
        tool,
        history_block(history),
        answer_format(env)
    )
}

pub fn reasoner(env: &AnyEnv, tool: Option<&str>, history: &[String]) -> String {
    let tool = tool.map(|t| format!("\n\n{t}")).unwrap_or_default();
    format!(
        "You are the reasoner of a team of two. A tool agent computed an answer with code; check its work, reason \
         carefully and give your own answer.\n\n{}{}{}\n\n{}",
        env.rules(),
        tool,
        history_block(history),
        answer_format(env)
    )
}

pub fn coder(env: &AnyEnv, last_code: Option<&str>, test_report: Option<&str>, history: &[String]) -> String {
    let mut extra = String::new();
    if let Some(code) = last_code {
        extra.push_str(&format!("\n\nYour previous program:\n```python\n{}\n```", code.trim_end()));
    }
    if let Some(report) = test_report {
        extra.push_str(&format!(
            "\n\nThe tester's tests on it:\n{report}\nDecide whether the program or the test is wrong, and fix the program if it is."
        ));
    }
    let io = match env {
        AnyEnv::Code(code) if code.is_function_task() => "",
        _ => " Read the input with input() or sys.stdin and print the answer;",
    };
    format!(
        "You are the coder of a team of two; a tester writes test cases for your program.{io} do not hard-code the \
         examples.\n\n{}{}{}\n\n{}",
        env.rules(),
        extra,
        history_block(history),
        answer_format(env)
    )
}

pub fn tester(env: &AnyEnv, code: Option<&str>, history: &[String]) -> String {
    let code = code.map(|c| format!("\n\nThe coder's program:\n```python\n{}\n```", c.trim_end())).unwrap_or_default();
    // A function task's tests are asserts, which code models write unprompted; the
    // Input/Output blocks were followed in 9 replies of 64 (results/code/README.md).
    let entry = match env {
        AnyEnv::Code(task) => task.entry_point(),
        _ => None,
    };
    let format = match entry {
        Some(entry) => format!(
            "Write 3 to 5 tests as assert lines in one ```python block, with literal values only:\n\
             ```python\nassert {entry}(<arguments>) == <expected result>\n```"
        ),
        None => "Write 3 to 5 tests, each as:\n**Test Input:**\n```\n<input>\n```\n**Test Output:**\n```\n<expected output>\n```"
            .to_string(),
    };
    format!(
        "You are the tester of a team of two. Write new test cases for the problem and work out each expected output \
         by hand, carefully; the coder's program will be run on them.\n\n{}{}{}\n\n{format}",
        env.rules(),
        code,
        history_block(history)
    )
}

pub fn player(env: &AnyEnv, history: &[String]) -> String {
    format!(
        "You are playing tic-tac-toe against another player.\n\n{}{}{}\n\n{}",
        env.rules(),
        state(env),
        history_block(history),
        answer_format(env)
    )
}

/// The helper's prompt (code_collab), as CoMLRL poses it: the problem, then a function
/// `aux` that the main function may use, in one ```python block.
pub fn helper(env: &AnyEnv, last: Option<(&str, &str)>, history: &[String]) -> String {
    let aux = super::code_collab::HELPER_FUNCTION;
    format!(
        "Create a helper function for this coding problem.\n\nProblem:\n{}{}{}\n\nIMPORTANT INSTRUCTIONS:\n\
         - Output ONLY the function code, in one ```python block, with no explanations, examples or tests\n\
         - Create a helper function named '{aux}' that can assist the main function\n\
         - The function should return useful data for solving the problem\n\n\
         Your output should follow this format:\n```python\ndef {aux}(...):\n    # your function code here\n    return result\n```",
        problem(env),
        joint_report(last),
        history_block(history),
    )
}

/// The main agent's prompt (code_collab), as CoMLRL poses it: the problem, the helper's
/// name, and the task's function to write, which may call it.
pub fn main_function(env: &AnyEnv, last: Option<(&str, &str)>, history: &[String]) -> String {
    let aux = super::code_collab::HELPER_FUNCTION;
    let (entry, params) = match env {
        AnyEnv::Code(code) => {
            let entry = code.entry_point().unwrap_or("solve");
            (entry, parameters(&code.instance().problem, entry))
        }
        _ => ("solve", String::new()),
    };
    format!(
        "Solve this coding problem by implementing the required function.\n\nProblem:\n{}\n\n\
         You have access to a helper function: {aux}(...){}{}\n\nIMPORTANT INSTRUCTIONS:\n\
         - Output ONLY the function code, in one ```python block, with no explanations, examples or tests\n\
         - Do NOT redefine the {aux}() function\n\
         - Implement ONLY the '{entry}' function as specified\n\
         - You can call {aux}() to assign value to a variable within your function if helpful\n\n\
         Your output should follow this format:\n```python\ndef {entry}({params}):\n    # your function code here\n    return result\n```",
        problem(env),
        joint_report(last),
        history_block(history),
    )
}

/// A code task's problem text.
fn problem(env: &AnyEnv) -> String {
    match env {
        AnyEnv::Code(code) => code.instance().problem.trim_end().to_string(),
        other => other.rules(),
    }
}

/// The parameters of `def entry(...)` in `problem`.
fn parameters(problem: &str, entry: &str) -> String {
    let header = format!("def {entry}(");
    let Some(line) = problem.lines().find(|line| line.trim_start().starts_with(&header)) else {
        return String::new();
    };
    let after = &line.trim_start()[header.len()..];
    let mut depth = 0;
    let end = after.char_indices().find(|&(_, c)| {
        depth += match c {
            '(' | '[' => 1,
            ')' | ']' => -1,
            _ => 0,
        };
        depth < 0
    });
    end.map_or(after, |(i, _)| &after[..i]).to_string()
}

/// The team's previous joint program and how the hidden tests took it.
fn joint_report(last: Option<(&str, &str)>) -> String {
    match last {
        Some((program, report)) => {
            format!("\n\nYour team's previous program:\n```python\n{}\n```\n{report}", program.trim_end())
        }
        None => String::new(),
    }
}
