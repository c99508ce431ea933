use comfy_table::{Table, presets};
use petting::pipeline::headline::{Headline, is_of};
use petting::store::status::{StageState, StageStatus, stage_statuses};
use petting::store::{RunStore, StageId};
use serde_json::json;

use super::args::Format;

pub async fn run(url: &str, format: Format) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    let markers = store.ensure_exists().await?;
    let statuses = stage_statuses(&markers);
    // A run whose config cannot be read still shows what it committed.
    let config = petting::config::of_run(&store).await.ok();
    let running = store.running().await?;
    let headline = config.as_ref().map(|c| Headline::of(c, &statuses, &markers, &running));
    match format {
        Format::Text => {
            match &headline {
                Some(headline) => println!("run {}: {}", store.url(), line(headline)),
                None => println!("run {}", store.url()),
            }
            let running = headline.as_ref().map(|h| h.running.clone()).unwrap_or_default();
            print_table(&statuses, headline.as_ref().and_then(|h| h.next), &running);
        }
        Format::Json => {
            let stages: Vec<_> = statuses.iter().map(as_json).collect();
            let headline = headline.map(|h| h.as_json());
            let status = json!({"run": store.url(), "headline": headline, "stages": stages});
            println!("{}", serde_json::to_string_pretty(&status)?);
        }
    }
    Ok(())
}

/// `incomplete · 4/10 iterations · 23/52 stages · last: update of iteration 3 at
/// 21:40:12 UTC · next: rollout of iteration 4 · ETA 32m 10s at its pace so far`
fn line(headline: &Headline) -> String {
    let mut parts = vec![
        headline.state().to_string(),
        format!("{}/{} iterations", headline.iterations_done, headline.iterations),
        format!("{}/{} stages", headline.stages_done, headline.stages),
    ];
    if let Some((id, at)) = &headline.last {
        parts.push(format!("last: {id} at {}", at.format("%Y-%m-%d %H:%M:%S UTC")));
    }
    for running in &headline.running {
        parts.push(format!("running: {running}"));
    }
    if let Some(next) = headline.next.filter(|n| !headline.running.contains(n)) {
        parts.push(format!("next: {next}"));
    }
    if let Some(eta) = headline.eta_seconds {
        parts.push(format!("ETA {} at its pace so far", super::human_seconds(eta)));
    }
    parts.join(" · ")
}

fn as_json(status: &StageStatus) -> serde_json::Value {
    let (state, shards) = match status.state {
        StageState::Committed => ("committed", None),
        StageState::Partial { committed, shards } => ("partial", Some(json!({"committed": committed, "of": shards}))),
        StageState::Missing => ("missing", None),
    };
    json!({
        "iteration": status.iteration,
        "stage": status.stage.to_string(),
        "state": state,
        "shards": shards,
        "rows": status.rows,
        "files": status.files,
        "bytes": status.bytes,
        "seconds": status.seconds,
    })
}

/// Every stage up to the last iteration seen; the one the run runs next is `next`, and
/// those some process runs now are `running`.
fn print_table(statuses: &[StageStatus], next: Option<StageId>, running: &[StageId]) {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING).set_header([
        "iteration",
        "stage",
        "state",
        "rows",
        "files",
        "bytes",
        "seconds",
    ]);
    for status in statuses {
        let is_next = next.is_some_and(|id| is_of(status, &id));
        let is_running = running.iter().any(|id| is_of(status, id));
        let state = match status.state {
            StageState::Missing if is_running => "running".to_string(),
            StageState::Partial { committed, shards } if is_running => format!("{committed}/{shards} shards, running"),
            StageState::Committed => "committed".to_string(),
            StageState::Partial { committed, shards } => format!("{committed}/{shards} shards"),
            StageState::Missing if is_next => "next".to_string(),
            StageState::Missing => "-".to_string(),
        };
        let done = status.state != StageState::Missing;
        let show = |text: String| if done { text } else { String::new() };
        table.add_row([
            status.iteration.map_or("-".to_string(), |k| k.to_string()),
            status.stage.to_string(),
            state,
            show(status.rows.to_string()),
            show(status.files.to_string()),
            show(super::human_bytes(status.bytes)),
            show(format!("{:.2}", status.seconds)),
        ]);
    }
    println!("{table}");
}
