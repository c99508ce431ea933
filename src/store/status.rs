//! Which stages of a run are committed, from its markers alone.

use std::collections::BTreeMap;

use crate::store::StoredMarker;
use crate::store::layout::Stage;

/// One stage of one iteration (or of the run), committed or not.
#[derive(Debug, Clone, PartialEq)]
pub struct StageStatus {
    pub stage: Stage,
    pub iteration: Option<u32>,
    pub state: StageState,
    pub rows: u64,
    pub files: usize,
    pub bytes: u64,
    /// Summed over shards.
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageState {
    Committed,
    /// Some shards of a sharded stage are committed.
    Partial {
        committed: u32,
        shards: u32,
    },
    Missing,
}

/// Every run-level stage, then every per-iteration stage of iterations 0..=last seen,
/// in pipeline order.
pub fn stage_statuses(markers: &[StoredMarker]) -> Vec<StageStatus> {
    let mut by_stage: BTreeMap<(Option<u32>, Stage), Vec<&StoredMarker>> = BTreeMap::new();
    for m in markers {
        by_stage.entry((m.marker.iteration, m.marker.stage)).or_default().push(m);
    }
    let last_iteration = markers.iter().filter_map(|m| m.marker.iteration).max();
    let run_level = [(None, Stage::PrepareData), (None, Stage::Update)];
    let per_iteration = (0..=last_iteration.unwrap_or(0))
        .filter(|_| last_iteration.is_some())
        .flat_map(|k| Stage::PER_ITERATION.map(|s| (Some(k), s)));
    run_level
        .into_iter()
        .chain(per_iteration)
        .map(|(iteration, stage)| status(stage, iteration, by_stage.get(&(iteration, stage))))
        .collect()
}

fn status(stage: Stage, iteration: Option<u32>, markers: Option<&Vec<&StoredMarker>>) -> StageStatus {
    let markers = markers.map(Vec::as_slice).unwrap_or_default();
    let whole = markers.iter().any(|m| m.marker.shard.is_none());
    let shards = markers.iter().filter_map(|m| m.marker.shard.map(|s| s.count)).max();
    let state = match (whole, shards) {
        (true, _) => StageState::Committed,
        (false, Some(count)) if markers.len() as u32 >= count => StageState::Committed,
        (false, Some(count)) => StageState::Partial { committed: markers.len() as u32, shards: count },
        (false, None) => StageState::Missing,
    };
    StageStatus {
        stage,
        iteration,
        state,
        rows: markers.iter().map(|m| m.marker.rows()).sum(),
        files: markers.iter().map(|m| m.marker.files.len()).sum(),
        bytes: markers.iter().map(|m| m.marker.bytes()).sum(),
        seconds: markers.iter().map(|m| m.marker.seconds()).sum(),
    }
}
