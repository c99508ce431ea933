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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline.
    #[command(subcommand)]
    Pipeline(PipelineCommand),
    /// Check or show an iteration.yaml.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run one stage of an existing run by hand (it reads the run's frozen run.yaml).
    #[command(subcommand)]
    Stage(StageCommand),
    /// Query a run's committed tables with SQL (an interactive prompt without a query).
    Sql(SqlArgs),
    /// Show which stages of a run are committed, per iteration.
    Status(RunArgs),
    /// Delete files of a run that no commit marker names (crashed or losing attempts).
    Gc(GcArgs),
    /// Check every committed file of a run against the size and sha256 its marker records.
    Verify(RunArgs),
    /// Describe the tables a run holds and their columns.
    Schema(SchemaArgs),
}

#[derive(Debug, Subcommand)]
pub enum PipelineCommand {
    /// Run (or resume) the pipeline an iteration.yaml describes.
    Run(PipelineRunArgs),
}

#[derive(Debug, clap::Args)]
pub struct PipelineRunArgs {
    /// The run's iteration.yaml.
    pub config: PathBuf,
    /// Resume a run even though its iteration.yaml changed since it started.
    #[arg(long)]
    pub allow_config_change: bool,
}

#[derive(Debug, Subcommand)]
pub enum StageCommand {
    /// Write the tasks table (train and test splits) and, with warm_start, the demonstrations.
    PrepareData(StageArgs),
}

#[derive(Debug, clap::Args)]
pub struct StageArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    #[arg(long)]
    pub run: String,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Parse and validate an iteration.yaml; print a summary.
    Check { config: PathBuf },
    /// Print an iteration.yaml with every default filled in.
    Show { config: PathBuf },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The run: a local path, file:///path, s3://bucket/prefix, gs://…, az://…
    pub run: String,
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
    /// First check every committed file's sha256 (reads the whole run).
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
pub struct SchemaArgs {
    /// One table; all tables when absent.
    pub table: Option<String>,
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
