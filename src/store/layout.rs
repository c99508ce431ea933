//! Where everything lives inside a run, as pure functions of names and numbers.
//!
//! ```text
//! <run>/run.yaml
//! <run>/tasks/split=train/part-<shard>-<attempt>-<seq>.parquet
//! <run>/turns/iteration=7/part-<shard>-<attempt>-<seq>.parquet      (groups, samples, updates, evals alike)
//! <run>/checkpoints/<policy>/v000008.<attempt>/…                    (a Hugging Face folder)
//! <run>/_commits/prepare-data.json
//! <run>/_commits/iteration=7/<stage>[-<shard>].json
//! ```
//!
//! Every data file name carries the attempt that wrote it, so two attempts at the same
//! stage never write the same object: a loser's files stay invisible instead of
//! overwriting the winner's. Checkpoint folders carry the attempt for the same reason.

use serde::{Deserialize, Serialize};

use crate::schema::Table;

pub const RUN_CONFIG: &str = "run.yaml";
pub const COMMITS_DIR: &str = "_commits";
/// The digest of every file of a user's own the run's environment is made of, frozen
/// with its config (`envs::user_files`).
pub const ENVIRONMENT_FILES: &str = "environment.json";
/// Earlier run.yaml versions, kept when a run resumes with a changed config.
pub const CONFIG_HISTORY_DIR: &str = "_config_history";
/// Records of checkpoint files deleted by a retention (store/prune.rs); never collected by gc.
pub const PRUNED_DIR: &str = "_pruned";
/// Logs of servers a local run started (its vLLM server), never committed and never
/// collected by gc.
pub const LOGS_DIR: &str = "_logs";
/// TensorBoard's event files (`tracking.tensorboard`), one per committed stage; never
/// committed and never collected by gc.
pub const TENSORBOARD_DIR: &str = "_tensorboard";
/// The MLflow run a run logs into (`tracking.mlflow`); never committed and never
/// collected by gc.
pub const MLFLOW_RUN: &str = "_mlflow/run.json";
/// A W&B offline run and the metrics it is rebuilt from (`tracking.wandb`); never
/// committed and never collected by gc.
pub const WANDB_DIR: &str = "_wandb";
/// One file per stage being run now, kept fresh by its process (store/running.rs); never
/// committed and never collected by gc.
pub const RUNNING_DIR: &str = "_running";

/// A stage of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    PrepareData,
    Rollout,
    Group,
    Advantage,
    Update,
    Evaluate,
}

impl Stage {
    /// Stages run once per iteration, in order.
    pub const PER_ITERATION: [Stage; 5] =
        [Stage::Rollout, Stage::Group, Stage::Advantage, Stage::Update, Stage::Evaluate];

    pub fn name(self) -> &'static str {
        match self {
            Stage::PrepareData => "prepare-data",
            Stage::Rollout => "rollout",
            Stage::Group => "group",
            Stage::Advantage => "advantage",
            Stage::Update => "update",
            Stage::Evaluate => "evaluate",
        }
    }

    pub fn from_name(name: &str) -> Option<Stage> {
        [Stage::PrepareData].into_iter().chain(Stage::PER_ITERATION).find(|s| s.name() == name)
    }

    /// Whether the stage can be split into shards: rollout and evaluate play each task on
    /// its own, every other stage reads the whole iteration.
    pub fn runs_in_shards(self) -> bool {
        matches!(self, Stage::Rollout | Stage::Evaluate)
    }

    /// Whether the stage runs once per run rather than once per iteration.
    pub fn is_run_level(self) -> bool {
        matches!(self, Stage::PrepareData)
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Slice `index` of `count` of a sharded stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether the item at `position` of a stage's work list (a task of the batch or of
    /// the test split) is this shard's: positions `index` mod `count`.
    pub fn holds(self, position: usize) -> bool {
        position as u32 % self.count == self.index
    }
}

/// One commit of one stage: what a commit marker stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageId {
    pub stage: Stage,
    /// None for run-level stages.
    pub iteration: Option<u32>,
    pub shard: Option<Shard>,
}

impl StageId {
    /// A run-level stage: prepare-data, or the update that commits every policy's v0
    /// (`_commits/update.json`) before iteration 0.
    pub fn run_level(stage: Stage) -> StageId {
        assert!(stage.is_run_level() || stage == Stage::Update, "{stage} runs once per iteration");
        StageId { stage, iteration: None, shard: None }
    }

