//! Workflows: who acts in which order, what each agent sees, and what its reply does.
//!
//! The API the rollout uses is one value, [`Episode`]: an environment, the turn order,
//! a history, and the state of its workflow (one file each: the other agents' last
//! outputs, tool results, tests).
//!
//! ```text
//!  let mut episode = Episode::new(kind, env, max_turns)?;        // Clone + Send
//!  while let Some(agent) = episode.next_agent() {                // a Agent, e.g. Agent::TOOL
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
//! * single agent ([`single_agent`]): the environment's step reward; math and code answer once.
//! * tool agent + planner ([`tool_planner`]; Plan-Path, Sudoku, Sokoban): the tool agent's
//!   program runs in the sandbox with the instance predefined; the action list it prints is
//!   simulated on a copy of the state, whose reward is the tool agent's; the real state
//!   does not move. The planner's answer acts on the real state.
//! * tool agent + reasoner ([`tool_reasoner`]; math): tool 1 if its printed answer is
//!   right, else 0; reasoner 1 if right, else 0. Done when both answers agree.
//! * coder + tester ([`coder_tester`]; code): coder = pass rate of the hidden tests; tester
//!   = the share of its tests the reference program passes (when the task has one;
//!   otherwise the share the coder's program passes). Done when the coder's program
//!   passes all the tester's tests.
//! * helper + main ([`code_collab`]; code, CoMLRL's split): both answer at once; the
//!   helper's function and the main function, joined, are scored by the hidden tests, and
//!   both earn the pass rate as the team reward.
//! * two players ([`two_players`]; tic-tac-toe): the mover's reward from the game; an
//!   unreadable reply forfeits.
//! * alone (tool_planner, one turn): as above, but the planner sees nothing of the tool agent's
//!   turn and cannot adopt its answer; each agent plays as a single agent would.
//! * A reply that does not parse (no program, no answer) earns [`NO_ANSWER`] and changes
//!   nothing.

mod code_collab;
mod coder_tester;
pub mod demos;
pub mod prompts;
mod single_agent;
mod tool;
mod tool_planner;
mod tool_reasoner;
mod two_players;

use serde::{Deserialize, Serialize};

use crate::envs::AnyEnv;
use crate::sandbox::{Program, RunOutput, Sandbox};

pub use crate::agent::Agent;
pub use coder_tester::parse_tests;
pub use tool::{run_program, tool_preamble};
pub use tool_planner::ADOPT_TOOL_ANSWER;

/// Local reward of a reply that yields no action.
pub const NO_ANSWER: f64 = -1.0;

/// History lines kept in prompts.
const HISTORY_SHOWN: usize = 6;

/// `workflow:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// Which workflow plays the environment; unset: a hosted environment's own order.
    #[serde(default = "environment")]
    pub kind: WorkflowKind,
    /// Turns per episode; within a turn every agent acts once, in the workflow's order.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// Rollouts play each agent alone (tool_planner, max_turns 1): the planner sees nothing of
    /// the tool agent and cannot adopt its answer, so each role learns as a single agent
    /// would (the paper's "train in single agent, evaluate in MAS" ablation). Data, warm
    /// start and the multi_agent evaluation still play the team.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alone: bool,
}

fn default_max_turns() -> u32 {
    4
}

fn environment() -> WorkflowKind {
    WorkflowKind::Environment
}

/// A run file without `workflow:` plays a hosted environment in its own order, until
/// the environment says the episode is over (or 100 turns).
impl Default for WorkflowConfig {
    fn default() -> Self {
        WorkflowConfig { kind: WorkflowKind::Environment, max_turns: 100, alone: false }
    }
}

/// Why agents act alone in one turn only: they share the environment's state.
pub const ALONE_OVER_TURNS: &str = "acting alone needs workflow.max_turns: 1; over more turns the planner's \
     moves reach the tool agent through the state they share, so neither would be alone";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowKind {
    /// One agent does everything.
    SingleAgent,
    /// A tool agent writes a program whose output a planner sees (games, planning).
    ToolPlanner,
    /// A tool agent computes with code, a reasoner reasons; done when they agree (math).
    ToolReasoner,
    /// A coder writes programs, a tester writes tests (code).
    CoderTester,
    /// The main agent writes the task's function and a helper a function `aux` it may
    /// call, both at once (code function tasks; CoMLRL's split of HumanEval).
    CodeCollab,
    /// Two players take turns (tic-tac-toe).
    TwoPlayers,
    /// A hosted environment says whose turn it is and what each agent sees (TextArena,
    /// a user's own environment, an agent program): play steps those episodes itself.
    Environment,
}

