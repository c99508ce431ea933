//! The `petting` command line: parse, call one library function, print.

mod args;
mod config;
mod gc;
mod pipeline;
mod schema;
mod sql;
mod stage;
mod status;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, ConfigCommand, PipelineCommand, StageCommand};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PETTING_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            // Library errors usually quote their source already; show only what adds.
            let mut shown = error.to_string();
            for cause in error.chain().skip(1) {
                let cause = cause.to_string();
                if !shown.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                    shown = cause;
                }
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Pipeline(PipelineCommand::Run(args)) => pipeline::run(args).await,
        Command::Config(ConfigCommand::Check { config }) => config::check(&config),
        Command::Config(ConfigCommand::Show { config }) => config::show(&config),
        Command::Stage(StageCommand::PrepareData(args)) => stage::prepare_data(&args.run).await,
        Command::Sql(args) => sql::run(args).await,
        Command::Status(args) => status::run(&args.run).await,
        Command::Gc(args) => gc::run(args).await,
        Command::Verify(args) => gc::verify(&args.run).await,
        Command::Schema(args) => schema::run(args.table.as_deref()),
    }
}

/// `1.2 MiB`-style sizes for tables a person reads.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
