use std::path::PathBuf;

use petting::inspect::report;
use petting::store::RunStore;

use super::args::ReportArgs;

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