impl WorkflowKind {
    pub const ALL: [WorkflowKind; 7] = [
        WorkflowKind::SingleAgent,
        WorkflowKind::ToolPlanner,
        WorkflowKind::ToolReasoner,
        WorkflowKind::CoderTester,
        WorkflowKind::CodeCollab,
        WorkflowKind::TwoPlayers,
        WorkflowKind::Environment,
    ];

    /// The agents of the workflow, in the order they act within a turn; none for
    /// `environment`, whose environment names its own.
    pub fn agents(self) -> &'static [Agent] {
        match self {
            WorkflowKind::SingleAgent => &[Agent::SINGLE],
            WorkflowKind::ToolPlanner => &[Agent::TOOL, Agent::PLANNER],
            WorkflowKind::ToolReasoner => &[Agent::TOOL, Agent::REASONER],
            WorkflowKind::CoderTester => &[Agent::CODER, Agent::TESTER],
            WorkflowKind::CodeCollab => &[Agent::MAIN, Agent::HELPER],
            WorkflowKind::TwoPlayers => &[Agent::PLAYER_X, Agent::PLAYER_O],
            WorkflowKind::Environment => &[],
        }
    }

    /// Whether this workflow can play the environment named `env` (`AnyEnv::name`).
    pub fn plays(self, env: &str) -> bool {
        match self {
            WorkflowKind::SingleAgent => !matches!(env, "tic_tac_toe" | "textarena" | "external"),
            WorkflowKind::ToolPlanner => matches!(env, "plan_path" | "sudoku" | "sokoban"),
            WorkflowKind::ToolReasoner => matches!(env, "math" | "reasoning_gym"),
            WorkflowKind::CoderTester | WorkflowKind::CodeCollab => env == "code",
            WorkflowKind::TwoPlayers => env == "tic_tac_toe",
            WorkflowKind::Environment => matches!(env, "textarena" | "external" | "agent_program"),
        }
    }

    /// The workflows that can play the environment named `env`.
    pub fn playing(env: &str) -> Vec<WorkflowKind> {
        WorkflowKind::ALL.into_iter().filter(|w| w.plays(env)).collect()
    }

    /// Whether every agent acts in each step at once, each from its own prompt (else
    /// they take turns in [`agents`](WorkflowKind::agents) order).
    pub fn simultaneous(self) -> bool {
        self == WorkflowKind::CodeCollab
    }

    /// How many steps a turn takes: one where the agents answer at once, one per agent
    /// where they take turns (one for `environment`, whose agents its host names).
    pub fn steps_per_turn(self) -> u32 {
        if self.simultaneous() { 1 } else { self.agents().len().max(1) as u32 }
    }

    /// Whether the agents can act alone (`workflow.alone`, evaluation modes `alone` and
    /// `tool_alone`): only where no agent's turn needs the other's.
    pub fn can_act_alone(self) -> bool {
        self == WorkflowKind::ToolPlanner
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("the {workflow:?} workflow cannot play {env}")]
    Unsupported { workflow: WorkflowKind, env: &'static str },
    #[error("only tool_planner's agents can act alone, not {workflow:?}'s")]
    NotAlone { workflow: WorkflowKind },
    #[error("agents act alone in one turn only, not {max_turns}: over more they would share the state")]
    AloneOverTurns { max_turns: u32 },
    #[error(
        "code_collab splits a function between a helper and the main agent: every code task needs an entry_point \
         (the function's name), as HumanEval's have"
    )]
    NotAFunction,
}

/// What one agent's reply did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnOutcome {
    pub turn: u32,
    pub agent: Agent,
    /// The parsed action as JSON; None when the reply did not parse.
    pub action: Option<String>,
    /// The action as later prompts show it, where the JSON would mislead or hide it.
    pub shown: Option<String>,
    /// Why the reply did not parse.
    pub parse_error: Option<String>,
    /// Tool output or environment feedback, as later prompts show it.
    pub feedback: Option<String>,
    pub local_reward: f64,
    /// The team's reward after the reply; in self-play, the mover's own result.
    pub team_reward: f64,
    pub done: bool,
    pub success: bool,
    /// Local rewards the step credited to agents other than the mover (a hosted game's
    /// final rewards): play adds each to that agent's latest turn on the trajectory.
    pub credited: Vec<(Agent, f64)>,
}

impl TurnOutcome {
    /// An outcome before the reply is read: nothing done, nothing earned.
    pub(crate) fn blank(agent: Agent) -> TurnOutcome {
        TurnOutcome {
            turn: 0,
            agent,
            action: None,
            shown: None,
            parse_error: None,
            feedback: None,
            local_reward: 0.0,
            team_reward: 0.0,
            done: false,
            success: false,
            credited: Vec::new(),
        }
    }
}

