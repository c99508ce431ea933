use petting::policies::Retention;
use petting::policies::doomed_files;
use petting::store::RunStore;

use super::args::{Format, GcArgs, PruneArgs};

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

pub async fn verify(url: &str, format: Format) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    store.ensure_exists().await?;
    let (checked, pruned) = store.verify().await?;
    if format == Format::Json {
        println!("{}", serde_json::json!({"run": store.url(), "checked": checked, "pruned": pruned}));
        return Ok(());
    }
    println!("{checked} committed files match their size and sha256");
    if pruned > 0 {
        println!("{pruned} committed files were pruned on purpose (see _pruned/)");
    }
    Ok(())
}

pub async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let retention = Retention { keep_last: args.keep_last, weights: args.weights, keep_every: args.keep_every };
    let store = RunStore::open(&args.run)?;
    let markers = store.ensure_exists().await?;
    let report = store.prune(&doomed_files(&markers, &retention), &retention.to_string(), args.dry_run).await?;
    let verb = if args.dry_run { "would delete" } else { "deleted" };
    for file in &report.files {
        println!("{verb} {} ({})", file.path, super::human_bytes(file.bytes));
    }
    println!("{verb} {} checkpoint files, {}", report.files.len(), super::human_bytes(report.bytes()));
    if let Some(record) = &report.record {
        println!("recorded in {record}");
    }
    Ok(())
}
