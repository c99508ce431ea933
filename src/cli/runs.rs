//! `petting runs PREFIX`: the runs under a folder or an object-store prefix and how far
//! each has come.

use comfy_table::{Table, presets};
use petting::pipeline::{self, driver};
use petting::store::{RunStore, StageId, committed_among};
use serde_json::json;

use super::args::{Format, RunsArgs};

/// How many folders below the prefix runs are looked for.
const DEPTH: usize = 4;

/// One run's state.
struct RunState {
    url: String,
    iterations: Option<u32>,
    /// Iterations whose update is committed.
    trained: u32,
    last: Option<String>,
    /// `finished`, `next: <stage>`, or why the run cannot be read.
    state: String,
}

pub async fn run(args: &RunsArgs) -> anyhow::Result<()> {
    let mut states = Vec::new();
    for store in RunStore::runs_under(&args.prefix, DEPTH).await? {
        states.push(state(&store).await);
    }
    match args.format {
        Format::Json => {
            let runs: Vec<_> = states
                .iter()
                .map(|s| {
                    json!({"run": s.url, "iterations": s.iterations, "trained": s.trained,
                           "last_committed": s.last, "state": s.state})
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&runs)?);
        }
        Format::Text if states.is_empty() => println!("no runs under {} (none holds a run.yaml)", args.prefix),
        Format::Text => {
            let mut table = Table::new();
            table.load_preset(presets::NOTHING).set_header(["run", "trained", "last committed", "state"]);
            for s in &states {
                let trained = s.iterations.map_or("-".into(), |n| format!("{}/{n}", s.trained));
                table.add_row([s.url.clone(), trained, s.last.clone().unwrap_or("-".into()), s.state.clone()]);
            }
            println!("{table}");
        }
    }
    Ok(())
}

async fn state(store: &RunStore) -> RunState {
    let url = store.url().to_string();
    let unreadable = |e: &dyn std::fmt::Display| RunState {
        url: url.clone(),
        iterations: None,
        trained: 0,
        last: None,
        state: format!("cannot be read: {e}"),
    };
    let (config, markers) = match (petting::config::of_run(store).await, store.markers().await) {
        (Ok(config), Ok(markers)) => (config, markers),
        (Err(e), _) => return unreadable(&e),
        (_, Err(e)) => return unreadable(&e),
    };
    let committed = |id: &StageId| committed_among(&markers, id.stage, id.iteration).is_some();
    let schedule = pipeline::schedule(&config);
    let trained = (0..config.iterations).filter(|&k| committed(&StageId::at(petting::store::Stage::Update, k))).count();
    let last = schedule.iter().rev().find(|id| committed(id)).map(|id| driver::stop_name(*id));
    let state = match schedule.iter().find(|id| !committed(id)) {
        None => "finished".to_string(),
        Some(next) => format!("next: {}", driver::stop_name(*next)),
    };
    RunState { url, iterations: Some(config.iterations), trained: trained as u32, last, state }
}
