use std::io::Write;

use anyhow::Context;
use petting::inspect::{self, export};
use petting::store::RunStore;

use super::args::{ExportArgs, ExportFormat};

pub async fn run(args: ExportArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    store.ensure_exists().await?;
    let turns = inspect::iteration_turns(&store, args.iteration).await?;
    let transcripts = export::transcripts(&turns, args.iteration);
    let bytes = match args.format {
        ExportFormat::Jsonl => export::to_jsonl(&transcripts).into_bytes(),
        ExportFormat::Parquet => export::to_parquet(&transcripts)?,
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {} transcripts to {}", transcripts.len(), path.display());
        }
        None => std::io::stdout().write_all(&bytes)?,
    }
    Ok(())
}