/// The state of one workflow's episode.
#[derive(Debug, Clone)]
enum Workflow {
    SingleAgent,
    ToolPlanner(tool_planner::ToolPlanner),
    ToolReasoner(tool_reasoner::ToolReasoner),
    CoderTester(coder_tester::CoderTester),
    CodeCollab(code_collab::CodeCollab),
    TwoPlayers,
}

/// One episode of a workflow on one of petting's own environments.
#[derive(Debug, Clone)]
pub struct Episode {
    kind: WorkflowKind,
    env: AnyEnv,
    workflow: Workflow,
    roles: Vec<Agent>,
    max_turns: u32,
    turn: u32,
    next: usize,
    done: bool,
    history: Vec<String>,
    /// Length of the history when this turn began.
    turn_start: usize,
}

impl Episode {
    pub fn new(kind: WorkflowKind, env: AnyEnv, max_turns: u32) -> Result<Episode, Error> {
        if !kind.plays(env.name()) {
            return Err(Error::Unsupported { workflow: kind, env: env.name() });
        }
        if kind == WorkflowKind::CodeCollab && !matches!(&env, AnyEnv::Code(code) if code.is_function_task()) {
            return Err(Error::NotAFunction);
        }
        let workflow = match kind {
            WorkflowKind::SingleAgent => Workflow::SingleAgent,
            WorkflowKind::ToolPlanner => Workflow::ToolPlanner(Default::default()),
            WorkflowKind::ToolReasoner => Workflow::ToolReasoner(Default::default()),
            WorkflowKind::CoderTester => Workflow::CoderTester(Default::default()),
            WorkflowKind::CodeCollab => Workflow::CodeCollab(Default::default()),
            WorkflowKind::TwoPlayers => Workflow::TwoPlayers,
            WorkflowKind::Environment => return Err(Error::Unsupported { workflow: kind, env: env.name() }),
        };
        let roles = match &env {
            AnyEnv::TicTacToe(game) => two_players::turn_order(game),
            _ => kind.agents().to_vec(),
        };
        Ok(Episode {
            kind,
            env,
            workflow,
            roles,
            max_turns: max_turns.max(1),
            turn: 0,
            next: 0,
            done: false,
            history: Vec::new(),
            turn_start: 0,
        })
    }

    /// This episode with its agents acting alone (tool_planner, one turn: over more
    /// turns the planner's moves would reach the tool agent through the state).
    pub fn alone(mut self) -> Result<Episode, Error> {
        let Workflow::ToolPlanner(state) = &mut self.workflow else {
            return Err(Error::NotAlone { workflow: self.kind });
        };
        if self.max_turns != 1 {
            return Err(Error::AloneOverTurns { max_turns: self.max_turns });
        }
        state.alone = true;
        Ok(self)
    }

    /// The agent that acts next, or None when the episode is over (the first of them
    /// where the agents answer at once).
    pub fn next_agent(&self) -> Option<Agent> {
        (!self.done).then(|| self.roles[self.next])
    }

    /// The agents that act in the next step: every role at once where the workflow has
    /// them answer together, else the next in turn; none once the episode is over.
    pub fn acting(&self) -> Vec<Agent> {
        match (self.done, self.kind.simultaneous()) {
            (true, _) => Vec::new(),
            (false, true) => self.roles.clone(),
            (false, false) => vec![self.roles[self.next]],
        }
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
        match &self.workflow {
            Workflow::ToolPlanner(state) => state.tool.solved,
            Workflow::ToolReasoner(state) => state.tool.solved,
            _ => false,
        }
    }

    /// The history lines a prompt shows. Where the workflow hands this turn's earlier
    /// replies over in full (the tool report, the coder's program, the tests), their
    /// history lines would only repeat them, so only earlier turns are shown.
    fn shown_history(&self) -> &[String] {
        let shown_in_full = !matches!(self.workflow, Workflow::SingleAgent | Workflow::TwoPlayers);
        let h = &self.history;
        let h = if shown_in_full { &h[..self.turn_start] } else { &h[..] };
        &h[h.len().saturating_sub(HISTORY_SHOWN)..]
    }

    /// The next agent's prompt (plain text).
    pub fn prompt(&self) -> String {
        self.prompt_of(self.roles[self.next])
    }

    /// What `agent`, one of [`acting`](Episode::acting), is asked in the next step.
    pub fn prompt_of(&self, agent: Agent) -> String {
        let (env, history) = (&self.env, self.shown_history());
        match &self.workflow {
            Workflow::SingleAgent => prompts::single_agent(env, history),
            Workflow::ToolPlanner(state) => state.prompt(env, agent, history),
            Workflow::ToolReasoner(state) => state.prompt(env, agent, history),
            Workflow::CoderTester(state) => state.prompt(env, agent, history),
            Workflow::CodeCollab(state) => state.prompt(env, agent, history),
            Workflow::TwoPlayers => prompts::player(env, history),
        }
    }

