//! Command-line arguments. The doc comments are the help text.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Train teams of LLM agents with on-policy multi-agent RL (AT-GRPO), as a batch
/// pipeline over Parquet trajectory stores you can query with SQL.
#[derive(Debug, Parser)]
#[command(name = "petting", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log lines on stderr (-v: info, -vv: debug); `PETTING_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr: no progress bars, no warnings.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// How a command that prints a table or a summary prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// For people.
    #[default]
    Text,
    /// For programs: one JSON document.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented run file to start from (`petting init math my-run`).
    Init(InitArgs),
    /// Run a pipeline.
    #[command(subcommand)]
    Pipeline(PipelineCommand),
    /// Run one stage of an existing run by itself (the pipeline runs them in order).
    Stage(StageArgs),
    /// Check or show an iteration.yaml.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Query a run's committed tables with SQL (an interactive prompt without a query).
    Sql(SqlArgs),
    /// Show which stages of a run are committed, per iteration.
    Status(RunArgs),
    /// List the runs under a local folder or an object-store prefix, with their state.
    Runs(RunsArgs),
    /// Show one task's sampling tree: every candidate per turn and agent, with rewards,
    /// advantages, the selected branch, responses and feedback.
    Show(ShowArgs),
    /// Write an iteration's selected trajectories as chat transcripts (one record per
    /// agent turn: the prompt as the user message, the reply as the assistant's).
    Export(ExportArgs),
    /// Write an HTML page with charts (success, rewards, lengths, PPO statistics, time per
    /// stage) and the trees of the groups whose rewards spread the most, viewable without a network.
    Report(ReportArgs),
    /// Serve a live web dashboard over runs on 127.0.0.1: their state, charts (overlaid
    /// across runs, each with its editable SQL), time line, sampling trees token by token
    /// and configs, updated as the runs commit.
    Ui(UiArgs),
    /// Compare runs: held-out success per method (rows) and task (columns), averaged over
    /// seeds, with Δ against the untrained single agent; also writes a CSV, a bar chart and
    /// learning curves.
    Compare(CompareArgs),
    /// Delete files of a run that no commit marker names (crashed or losing attempts).
    Gc(GcArgs),
    /// Delete checkpoint files a run no longer needs (older versions' optimiser states, and
    /// with --weights their weights), recorded under _pruned/ so reads and verify know.
    Prune(PruneArgs),
    /// Check every committed file of a run against the size and sha256 its marker records.
    Verify(RunArgs),
    /// Describe the tables a run holds and their columns.
    Schema(SchemaArgs),
    /// Inspect, run and import policy models (Hugging Face folders).
    #[command(subcommand)]
    Model(ModelCommand),
    /// Check this machine for what petting uses: libtorch and CUDA, GPUs, Python and its
    /// packages, a vLLM server, free disk.
    Doctor(DoctorArgs),
    /// Print a shell completion script (`petting completions bash > ~/.local/share/bash-completion/completions/petting`).
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// What the run file trains.
    #[arg(value_enum, default_value_t = Template::PlanPath)]
    pub template: Template,
    /// The folder to write `iteration.yaml` into (made if missing).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Template {
    /// Plan-Path with a tool agent and a planner on the embedded default model.
    PlanPath,
    /// Arithmetic with a tool agent and a reasoner on SmolLM2-135M-Instruct.
    Math,
    /// HumanEval with a coder and a tester on Qwen2.5-Coder-0.5B-Instruct.
    Code,
    /// Tic-tac-toe self-play on the embedded default model.
    TicTacToe,
    /// A TextArena game (TicTacToe-v0) on SmolLM2-135M-Instruct.
    Textarena,
    /// A reasoning-gym dataset (basic_arithmetic) on SmolLM2-135M-Instruct.
    ReasoningGym,
    /// Your own agent program (a Python file written beside the run file) on SmolLM2-135M-Instruct.
    AgentProgram,
}

#[derive(Debug, clap::Args)]
pub struct UiArgs {
    /// Runs, or folders and URL prefixes holding runs (listed again as runs appear).
    #[arg(default_value = "runs")]
    pub runs: Vec<String>,
    /// The port to serve on; 0 takes a free one (the address is printed).
    #[arg(long, default_value_t = 8750)]
    pub port: u16,
    /// The address to listen on: 127.0.0.1 keeps the dashboard to this machine.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
}

