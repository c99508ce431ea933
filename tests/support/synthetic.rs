//! Synthetic committed runs: plausible rows of the real schemas, deterministic per seed.

use petting::store::{CommitInfo, CommitMarker, Partition, RunStore, Stage, StageId};
use petting::tables::{self, TurnRow};

/// A tiny counter-based generator (splitmix64), so data depends only on its seed.
pub struct Mix(u64);

impl Mix {
    pub fn new(seed: u64) -> Mix {
        Mix(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub const AGENTS: [&str; 2] = ["tool", "planner"];

/// `rows` candidate rows of one iteration: tasks x 2 agents x 4 turns x 8 branches.
pub fn turn_rows(iteration: u32, rows: usize, seed: u64) -> Vec<TurnRow> {
    let mut mix = Mix::new(seed ^ u64::from(iteration) << 32);
    (0..rows)
        .map(|i| {
            let branch = (i % 8) as u32;
            let agent = AGENTS[(i / 8) % 2];
            let turn = ((i / 16) % 4) as u32;
            let task = i / 64;
            let response_len = 4 + mix.below(12) as usize;
            let reward = (mix.unit() * 4.0).round() / 2.0 - 0.5;
            TurnRow {
                candidate_id: format!("task-{task:06}/e0/t{turn}/{agent}/b{branch}"),
                run: "synthetic".into(),
                task_id: format!("task-{task:06}"),
                episode: 0,
                turn,
                agent: agent.into(),
                policy: "shared".into(),
                policy_version: iteration,
                weights_sha256: format!("{iteration:064x}"),
                engine: "tch".into(),
                engine_model: "p".into(),
                branch,
                node_id: (i % 64) as u32,
                parent_id: if turn == 0 && agent == "tool" { None } else { Some(0) },
                selected: branch == 0,
                prompt_message: format!("grid for task {task}, {agent} at turn {turn}"),
                prompt_text: format!("grid for task {task}, {agent} at turn {turn}"),
                prompt_tokens: (0..16).map(|t| ((task * 31 + t) % 500) as i32).collect(),
                response_text: "RRDDLU".chars().take(response_len.min(6)).collect(),
                response_tokens: (0..response_len).map(|_| mix.below(500) as i32).collect(),
                response_logprobs: (0..response_len).map(|_| -(mix.unit() as f32) * 3.0).collect(),
                finish_reason: "eos".into(),
                action: Some("[\"R\"]".into()),
                parse_error: None,
                feedback: None,
                local_reward: reward,
                team_reward: if reward > 0.5 { 1.0 } else { 0.0 },
                done: turn == 3,
                success: reward > 1.0,
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                sampling_seed: mix.next(),
                generation_seconds: 0.25,
                failure: None,
                credited_reward: None,
                staleness: Some(0),
                trainable: Some(true),
            }
        })
        .collect()
}

/// Commits a rollout of `rows_per_iteration` synthetic turns for each of `iterations`,
/// written in parts of at most `part_rows` rows.
pub async fn commit_turns(
    store: &RunStore,
    iterations: u32,
    rows_per_iteration: usize,
    part_rows: usize,
) -> Vec<CommitMarker> {
    let mut markers = Vec::new();
    for iteration in 0..iterations {
        let rows = turn_rows(iteration, rows_per_iteration, 7);
        markers.push(commit_rows(store, iteration, &rows, part_rows).await);
    }
    markers
}

/// Commits `rows` as the rollout of `iteration`, in parts of at most `part_rows` rows.
pub async fn commit_rows(store: &RunStore, iteration: u32, rows: &[TurnRow], part_rows: usize) -> CommitMarker {
    let mut writer = store.begin(StageId::at(Stage::Rollout, iteration));
    for chunk in rows.chunks(part_rows) {
        let batch = tables::to_batch(chunk).unwrap();
        writer.write_table(petting::schema::Table::Turns, Partition::Iteration(iteration), &[batch]).await.unwrap();
    }
    let info =
        CommitInfo { run: "synthetic".into(), seed: 7, config_sha256: "synthetic".into(), ..CommitInfo::default() };
    writer.finish().commit(info).await.unwrap()
}
