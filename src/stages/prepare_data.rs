//! The prepare-data stage: writes the `tasks` table (and, for embedded-default runs,
//! `demonstrations`) and commits `_commits/prepare-data.json`.
//!
//! * Games and planning (Plan-Path, Sudoku, Sokoban, tic-tac-toe) are generated. Task
//!   `i` of a split has the seed `stream([run seed, split, i])`; the two splits use
//!   disjoint key ranges, and duplicates are skipped by instance content: the test split
//!   is generated first, then train skips any instance the test split (or train) already
//!   has, so no puzzle is ever in both.
//! * Math and code read `data.test_file` and `data.train_file` (JSONL or Parquet with a
//!   column mapping, see `envs::dataset`); train rows whose problem is also a test
//!   problem are dropped, then the first `train_tasks` / `test_tasks` rows are kept.
//! * With `warm_start`, demonstrations are played on the training tasks (cycling
//!   through them) by `workflows::demos::Demonstrator` until there are
//!   `warm_start.demonstrations` rows.

use std::collections::HashSet;

use serde::Serialize;

use crate::config::{EnvConfig, RunConfig};
use crate::envs::rng::{SplitMix64, stream};
use crate::envs::{self, AnyEnv, Env, PlanPath, Sokoban, Sudoku, TicTacToe, dataset};
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::schema::Table;
use crate::store::{self, CommitMarker, Partition, RunStore, Split, Stage, StageId};
use crate::tables::{self, DemonstrationRow, TaskRow};
use crate::workflows::Episode;
use crate::workflows::demos::Demonstrator;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(transparent)]
    Env(#[from] envs::Error),

    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::Error),

    #[error(transparent)]
    Workflow(#[from] crate::workflows::Error),

    #[error("{env} reads its tasks from files: set data.{key} in the config")]
    MissingFile { env: &'static str, key: &'static str },

    #[error("{split}: {wanted} tasks wanted, but only {found} distinct ones {source_text}")]
    NotEnoughTasks { split: &'static str, wanted: usize, found: usize, source_text: String },

    #[error("warm_start demonstrations exist for plan_path, sudoku, sokoban and tic_tac_toe, not {env}")]
    NoDemonstrations { env: &'static str },

    #[error("cannot encode the {table} table: {source}")]
    Encode { table: Table, source: serde_arrow::Error },
}

/// Split keys of the seed streams.
const TRAIN: u64 = 1;
const TEST: u64 = 2;
/// Draws tried per wanted task before giving up on finding distinct instances.
const DRAWS_PER_TASK: usize = 50;

/// What prepare-data wrote.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub marker: CommitMarker,
    pub train: usize,
    pub test: usize,
    pub demonstrations: usize,
}

/// Runs the stage: generates or reads the tasks, plays the demonstrations, commits.
pub async fn run(store: &RunStore, config: &RunConfig) -> Result<Prepared, Error> {
    let (train, test) = tasks(config)?;
    let demonstrations = match &config.warm_start {
        Some(warm) => demonstrations(config, &train, warm.demonstrations as usize)?,
        None => Vec::new(),
    };
    let mut writer = store.begin(StageId::run_level(Stage::PrepareData));
    let encode = |table| move |source| Error::Encode { table, source };
    for (split, rows) in [(Split::Train, &train), (Split::Test, &test)] {
        let batch = tables::to_batch(rows).map_err(encode(Table::Tasks))?;
        writer.write_table(Table::Tasks, Partition::Split(split), &[batch]).await?;
    }
    if !demonstrations.is_empty() {
        let batch = tables::to_batch(&demonstrations).map_err(encode(Table::Demonstrations))?;
        writer.write_table(Table::Demonstrations, Partition::Split(Split::Train), &[batch]).await?;
    }
    let info = super::run_info(config);
    let marker = writer.finish().commit(info).await?;
    Ok(Prepared { marker, train: train.len(), test: test.len(), demonstrations: demonstrations.len() })
}

/// The train and test tasks of a config.
pub fn tasks(config: &RunConfig) -> Result<(Vec<TaskRow>, Vec<TaskRow>), Error> {
    let (train_n, test_n) = (config.data.train_tasks as usize, config.data.test_tasks as usize);
    match &config.env {
        EnvConfig::Math(_) | EnvConfig::Code(_) => from_files(config, train_n, test_n),
        env => {
            let mut seen = HashSet::new();
            let test = generate(env, config.seed, TEST, test_n, &mut seen)?;
            let train = generate(env, config.seed, TRAIN, train_n, &mut seen)?;
            Ok((train, test))
        }
    }
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("instances serialise")
}

/// A freshly generated environment of one of the generated families.
fn generate_env(env: &EnvConfig, seed: u64) -> AnyEnv {
    match env {
        EnvConfig::PlanPath(c) => AnyEnv::PlanPath(PlanPath::generate(c, seed)),
        EnvConfig::Sudoku(c) => AnyEnv::Sudoku(Sudoku::generate(c, seed)),
        EnvConfig::Sokoban(c) => AnyEnv::Sokoban(Sokoban::generate(c, seed)),
        EnvConfig::TicTacToe(_) => AnyEnv::TicTacToe(TicTacToe::generate(seed)),
        EnvConfig::Math(_) | EnvConfig::Code(_) => unreachable!("read from files"),
    }
}

/// The instance JSON of a generated environment: what makes two tasks the same.
fn instance_of(env: &AnyEnv) -> String {
    match env {
        AnyEnv::PlanPath(e) => json(&e.instance()),
        AnyEnv::Sudoku(e) => json(&e.instance()),
        AnyEnv::Sokoban(e) => json(&e.instance()),
        AnyEnv::TicTacToe(e) => json(&e.instance()),
        AnyEnv::Math(_) | AnyEnv::Code(_) => unreachable!("read from files"),
    }
}

/// The reference JSON and difficulty of a generated environment. Solving is the costly
/// part of generation (minimax, BFS), so it runs only for instances that are kept.
fn reference_of(env: &AnyEnv) -> (Option<String>, Option<f64>) {
    match env {
        AnyEnv::PlanPath(e) => {
            let path = e.solve().map(|p| e.format_action(&p));
            (path.map(|p| json(&p)), Some(e.shortest() as f64))
        }
        AnyEnv::Sudoku(e) => (e.solve().map(|s| e.format_action(&s)), Some(e.blanks() as f64)),
        AnyEnv::Sokoban(e) => {
            let moves = e.solve().map(|m| e.format_action(&m));
            let difficulty = moves.as_ref().map(|m| m.len() as f64);
            (moves.map(|m| json(&m)), difficulty)
        }
        AnyEnv::TicTacToe(e) => {
            let best = e.solve().map(|cell| json(&e.format_action(&cell)));
            let empty = e.cells().iter().filter(|c| c.is_none()).count();
            (best, Some(empty as f64))
        }
        AnyEnv::Math(_) | AnyEnv::Code(_) => unreachable!("read from files"),
    }
}

fn generate(
    env: &EnvConfig,
    run_seed: u64,
    split: u64,
    n: usize,
    seen: &mut HashSet<String>,
) -> Result<Vec<TaskRow>, Error> {
    let name = if split == TRAIN { "train" } else { "test" };
    let mut rows = Vec::with_capacity(n);
    let draws = n * DRAWS_PER_TASK + 1000;
    for index in 0..draws as u64 {
        if rows.len() == n {
            break;
        }
        let seed = stream(&[run_seed, split, index]);
        let generated = generate_env(env, seed);
        let instance = instance_of(&generated);
        if !seen.insert(instance.clone()) {
            continue;
        }
        let (reference, difficulty) = reference_of(&generated);
        rows.push(TaskRow {
            task_id: format!("{}/{name}/{:06}", env.name(), rows.len()),
            env: env.name().to_string(),
            seed,
            instance,
            reference,
            difficulty,
            source: "generated".into(),
        });
    }
    if rows.len() < n {
        return Err(Error::NotEnoughTasks {
            split: name,
            wanted: n,
            found: rows.len(),
            source_text: format!("in {draws} draws; lower data.{name}_tasks"),
        });
    }
    Ok(rows)
}

fn from_files(config: &RunConfig, train_n: usize, test_n: usize) -> Result<(Vec<TaskRow>, Vec<TaskRow>), Error> {
    let env = config.env.name();
    let train_file = config.data.train_file.as_ref().ok_or(Error::MissingFile { env, key: "train_file" })?;
    let test_file = config.data.test_file.as_ref().ok_or(Error::MissingFile { env, key: "test_file" })?;
    // (id, problem text, instance JSON, reference)
    let read = |file| -> Result<Vec<(String, String, String, Option<String>)>, Error> {
        Ok(match &config.env {
            EnvConfig::Math(_) => dataset::math_records(file)?
                .into_iter()
                .map(|r| (r.id, r.instance.problem.clone(), json(&r.instance), Some(json(&r.instance.answer))))
                .collect(),
            _ => dataset::code_records(file)?
                .into_iter()
                .map(|r| (r.id, r.instance.problem.clone(), json(&r.instance), r.solution.map(|s| json(&s))))
                .collect(),
        })
    };
    let rows = |records: Vec<(String, String, String, Option<String>)>,
                split: &'static str,
                n: usize,
                file: &crate::config::DatasetFile| {
        if records.len() < n {
            return Err(Error::NotEnoughTasks {
                split,
                wanted: n,
                found: records.len(),
                source_text: format!("in {}; lower data.{split}_tasks", file.path.display()),
            });
        }
        Ok(records
            .into_iter()
            .take(n)
            .enumerate()
            .map(|(i, (id, _, instance, reference))| TaskRow {
                task_id: format!("{env}/{split}/{i:06}-{id}"),
                env: env.to_string(),
                seed: 0,
                instance,
                reference,
                difficulty: None,
                source: file.path.display().to_string(),
            })
            .collect::<Vec<_>>())
    };
    let test_records = read(test_file)?;
    let test_problems: HashSet<String> = test_records.iter().map(|r| r.1.trim().to_string()).collect();
    let mut seen = HashSet::new();
    let train_records: Vec<_> = read(train_file)?
        .into_iter()
        .filter(|r| !test_problems.contains(r.1.trim()) && seen.insert(r.1.trim().to_string()))
        .collect();
    Ok((rows(train_records, "train", train_n, train_file)?, rows(test_records, "test", test_n, test_file)?))
}

fn demonstrations(config: &RunConfig, train: &[TaskRow], wanted: usize) -> Result<Vec<DemonstrationRow>, Error> {
    let plan_path = match &config.env {
        EnvConfig::PlanPath(c) => c.demonstrations.clone(),
        EnvConfig::Sudoku(_) | EnvConfig::Sokoban(_) | EnvConfig::TicTacToe(_) => Default::default(),
        other => return Err(Error::NoDemonstrations { env: other.name() }),
    };
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let envs: Vec<AnyEnv> =
        train.iter().map(|t| AnyEnv::from_instance(&config.env, &t.instance)).collect::<Result<_, _>>()?;
    let demonstrator = Demonstrator::new(plan_path, &envs[0], &sandbox)?;
    let mut rows = Vec::with_capacity(wanted);
    let mut episode_index = 0usize;
    while rows.len() < wanted {
        let task = &train[episode_index % train.len()];
        let env = envs[episode_index % envs.len()].clone();
        let mut rng = SplitMix64::new(stream(&[config.seed, 3, episode_index as u64]));
        let episode = Episode::new(config.workflow.kind, env, config.workflow.max_turns)?;
        for demo in demonstrator.play(episode, &mut rng, &sandbox) {
            if rows.len() == wanted {
                break;
            }
            rows.push(DemonstrationRow {
                demo_id: format!("{}/d{episode_index}/t{}/{}", task.task_id, demo.turn, demo.agent),
                task_id: task.task_id.clone(),
                turn: demo.turn,
                agent: demo.agent.to_string(),
                prompt: demo.prompt,
                response: demo.response,
                choice: demo.choice.to_string(),
                local_reward: demo.local_reward,
            });
        }
        episode_index += 1;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    const PLANNERS: &str = "workflow: {kind: tool_planner}\nagents: {tool: {policy: p}, planner: {policy: p}}\n";

    fn config(body: &str) -> RunConfig {
        let text = format!(
            "store: memory://x\niterations: 1\npolicies: {{p: {{model: m}}}}\nrollout: {{tasks_per_iteration: 4}}\nevaluation: {{tasks: 20}}\n{body}"
        );
        parse(&text, std::path::Path::new("test.yaml")).unwrap()
    }

    #[test]
    fn splits_are_disjoint_deterministic_and_seeded_by_the_run() {
        let c = config(&format!("env: {{name: sudoku}}\ndata: {{train_tasks: 300, test_tasks: 100}}\n{PLANNERS}"));
        let (train, test) = tasks(&c).unwrap();
        assert_eq!((train.len(), test.len()), (300, 100));
        let test_set: HashSet<&str> = test.iter().map(|t| t.instance.as_str()).collect();
        assert!(train.iter().all(|t| !test_set.contains(t.instance.as_str())));
        let (again, _) = tasks(&c).unwrap();
        assert_eq!(train, again);
        assert_eq!(train[0].task_id, "sudoku/train/000000");
        let other =
            config(&format!("seed: 7\nenv: {{name: sudoku}}\ndata: {{train_tasks: 300, test_tasks: 100}}\n{PLANNERS}"));
        assert_ne!(tasks(&other).unwrap().0[0].instance, train[0].instance);
    }

    #[test]
    fn too_few_distinct_instances_is_an_error() {
        // Tic-tac-toe has about a thousand opening positions of at most four moves.
        let c = config(
            "env: {name: tic_tac_toe}\nworkflow: {kind: two_players}\nagents: {player_x: {policy: p}, player_o: {policy: p}}\ndata: {train_tasks: 5000, test_tasks: 100}\n",
        );
        let message = tasks(&c).unwrap_err().to_string();
        assert!(message.starts_with("train: 5000 tasks wanted, but only "), "{message}");
    }
}