#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// A local folder or a URL prefix (s3://bucket/runs, gs://…, az://…, file:///…).
    pub prefix: String,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// A run file: also check its vLLM server and the free disk where its store is.
    pub config: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Print a model folder's architecture, parameter count and dtype as JSON.
    Info {
        /// A Hugging Face folder (config.json, *.safetensors).
        dir: PathBuf,
    },
    /// Generate from a prompt or a chat; prints one JSON object per sequence:
    /// {"text", "token_ids", "logprobs", "finish_reason"}.
    Generate(ModelGenerateArgs),
    /// Per-token logprobs of responses: reads JSON lines {"prompt_ids": [...], "response_ids": [...]}
    /// and prints each line with "logprobs" added.
    Score(ModelScoreArgs),
    /// Convert a GGUF file (llama.cpp) into a Hugging Face folder.
    ImportGguf(ImportGgufArgs),
}

#[derive(Debug, clap::Args)]
pub struct ModelLoadArgs {
    /// A Hugging Face folder (config.json, *.safetensors, tokenizer.json).
    pub dir: PathBuf,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Weight dtype (f32, bf16, f16); f32 on CPU and bf16 on CUDA when absent.
    #[arg(long)]
    pub dtype: Option<String>,
    /// A PEFT LoRA adapter folder to apply.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ModelGenerateArgs {
    #[command(flatten)]
    pub model: ModelLoadArgs,
    /// Plain text prompt (tokenised with the tokenizer's special tokens).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    pub prompt: Option<String>,
    /// A conversation as JSON, [{"role": "user", "content": "..."}], rendered with the chat template.
    #[arg(long)]
    pub chat: Option<String>,
    /// With --chat: Qwen3's enable_thinking (true or false); unset when absent.
    #[arg(long)]
    pub enable_thinking: Option<bool>,
    /// New tokens at most.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Greedy decoding (the default unless --temperature is given).
    #[arg(long, conflicts_with_all = ["temperature", "top_p", "top_k"])]
    pub greedy: bool,
    /// Sampling temperature.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Seed of the first sequence; sequence i uses seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sequences to sample from the prompt.
    #[arg(long, default_value_t = 1)]
    pub num_sequences: usize,
    /// Stop after any of these strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ModelScoreArgs {
    #[command(flatten)]
    pub model: ModelLoadArgs,
    /// JSON lines with prompt_ids and response_ids.
    #[arg(long)]
    pub input: PathBuf,
    /// Padded tokens per forward (micro-batch budget).
    #[arg(long, default_value_t = 8192)]
    pub max_tokens: usize,
}

