use comfy_table::{Table, presets};
use petting::store::RunStore;
use petting::store::status::{StageState, stage_statuses};

pub async fn run(url: &str) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    let markers = store.ensure_exists().await?;
    println!("run {}", store.url());
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
    for status in stage_statuses(&markers) {
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
    Ok(())
}
