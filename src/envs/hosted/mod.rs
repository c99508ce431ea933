//! Hosted environments: the episodes live in a host process (`python/petting_env`),
//! petting sends it the agents' replies and reads back whose turn it is, what that
//! agent sees and what each reply earned. TextArena's games and a user's own
//! environment class are hosted.
//!
//! ```text
//!  play:  make ──► first turns          (one message for every episode of the stage)
//!   each step: fork (tree: K copies of each live episode) ──► step (every reply) ──► drop
//! ```
//!
//! A [`Hosted`] value is a handle: its clones name the same episode in the host until
//! play forks them, so only play steps hosted episodes, in batches.

pub mod host;
mod judge;
mod package;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::agent::Agent;
use crate::validate::{Invalid, check};

pub use host::{Host, InvalidReplies, Stepped, Turn};
pub use judge::Judge;

/// `env: {name: textarena, game: TicTacToe-v0, players: 2}`: a TextArena game; its
/// agents are `player_0 … player_{players-1}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextArenaConfig {
    /// A registered TextArena game id (`TicTacToe-v0`), or `module:Class` of an
    /// unregistered one.
    pub game: String,
    /// How many players; the agents are `player_0 … player_{players-1}`.
    #[serde(default = "two")]
    pub players: u32,
    /// The mover's local reward for a reply TextArena finds invalid.
    #[serde(default = "minus_one")]
    pub invalid_move_penalty: f64,
    /// Keyword arguments of the game's constructor.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kwargs: BTreeMap<String, Value>,
    /// What a player sees on its turn: `full` (default), every message of the game so
    /// far, as TextArena gives it; `latest`, the rules and the messages since its
    /// previous turn, a prompt that does not grow (docs/environments.md).
    #[serde(default, skip_serializing_if = "is_default")]
    pub history: TextArenaHistory,
    /// The players' rewards: `outcome` (default), TextArena's win/loss/draw at the end;
    /// `score`, the game's running score as the team reward and each move's gain as its
    /// own (Hanabi's fireworks).
    #[serde(default, skip_serializing_if = "is_default")]
    pub reward: TextArenaReward,
    /// What an agent sees: a minijinja template over `observation`, `agent` and `turn`
    /// (the model's chat template is applied around it).
    #[serde(default = "default_prompt")]
    pub prompt: String,
    #[serde(default)]
    pub host: HostSettings,
}

/// `env.history` of a TextArena game.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TextArenaHistory {
    /// Every message the player has been shown since the game began (TextArena's own
    /// observation): the prompt grows with every move.
    #[default]
    Full,
    /// The game's opening prompt (its rules) and the messages since the player's previous
    /// turn ended: for games that restate their whole state every turn (Hanabi), the
    /// same information in a prompt that does not grow.
    Latest,
}

/// `env.reward` of a TextArena game.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TextArenaReward {
    /// TextArena's result at the end: win +1, loss −1, draw 0, each player's on its last
    /// turn; the team reward is their mean.
    #[default]
    Outcome,
    /// The game's running score, for games that keep one (Hanabi: the cards played,
    /// 0–25): the team reward after every move is the score so far, and the mover's local
    /// reward is what its move added; a game cut off at `max_turns` keeps the score it
    /// reached. TextArena's result decides success (Hanabi: all five fireworks).
    Score,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// `env: {name: external, module: my_env:MyEnv, config: {…}}` (a class the host loads)
/// or `env: {name: external, command: [python, my_env.py]}` (a script that serves one
/// with `petting_env.serve`): a user's own environment. Its agents are the class's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExternalConfig {
    /// `module:Class` or `file.py:Class`, found from the run file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// A host of the user's own; a first word `python` is petting's interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Handed to the class as its config.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Value>,
    /// What an agent sees: a minijinja template over `observation`, `agent` and `turn`
    /// (the model's chat template is applied around it).
    #[serde(default = "default_prompt")]
    pub prompt: String,
    #[serde(default)]
    pub host: HostSettings,
}

/// `env: {name: reasoning_gym, dataset: basic_arithmetic, config: {…}}`: a reasoning-gym
/// dataset as math tasks, for the single-agent and tool + reasoner workflows. The host
/// makes the tasks from the run seed and scores every answer with the dataset's own
/// `score_answer` (or `reward: rewards.py:fn`, called with the task row and the reply).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningGymConfig {
    /// The reasoning-gym dataset, e.g. `basic_arithmetic`.
    pub dataset: String,
    /// The dataset's options (all but `seed` and `size`, which petting sets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Value>,
    /// Scores a reply instead of the dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<PythonReward>,
    /// Relative tolerance when the tool agent's and the reasoner's answers are compared
    /// for agreement.
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    #[serde(default)]
    pub host: HostSettings,
}