#[derive(Debug, clap::Args)]
pub struct ImportGgufArgs {
    /// The .gguf file.
    pub file: PathBuf,
    /// The folder to write.
    #[arg(long)]
    pub output: PathBuf,
    /// Weight dtype of the written safetensors (f32 or bf16).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

#[derive(Debug, Subcommand)]
pub enum PipelineCommand {
    /// Run (or resume) the pipeline an iteration.yaml describes.
    Run(PipelineRunArgs),
    /// Print every step of the run as `petting stage` commands with what each waits for,
    /// for an external scheduler (Argo, Airflow, a Slurm dependency chain).
    Plan(PipelinePlanArgs),
}

#[derive(Debug, clap::Args)]
pub struct PipelinePlanArgs {
    /// The run's iteration.yaml.
    pub config: PathBuf,
    /// Split every rollout and evaluation into this many shards.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: u32,
    /// json: one JSON object per line and step, {"step", "after", "command"}.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// The same as --format json.
    #[arg(long, hide = true)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PipelineRunArgs {
    /// The run's iteration.yaml.
    pub config: PathBuf,
    /// Set a key of the file, e.g. `--set seed=2 --set algorithm.alpha=0.5` (repeatable; a
    /// YAML value; relative paths are relative to the file). A run resumes only with the
    /// same settings, since they are part of its config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<petting::config::Override>,
    /// Resume a run even though its iteration.yaml changed since it started (the old
    /// config is kept under _config_history/).
    #[arg(long)]
    pub allow_config_change: bool,
    /// Stop before this stage, e.g. `rollout:3` (to run it by hand, sharded, elsewhere).
    #[arg(long, value_name = "STAGE:K")]
    pub until: Option<String>,
    /// Start a new run from iteration K of a stored run (its policies of version K),
    /// e.g. `--from runs/plan-path@10`; resuming the new run later needs no --from.
    /// `URL@K:group` replays: iteration K's turns are copied from the source, not sampled.
    #[arg(long, value_name = "URL@K[:group]")]
    pub from: Option<petting::config::ForkConfig>,
    /// Run as worker I of N processes sharing this run (on one machine or many, e.g. a
    /// Kubernetes Indexed Job or a Slurm array: see deploy/): each plays its shard of
    /// every rollout and evaluation; worker 0 runs the other stages while the rest wait.
    #[arg(long, value_name = "I/N", value_parser = parse_shard, conflicts_with = "ranks")]
    pub worker: Option<petting::store::Shard>,
    /// Run only one lane of the run's stages, each once what it needs is committed:
    /// train (prepare-data, group, advantage, update), sample (rollout and evaluate),
    /// rollout or evaluate. A run with rollout.max_staleness or evaluation.beside starts
    /// its other lanes by itself; give --lane to run each in its own place (another
    /// machine, a `taskset`).
    #[arg(long, value_name = "LANE", conflicts_with_all = ["worker", "ranks"])]
    pub lane: Option<petting::pipeline::Lane>,
    #[command(flatten)]
    pub ranks: RankArgs,
}

/// Running as one of N ranks (docs/cluster.md).
#[derive(Debug, clap::Args)]
pub struct RankArgs {
    /// Start N local ranks of this command, as `torchrun --standalone --nproc-per-node N`
    /// does: each update runs data-parallel over them (c10d: Gloo on CPU), and with
    /// `pipeline run` each plays its shard of every rollout and evaluation. Under
    /// torchrun, srun or a PyTorchJob leave it out: the launcher's RANK, WORLD_SIZE,
    /// MASTER_ADDR and MASTER_PORT say the same.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ranks: Option<u32>,
    /// How long the ranks wait for each other to join.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub rendezvous_timeout: u64,
    /// How long a rank waits in one collective (an all-reduce) for the others.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub collective_timeout: u64,
}

impl RankArgs {
    pub fn timeouts(&self) -> petting::ranks::Timeouts {
        use std::time::Duration;
        petting::ranks::Timeouts {
            rendezvous: Duration::from_secs(self.rendezvous_timeout),
            collective: Duration::from_secs(self.collective_timeout),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct StageArgs {
    /// The stage to run.
    #[arg(value_enum)]
    pub stage: StageName,
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    #[arg(required_unless_present = "run_flag")]
    pub run: Option<String>,
    /// The run, as earlier versions named it.
    #[arg(long = "run", hide = true, conflicts_with = "run")]
    pub run_flag: Option<String>,
    /// The iteration, for per-iteration stages.
    #[arg(long)]
    pub iteration: Option<u32>,
    /// Run one slice of a rollout or an evaluation, e.g. `--shard 0/2`; the slices
    /// together write what one unsharded stage writes.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<petting::store::Shard>,
    /// Ranks, for `update`.
    #[command(flatten)]
    pub ranks: RankArgs,
}

fn parse_shard(text: &str) -> Result<petting::store::Shard, String> {
    let (index, count) = text.split_once('/').ok_or("expected INDEX/COUNT, e.g. 0/2")?;
    let index: u32 = index.trim().parse().map_err(|_| format!("{index:?} is not a shard index"))?;
    let count: u32 = count.trim().parse().map_err(|_| format!("{count:?} is not a shard count"))?;
    if count == 0 || index >= count {
        return Err(format!("shard {index}/{count}: the index must be below the count"));
    }
    Ok(petting::store::Shard { index, count })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StageName {
    /// Write the tasks table (train and test splits) and, with warm_start, the demonstrations.
    PrepareData,
    /// Commit version 0 of every policy (with warm_start, trained by SFT on the demonstrations).
    Init,
    /// Play the iteration's training tasks with tree sampling and write every candidate to turns.
    Rollout,
    /// Group the iteration's candidates and compute group statistics.
    Group,
    /// Compute advantages and route samples to their policies.
    Advantage,
    /// Train each policy on its own samples (PPO-clip) and commit the next version.
    Update,
    /// Play the test split with the iteration's policies and write evals.
    Evaluate,
}

impl StageArgs {
    pub fn run(&self) -> &str {
        self.run.as_deref().or(self.run_flag.as_deref()).expect("clap requires one")
    }
}

impl StageName {
    /// The stage it runs (`init` is the run-level update).
    pub fn stage(self) -> petting::store::Stage {
        use petting::store::Stage;
        match self {
            StageName::PrepareData => Stage::PrepareData,
            StageName::Init | StageName::Update => Stage::Update,
            StageName::Rollout => Stage::Rollout,
            StageName::Group => Stage::Group,
            StageName::Advantage => Stage::Advantage,
            StageName::Evaluate => Stage::Evaluate,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Parse and validate an iteration.yaml; print a summary.
    Check(ConfigArgs),
    /// Print an iteration.yaml with every default filled in.
    Show(ConfigArgs),
    /// Print the run file's JSON Schema (for editors), or its reference as Markdown: every
    /// key with its type, default and meaning.
    Schema {
        #[arg(long, value_enum, default_value_t = SchemaFormat::Json)]
        format: SchemaFormat,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchemaFormat {
    Json,
    Markdown,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// The iteration.yaml.
    pub config: PathBuf,
    /// Check it as a fork of a stored run (`URL@K`), as `pipeline run --from` would run it:
    /// some configs are only valid as a fork (a LoRA adapter on a scratch-trained base).
    #[arg(long, value_name = "URL@K[:group]")]
    pub from: Option<petting::config::ForkConfig>,
    /// Set a key of the file as `pipeline run --set` does, to check the variant it would run.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<petting::config::Override>,
    /// Check it for a run of N ranks (`--ranks N`, torchrun, srun): its pools must add
    /// up to N.
    #[arg(long, value_name = "N")]
    pub ranks: Option<u32>,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// The query; without one, an interactive prompt opens.
    pub query: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Write the result to this file instead of standard output (required for parquet).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// First check every committed file's sha256, checkpoints included, however large
    /// (without it, the tables are checked when they add up to at most 512 MiB).
    #[arg(long)]
    pub verify: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// Spare uncommitted files younger than this (e.g. 30s, 15m, 1h), which a running
    /// stage may still commit.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub grace: std::time::Duration,
    /// List what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// The newest versions of each policy kept whole (at least 1: the next update
    /// continues from the newest version's optimiser state).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep_last: u32,
    /// Also delete older versions' weights (version 0 is always kept).
    #[arg(long)]
    pub weights: bool,
    /// With --weights: keep the weights of every version divisible by this.
    #[arg(long, requires = "weights", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep_every: Option<u32>,
    /// List what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, clap::Args)]
pub struct SchemaArgs {
    /// One table; all tables when absent.
    pub table: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

/// `90`, `90s`, `15m`, `2h`, `1d`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration such as 30s, 15m or 1h"))?;
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}; use s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(number * seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("0").unwrap().as_secs(), 0);
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("15m").unwrap().as_secs(), 900);
        assert_eq!(parse_duration("2h").unwrap().as_secs(), 7200);
        assert!(parse_duration("1w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// The iteration whose rollout to show.
    #[arg(long)]
    pub iteration: u32,
    /// The task id (`petting sql RUN "select distinct task_id from turns where iteration = K"`).
    #[arg(long)]
    pub task: String,
    /// Whole prompts, responses and feedback instead of their first characters.
    #[arg(long)]
    pub full: bool,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// The iteration whose rollout to export.
    #[arg(long)]
    pub iteration: u32,
    #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
    pub format: ExportFormat,
    /// The file to write (JSON Lines go to standard output without it; Parquet needs it).
    #[arg(long, required_if_eq("format", "parquet"))]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// One JSON object per line, with `messages` as TRL and Hugging Face datasets read it.
    Jsonl,
    /// A zstd Parquet file with the same columns.
    Parquet,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
    /// The folder to write index.html, charts/ and trees/ into [default: <run name>-report]
    #[arg(long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The runs: local paths or URLs. Rows come from each run's version 0 and final version.
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The folder to write compare.csv, compare.png and the learning curves into.
    #[arg(long, default_value = "comparison")]
    pub output: PathBuf,
    /// Compare the trained rows at this version (an equal budget of iterations) instead of
    /// each run's final version.
    #[arg(long, value_name = "VERSION")]
    pub at: Option<u32>,
    /// Label every run's rows with this setting of its config, e.g. `--label algorithm.credit`
    /// (repeatable). Without it only runs of one method, task and seed are labelled, by the
    /// settings that differ between them, or by run name.
    #[arg(long, value_name = "KEY")]
    pub label: Vec<String>,
    /// json: the table's cells, as compare.csv has them.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}
