//! The commit marker: the JSON document whose creation makes a stage's files visible.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::schema::Table;
use crate::store::layout::{Shard, Stage, StageId};

/// Bumped when the marker's layout changes incompatibly.
pub const MARKER_FORMAT: u32 = 1;

/// What one committed stage attempt wrote, read and ran with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitMarker {
    pub format: u32,
    pub run: String,
    pub stage: Stage,
    pub iteration: Option<u32>,
    pub shard: Option<Shard>,
    /// Attempt id carried by every file name below.
    pub attempt: String,
    /// Every file the commit makes visible.
    pub files: Vec<FileEntry>,
    /// Markers of the committed stages this one read, with their hashes.
    pub inputs: Vec<InputRef>,
    /// Policy versions the stage sampled or trained from.
    pub policies_used: Vec<PolicyRef>,
    /// Past versions a league's roles played (`agents.<role>.league`): sampled, never trained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub opponents_used: Vec<PolicyRef>,
    /// Checkpoints the stage produced.
    pub checkpoints: Vec<CheckpointRef>,
    pub seed: u64,
    pub config_sha256: String,
    pub code_version: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Of the wall time, seconds in model compute (sampling, training steps).
    #[serde(default)]
    pub model_seconds: f64,
    /// Of the wall time, seconds running tool programs in the sandbox.
    #[serde(default)]
    pub sandbox_seconds: f64,
    /// The markers of another run whose rows this commit copies instead of computing
    /// them (a replay fork), as `<run URL>/<marker path>` with each marker's hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reused_from: Vec<InputRef>,
    /// Tasks the stage skipped because a prompt was longer than
    /// `rollout.max_prompt_tokens` (`rollout.overlong_prompt: skip`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_tasks: Vec<String>,
    /// Episodes an agent program failed, as `<task_id>/e<episode>: <reason>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_episodes: Vec<String>,
}

/// One file a commit makes visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the run.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
    /// The table a Parquet part belongs to; None for other files (checkpoints).
    pub table: Option<Table>,
    /// Rows of a Parquet part.
    pub rows: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRef {
    pub marker: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRef {
    pub policy: String,
    pub version: u32,
    pub weights_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    pub policy: String,
    pub version: u32,
    pub parent_version: Option<u32>,
    /// Folder of the checkpoint, relative to the run; its files are listed in `files`.
    pub dir: String,
    pub weights_sha256: String,
}

impl CommitMarker {
    pub fn stage_id(&self) -> StageId {
        StageId { stage: self.stage, iteration: self.iteration, shard: self.shard }
    }

    pub fn seconds(&self) -> f64 {
        (self.finished_at - self.started_at).num_microseconds().unwrap_or(0) as f64 / 1e6
    }

    pub fn rows(&self) -> u64 {
        self.files.iter().filter_map(|f| f.rows).sum()
    }

    pub fn rows_of(&self, table: Table) -> u64 {
        self.files_of(table).filter_map(|f| f.rows).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    pub fn files_of(&self, table: Table) -> impl Iterator<Item = &FileEntry> {
        self.files.iter().filter(move |f| f.table == Some(table))
    }
}

impl Serialize for Table {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Table {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Table, D::Error> {
        let name = String::deserialize(d)?;
        Table::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown table {name:?}")))
    }
}
