//! The `iteration.yaml` schema: everything a run is made of, validated once, here.
//!
//! Unknown keys and wrong types are errors naming the file, the key path and what is
//! allowed; cross-field rules (every workflow role has an agent, every agent's policy
//! exists, …) are checked by [`RunConfig::validate`] right after parsing, so no stage
//! ever meets a half-valid config. Paths inside the file are relative to the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// A problem with a config file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {file}: {source}")]
    Read { file: PathBuf, source: std::io::Error },

    #[error("{file}: {}{message}", key_prefix(.key))]
    Parse { file: PathBuf, key: Option<String>, message: String },

    #[error("{file}: {key}: {message}")]
    Invalid { file: PathBuf, key: String, message: String },
}

fn key_prefix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default()
}

/// A whole run: `iteration.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Where the run lives: a local path, file:///path, s3://bucket/prefix, gs://…, az://… or memory://.
    pub store: String,
    /// Name recorded in every row the run samples; defaults to the store's last path segment.
    #[serde(default)]
    pub name: Option<String>,
    /// Seed of every random stream of the run (tasks, sampling, initialisation).
    #[serde(default)]
    pub seed: u64,
    /// Training iterations to run (each: rollout, group, advantage, update, evaluate).
    pub iterations: u32,
    /// The environment and its parameters.
    pub env: EnvConfig,
    /// How many tasks prepare-data makes, or which dataset files it reads.
    #[serde(default)]
    pub data: DataConfig,
    /// Who acts in which order.
    pub workflow: WorkflowConfig,
    /// Each workflow role and the policy that plays it.
    pub agents: BTreeMap<String, AgentConfig>,
    /// The trainable policies, by name.
    pub policies: BTreeMap<String, PolicyConfig>,
    /// How training trajectories are sampled.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// Advantage estimator and loss.
    #[serde(default)]
    pub algorithm: AlgorithmConfig,
    /// Optimisation of each policy on its own samples.
    #[serde(default)]
    pub update: UpdateConfig,
    /// Held-out evaluation.
    #[serde(default)]
    pub evaluation: EvaluationConfig,
    /// Supervised warm start on solver demonstrations, building v0 of policies whose
    /// model is initialised from scratch (the embedded default).
    #[serde(default)]
    pub warm_start: Option<WarmStartConfig>,
    /// The stored run this one starts from (`pipeline run --from URL@K` sets it): that
    /// run's policies of version K are this run's checkpoints of version K, and its
    /// iterations run from K on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkConfig>,
}

/// A stored run and one of its iterations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkConfig {
    /// The source run: a local path or a URL.
    pub from: String,
    /// Its iteration K: the run starts from the policies iteration K sampled with.
    pub iteration: u32,
    /// Replay (`URL@K:group`): copy the source's rollout of iteration K instead of sampling
    /// it, so group, advantage and update run with this run's algorithm on exactly the
    /// same turns. Everything that decides what rollout K samples must match the source.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
}

impl std::str::FromStr for ForkConfig {
    type Err = String;

    /// `URL@K` or `URL@K:group`, e.g. `runs/plan-path@10` or `s3://bucket/runs/a@3:group`.
    fn from_str(text: &str) -> Result<ForkConfig, String> {
        let (from, rest) =
            text.rsplit_once('@').ok_or_else(|| format!("{text:?} is not URL@K or URL@K:group (e.g. runs/a@10)"))?;
        let (k, stage) = rest.split_once(':').map_or((rest, None), |(k, s)| (k, Some(s)));
        let iteration = k.parse().map_err(|_| format!("{k:?} after '@' in {text:?} is not an iteration number"))?;
        if from.is_empty() {
            return Err(format!("{text:?} names no run before '@'"));
        }
        let replay = match stage {
            None => false,
            Some("group") => true,
            Some(other) => {
                return Err(format!(
                    "{other:?} after ':' in {text:?}: a fork restarts at rollout (URL@K) or at group, \
                     replaying rollout K (URL@K:group)"
                ));
            }
        };
        Ok(ForkConfig { from: from.to_string(), iteration, replay })
    }
}

/// The environment, chosen by `name`, with its own parameters beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum EnvConfig {
    PlanPath(PlanPathConfig),
    Sudoku(SudokuConfig),
    Sokoban(SokobanConfig),
    TicTacToe(TicTacToeConfig),
    Math(MathConfig),
    Code(CodeConfig),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanPathConfig {
    /// Grid side length.
    pub size: u32,
    /// Probability that a cell is a wall.
    pub wall_probability: f64,
    /// Moves allowed in one episode before it ends unsolved.
    pub max_moves: u32,
    /// How the warm-start demonstrations choose tools and whether the planner trusts them.
    pub demonstrations: PlanPathDemonstrations,
}

impl Default for PlanPathConfig {
    fn default() -> Self {
        PlanPathConfig {
            size: 10,
            wall_probability: 0.22,
            max_moves: 200,
            demonstrations: PlanPathDemonstrations::default(),
        }
    }
}

/// Choice-level imperfection of the Plan-Path demonstrations (shares must sum to 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanPathDemonstrations {
    /// Share of tool programs that call `bfs` (always right).
    pub tool_bfs: f64,
    /// Share that call `greedy`, which stops at the first wall.
    pub tool_greedy: f64,
    /// Share that call `random_walk`.
    pub tool_random_walk: f64,
    /// Share of broken programs (errors, swapped arguments).
    pub tool_broken: f64,
    /// Probability that the planner copies the tool's output rather than writing its own path.
    pub planner_copies_tool: f64,
}