fn default_tolerance() -> f64 {
    1e-6
}

impl ReasoningGymConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(
            !self.dataset.trim().is_empty(),
            "env.dataset",
            "must name a reasoning-gym dataset, e.g. basic_arithmetic",
        )?;
        check(self.tolerance >= 0.0, "env.tolerance", "must not be negative")?;
        if let Some(reward) = &self.reward {
            reward.validate()?;
        }
        self.host.validate()
    }
}

/// `reward: {python: rewards.py:fn}`: a Python function, found from the run file's
/// folder, that scores an answer as TRL's `reward_funcs` do: `fn(task, reply) -> float`
/// with the task row and the text the answer came from; 1 is a right answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PythonReward {
    /// `file.py:function`, found from the run file's folder.
    pub python: String,
}

impl PythonReward {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(
            self.python.split_once(':').is_some_and(|(file, name)| !file.is_empty() && !name.is_empty()),
            "env.reward.python",
            "must be file.py:function",
        )
    }
}

/// How the host process runs (`env.host`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HostSettings {
    /// The Python interpreter; unset: `PETTING_PYTHON`, else the checkout's `.venv`
    /// (scripts/install/python-tools.sh makes it), else `python3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<PathBuf>,
    /// Longest wait for one answer of the host.
    pub timeout_seconds: f64,
    /// The folder the host runs in and finds a user's files from: the run file's
    /// (filled in when the run file is read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings { python: None, timeout_seconds: 120.0, workdir: None }
    }
}

fn two() -> u32 {
    2
}

fn minus_one() -> f64 {
    -1.0
}

fn default_prompt() -> String {
    "{{ observation }}".into()
}

impl TextArenaConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(!self.game.trim().is_empty(), "env.game", "must name a TextArena game, e.g. TicTacToe-v0")?;
        check(self.players >= 1, "env.players", "must be at least 1")?;
        check(self.invalid_move_penalty.is_finite(), "env.invalid_move_penalty", "must be a number")?;
        check_prompt(&self.prompt)?;
        self.host.validate()
    }

    /// The agents: `player_0 … player_{players-1}`.
    pub fn agents(&self) -> Vec<Agent> {
        (0..self.players).map(|i| Agent::named(&format!("player_{i}")).expect("a valid name")).collect()
    }
}

impl ExternalConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(
            self.module.is_some() != self.command.is_some(),
            "env",
            "an external environment needs one of module (my_env:MyEnv) or command ([python, my_env.py])",
        )?;
        check(
            self.command.as_ref().is_none_or(|c| !c.is_empty() && !c[0].is_empty()),
            "env.command",
            "must name a program, e.g. [python, my_env.py]",
        )?;
        check_prompt(&self.prompt)?;
        self.host.validate()
    }
}

impl HostSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(
            self.timeout_seconds > 0.0 && self.timeout_seconds.is_finite(),
            "env.host.timeout_seconds",
            "must be a positive number of seconds",
        )
    }

    /// The interpreter that runs the host.
    fn python(&self) -> PathBuf {
        interpreter(self.python.as_deref())
    }
}