    /// A stage of one iteration.
    pub fn at(stage: Stage, iteration: u32) -> StageId {
        assert!(!stage.is_run_level(), "{stage} runs once per run");
        StageId { stage, iteration: Some(iteration), shard: None }
    }

    pub fn with_shard(self, index: u32, count: u32) -> StageId {
        assert!(index < count, "shard {index} of {count}");
        StageId { shard: Some(Shard { index, count }), ..self }
    }

    /// Path of the commit marker, relative to the run.
    pub fn marker_path(&self) -> String {
        let file = match self.shard {
            None => format!("{}.json", self.stage),
            Some(shard) => format!("{}-{}.json", self.stage, shard.index),
        };
        match self.iteration {
            None => format!("{COMMITS_DIR}/{file}"),
            Some(k) => format!("{COMMITS_DIR}/iteration={k}/{file}"),
        }
    }

    /// Parses a marker path back; None for anything that is not a marker.
    /// The shard count is not in the path; it comes from the marker's contents.
    pub fn from_marker_path(path: &str) -> Option<(Stage, Option<u32>, Option<u32>)> {
        let rest = path.strip_prefix(COMMITS_DIR)?.strip_prefix('/')?;
        let (iteration, file) = match rest.split_once('/') {
            Some((dir, file)) => (Some(dir.strip_prefix("iteration=")?.parse().ok()?), file),
            None => (None, rest),
        };
        let stem = file.strip_suffix(".json")?;
        if let Some(stage) = Stage::from_name(stem) {
            return Some((stage, iteration, None));
        }
        let (name, shard) = stem.rsplit_once('-')?;
        Some((Stage::from_name(name)?, iteration, Some(shard.parse().ok()?)))
    }

    pub fn shard_index(&self) -> u32 {
        self.shard.map_or(0, |s| s.index)
    }
}

impl std::fmt::Display for StageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.stage)?;
        if let Some(k) = self.iteration {
            write!(f, " of iteration {k}")?;
        }
        if let Some(s) = self.shard {
            write!(f, " (shard {} of {})", s.index, s.count)?;
        }
        Ok(())
    }
}

/// The hive partition a table file belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partition {
    Iteration(u32),
    Split(Split),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Test,
}

impl Split {
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}

impl Partition {
    /// The hive folder name, e.g. `iteration=7`.
    pub fn segment(&self) -> String {
        match self {
            Partition::Iteration(k) => format!("iteration={k}"),
            Partition::Split(s) => format!("split={}", s.name()),
        }
    }
}

/// Path of the `seq`-th Parquet part a stage attempt writes for a table.
pub fn part_path(table: Table, partition: &Partition, shard: u32, attempt: &str, seq: u32) -> String {
    format!("{table}/{}/part-{shard}-{attempt}-{seq}.parquet", partition.segment())
}

/// Folder of a checkpoint written by one attempt.
pub fn checkpoint_dir(policy: &str, version: u32, attempt: &str) -> String {
    format!("checkpoints/{policy}/v{version:06}.{attempt}")
}

/// Whether `relative` is a file a stage attempt writes (a table's Parquet part, a file
/// of a checkpoint or of the built tokenizer), the only files `gc` may ever delete. The
/// shape is matched whole, attempt id included, so a user's file that happens to lie in
/// the run's folder (a run file, a dataset, a program) is never taken for an orphan.
pub fn is_attempt_output(relative: &str) -> bool {
    let parts: Vec<&str> = relative.split('/').collect();
    match parts.as_slice() {
        ["tokenizer", attempt, name] => is_attempt(attempt) && !name.is_empty(),
        ["checkpoints", policy, version, _, ..] => !policy.is_empty() && is_checkpoint_folder(version),
        [table, partition, file] => {
            Table::from_name(table).is_some_and(Table::is_stored) && is_partition(partition) && is_part_file(file)
        }
        _ => false,
    }
}

