//! Typed rows of every table, converted to and from Arrow batches with the schemas of
//! `schemas/*.json`.
//!
//! A row type holds the file columns of its table, not its partition columns (those
//! live in the path). The tests at the bottom fail when a row type and its JSON file
//! disagree on a column's name, type or nullability.

use arrow::record_batch::RecordBatch;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::schema::Table;

/// A row of one table.
pub trait Row: Serialize + DeserializeOwned {
    const TABLE: Table;
}

/// Builds one batch with the table's file schema.
pub fn to_batch<R: Row>(rows: &[R]) -> Result<RecordBatch, serde_arrow::Error> {
    serde_arrow::to_record_batch(R::TABLE.file_schema().fields(), &rows)
}

/// Casts a query result to the table's file schema: columns picked by name in schema
/// order and cast to the declared types; a null in a non-nullable column is an error.
pub fn conform(batch: &RecordBatch, table: Table) -> Result<RecordBatch, arrow::error::ArrowError> {
    let schema = table.file_schema();
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let column = batch.column_by_name(field.name()).ok_or_else(|| {
                arrow::error::ArrowError::SchemaError(format!("the result has no column {}", field.name()))
            })?;
            arrow::compute::cast(column, field.data_type())
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, columns)
}

/// Reads rows back; columns the row type does not name (such as partition columns
/// added by SQL) are ignored.
pub fn from_batch<R: Row>(batch: &RecordBatch) -> Result<Vec<R>, serde_arrow::Error> {
    serde_arrow::from_record_batch(batch)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRow {
    pub task_id: String,
    pub env: String,
    pub seed: u64,
    pub instance: String,
    pub reference: Option<String>,
    pub difficulty: Option<f64>,
    pub source: String,
}
impl Row for TaskRow {
    const TABLE: Table = Table::Tasks;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemonstrationRow {
    pub demo_id: String,
    pub task_id: String,
    pub turn: u32,
    pub agent: String,
    pub prompt: String,
    pub response: String,
    pub choice: String,
    pub local_reward: f64,
}
impl Row for DemonstrationRow {
    const TABLE: Table = Table::Demonstrations;
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnRow {
    pub candidate_id: String,
    pub run: String,
    pub task_id: String,
    pub episode: u32,
    pub turn: u32,
    pub agent: String,
    pub policy: String,
    pub policy_version: u32,
    /// Digest of the committed weights that sampled the row (the checkpoint's `weights_sha256`).
    pub weights_sha256: String,
    /// What sampled the row: tch or vllm.
    pub engine: String,
    /// The name the engine knows the weights by: the policy for tch; for vLLM the
    /// served model, or the adapter `<policy>-v<k>-<digest>`.
    pub engine_model: String,
    pub branch: u32,
    pub node_id: u32,
    pub parent_id: Option<u32>,
    pub selected: bool,
    pub prompt_message: String,
    pub prompt_text: String,
    pub prompt_tokens: Vec<i32>,
    pub response_text: String,
    pub response_tokens: Vec<i32>,
    pub response_logprobs: Vec<f32>,
    pub finish_reason: String,
    pub action: Option<String>,
    pub parse_error: Option<String>,
    pub feedback: Option<String>,
    pub local_reward: f64,
    pub team_reward: f64,
    pub done: bool,
    pub success: bool,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub sampling_seed: u64,
    pub generation_seconds: f64,
    /// Why the row's episode failed (an agent program's crash, timeout, missing verdict…).
    pub failure: Option<String>,
    /// What the candidate's group compares it on (`algo::credit`).
    pub credited_reward: Option<f64>,
    /// The version its iteration's update trains minus `policy_version` (0 strictly
    /// on-policy; at most `rollout.max_staleness`). None in runs made before the column existed.
    pub staleness: Option<u32>,
    /// Some(false) for a frozen agent's turn: never grouped or trained. None in runs made
    /// before the column existed.
    pub trainable: Option<bool>,
}
impl Row for TurnRow {
    const TABLE: Table = Table::Turns;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRow {
    pub group_id: String,
    pub task_id: String,
    pub agent: Option<String>,
    pub turn: Option<u32>,
    pub size: u32,
    pub mean: f64,
    pub std: f64,
    pub degenerate: bool,
    pub kept: bool,
}
impl Row for GroupRow {
    const TABLE: Table = Table::Groups;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRow {
    pub candidate_id: String,
    pub group_id: String,
    pub agent: String,
    pub policy: String,
    pub policy_version: u32,
    pub mixed_reward: f64,
    pub advantage: f64,
    pub response_token_count: u32,
    /// `algorithm.name: ppo` only.
    pub value: Option<f64>,
    pub value_target: Option<f64>,
    /// `critic.values: token` only: one per response token.
    pub token_values: Option<Vec<f32>>,
    pub token_value_targets: Option<Vec<f32>>,
    pub token_advantages: Option<Vec<f32>>,
}
impl Row for SampleRow {
    const TABLE: Table = Table::Samples;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateRow {
    pub policy: String,
    pub mode: String,
    pub version_from: u32,
    pub version_to: u32,
    pub step: u32,
    pub loss: f64,
    pub clip_fraction: f64,
    pub ratio_mean: f64,
    pub ratio_max: f64,
    pub logprob_drift_mean: f64,
    pub logprob_drift_max: f64,
    pub approx_kl: f64,
    pub grad_norm: f64,
    pub entropy: f64,
    pub tokens: u64,
    pub sequences: u32,
    pub learning_rate: f64,
    /// None in runs made before the column existed.
    pub weights_change: Option<f64>,
    /// None in runs made before the column existed.
    pub skipped: Option<bool>,
    /// None for SFT steps and in runs made before the column existed.
    pub truncated: Option<u32>,
    /// None for SFT steps and in runs made before the columns existed.
    pub mismatch_fraction: Option<f64>,
    pub mismatch_p95: Option<f64>,
    /// None for a step of one process, and in runs made before the columns existed.
    pub ranks: Option<u32>,
    pub allreduce_bytes: Option<u64>,
    pub allreduce_seconds: Option<f64>,
    pub seconds: f64,
    /// A critic step's agent, and its head's explained variance.
    pub agent: Option<String>,
    pub explained_variance: Option<f64>,
    /// The step's samples an older version sampled (`rollout.max_staleness`), their
    /// logprob drift and mismatch (the drift and mismatch columns above are the others').
    /// None unless rollouts may be stale, and in runs made before the columns existed.
    pub stale_sequences: Option<u32>,
    pub stale_logprob_drift_mean: Option<f64>,
    pub stale_mismatch_fraction: Option<f64>,
}
impl Row for UpdateRow {
    const TABLE: Table = Table::Updates;
}

/// The engine-vs-trainer logprob gap of one trained sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobGapRow {
    pub candidate_id: String,
    pub policy: String,
    pub version: u32,
    pub engine: String,
    pub tokens: u32,
    pub gap_mean: f64,
    pub gap_max: f64,
    pub log_ratio_mean: f64,
    /// How many versions behind `version` sampled it; None in runs made before the column existed.
    pub staleness: Option<u32>,
}
impl Row for LogprobGapRow {
    const TABLE: Table = Table::LogprobGaps;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    pub task_id: String,
    pub env: String,
    pub mode: String,
    pub sample: u32,
    pub policies: String,
    pub success: bool,
    pub reward: f64,
    pub turns: u32,
    pub tokens: u64,
    pub seconds: f64,
    pub opponent_version: Option<u32>,
}
impl Row for EvalRow {
    const TABLE: Table = Table::Evals;
}

/// Timestamps are microseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRow {
    pub stage: String,
    pub iteration: Option<i64>,
    pub shard: Option<u32>,
    pub shards: Option<u32>,
    pub marker: String,
    pub marker_sha256: String,
    pub attempt: String,
    pub files: u32,
    pub rows: u64,
    pub bytes: u64,
    pub seed: u64,
    pub config_sha256: String,
    pub code_version: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub seconds: f64,
    pub model_seconds: f64,
    pub sandbox_seconds: f64,
    pub reused_from: Option<String>,
    pub skipped_tasks: Option<String>,
    pub failed_episodes: Option<String>,
}
impl Row for CommitRow {
    const TABLE: Table = Table::Commits;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRow {
    pub policy: String,
    pub version: u32,
    pub parent_version: Option<u32>,
    pub iteration: Option<i64>,
    pub stage: String,
    pub path: String,
    pub weights_sha256: String,
    pub optimizer_sha256: Option<String>,
    pub bytes: u64,
    pub pruned_bytes: u64,
}
impl Row for CheckpointRow {
    const TABLE: Table = Table::Checkpoints;
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::DataType;
    use serde_arrow::schema::{SchemaLike, TracingOptions};

    /// The Arrow type serde traces for the row type, with list item names and timestamps
    /// (carried as i64 microseconds) normalised to what the JSON files say.
    fn traced_fields<R: Row>() -> Vec<(String, DataType, bool)> {
        let options = TracingOptions::default().strings_as_large_utf8(false).sequence_as_large_list(false);
        let fields = Vec::<arrow::datatypes::FieldRef>::from_type::<R>(options).unwrap();
        fields.iter().map(|f| (f.name().clone(), normalise(f.data_type()), f.is_nullable())).collect()
    }

    fn normalise(t: &DataType) -> DataType {
        match t {
            DataType::List(item) => DataType::List(std::sync::Arc::new(arrow::datatypes::Field::new_list_field(
                normalise(item.data_type()),
                item.is_nullable(),
            ))),
            DataType::Timestamp(..) => DataType::Int64,
            other => other.clone(),
        }
    }

    fn schema_fields(table: Table) -> Vec<(String, DataType, bool)> {
        let schema = table.file_schema();
        schema.fields().iter().map(|f| (f.name().clone(), normalise(f.data_type()), f.is_nullable())).collect()
    }

    fn assert_row_matches_schema<R: Row>() {
        assert_eq!(
            traced_fields::<R>(),
            schema_fields(R::TABLE),
            "the Rust row type of `{}` drifted from schemas/{}.json",
            R::TABLE,
            R::TABLE
        );
    }

    #[test]
    fn every_row_type_matches_its_schema_file() {
        assert_row_matches_schema::<TaskRow>();
        assert_row_matches_schema::<DemonstrationRow>();
        assert_row_matches_schema::<TurnRow>();
        assert_row_matches_schema::<GroupRow>();
        assert_row_matches_schema::<SampleRow>();
        assert_row_matches_schema::<UpdateRow>();
        assert_row_matches_schema::<EvalRow>();
        assert_row_matches_schema::<CommitRow>();
        assert_row_matches_schema::<CheckpointRow>();
    }

    #[test]
    fn a_drifted_row_type_is_caught() {
        #[derive(Serialize, Deserialize)]
        struct Drifted {
            task_id: String,
            env: String,
            seed: u32, // the schema says UInt64
            instance: String,
            reference: Option<String>,
            difficulty: Option<f64>,
            source: String,
        }
        impl Row for Drifted {
            const TABLE: Table = Table::Tasks;
        }
        assert_ne!(traced_fields::<Drifted>(), schema_fields(Table::Tasks));
    }

    #[test]
    fn rows_survive_a_round_trip_through_a_batch() {
        let rows = vec![
            SampleRow {
                candidate_id: "t/e0/t1/tool/b3".into(),
                group_id: "t/t1/tool".into(),
                agent: "tool".into(),
                policy: "shared".into(),
                policy_version: 4,
                mixed_reward: 1.5,
                advantage: -0.25,
                response_token_count: 12,
                value: Some(0.5),
                value_target: Some(0.75),
                token_values: Some(vec![0.5, 0.25]),
                token_value_targets: Some(vec![0.75, 0.75]),
                token_advantages: Some(vec![0.25, 0.5]),
            },
            SampleRow {
                candidate_id: "t/e0/t1/tool/b4".into(),
                group_id: "t/t1/tool".into(),
                agent: "tool".into(),
                policy: "shared".into(),
                policy_version: 4,
                mixed_reward: 2.0,
                advantage: 0.25,
                response_token_count: 7,
                value: None,
                value_target: None,
                token_values: None,
                token_value_targets: None,
                token_advantages: None,
            },
        ];
        let batch = to_batch(&rows).unwrap();
        assert_eq!(batch.schema(), Table::Samples.file_schema());
        assert_eq!(from_batch::<SampleRow>(&batch).unwrap(), rows);
    }

    #[test]
    fn list_columns_keep_their_values() {
        let row = TurnRow {
            candidate_id: "c".into(),
            run: "r".into(),
            task_id: "t".into(),
            episode: 0,
            turn: 2,
            agent: "planner".into(),
            policy: "p".into(),
            policy_version: 3,
            weights_sha256: "ab".repeat(32),
            engine: "tch".into(),
            engine_model: "p".into(),
            branch: 1,
            node_id: 9,
            parent_id: None,
            selected: true,
            prompt_message: "grid".into(),
            prompt_text: "grid".into(),
            prompt_tokens: vec![5, 6, 7],
            response_text: "RRD".into(),
            response_tokens: vec![11, 11, 12, 2],
            response_logprobs: vec![-0.5, -0.25, -1.0, -0.125],
            finish_reason: "eos".into(),
            action: Some("[\"R\",\"R\",\"D\"]".into()),
            parse_error: None,
            feedback: None,
            local_reward: 1.0,
            team_reward: 1.5,
            done: true,
            success: true,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            sampling_seed: 77,
            generation_seconds: 0.5,
            failure: None,
            credited_reward: Some(2.5),
            staleness: Some(0),
            trainable: Some(true),
        };
        let batch = to_batch(std::slice::from_ref(&row)).unwrap();
        assert_eq!(from_batch::<TurnRow>(&batch).unwrap(), vec![row]);
    }
}
