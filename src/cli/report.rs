use std::path::PathBuf;

use anyhow::Context;
use petting::inspect::{compare, report};
use petting::store::RunStore;

use super::args::{CompareArgs, Format, ReportArgs};

pub async fn run(args: ReportArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    store.ensure_exists().await?;
    let dir = args.output.unwrap_or_else(|| default_folder(store.url()));
    let written = report::write_report(&store, &dir).await?;
    println!("wrote {} ({} charts, {} trees)", written.index.display(), written.charts.len(), written.trees.len());
    Ok(())
}

/// `<last part of the run's URL>-report` in the current folder: never inside the run,
/// whose files `petting gc` would take for debris.
fn default_folder(url: &str) -> PathBuf {
    let name = url.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("run");
    PathBuf::from(format!("{name}-report"))
}

pub async fn compare(args: CompareArgs) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for url in &args.runs {
        let store = RunStore::open(url)?;
        store.ensure_exists().await?;
        let run = compare::read_run(&store).await.with_context(|| format!("cannot compare {url}"))?;
        let trained = args.at.unwrap_or(run.iterations);
        if !run.success.iter().flat_map(|s| &s.points).any(|p| p.0 == i64::from(trained)) {
            eprintln!("note: {url} has no evaluation of version {trained}; only its untrained rows count");
        }
        runs.push(run);
    }
    compare::label_runs(&mut runs, &args.label)?;
    let table = compare::table(&runs, args.at);
    let single_seed = table.rows.iter().flat_map(|(_, cells)| cells.iter().flatten()).filter(|c| c.seeds < 2).count();
    if single_seed > 0 {
        eprintln!(
            "note: {single_seed} cells have one seed: their ± 0.0 is no measured spread; run more seeds to compare them"
        );
    }
    let written = compare::write_comparison(&runs, &table, &args.output)?;
    match args.format {
        Format::Text => {
            print!("{}", compare::render(&table));
            println!("wrote {} files into {}", written.files.len(), args.output.display());
        }
        Format::Json => println!("{}", serde_json::to_string_pretty(&compare::cells(&table))?),
    }
    Ok(())
}