    /// The program the sandbox runs for a tool agent's reply, if the next agent is a
    /// tool agent and the reply holds one. [`Episode::step`] runs it itself; callers
    /// that already know a program's output (demonstrations) use [`Episode::step_with`].
    pub fn tool_program(&self, reply: &str) -> Option<Program> {
        if self.next_agent() != Some(Agent::TOOL) {
            return None;
        }
        tool::program(&self.env, reply)
    }

    /// Applies the next agent's reply: runs its program if it is a tool agent, steps the
    /// environment, and moves on to the next agent.
    pub fn step(&mut self, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
        let run = self.tool_program(reply).map(|program| run_program(&program, sandbox));
        self.step_with(reply, run, sandbox)
    }

    /// Applies the replies of every agent acting in this step, in [`acting`](Episode::acting)
    /// order: judged together where the agents answer at once, else the one reply as
    /// [`Episode::step`] applies it. One outcome per reply.
    pub fn step_joint(&mut self, replies: &[(Agent, &str)], sandbox: &Sandbox) -> Vec<TurnOutcome> {
        let Workflow::CodeCollab(state) = &mut self.workflow else {
            return replies.iter().map(|(_, reply)| self.step(reply, sandbox)).collect();
        };
        let mut outcomes = state.step(&mut self.env, replies, sandbox);
        for outcome in &mut outcomes {
            outcome.turn = self.turn;
            self.record(outcome);
        }
        // One step is the whole turn: every agent has acted.
        self.next = self.roles.len() - 1;
        if let Some((first, others)) = outcomes.split_first_mut() {
            self.advance(first);
            for outcome in others {
                (outcome.done, outcome.team_reward, outcome.success) = (first.done, first.team_reward, first.success);
            }
        }
        outcomes
    }

    /// [`Episode::step`] with the tool program's output given (None: it has none).
    pub fn step_with(&mut self, reply: &str, tool_run: Option<RunOutput>, sandbox: &Sandbox) -> TurnOutcome {
        let agent = self.next_agent().expect("step called on a finished episode");
        let env = &mut self.env;
        let mut outcome = match &mut self.workflow {
            Workflow::SingleAgent => single_agent::step(env, agent, reply, sandbox),
            Workflow::ToolPlanner(state) => state.step(env, agent, reply, tool_run, sandbox),
            Workflow::ToolReasoner(state) => state.step(env, agent, reply, tool_run, sandbox),
            Workflow::CoderTester(state) => state.step(env, agent, reply, sandbox),
            Workflow::CodeCollab(_) => unreachable!("code_collab's agents answer at once: Episode::step_joint"),
            Workflow::TwoPlayers => two_players::step(env, agent, reply, sandbox),
        };
        outcome.turn = self.turn;
        self.record(&outcome);
        self.advance(&mut outcome);
        outcome
    }

    /// Adds the reply's history line.
    fn record(&mut self, outcome: &TurnOutcome) {
        let summary = match (outcome.shown.as_ref().or(outcome.action.as_ref()), &outcome.parse_error) {
            (Some(action), _) => action.clone(),
            (None, Some(error)) => format!("no answer ({error})"),
            (None, None) => "no answer".into(),
        };
        let feedback = outcome.feedback.as_deref().map(|f| f.lines().last().unwrap_or("")).unwrap_or("");
        let line = format!("Turn {}, {}: {} -> {feedback}", outcome.turn + 1, outcome.agent, shorten(&summary, 120));
        self.history.push(line);
    }

    /// Moves on to the next agent; the episode ends when the env or workflow says so,
    /// or after max_turns.
    fn advance(&mut self, outcome: &mut TurnOutcome) {
        self.done = outcome.done || self.env.done();
        self.next += 1;
        if self.next == self.roles.len() {
            self.next = 0;
            self.turn += 1;
            self.turn_start = self.history.len();
            if self.turn >= self.max_turns {
                self.done = true;
            }
        }
        outcome.done = self.done;
        outcome.team_reward = match &self.env {
            AnyEnv::TicTacToe(game) => two_players::own_result(game, outcome.agent),
            env => env.team_reward(),
        };
        outcome.success = self.env.success();
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

/// A reply that acts on the real environment (single agent, planner, reasoner, coder,
/// player).
fn env_step(env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
    let acted = env.act(reply, sandbox);
    let mut outcome = TurnOutcome::blank(agent);
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
    outcome
}

pub(crate) fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(limit).collect::<String>())
    }
}

#[cfg(test)]
mod tests;