impl Default for PlanPathDemonstrations {
    fn default() -> Self {
        PlanPathDemonstrations {
            tool_bfs: 0.15,
            tool_greedy: 0.45,
            tool_random_walk: 0.30,
            tool_broken: 0.10,
            planner_copies_tool: 0.45,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SudokuConfig {
    /// Side of the grid (a square number: 4 or 9).
    pub size: u32,
    /// Empty cells in a generated puzzle.
    pub blanks: u32,
}

impl Default for SudokuConfig {
    fn default() -> Self {
        SudokuConfig { size: 4, blanks: 8 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SokobanConfig {
    /// Side of the room, walls included.
    pub size: u32,
    /// Boxes (and goals) in the room.
    pub boxes: u32,
    /// Reverse-play pulls used to scatter the boxes away from the goals.
    pub reverse_steps: u32,
    /// Moves allowed in one episode before it ends unsolved.
    pub max_moves: u32,
}

impl Default for SokobanConfig {
    fn default() -> Self {
        SokobanConfig { size: 6, boxes: 1, reverse_steps: 20, max_moves: 200 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TicTacToeConfig {
    /// Opponent of the trained player at evaluation.
    pub eval_opponent: Opponent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Opponent {
    /// The trained policy plays both sides.
    #[default]
    SelfPlay,
    /// A perfect minimax player.
    Minimax,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathConfig {
    /// Relative tolerance for numeric equality of answers.
    pub tolerance: f64,
    /// Wall-clock limit of the tool agent's program, in seconds.
    pub tool_timeout_seconds: f64,
}

impl Default for MathConfig {
    fn default() -> Self {
        MathConfig { tolerance: 1e-6, tool_timeout_seconds: 20.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeConfig {
    /// Wall-clock limit of one test run, in seconds.
    pub test_timeout_seconds: f64,
    /// Hidden tests used for the reward per problem (the first N).
    pub max_hidden_tests: u32,
}

impl Default for CodeConfig {
    fn default() -> Self {
        CodeConfig { test_timeout_seconds: 30.0, max_hidden_tests: 4 }
    }
}

impl EnvConfig {
    pub fn name(&self) -> &'static str {
        match self {
            EnvConfig::PlanPath(_) => "plan_path",
            EnvConfig::Sudoku(_) => "sudoku",
            EnvConfig::Sokoban(_) => "sokoban",
            EnvConfig::TicTacToe(_) => "tic_tac_toe",
            EnvConfig::Math(_) => "math",
            EnvConfig::Code(_) => "code",
        }
    }

    /// Workflows that can play this environment.
    pub fn workflows(&self) -> &'static [WorkflowKind] {
        use WorkflowKind::*;
        match self {
            EnvConfig::PlanPath(_) | EnvConfig::Sudoku(_) | EnvConfig::Sokoban(_) => &[SingleAgent, ToolPlanner],
            EnvConfig::TicTacToe(_) => &[TwoPlayers],
            EnvConfig::Math(_) => &[SingleAgent, ToolReasoner],
            EnvConfig::Code(_) => &[SingleAgent, CoderTester],
        }
    }
}

/// Where tasks come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Training tasks (generated, or the first N of the train file).
    pub train_tasks: u32,
    /// Test tasks, disjoint from the training tasks.
    pub test_tasks: u32,
    /// Dataset file for the training split (math, code); generated when absent.
    pub train_file: Option<DatasetFile>,
    /// Dataset file for the test split (math, code); generated when absent.
    pub test_file: Option<DatasetFile>,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig { train_tasks: 640, test_tasks: 200, train_file: None, test_file: None }
    }
}

/// A user's JSONL or Parquet file and which of its columns hold what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetFile {
    /// Path of the file, relative to this config file.
    pub path: PathBuf,
    /// jsonl or parquet; taken from the extension when absent.
    #[serde(default)]
    pub format: Option<DatasetFormat>,
    /// Column of the file for each field the environment reads (e.g. problem: question).
    #[serde(default)]
    pub columns: BTreeMap<DatasetField, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetFormat {
    Jsonl,
    Parquet,
}

/// A field an environment reads from a dataset row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetField {
    Id,
    Problem,
    Answer,
    Tests,
    PublicTests,
    Solution,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// Which workflow plays the environment.
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

/// Why agents act alone in one turn only: they share the environment's state.
const ALONE_OVER_TURNS: &str = "acting alone needs workflow.max_turns: 1; over more turns the planner's \
     moves reach the tool agent through the state they share, so neither would be alone";

fn default_max_turns() -> u32 {
    4
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Two players take turns (tic-tac-toe).
    TwoPlayers,
}

impl WorkflowKind {
    /// The roles of the workflow, in the order they act within a turn.
    pub fn roles(self) -> &'static [&'static str] {
        match self {
            WorkflowKind::SingleAgent => &["agent"],
            WorkflowKind::ToolPlanner => &["tool", "planner"],
            WorkflowKind::ToolReasoner => &["tool", "reasoner"],
            WorkflowKind::CoderTester => &["coder", "tester"],
            WorkflowKind::TwoPlayers => &["player_x", "player_o"],
        }
    }

    /// Whether the agents can act alone (`workflow.alone`, evaluation modes `alone` and
    /// `tool_alone`): only where no agent's turn needs the other's.
    pub fn can_act_alone(self) -> bool {
        self == WorkflowKind::ToolPlanner
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The policy (a key of `policies`) that plays this role.
    pub policy: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Hugging Face folder of the base model (config.json, tokenizer.json, *.safetensors),
    /// relative to this config file.
    pub model: PathBuf,
    /// pretrained: load the folder's weights and tokenizer; scratch: initialise from its
    /// config.json with the run seed and build the tokenizer from the task corpus.
    #[serde(default)]
    pub init: ModelInit,
    /// Where the policy samples and trains: cpu, cuda or cuda:N.
    #[serde(default)]
    pub device: Device,
    /// Weight dtype; bf16 on CUDA and f32 on CPU when absent.
    #[serde(default)]
    pub dtype: Option<DType>,
    /// Train a LoRA adapter on a frozen base instead of all weights.
    #[serde(default)]
    pub lora: Option<LoraConfig>,
    /// AdamW settings.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ModelInit {
    #[default]
    Pretrained,
    Scratch,
}

/// A device: `cpu`, `cuda` (the first GPU) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Device, D::Error> {
        let text = String::deserialize(d)?;
        let device = match text.as_str() {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            other => other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Device::Cuda),
        };
        device.ok_or_else(|| serde::de::Error::custom(format!("unknown device {text:?}, expected cpu, cuda or cuda:N")))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Rank of the low-rank update.
    pub rank: u32,
    /// Scaling numerator: the update is scaled by alpha / rank.
    pub alpha: f64,
    /// Dropout on the adapter's input during training.
    pub dropout: f64,
    /// Linear layers that get an adapter, by their last name segment; all of them when empty.
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig { rank: 16, alpha: 32.0, dropout: 0.0, targets: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Adam betas.
    pub betas: [f64; 2],
    /// Adam epsilon.
    pub eps: f64,
    /// Linear warm-up steps.
    pub warmup_steps: u32,
    /// Learning-rate schedule after warm-up.
    pub schedule: Schedule,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            lr: 1e-6,
            weight_decay: 0.01,
            betas: [0.9, 0.999],
            eps: 1e-8,
            warmup_steps: 0,
            schedule: Schedule::Constant,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    #[default]
    Constant,
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Training tasks per iteration (B).
    pub tasks_per_iteration: u32,
    /// Candidates per (task, agent, turn) in tree mode, trajectories per task otherwise (K).
    pub k: u32,
    /// tree: AT-GRPO's branch-and-select sampling; independent: K separate trajectories.
    pub mode: RolloutMode,
    /// How the candidate that continues the trajectory is chosen in tree mode.
    pub select: Selection,
    /// Sampling settings.
    pub sampling: SamplingConfig,
    /// Longer prompts are cut from the left.
    pub max_prompt_tokens: u32,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            tasks_per_iteration: 16,
            k: 4,
            mode: RolloutMode::Tree,
            select: Selection::BestReward,
            sampling: SamplingConfig::default(),
            max_prompt_tokens: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    Tree,
    Independent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Highest mixed reward; ties go to the lowest branch.
    BestReward,
    /// Always branch 0 (a random pick, since branches are exchangeable).
    First,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy decoding.
    pub temperature: f64,
    /// Nucleus threshold; 1 disables it.
    pub top_p: f64,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: u32,
    /// Tokens generated at most per response.
    pub max_new_tokens: u32,
    /// Generation also stops after any of these strings.
    pub stop: Vec<String>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 256, stop: Vec::new() }
    }
}

impl SamplingConfig {
    fn greedy() -> Self {
        SamplingConfig { temperature: 0.0, ..SamplingConfig::default() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmConfig {
    /// Advantage estimator.
    pub name: Algorithm,
    /// Weight of the team reward in r = alpha * r_team + r_local.
    pub alpha: f64,
    /// Added to the group std before dividing.
    pub std_epsilon: f64,
    /// PPO clip range: ratios outside [1 - eps, 1 + eps] stop contributing gradient.
    pub clip_epsilon: f64,
    /// Which groups are trained on.
    pub filter: GroupFilter,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        AlgorithmConfig {
            name: Algorithm::AtGrpo,
            alpha: 1.0,
            std_epsilon: 1e-6,
            clip_epsilon: 0.2,
            filter: GroupFilter::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Groups by (task, agent, turn), A = (r - mean) / (std + eps).
    AtGrpo,
    /// Groups by task only.
    Grpo,
    /// GRPO without std normalisation, sequence-sum token normalisation.
    DrGrpo,
    /// CoMLRL MAGRPO: group-mean baseline.
    Magrpo,
    /// CoMLRL MARLOO: leave-one-out baseline.
    Marloo,
    /// CoMLRL MAReMax: group-max baseline.
    Maremax,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct GroupFilter {
    /// Drop groups whose rewards are all equal (no learning signal).
    pub drop_degenerate: bool,
    /// Drop this fraction of groups with the lowest mean reward.
    pub drop_lowest_mean_fraction: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateConfig {
    /// Passes over the iteration's samples.
    pub epochs: u32,
    /// Sequences per optimiser step.
    pub mini_batch_sequences: u32,
    /// Tokens per forward/backward pass; bounds memory, not the step.
    pub micro_batch_tokens: u32,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// Recompute activations in the backward pass to save memory.
    pub gradient_checkpointing: bool,
    /// Largest mean |recomputed - sampled| token logprob accepted before the first step;
    /// more means the weights or the sampler are wrong, and the update refuses.
    pub max_logprob_drift: f64,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            epochs: 1,
            mini_batch_sequences: 64,
            micro_batch_tokens: 8192,
            grad_clip: 1.0,
            gradient_checkpointing: false,
            max_logprob_drift: 0.05,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvaluationConfig {
    /// Evaluate after every N-th iteration (and after the last); 0 evaluates only after the last.
    pub every: u32,
    /// Also evaluate the starting policies (v0) before training.
    pub at_start: bool,
    /// Test tasks played per evaluation (at most data.test_tasks).
    pub tasks: u32,
    /// Episodes per task.
    pub samples: u32,
    /// Which set-ups are evaluated.
    pub modes: Vec<EvalMode>,
    /// Sampling settings; greedy by default.
    pub sampling: SamplingConfig,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        EvaluationConfig {
            every: 10,
            at_start: true,
            tasks: 200,
            samples: 1,
            modes: vec![EvalMode::MultiAgent],
            sampling: SamplingConfig::greedy(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    /// The environment's single-agent workflow, played by the first agent's policy.
    SingleAgent,
    /// The configured workflow, its agents working together.
    MultiAgent,
    /// The configured workflow with the two roles' policies exchanged.
    Swapped,
    /// The configured workflow with each agent acting alone, as `workflow.alone` trains
    /// them (tool_planner only): success is the planner's own.
    Alone,
    /// The same episodes, but success is the tool agent's own: its latest printed answer,
    /// simulated on the state it saw, solves the task (tool_planner only).
    ToolAlone,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmStartConfig {
    /// Demonstrations generated from the environment's solver.
    pub demonstrations: u32,
    /// Optimiser steps of supervised training.
    pub steps: u32,
    /// Demonstrations per step.
    pub batch_size: u32,
    /// AdamW settings of the warm start.
    pub optimizer: OptimizerConfig,
}

impl Default for WarmStartConfig {
    fn default() -> Self {
        WarmStartConfig {
            demonstrations: 20_000,
            steps: 400,
            batch_size: 64,
            optimizer: OptimizerConfig {
                lr: 2e-3,
                warmup_steps: 100,
                schedule: Schedule::Cosine,
                ..OptimizerConfig::default()
            },
        }
    }
}

/// A parsed, validated config and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: RunConfig,
    /// The file as written, frozen into the run as run.yaml.
    pub text: String,
    pub file: PathBuf,
}

impl LoadedConfig {
    /// Folder that relative paths in the file are resolved against.
    pub fn base_dir(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("."))
    }

    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.base_dir().join(path)
    }

    /// The store URL, with a local path taken relative to the config file.
    pub fn store_url(&self) -> String {
        self.resolve_url(&self.config.store)
    }

    /// A URL as it is; a local path relative to the config file's folder.
    fn resolve_url(&self, location: &str) -> String {
        if location.contains("://") {
            location.to_string()
        } else {
            absolute(&self.resolve(Path::new(location))).to_string_lossy().into_owned()
        }
    }

    /// The config as a run freezes it: every default filled in and every local path
    /// absolute, so stages reading it from the store need nothing else.
    pub fn resolved(&self) -> RunConfig {
        let mut config = self.config.clone();
        config.store = self.store_url();
        if let Some(fork) = &mut config.fork {
            fork.from = self.resolve_url(&fork.from);
        }
        for policy in config.policies.values_mut() {
            policy.model = absolute(&self.resolve(&policy.model));
        }
        for file in [&mut config.data.train_file, &mut config.data.test_file].into_iter().flatten() {
            file.path = absolute(&self.resolve(&file.path));
        }
        config
    }

    /// The text of `run.yaml`: the resolved config as YAML, with where it came from.
    pub fn frozen_yaml(&self) -> String {
        let yaml = serde_saphyr::to_string(&self.resolved()).expect("a config always serialises");
        format!("# Frozen by {} from {}\n{yaml}", crate::CODE_VERSION, absolute(&self.file).display())
    }
}

/// Reads, parses and validates a config file.
pub fn load(file: &Path) -> Result<LoadedConfig, Error> {
    load_with(file, &[])
}

/// Reads a config file, sets the overridden keys in it, then parses and validates it.
pub fn load_with(file: &Path, overrides: &[Override]) -> Result<LoadedConfig, Error> {
    let mut text = std::fs::read_to_string(file).map_err(|source| Error::Read { file: file.to_path_buf(), source })?;
    if !overrides.is_empty() {
        text = apply_overrides(&text, overrides, file)?;
    }
    let config = parse(&text, file)?;
    Ok(LoadedConfig { config, text, file: file.to_path_buf() })
}

/// `KEY=VALUE` from the command line: a dotted key of the file (`algorithm.alpha`) and a
/// YAML value, which replaces the file's value before the file is parsed. Relative paths
/// in values are taken relative to the file, like the file's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub key: String,
    pub value: String,
}

impl std::str::FromStr for Override {
    type Err = String;

    fn from_str(text: &str) -> Result<Override, String> {
        let (key, value) =
            text.split_once('=').ok_or_else(|| format!("{text:?} is not KEY=VALUE (e.g. algorithm.alpha=0.5)"))?;
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(format!("{key:?} in {text:?} is not a dotted key (e.g. algorithm.alpha)"));
        }
        Ok(Override { key: key.to_string(), value: value.to_string() })
    }
}

fn apply_overrides(text: &str, overrides: &[Override], file: &Path) -> Result<String, Error> {
    let parse_error = |message: String| Error::Parse { file: file.to_path_buf(), key: None, message };
    let mut tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    for Override { key, value } in overrides {
        let value = serde_saphyr::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.clone()));
        set_key(&mut tree, key, value).map_err(|message| Error::Invalid {
            file: file.to_path_buf(),
            key: key.clone(),
            message,
        })?;
    }
    Ok(serde_saphyr::to_string(&tree).expect("a YAML tree always serialises"))
}

/// Sets a dotted key in a YAML tree, creating the mappings on its way that are absent.
fn set_key(tree: &mut serde_json::Value, key: &str, value: serde_json::Value) -> Result<(), String> {
    let mut node = tree;
    for part in key.split('.') {
        if node.is_null() {
            *node = serde_json::Value::Object(Default::default());
        }
        let serde_json::Value::Object(map) = node else {
            return Err(format!("--set cannot set `{part}` inside a value that is not a mapping"));
        };
        node = map.entry(part).or_insert(serde_json::Value::Null);
    }
    *node = value;
    Ok(())
}

/// Parses and validates config text; `file` only names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<RunConfig, Error> {
    let mut key = None;
    let parsed = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            key = (path != ".").then_some(path);
            e.into_inner()
        })
    });
    let config: RunConfig = parsed.map_err(|e| {
        let message = e.to_string();
        let message = message.strip_prefix("error: ").unwrap_or(&message).to_string();
        Error::Parse { file: file.to_path_buf(), key, message }
    })?;
    config.validate().map_err(|(key, message)| Error::Invalid { file: file.to_path_buf(), key, message })?;
    Ok(config)
}

fn absolute(path: &Path) -> PathBuf {
    crate::store::absolute_path(path).unwrap_or_else(|_| path.to_path_buf())
}

type Invalid = (String, String);

fn check(ok: bool, key: impl Into<String>, message: impl Into<String>) -> Result<(), Invalid> {
    if ok { Ok(()) } else { Err((key.into(), message.into())) }
}

fn check_probability(value: f64, key: &str) -> Result<(), Invalid> {
    check((0.0..=1.0).contains(&value), key, format!("{value} is not a probability in [0, 1]"))
}

impl RunConfig {
    /// Cross-field rules that serde cannot express. Returns the key path and the problem.
    pub fn validate(&self) -> Result<(), Invalid> {
        check(!self.store.trim().is_empty(), "store", "is empty; give a local path or a URL such as s3://bucket/run")?;
        self.validate_env()?;
        check(
            !self.workflow.alone || self.workflow.kind.can_act_alone(),
            "workflow.alone",
            format!(
                "only tool_planner's agents can act alone; in {:?} each agent's turn needs the other's",
                self.workflow.kind
            ),
        )?;
        check(!self.workflow.alone || self.workflow.max_turns == 1, "workflow.alone", ALONE_OVER_TURNS)?;
        self.validate_agents()?;
        for (name, policy) in &self.policies {
            policy.validate(&format!("policies.{name}"))?;
        }
        self.validate_rollout()?;
        self.validate_algorithm()?;
        self.validate_update()?;
        self.validate_evaluation()?;
        if let Some(fork) = &self.fork {
            check(!fork.from.trim().is_empty(), "fork.from", "is empty; give the source run's path or URL")?;
            check(
                fork.iteration <= self.iterations,
                "fork.iteration",
                format!("is {}, past the run's last iteration ({})", fork.iteration, self.iterations),
            )?;
        }
        if let Some(warm) = &self.warm_start {
            check(
                !matches!(self.env, EnvConfig::Math(_) | EnvConfig::Code(_)),
                "warm_start",
                "demonstrations exist for plan_path, sudoku, sokoban and tic_tac_toe; math and code start from a pretrained model",
            )?;
            check(warm.steps > 0 && warm.batch_size > 0, "warm_start", "steps and batch_size must be at least 1")?;
            check(warm.demonstrations > 0, "warm_start.demonstrations", "must be at least 1")?;
            check(warm.optimizer.lr > 0.0, "warm_start.optimizer.lr", "must be positive")?;
        }
        Ok(())
    }

    fn validate_env(&self) -> Result<(), Invalid> {
        let workflows = self.env.workflows();
        check(
            workflows.contains(&self.workflow.kind),
            "workflow.kind",
            format!("{:?} cannot play {}; it takes {:?}", self.workflow.kind, self.env.name(), workflows),
        )?;
        check(self.workflow.max_turns >= 1, "workflow.max_turns", "must be at least 1")?;
        check(self.data.train_tasks >= 1, "data.train_tasks", "must be at least 1")?;
        check(self.data.test_tasks >= 1, "data.test_tasks", "must be at least 1")?;
        match &self.env {
            EnvConfig::PlanPath(p) => {
                check(p.size >= 2, "env.size", "must be at least 2")?;
                check((0.0..0.9).contains(&p.wall_probability), "env.wall_probability", "must be in [0, 0.9)")?;
                let d = &p.demonstrations;
                for (value, key) in [
                    (d.tool_bfs, "tool_bfs"),
                    (d.tool_greedy, "tool_greedy"),
                    (d.tool_random_walk, "tool_random_walk"),
                    (d.tool_broken, "tool_broken"),
                    (d.planner_copies_tool, "planner_copies_tool"),
                ] {
                    check_probability(value, &format!("env.demonstrations.{key}"))?;
                }
                let total = d.tool_bfs + d.tool_greedy + d.tool_random_walk + d.tool_broken;
                check(
                    (total - 1.0).abs() < 1e-9,
                    "env.demonstrations",
                    format!("the tool_* shares sum to {total}, not 1"),
                )
            }
            EnvConfig::Sudoku(s) => {
                let root = (s.size as f64).sqrt() as u32;
                check(
                    root * root == s.size && s.size >= 4,
                    "env.size",
                    format!("{} is not a square of at least 4 (4, 9, …)", s.size),
                )?;
                check(
                    s.blanks >= 1 && s.blanks < s.size * s.size,
                    "env.blanks",
                    "must leave at least one blank and one clue",
                )
            }
            EnvConfig::Sokoban(s) => {
                check(s.size >= 4, "env.size", "must be at least 4 (walls included)")?;
                check(s.boxes >= 1, "env.boxes", "must be at least 1")
            }
            EnvConfig::Math(m) => {
                check(m.tolerance >= 0.0, "env.tolerance", "must not be negative")?;
                self.check_data_files()
            }
            EnvConfig::Code(c) => {
                check(c.test_timeout_seconds > 0.0, "env.test_timeout_seconds", "must be positive")?;
                self.check_data_files()
            }
            EnvConfig::TicTacToe(_) => Ok(()),
        }
    }

    /// Math and code read their tasks from files.
    fn check_data_files(&self) -> Result<(), Invalid> {
        check(
            self.data.train_file.is_some() && self.data.test_file.is_some(),
            "data",
            format!("{} reads its tasks from files: set data.train_file and data.test_file", self.env.name()),
        )
    }

    fn validate_agents(&self) -> Result<(), Invalid> {
        let roles = self.workflow.kind.roles();
        for role in roles {
            check(
                self.agents.contains_key(*role),
                "agents",
                format!("the {:?} workflow needs an agent `{role}`", self.workflow.kind),
            )?;
        }
        for (role, agent) in &self.agents {
            check(
                roles.contains(&role.as_str()),
                format!("agents.{role}"),
                format!("is not a role of {:?}, whose roles are {roles:?}", self.workflow.kind),
            )?;
            let known: Vec<&String> = self.policies.keys().collect();
            check(
                self.policies.contains_key(&agent.policy),
                format!("agents.{role}.policy"),
                format!("names no policy `{}`; the policies are {known:?}", agent.policy),
            )?;
        }
        for name in self.policies.keys() {
            check(
                self.agents.values().any(|a| &a.policy == name),
                format!("policies.{name}"),
                "is played by no agent",
            )?;
        }
        Ok(())
    }

    fn validate_rollout(&self) -> Result<(), Invalid> {
        let r = &self.rollout;
        check(r.k >= 1, "rollout.k", "must be at least 1")?;
        check(r.tasks_per_iteration >= 1, "rollout.tasks_per_iteration", "must be at least 1")?;
        check(
            r.tasks_per_iteration <= self.data.train_tasks,
            "rollout.tasks_per_iteration",
            format!("{} is more than data.train_tasks ({})", r.tasks_per_iteration, self.data.train_tasks),
        )?;
        check(r.max_prompt_tokens >= 1, "rollout.max_prompt_tokens", "must be at least 1")?;
        r.sampling.validate("rollout.sampling")
    }

    fn validate_algorithm(&self) -> Result<(), Invalid> {
        let a = &self.algorithm;
        check(a.alpha >= 0.0, "algorithm.alpha", "must not be negative")?;
        check(a.std_epsilon > 0.0, "algorithm.std_epsilon", "must be positive")?;
        check(a.clip_epsilon > 0.0 && a.clip_epsilon < 1.0, "algorithm.clip_epsilon", "must be in (0, 1)")?;
        let f = a.filter.drop_lowest_mean_fraction;
        check((0.0..1.0).contains(&f), "algorithm.filter.drop_lowest_mean_fraction", "must be in [0, 1)")
    }

    fn validate_update(&self) -> Result<(), Invalid> {
        let u = &self.update;
        check(u.epochs >= 1, "update.epochs", "must be at least 1")?;
        check(u.mini_batch_sequences >= 1, "update.mini_batch_sequences", "must be at least 1")?;
        check(u.micro_batch_tokens >= 1, "update.micro_batch_tokens", "must be at least 1")?;
        check(u.grad_clip > 0.0, "update.grad_clip", "must be positive")?;
        check(u.max_logprob_drift > 0.0, "update.max_logprob_drift", "must be positive")
    }

    fn validate_evaluation(&self) -> Result<(), Invalid> {
        let e = &self.evaluation;
        check(e.tasks >= 1, "evaluation.tasks", "must be at least 1")?;
        check(
            e.tasks <= self.data.test_tasks,
            "evaluation.tasks",
            format!("{} is more than data.test_tasks ({})", e.tasks, self.data.test_tasks),
        )?;
        check(e.samples >= 1, "evaluation.samples", "must be at least 1")?;
        check(!e.modes.is_empty(), "evaluation.modes", "must name at least one mode")?;
        let two_roles = self.workflow.kind.roles().len() == 2;
        check(
            !e.modes.contains(&EvalMode::Swapped) || two_roles,
            "evaluation.modes",
            "swapped needs a workflow with two roles",
        )?;
        let alone = e.modes.iter().any(|m| matches!(m, EvalMode::Alone | EvalMode::ToolAlone));
        check(
            !alone || self.workflow.kind.can_act_alone(),
            "evaluation.modes",
            "alone and tool_alone need the tool_planner workflow",
        )?;
        check(!alone || self.workflow.max_turns == 1, "evaluation.modes", ALONE_OVER_TURNS)?;
        e.sampling.validate("evaluation.sampling")
    }

    /// The first iteration the run trains: 0, or the iteration it was forked from.
    pub fn first_iteration(&self) -> u32 {
        self.fork.as_ref().map_or(0, |f| f.iteration)
    }

    /// The sections that decide what a rollout samples (given the weights) and that
    /// differ between two configs: a replay copies turns only between equal ones.
    pub fn sampling_differences(&self, other: &RunConfig) -> Vec<&'static str> {
        fn json<T: Serialize>(value: &T) -> serde_json::Value {
            serde_json::to_value(value).expect("a config always serialises")
        }
        let sections: [(&'static str, serde_json::Value, serde_json::Value); 6] = [
            ("seed", json(&self.seed), json(&other.seed)),
            ("env", json(&self.env), json(&other.env)),
            ("data", json(&self.data), json(&other.data)),
            ("workflow", json(&self.workflow), json(&other.workflow)),
            ("agents", json(&self.agents), json(&other.agents)),
            ("rollout", json(&self.rollout), json(&other.rollout)),
        ];
        sections.into_iter().filter(|(_, a, b)| a != b).map(|(name, _, _)| name).collect()
    }

    /// The run's name: `name`, or the last segment of the store URL.
    pub fn run_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let trimmed = self.store.trim_end_matches('/');
            trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
        })
    }

    /// sha256 of the resolved config (defaults filled in), so formatting and comments
    /// do not count as a change but every setting does.
    pub fn sha256(&self) -> String {
        let json = serde_json::to_vec(self).expect("a config always serialises");
        hex::encode(Sha256::digest(json))
    }
}

impl PolicyConfig {
    fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(
            !self.model.as_os_str().is_empty(),
            format!("{key}.model"),
            "is empty; give a Hugging Face model folder",
        )?;
        if let Some(lora) = &self.lora {
            check(lora.rank >= 1, format!("{key}.lora.rank"), "must be at least 1")?;
            check(lora.alpha > 0.0, format!("{key}.lora.alpha"), "must be positive")?;
            check((0.0..1.0).contains(&lora.dropout), format!("{key}.lora.dropout"), "must be in [0, 1)")?;
        }
        check(self.optimizer.lr > 0.0, format!("{key}.optimizer.lr"), "must be positive")?;
        let [b1, b2] = self.optimizer.betas;
        check(
            (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2),
            format!("{key}.optimizer.betas"),
            "must both be in [0, 1)",
        )?;
        check(
            self.dtype != Some(DType::F16) || self.device != Device::Cpu,
            format!("{key}.dtype"),
            "f16 is for CUDA; use f32 or bf16 on cpu",
        )
    }
}

impl SamplingConfig {
    fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(self.temperature >= 0.0, format!("{key}.temperature"), "must not be negative (0 is greedy)")?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, format!("{key}.top_p"), "must be in (0, 1]")?;
        check(self.max_new_tokens >= 1, format!("{key}.max_new_tokens"), "must be at least 1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "
store: runs/x
iterations: 2
env: {name: plan_path}
workflow: {kind: tool_planner}
agents:
  tool: {policy: shared}
  planner: {policy: shared}
policies:
  shared: {model: ../checkpoints/tiny}
";

    fn parse_str(text: &str) -> Result<RunConfig, Error> {
        parse(text, Path::new("it.yaml"))
    }

    fn error_of(text: &str) -> String {
        parse_str(text).unwrap_err().to_string()
    }

    fn overridden(overrides: &[&str]) -> Result<RunConfig, Error> {
        let overrides: Vec<Override> = overrides.iter().map(|o| o.parse().unwrap()).collect();
        parse_str(&apply_overrides(MINIMAL, &overrides, Path::new("it.yaml"))?)
    }

    #[test]
    fn overrides_replace_nested_and_absent_keys() {
        let config = overridden(&[
            "seed=7",
            "env.size=6",
            "algorithm.name=grpo",
            "store=s3://b/r",
            "policies.shared.lora.rank=4",
        ])
        .unwrap();
        assert_eq!(config.seed, 7);
        assert!(matches!(config.env, EnvConfig::PlanPath(PlanPathConfig { size: 6, .. })));
        assert_eq!(config.algorithm.name, Algorithm::Grpo);
        assert_eq!(config.store, "s3://b/r");
        assert_eq!(config.policies["shared"].lora.as_ref().unwrap().rank, 4);
    }

    #[test]
    fn a_fork_restarts_at_rollout_or_replays_it() {
        let fork: ForkConfig = "s3://b/runs/a@3".parse().unwrap();
        assert_eq!((fork.from.as_str(), fork.iteration, fork.replay), ("s3://b/runs/a", 3, false));
        let fork: ForkConfig = "runs/a@10:group".parse().unwrap();
        assert_eq!((fork.from.as_str(), fork.iteration, fork.replay), ("runs/a", 10, true));
        assert!("runs/a@1:advantage".parse::<ForkConfig>().unwrap_err().contains("URL@K:group"));
        assert!("runs/a".parse::<ForkConfig>().is_err() && "@1".parse::<ForkConfig>().is_err());
    }

    #[test]
    fn a_bad_override_names_its_key() {
        let message = overridden(&["iterations=many"]).unwrap_err().to_string();
        assert!(message.starts_with("it.yaml: iterations: "), "{message}");
        let message = overridden(&["iterations.low=1"]).unwrap_err().to_string();
        assert!(message.starts_with("it.yaml: iterations.low: --set cannot set `low`"), "{message}");
        assert!("seed".parse::<Override>().is_err() && "a..b=1".parse::<Override>().is_err());
    }

    #[test]
    fn a_minimal_config_gets_the_documented_defaults() {
        let config = parse_str(MINIMAL).unwrap();
        assert_eq!(config.rollout.k, 4);
        assert_eq!(config.algorithm.name, Algorithm::AtGrpo);
        assert_eq!(config.algorithm.alpha, 1.0);
        assert_eq!(config.evaluation.sampling.temperature, 0.0);
        assert_eq!(config.env, EnvConfig::PlanPath(PlanPathConfig::default()));
        assert_eq!(config.policies["shared"].device, Device::Cpu);
        assert_eq!(config.run_name(), "x");
    }

    #[test]
    fn an_unknown_key_names_its_path_and_the_allowed_keys() {
        let message = error_of(&MINIMAL.replace("iterations: 2", "iterations: 2\nrollout: {kk: 3}"));
        assert!(message.starts_with("it.yaml: rollout"), "{message}");
        assert!(message.contains("unknown field `kk`, expected one of tasks_per_iteration, k, "), "{message}");
        assert!(message.contains("line 4 column 11"), "{message}");
    }

    #[test]
    fn a_wrong_type_names_its_path_and_the_expected_type() {
        let message = error_of(&MINIMAL.replace("iterations: 2", "iterations: two"));
        assert!(message.starts_with("it.yaml: iterations: "), "{message}");
        assert!(message.contains("u32") || message.contains("integer"), "{message}");
    }

    #[test]
    fn a_nested_wrong_type_names_the_full_path() {
        let message = error_of(&MINIMAL.replace("{model: ../checkpoints/tiny}", "{model: m, lora: {rank: big}}"));
        assert!(message.starts_with("it.yaml: policies.shared.lora.rank: "), "{message}");
    }

    #[test]
    fn an_unknown_env_lists_the_environments() {
        let message = error_of(&MINIMAL.replace("name: plan_path", "name: chess"));
        assert!(message.contains("chess") && message.contains("plan_path") && message.contains("sokoban"), "{message}");
    }

    #[test]
    fn an_unknown_env_parameter_is_refused() {
        let message = error_of(&MINIMAL.replace("name: plan_path", "name: plan_path, sise: 6"));
        assert!(message.contains("unknown field `sise`, expected one of size, "), "{message}");
    }

    #[test]
    fn malformed_yaml_is_a_parse_error_with_a_location() {
        let message = error_of("store: [unclosed\niterations: 2\n");
        assert!(message.starts_with("it.yaml: "), "{message}");
        assert!(message.contains("line"), "{message}");
    }

    #[test]
    fn an_agent_must_name_an_existing_policy() {
        let message = error_of(&MINIMAL.replace("planner: {policy: shared}", "planner: {policy: other}"));
        assert_eq!(message, "it.yaml: agents.planner.policy: names no policy `other`; the policies are [\"shared\"]");
    }

    #[test]
    fn every_role_of_the_workflow_needs_an_agent() {
        let message = error_of(&MINIMAL.replace("  planner: {policy: shared}\n", ""));
        assert!(message.contains("agents: the ToolPlanner workflow needs an agent `planner`"), "{message}");
    }

    #[test]
    fn a_workflow_must_fit_the_environment() {
        let message = error_of(&MINIMAL.replace("kind: tool_planner", "kind: coder_tester"));
        assert!(message.contains("workflow.kind: CoderTester cannot play plan_path"), "{message}");
    }

    #[test]
    fn only_tool_and_planner_play_alone_and_in_one_turn() {
        let modes = "evaluation.modes=[multi_agent, alone, tool_alone]";
        let config = overridden(&["workflow.alone=true", "workflow.max_turns=1", modes]).unwrap();
        assert!(config.workflow.alone);
        assert_eq!(config.evaluation.modes, [EvalMode::MultiAgent, EvalMode::Alone, EvalMode::ToolAlone]);
        let single = MINIMAL.replace("kind: tool_planner", "kind: single_agent").replace(
            "agents:\n  tool: {policy: shared}\n  planner: {policy: shared}",
            "agents:\n  agent: {policy: shared}",
        );
        let message = error_of(&single.replace("kind: single_agent", "kind: single_agent, alone: true"));
        assert!(message.contains("workflow.alone: only tool_planner's agents can act alone"), "{message}");
        for mode in ["alone", "tool_alone"] {
            let message = error_of(&format!("{single}evaluation: {{modes: [{mode}]}}\n"));
            assert!(message.contains("evaluation.modes: alone and tool_alone need the tool_planner"), "{message}");
        }
        for (set, key) in
            [("workflow.alone=true", "workflow.alone"), ("evaluation.modes=[tool_alone]", "evaluation.modes")]
        {
            let message = overridden(&[set, "workflow.max_turns=2"]).unwrap_err().to_string();
            assert!(message.contains(&format!("{key}: acting alone needs workflow.max_turns: 1")), "{message}");
        }
    }

    #[test]
    fn devices_parse_and_bad_ones_are_named() {
        let config =
            parse_str(&MINIMAL.replace("{model: ../checkpoints/tiny}", "{model: m, device: \"cuda:1\"}")).unwrap();
        assert_eq!(config.policies["shared"].device, Device::Cuda(1));
        let message = error_of(&MINIMAL.replace("{model: ../checkpoints/tiny}", "{model: m, device: tpu}"));
        assert!(message.contains("policies.shared.device") && message.contains("cpu, cuda or cuda:N"), "{message}");
    }

    #[test]
    fn demonstration_shares_must_sum_to_one() {
        let message = error_of(&MINIMAL.replace("name: plan_path", "name: plan_path, demonstrations: {tool_bfs: 0.5}"));
        assert!(message.contains("env.demonstrations: the tool_* shares sum to 1.35"), "{message}");
    }

    #[test]
    fn the_frozen_config_parses_back_with_absolute_paths() {
        let loaded = LoadedConfig {
            config: parse_str(MINIMAL).unwrap(),
            text: MINIMAL.into(),
            file: "/etc/petting/it.yaml".into(),
        };
        let frozen = parse(&loaded.frozen_yaml(), Path::new("run.yaml")).unwrap();
        assert_eq!(frozen.store, "/etc/petting/runs/x");
        assert_eq!(frozen.policies["shared"].model, Path::new("/etc/checkpoints/tiny"));
        assert_eq!(frozen.rollout, loaded.config.rollout);
        assert_eq!(frozen, loaded.resolved());
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_settings() {
        let a = parse_str(MINIMAL).unwrap();
        let b = parse_str(&format!("# a comment\n{MINIMAL}")).unwrap();
        let c = parse_str(&MINIMAL.replace("iterations: 2", "iterations: 3")).unwrap();
        assert_eq!(a.sha256(), b.sha256());
        assert_ne!(a.sha256(), c.sha256());
    }
}
