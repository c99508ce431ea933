use std::path::PathBuf;

use anyhow::Context;
use petting::inspect::{compare, report};
use petting::store::RunStore;

use super::args::{CompareArgs, ReportArgs};

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
        let last = run.success.iter().flat_map(|s| &s.points).map(|p| p.0).max();
        if last != Some(i64::from(run.iterations)) {
            let at = last.map_or("nothing".to_string(), |v| format!("up to version {v}"));
            eprintln!("note: {url} has evaluated {at} of {}; only its untrained rows count", run.iterations);
        }
        runs.push(run);
    }
    let table = compare::table(&runs);
    print!("{}", compare::render(&table));
    let written = compare::write_comparison(&runs, &table, &args.output)?;
    println!("wrote {} files into {}", written.files.len(), args.output.display());
    Ok(())
}