/// A uuid's 32 lowercase hex digits, as `StageWriter` names its attempts.
fn is_attempt(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_partition(segment: &str) -> bool {
    match segment.split_once('=') {
        Some(("iteration", k)) => k.parse::<u32>().is_ok(),
        Some(("split", split)) => matches!(split, "train" | "test"),
        _ => false,
    }
}

/// `part-<shard>-<attempt>-<seq>.parquet`.
fn is_part_file(name: &str) -> bool {
    let Some(stem) = name.strip_prefix("part-").and_then(|n| n.strip_suffix(".parquet")) else { return false };
    let fields: Vec<&str> = stem.split('-').collect();
    matches!(fields.as_slice(), [shard, attempt, seq]
        if shard.parse::<u32>().is_ok() && is_attempt(attempt) && seq.parse::<u32>().is_ok())
}

/// `v<6 digits>.<attempt>`.
fn is_checkpoint_folder(name: &str) -> bool {
    let Some((version, attempt)) = name.strip_prefix('v').and_then(|n| n.split_once('.')) else { return false };
    version.len() == 6 && version.bytes().all(|b| b.is_ascii_digit()) && is_attempt(attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_paths_follow_the_design() {
        assert_eq!(StageId::run_level(Stage::PrepareData).marker_path(), "_commits/prepare-data.json");
        assert_eq!(StageId::run_level(Stage::Update).marker_path(), "_commits/update.json");
        assert_eq!(StageId::at(Stage::Rollout, 7).marker_path(), "_commits/iteration=7/rollout.json");
        assert_eq!(
            StageId::at(Stage::Rollout, 7).with_shard(2, 4).marker_path(),
            "_commits/iteration=7/rollout-2.json"
        );
    }

    #[test]
    fn marker_paths_parse_back() {
        for id in [
            StageId::run_level(Stage::PrepareData),
            StageId::run_level(Stage::Update),
            StageId::at(Stage::Evaluate, 12),
            StageId::at(Stage::Rollout, 0).with_shard(3, 4),
        ] {
            let parsed = StageId::from_marker_path(&id.marker_path()).unwrap();
            assert_eq!(parsed, (id.stage, id.iteration, id.shard.map(|s| s.index)));
        }
        assert_eq!(StageId::from_marker_path("_commits/iteration=x/rollout.json"), None);
        assert_eq!(StageId::from_marker_path("_commits/iteration=1/unknown.json"), None);
        assert_eq!(StageId::from_marker_path("turns/iteration=1/rollout.json"), None);
    }

    #[test]
    fn data_paths_are_hive_partitioned_and_attempt_unique() {
        assert_eq!(
            part_path(Table::Turns, &Partition::Iteration(7), 0, "a1b2", 3),
            "turns/iteration=7/part-0-a1b2-3.parquet"
        );
        assert_eq!(
            part_path(Table::Tasks, &Partition::Split(Split::Test), 1, "ff", 0),
            "tasks/split=test/part-1-ff-0.parquet"
        );
        assert_eq!(checkpoint_dir("shared", 8, "a1b2"), "checkpoints/shared/v000008.a1b2");
    }

    #[test]
    fn only_what_an_attempt_writes_is_attempt_output() {
        let attempt = "0123456789abcdef0123456789abcdef";
        for path in [
            part_path(Table::Turns, &Partition::Iteration(7), 0, attempt, 3),
            part_path(Table::Tasks, &Partition::Split(Split::Test), 1, attempt, 0),
            format!("{}/model.safetensors", checkpoint_dir("shared", 8, attempt)),
            format!("{}/meta.json", checkpoint_dir("shared", 8, attempt)),
            format!("tokenizer/{attempt}/tokenizer.json"),
        ] {
            assert!(is_attempt_output(&path), "{path}");
        }
        for path in [
            "run.yaml",
            "program.py",
            "data/train.jsonl",
            "turns/notes.txt",
            "turns/iteration=7/my.parquet",
            "turns/iteration=x/part-0-0123456789abcdef0123456789abcdef-0.parquet",
            "commits/iteration=7/part-0-0123456789abcdef0123456789abcdef-0.parquet",
            "turns/iteration=7/part-0-a1b2-0.parquet",
            "checkpoints/shared/v000008/model.safetensors",
            "checkpoints/shared/README.md",
            "tokenizer/tokenizer.json",
            "other/run/turns/iteration=7/part-0-0123456789abcdef0123456789abcdef-0.parquet",
        ] {
            assert!(!is_attempt_output(path), "{path}");
        }
    }
}
