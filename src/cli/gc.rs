use petting::store::RunStore;

use super::args::GcArgs;

pub async fn run(args: GcArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    store.ensure_exists().await?;
    let report = store.gc(args.grace, args.dry_run).await?;
    let verb = if args.dry_run { "would delete" } else { "deleted" };
    for (path, bytes) in &report.deleted {
        println!("{verb} {path} ({})", super::human_bytes(*bytes));
    }
    let total: u64 = report.deleted.iter().map(|(_, b)| b).sum();
    println!("{verb} {} uncommitted files, {}", report.deleted.len(), super::human_bytes(total));
    if !report.spared.is_empty() {
        println!(
            "spared {} uncommitted files younger than {}s (a stage may still commit them; see --grace)",
            report.spared.len(),
            args.grace.as_secs()
        );
    }
    Ok(())
}

pub async fn verify(url: &str) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    store.ensure_exists().await?;
    let checked = store.verify().await?;
    println!("{checked} committed files match their size and sha256");
    Ok(())
}
