use chrono::{DateTime, Utc};
use comfy_table::{Table, presets};
use petting::config::RunConfig;
use petting::store::status::{StageState, StageStatus, stage_statuses};
use petting::store::{RunStore, Stage, StageId, StoredMarker};
use serde_json::json;

use super::args::Format;

pub async fn run(url: &str, format: Format) -> anyhow::Result<()> {
    let store = RunStore::open(url)?;
    let markers = store.ensure_exists().await?;
    let statuses = stage_statuses(&markers);
    // A run whose config cannot be read still shows what it committed.
    let config = petting::config::of_run(&store).await.ok();
    let headline = config.as_ref().map(|c| Headline::of(c, &statuses, &markers));
    match format {
        Format::Text => {
            match &headline {
                Some(headline) => println!("run {}: {}", store.url(), headline.line()),
                None => println!("run {}", store.url()),
            }
            print_table(&statuses, headline.as_ref().and_then(|h| h.next));
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

/// Where a run stands: its iterations and stages committed against its schedule, the
/// last commit, the next stage and, while stages are left, when it would end at the
/// pace of its commits so far. The store cannot tell a running stage from a stopped
/// run: the next stage is the one a `pipeline run` runs next.
struct Headline {
    iterations: u32,
    iterations_done: u32,
    stages: usize,
    stages_done: usize,
    last: Option<(StageId, DateTime<Utc>)>,
    next: Option<StageId>,
    eta_seconds: Option<f64>,
}

impl Headline {
    fn of(config: &RunConfig, statuses: &[StageStatus], markers: &[StoredMarker]) -> Headline {
        let committed = |id: &StageId| statuses.iter().any(|s| is_of(s, id) && s.state == StageState::Committed);
        let schedule = petting::pipeline::schedule(config);
        let updates_done = schedule
            .iter()
            .filter(|id| id.stage == Stage::Update && id.iteration.is_some())
            .filter(|id| committed(id))
            .count() as u32;
        let iterations_done = config.first_iteration() + updates_done;
        let last = markers.iter().max_by_key(|m| m.marker.finished_at);
        let first = markers.iter().map(|m| m.marker.started_at).min();
        let left = config.iterations.saturating_sub(iterations_done);
        let eta_seconds = match (first, last) {
            (Some(first), Some(last)) if updates_done > 0 && left > 0 => {
                let span = (last.marker.finished_at - first).num_milliseconds() as f64 / 1e3;
                Some(span / f64::from(updates_done) * f64::from(left))
            }
            _ => None,
        };
        Headline {
            iterations: config.iterations,
            iterations_done,
            stages: schedule.len(),
            stages_done: schedule.iter().filter(|id| committed(id)).count(),
            last: last.map(|m| (StageId { shard: None, ..m.marker.stage_id() }, m.marker.finished_at)),
            next: schedule.into_iter().find(|id| !committed(id)),
            eta_seconds,
        }
    }

    /// `incomplete · 4/10 iterations · 23/52 stages · last: update of iteration 3 at
    /// 21:40:12 UTC · next: rollout of iteration 4 · ETA 32m 10s at its pace so far`
    fn line(&self) -> String {
        let mut parts = vec![
            self.state().to_string(),
            format!("{}/{} iterations", self.iterations_done, self.iterations),
            format!("{}/{} stages", self.stages_done, self.stages),
        ];
        if let Some((id, at)) = &self.last {
            parts.push(format!("last: {id} at {}", at.format("%Y-%m-%d %H:%M:%S UTC")));
        }
        if let Some(next) = &self.next {
            parts.push(format!("next: {next}"));
        }
        if let Some(eta) = self.eta_seconds {
            parts.push(format!("ETA {} at its pace so far", super::human_seconds(eta)));
        }
        parts.join(" · ")
    }

    fn state(&self) -> &'static str {
        if self.next.is_none() { "complete" } else { "incomplete" }
    }

    fn as_json(&self) -> serde_json::Value {
        json!({
            "state": self.state(),
            "iterations": self.iterations,
            "iterations_done": self.iterations_done,
            "stages": self.stages,
            "stages_done": self.stages_done,
            "last": self.last.as_ref().map(|(id, at)| json!({"stage": id.to_string(), "finished_at": at.to_rfc3339()})),
            "next": self.next.map(|id| id.to_string()),
            "eta_seconds": self.eta_seconds,
        })
    }
}

/// Whether `status` is the stage `id` (all of its shards).
fn is_of(status: &StageStatus, id: &StageId) -> bool {
    status.stage == id.stage && status.iteration == id.iteration
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

/// Every stage up to the last iteration seen; the one the run runs next is `next`.
fn print_table(statuses: &[StageStatus], next: Option<StageId>) {
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
        let state = match status.state {
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
