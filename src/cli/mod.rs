//! The `petting` command line: parse, call one library function, print.

mod args;
mod config;
mod doctor;
mod exit;
mod export;
mod gc;
mod init;
mod lanes;
mod model;
mod pipeline;
mod progress;
mod ranks;
mod report;
mod runs;
mod schema;
mod show;
mod sql;
mod stage;
mod status;
mod ui;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, ConfigCommand, ModelCommand, PipelineCommand};

/// libtorch running out of memory reaches the model's boundary as a panic, which the
/// library turns into an error naming the stage and the knob that helps; the default
/// hook would print the panic and libtorch's C++ backtrace before that error.
fn quiet_out_of_memory_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default().to_string();
        if petting::model::out_of_memory_message(&message).is_none() {
            default(info);
        }
    }));
}

pub fn main() -> ExitCode {
    // Like other Unix tools, stop quietly when the reader of our output goes away
    // (`petting sql … | head`) instead of failing on the broken pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    quiet_out_of_memory_panics();
    let cli = Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "petting=info,warn",
        (false, _) => "petting=debug,info",
    };
    if cli.quiet {
        progress::hide();
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PETTING_LOG").unwrap_or_else(|_| level.into()))
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log redirected to a file stays greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
            ExitCode::from(exit::code(&error))
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Pipeline(PipelineCommand::Run(args)) => pipeline::run(args).await,
        Command::Pipeline(PipelineCommand::Plan(args)) => pipeline::plan(&args),
        Command::Stage(args) => stage::run(args).await,
        Command::Config(ConfigCommand::Check(args)) => config::check(&args),
        Command::Config(ConfigCommand::Show(args)) => config::show(&args),
        Command::Config(ConfigCommand::Schema { format }) => config::schema(format),
        Command::Sql(args) => sql::run(args).await,
        Command::Init(args) => init::run(&args),
        Command::Status(args) => status::run(&args.run, args.format).await,
        Command::Runs(args) => runs::run(&args).await,
        Command::Ui(args) => ui::run(args).await,
        Command::Doctor(args) => doctor::run(&args).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "petting", &mut std::io::stdout());
            Ok(())
        }
        Command::Show(args) => show::run(args).await,
        Command::Export(args) => export::run(args).await,
        Command::Report(args) => report::run(args).await,
        Command::Compare(args) => report::compare(args).await,
        Command::Gc(args) => gc::run(args).await,
        Command::Prune(args) => gc::prune(args).await,
        Command::Verify(args) => gc::verify(&args.run, args.format).await,
        Command::Schema(args) => schema::run(args.table.as_deref(), args.format),
        Command::Model(ModelCommand::Info { dir }) => model::info(&dir),
        Command::Model(ModelCommand::Generate(args)) => model::generate(args),
        Command::Model(ModelCommand::Score(args)) => model::score(args),
        Command::Model(ModelCommand::ImportGguf(args)) => model::import_gguf(args),
    }
}

/// Seconds as `45 s`, `14m 02s` or `2h 05m`, for lines a person reads.
fn human_seconds(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
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