/// The Python a user's program runs with: the configured one, else `PETTING_PYTHON`,
/// else the checkout's `.venv` (scripts/install/python-tools.sh makes it), else `python3`.
pub fn interpreter(configured: Option<&Path>) -> PathBuf {
    if let Some(python) = configured {
        return python.to_path_buf();
    }
    if let Some(python) = std::env::var_os("PETTING_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if checkout.is_file() { checkout } else { PathBuf::from("python3") }
}

fn check_prompt(template: &str) -> Result<(), Invalid> {
    let mut env = minijinja::Environment::new();
    env.add_template("prompt", template)
        .map(|_| ())
        .map_err(|e| Invalid { key: "env.prompt".into(), message: format!("is not a valid template: {e}") })
}

/// The hosted environment of a run, as the host is started for it.
#[derive(Debug, Clone, Copy)]
pub enum HostedConfig<'a> {
    TextArena(&'a TextArenaConfig),
    External(&'a ExternalConfig),
    /// A task source and scorer; its episodes are petting's own math episodes.
    ReasoningGym(&'a ReasoningGymConfig),
    /// A reward function only: a dataset's math tasks scored by `env.reward`.
    Rewards {
        reward: &'a PythonReward,
        host: &'a HostSettings,
    },
}

impl HostedConfig<'_> {
    /// Whether the host holds the episodes (rather than only making and scoring tasks).
    pub fn holds_episodes(&self) -> bool {
        !matches!(self, HostedConfig::ReasoningGym(_) | HostedConfig::Rewards { .. })
    }

    fn reward(&self) -> Option<&str> {
        match self {
            HostedConfig::ReasoningGym(c) => c.reward.as_ref().map(|r| r.python.as_str()),
            HostedConfig::Rewards { reward, .. } => Some(&reward.python),
            _ => None,
        }
    }

    fn settings(&self) -> &HostSettings {
        match self {
            HostedConfig::TextArena(c) => &c.host,
            HostedConfig::External(c) => &c.host,
            HostedConfig::ReasoningGym(c) => &c.host,
            HostedConfig::Rewards { host, .. } => host,
        }
    }

    fn prompt(&self) -> &str {
        match self {
            HostedConfig::TextArena(c) => &c.prompt,
            HostedConfig::External(c) => &c.prompt,
            HostedConfig::ReasoningGym(_) | HostedConfig::Rewards { .. } => "",
        }
    }

    /// The `env` mapping of hello: the keys the host reads.
    fn hello_env(&self) -> Value {
        match self {
            HostedConfig::TextArena(c) => json!({
                "name": "textarena",
                "game": c.game,
                "players": c.players,
                "invalid_move_penalty": c.invalid_move_penalty,
                "kwargs": c.kwargs,
                "history": c.history,
                "reward": c.reward,
            }),
            HostedConfig::ReasoningGym(c) => {
                json!({"name": "reasoning_gym", "dataset": c.dataset, "config": c.config})
            }
            HostedConfig::Rewards { .. } => json!({"name": "rewards"}),
            HostedConfig::External(c) => {
                let mut env = json!({"name": "external", "config": c.config});
                if let Some(module) = &c.module {
                    env["module"] = json!(module);
                }
                env
            }
        }
    }

    fn launch(&self, message_bytes: u64) -> std::io::Result<host::Launch> {
        let settings = self.settings();
        let python = settings.python();
        let package = package::folder()?;
        let python_path = match std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            Some(existing) => format!("{}:{}", package.display(), existing.to_string_lossy()),
            None => package.display().to_string(),
        };
        let (program, args) = match self {
            HostedConfig::External(ExternalConfig { command: Some(command), .. }) => {
                let program = if matches!(command[0].as_str(), "python" | "python3") {
                    python.clone()
                } else {
                    PathBuf::from(&command[0])
                };
                (program, command[1..].to_vec())
            }
            _ => (python.clone(), vec!["-m".into(), "petting_env.host".into()]),
        };
        Ok(host::Launch {
            program,
            args,
            workdir: match &settings.workdir {
                Some(dir) => dir.clone(),
                None => std::env::current_dir()?,
            },
            env: vec![("PYTHONPATH".into(), python_path), ("PYTHONDONTWRITEBYTECODE".into(), "1".into())],
            timeout: Duration::from_secs_f64(settings.timeout_seconds),
            message_bytes,
        })
    }
}

/// A started host and what every episode of it shares.
#[derive(Debug)]
pub struct HostSession {
    pub host: Host,
    prompt: String,
    next_id: AtomicU64,
}

impl HostSession {
    /// Starts the host of `config` and checks that the agents of an environment it
    /// holds the episodes of are `agents`; its messages are bounded by `message_bytes`
    /// (`limits.host_message_bytes`).
    pub fn start(config: HostedConfig, agents: &[Agent], message_bytes: u64) -> Result<Arc<HostSession>, host::Error> {
        let launch = config
            .launch(message_bytes)
            .map_err(|source| host::Error::Start { command: "petting_env".into(), source })?;
        let host = Host::start(&launch, config.hello_env(), config.reward())?;
        let mut expected = agents.to_vec();
        let mut named = host.agents().to_vec();
        expected.sort();
        named.sort();
        if config.holds_episodes() && expected != named {
            return Err(host::Error::Agents { named, expected });
        }
        Ok(Arc::new(HostSession { host, prompt: config.prompt().to_string(), next_id: AtomicU64::new(0) }))
    }

    /// A fresh episode id.
    pub fn new_id(&self) -> String {
        format!("e{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// One hosted episode, as the workflows see it: its id in the host and its turn.
#[derive(Debug, Clone)]
pub struct Hosted {
    session: Arc<HostSession>,
    /// The task row, as the host's `make` receives it.
    task: Value,
    seed: u64,
    /// The episode's id in the host; empty until made.
    id: String,
    /// The agents asked to act next, each with its observation.
    acting: Vec<(Agent, String)>,
    done: bool,
    success: bool,
    team_reward: f64,
}

impl Hosted {
    /// An episode of `instance` (a `tasks` row's JSON), not yet made in the host.
    pub fn new(session: &Arc<HostSession>, instance: &str, seed: u64) -> Result<Hosted, super::Error> {
        let task: Value = serde_json::from_str(instance)
            .map_err(|e| super::Error::Instance { env: "hosted", reason: e.to_string() })?;
        Ok(Hosted {
            session: Arc::clone(session),
            task,
            seed,
            id: String::new(),
            acting: Vec::new(),
            done: false,
            success: false,
            team_reward: 0.0,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// What `make` needs for this episode under the id `id`.
    pub fn make_item(&self, id: String) -> (String, Value, u64) {
        // Python seeds and numpy's want 32 bits; the run's streams are 64.
        (id, self.task.clone(), self.seed % (1 << 31))
    }

    /// The episode made under `id`, at `turn`.
    pub fn made(&mut self, id: String, turn: &Turn) -> Result<(), String> {
        self.id = id;
        self.set_turn(Some(turn))
    }

    /// The episode after a step that the host took under `id` (a fork of this one).
    /// `asked` are the agents whose replies it took.
    pub fn stepped(&mut self, id: String, asked: &[Agent], stepped: &Stepped) -> Result<(), String> {
        if let InvalidReplies::Of(named) = &stepped.invalid
            && let Some(unasked) = named.iter().find(|name| !asked.iter().any(|a| a.as_str() == name.as_str()))
        {
            let asked: Vec<&str> = asked.iter().map(|a| a.as_str()).collect();
            return Err(format!("the host marked {unasked}'s reply invalid, but asked only {asked:?} this step"));
        }
        self.id = id;
        self.team_reward = stepped.team_reward;
        self.success = stepped.success;
        self.set_turn(stepped.next.as_ref().filter(|_| !stepped.done))
    }

    fn set_turn(&mut self, turn: Option<&Turn>) -> Result<(), String> {
        self.acting.clear();
        self.done = turn.is_none_or(|turn| turn.done);
        let Some(turn) = turn.filter(|turn| !turn.done) else {
            return Ok(());
        };
        let one = turn.agent.as_deref().map(|agent| (agent, turn.observation.as_deref().unwrap_or_default()));
        let several = turn.acting.iter().map(|a| (a.agent.as_str(), a.observation.as_str()));
        for (agent, observation) in one.into_iter().chain(several) {
            let agent = Agent::named(agent)?;
            if self.acting.iter().any(|(a, _)| *a == agent) {
                return Err(format!("a turn that asks {agent} twice"));
            }
            self.acting.push((agent, observation.to_string()));
        }
        if self.acting.is_empty() {
            return Err("a turn that is not done names no agent".into());
        }
        Ok(())
    }

    /// The agents asked to act next, each with what it sees; none once the episode is over.
    pub fn acting(&self) -> Vec<Agent> {
        self.acting.iter().map(|(agent, _)| *agent).collect()
    }

    /// The prompt of `agent`, one of those to act, at its `turn`: the run file's template
    /// over its observation.
    pub fn prompt(&self, agent: Agent, turn: u32) -> String {
        let observation = self.acting.iter().find(|(a, _)| *a == agent).map_or("", |(_, text)| text.as_str());
        let agent = agent.as_str();
        let env = minijinja::Environment::new();
        env.render_str(&self.session.prompt, minijinja::context! { observation, agent, turn })
            .unwrap_or_else(|e| format!("{observation}\n(env.prompt failed: {e})"))
    }

    pub fn done(&self) -> bool {
        self.done
    }

    pub fn success(&self) -> bool {
        self.success
    }

    pub fn team_reward(&self) -> f64 {
        self.team_reward
    }
}
