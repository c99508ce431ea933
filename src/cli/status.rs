use comfy_table::{Table, presets};
use petting::store::RunStore;
use petting::store::status::{StageState, StageStatus, stage_statuses};
use serde_json::json;

use super::args::Format;

pub async fn run(url: &str, format: Format) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    let markers = store.ensure_exists().await?;
    let statuses = stage_statuses(&markers);
    match format {
        Format::Text => print_table(store.url(), &statuses),
        Format::Json => {
            let stages: Vec<_> = statuses.iter().map(as_json).collect();
            println!("{}", serde_json::to_string_pretty(&json!({"run": store.url(), "stages": stages}))?);
        }
    }
    Ok(())
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

fn print_table(url: &str, statuses: &[StageStatus]) {
    println!("run {url}");
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
        let state = match status.state {
            StageState::Committed => "committed".to_string(),
            StageState::Partial { committed, shards } => format!("{committed}/{shards} shards"),
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
