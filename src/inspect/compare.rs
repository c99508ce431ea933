//! `petting compare`: held-out success of several runs side by side, one row per method
//! and one column per task, averaged over the runs' seeds, with the difference to the
//! untrained single agent of the same task.
//!
//! A run gives two kinds of rows: its version 0 (the untrained warm start, e.g. "MAS")
//! and its final version (e.g. "MAS + AT-GRPO (shared)"), each in every evaluated mode.
//! A fork's first version is its source's, counted with the source, so a fork gives only
//! trained rows. Runs that would give the same (row, task, seed) are told apart by the
//! settings that differ between them (or the keys `--label` names), else by run name,
//! so no run is dropped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::algo::Algorithm;
use crate::config::RunConfig;
use crate::sql::RunSql;
use crate::store::RunStore;
use crate::workflows::WorkflowKind;

use super::Error;
use super::chart::{self, BarChart, Bars, LineChart, Series};
use super::report::series;

/// One run's evaluations and rewards, and what it is.
#[derive(Debug, Clone)]
pub struct RunResults {
    pub url: String,
    /// The run's name (`RunConfig::run_name`).
    pub name: String,
    pub task: String,
    pub seed: u64,
    /// The version training ends with.
    pub iterations: u32,
    pub method: Method,
    /// Whether the run started from another run's checkpoints (`--from`).
    pub forked: bool,
    /// Success rate per evaluated version, one series per mode.
    pub success: Vec<Series>,
    /// Mean local reward of the sampled turns per iteration, one series per agent.
    pub reward: Vec<Series>,
    /// The run's frozen config as dotted keys (`algorithm.credit`) and YAML values.
    pub settings: BTreeMap<String, String>,
    /// What tells this run's rows apart from another's of the same method, task and
    /// seed (`[algorithm.credit=turn]`); empty when nothing needs telling apart.
    pub label: String,
}

/// How a run trains: who plays, with which estimator, on which policies.
#[derive(Debug, Clone, PartialEq)]
pub struct Method {
    pub single_agent: bool,
    pub algorithm: Algorithm,
    pub specialisation: Specialisation,
    pub alpha: f64,
    /// Rollouts played each agent alone (`workflow.alone`).
    pub alone: bool,
    /// PPO's critic reads the joint history (MAPPO), not each agent's own prompt.
    pub centralised_critic: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specialisation {
    /// L0: one policy plays every role.
    Shared,
    /// L1: a LoRA adapter per role.
    PerRoleLora,
    /// L2: a full model per role.
    PerRole,
}

impl Method {
    pub fn of(config: &RunConfig) -> Method {
        let policies: std::collections::BTreeSet<&str> = config.agents.values().map(|a| a.policy.as_str()).collect();
        let lora = config.policies.values().any(|p| p.lora.is_some());
        let specialisation = match (policies.len(), lora) {
            (0 | 1, _) => Specialisation::Shared,
            (_, true) => Specialisation::PerRoleLora,
            (_, false) => Specialisation::PerRole,
        };
        Method {
            single_agent: config.workflow.kind == WorkflowKind::SingleAgent,
            algorithm: config.algorithm.name,
            specialisation,
            alpha: config.algorithm.alpha,
            alone: config.workflow.alone,
            centralised_critic: config.critic.as_ref().is_some_and(|c| c.centralised()),
        }
    }

    /// The table row of this method's `version` evaluated in `mode`, e.g. "MAS", "MAS +
    /// AT-GRPO (shared)", "MAS + AT-GRPO (per-role), swapped", "MAS + AT-GRPO (per-role,
    /// trained alone)".
    pub fn row(&self, trained: bool, mode: &str) -> Row {
        let team = if self.single_agent { "single agent" } else { "MAS" };
        let specialisation = match (self.single_agent, self.specialisation) {
            (true, _) => "",
            (false, Specialisation::Shared) => "shared",
            (false, Specialisation::PerRoleLora) => "per-role LoRA",
            (false, Specialisation::PerRole) => "per-role",
        };
        let specialisation = match (specialisation, trained && self.alone) {
            ("", _) => String::new(),
            (s, false) => format!(" ({s})"),
            (s, true) => format!(" ({s}, trained alone)"),
        };
        let mut label = if trained {
            let alpha = if self.alpha == 1.0 { String::new() } else { format!(" α={}", self.alpha) };
            let estimator = if self.centralised_critic { "MAPPO" } else { self.algorithm.label() };
            format!("{team} + {estimator}{specialisation}{alpha}")
        } else if self.specialisation == Specialisation::Shared {
            team.to_string()
        } else {
            format!("{team}{specialisation}")
        };
        // A single-agent run's own workflow is its multi_agent mode.
        let mode_rank = match mode {
            "multi_agent" => 0,
            "single_agent" if self.single_agent => 0,
            "single_agent" => 1,
            _ => 2,
        };
        let method = label.clone();
        match (mode_rank, mode) {
            (0, _) => {}
            (1, _) => label.push_str(", first role alone"),
            (_, "alone") => label.push_str(", the planner alone"),
            (_, "tool_alone") => label.push_str(", the tool agent alone"),
            _ => label.push_str(&format!(", {mode}")),
        }
        Row { order: (!self.single_agent, trained, method, mode_rank), label }
    }
}

/// A row of the table; rows sort single agent first, untrained before trained, and a
/// method's other modes right after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    order: (bool, bool, String, u8),
    pub label: String,
}

/// Mean and sample standard deviation of a cell's seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    pub mean: f64,
    pub std: f64,
    pub seeds: usize,
}

impl Cell {
    fn of(values: &[f64]) -> Cell {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance =
            if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
        Cell { mean, std: variance.sqrt(), seeds: values.len() }
    }
}

/// Rows × tasks of held-out success.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub tasks: Vec<String>,
    pub rows: Vec<(Row, Vec<Option<Cell>>)>,
}

/// The row every Δ is measured against.
pub const BASELINE: &str = "single agent";

impl Table {
    /// `mean(row) - mean(single agent)` of a task, when both exist.
    pub fn delta(&self, row: usize, task: usize) -> Option<f64> {
        let baseline = self.rows.iter().find(|(r, _)| r.label == BASELINE)?.1[task]?;
        Some(self.rows[row].1[task]?.mean - baseline.mean)
    }
}

/// The table of the runs' version 0 and trained evaluations: version `at`, or each run's
/// final version without it. A run whose trained version is not evaluated (yet) gives
/// only its untrained rows.
pub fn table(runs: &[RunResults], at: Option<u32>) -> Table {
    // (row, task) -> seed -> success; runs that share a (row, task, seed) carry labels
    // that make their rows differ (label_runs), and of a fork's version 0 the source's counts.
    let mut values: BTreeMap<(Row, String), BTreeMap<u64, f64>> = BTreeMap::new();
    for run in runs {
        for mode in &run.success {
            for &(version, success) in &mode.points {
                let trained = match version {
                    0 if run.forked => continue,
                    0 => false,
                    v if v == i64::from(at.unwrap_or(run.iterations)) => true,
                    _ => continue,
                };
                let mut row = run.method.row(trained, &mode.name);
                row.label.push_str(&run.label);
                row.order.2.push_str(&run.label);
                values.entry((row, run.task.clone())).or_default().entry(run.seed).or_insert(success);
            }
        }
    }
    let mut tasks: Vec<String> = values.keys().map(|(_, task)| task.clone()).collect();
    tasks.sort();
    tasks.dedup();
    let mut rows: Vec<(Row, Vec<Option<Cell>>)> = Vec::new();
    for ((row, task), seeds) in values {
        if rows.last().is_none_or(|(last, _)| *last != row) {
            rows.push((row, vec![None; tasks.len()]));
        }
        let column = tasks.iter().position(|t| *t == task).expect("every task is a column");
        let cells = &mut rows.last_mut().expect("just pushed").1;
        cells[column] = Some(Cell::of(&seeds.into_values().collect::<Vec<_>>()));
    }
    Table { tasks, rows }
}

/// The table's cells as compare.csv has them, one object each.
pub fn cells(table: &Table) -> serde_json::Value {
    let mut cells = Vec::new();
    for (index, (row, values)) in table.rows.iter().enumerate() {
        for (task, cell) in values.iter().enumerate() {
            let Some(c) = cell else { continue };
            cells.push(serde_json::json!({
                "method": row.label,
                "task": table.tasks[task],
                "success_mean": c.mean,
                "success_std": c.std,
                "seeds": c.seeds,
                "delta_vs_single_agent": table.delta(index, task),
            }));
        }
    }
    serde_json::Value::Array(cells)
}

/// The table as aligned text, success in percent: `mean ± std (seeds) Δ`.
pub fn render(table: &Table) -> String {
    let mut cells: Vec<Vec<String>> = vec![std::iter::once("method".to_string()).chain(table.tasks.clone()).collect()];
    for (index, (row, values)) in table.rows.iter().enumerate() {
        let mut line = vec![row.label.clone()];
        for (task, cell) in values.iter().enumerate() {
            line.push(cell.map_or("-".to_string(), |c| {
                let delta = table.delta(index, task).filter(|_| row.label != BASELINE);
                let delta = delta.map_or(String::new(), |d| format!("  Δ {:+.1}", d * 100.0));
                format!("{:.1} ± {:.1} ({}){delta}", c.mean * 100.0, c.std * 100.0, c.seeds)
            }));
        }
        cells.push(line);
    }
    let widths: Vec<usize> =
        (0..cells[0].len()).map(|c| cells.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &cells {
        let padded: Vec<String> = line.iter().zip(&widths).map(|(text, w)| format!("{text:<w$}")).collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    }
    out
}

/// The table in long form: one line per (method, task).
pub fn csv(table: &Table) -> String {
    let mut out = String::from("method,task,success_mean,success_std,seeds,delta_vs_single_agent\n");
    for (index, (row, values)) in table.rows.iter().enumerate() {
        for (task, cell) in values.iter().enumerate() {
            let Some(c) = cell else { continue };
            let delta = table.delta(index, task).map_or(String::new(), |d| format!("{d:.4}"));
            let _ =
                writeln!(out, "\"{}\",{},{:.4},{:.4},{},{delta}", row.label, table.tasks[task], c.mean, c.std, c.seeds);
        }
    }
    out
}

/// Reads a run's config, evaluations and rewards.
pub async fn read_run(store: &RunStore) -> Result<RunResults, Error> {
    let config = crate::config::of_run(store).await?;
    let sql = RunSql::open(store).await?;
    let has = |table: &str| sql.context().table_exist(table).unwrap_or(false);
    let success = if has("evals") {
        let query = "SELECT iteration AS x, mode AS series, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS y \
                     FROM evals GROUP BY iteration, mode";
        series(&sql.query(query).await?.1)
    } else {
        Vec::new()
    };
    let reward = if has("turns") {
        let query =
            "SELECT iteration AS x, agent AS series, avg(local_reward) AS y FROM turns GROUP BY iteration, agent";
        series(&sql.query(query).await?.1)
    } else {
        Vec::new()
    };
    Ok(RunResults {
        url: store.url().to_string(),
        name: config.run_name(),
        task: config.env.name().to_string(),
        seed: config.seed,
        iterations: config.iterations,
        method: Method::of(&config),
        forked: config.fork.is_some(),
        success,
        reward,
        settings: settings_of(&config),
        label: String::new(),
    })
}

/// The keys that never tell methods apart: where a run is stored, its seed (the seeds of
/// a cell) and where it forked from.
const NOT_SETTINGS: [&str; 3] = ["store", "seed", "fork"];

/// A config as dotted keys and their values, lists and scalars as one value each, with
/// the documented default of every key the frozen config leaves out (a run made before
/// a key existed, or whose default is not written), so runs differ only where they run
/// differently.
fn settings_of(config: &RunConfig) -> BTreeMap<String, String> {
    let value = serde_json::to_value(config).expect("a config serialises");
    let mut out = crate::config::settings(&value);
    for (key, default) in crate::config::reference::defaults() {
        out.entry(key).or_insert(default);
    }
    out.retain(|key, _| !NOT_SETTINGS.iter().any(|n| key == n || key.starts_with(&format!("{n}."))));
    out
}

/// Sets each run's label. With `keys`, every run is labelled by their values. Without,
/// only runs that would give the same (method, task, seed) are, by the settings that
/// differ among them, or by run name where none does (a rerun). An unknown key is an
/// error naming it.
pub fn label_runs(runs: &mut [RunResults], keys: &[String]) -> Result<(), Error> {
    for key in keys {
        if !runs.iter().any(|r| r.settings.contains_key(key)) {
            let near: Vec<&String> = runs
                .iter()
                .flat_map(|r| r.settings.keys())
                .filter(|k| k.ends_with(key.rsplit('.').next().unwrap_or(key)))
                .collect();
            return Err(Error::Report(format!("--label {key}: no run has this setting (e.g. {near:?})")));
        }
    }
    let chosen = |run: &RunResults, keys: &[&String]| -> String {
        let values: Vec<String> =
            keys.iter().map(|k| format!("{k}={}", run.settings.get(*k).map_or("-", String::as_str))).collect();
        format!(" [{}]", values.join(", "))
    };
    if !keys.is_empty() {
        let keys: Vec<&String> = keys.iter().collect();
        for run in runs.iter_mut() {
            run.label = chosen(run, &keys);
        }
        return Ok(());
    }
    let same = |a: &RunResults, b: &RunResults| a.method == b.method && a.task == b.task && a.seed == b.seed;
    for run in runs.iter_mut() {
        run.label.clear();
    }
    for i in 0..runs.len() {
        let group: Vec<usize> = (0..runs.len()).filter(|&j| same(&runs[i], &runs[j])).collect();
        if group.len() < 2 {
            continue;
        }
        let differing: Vec<&String> = runs[i]
            .settings
            .keys()
            .filter(|k| group.iter().any(|&j| runs[j].settings.get(*k) != runs[i].settings.get(*k)))
            .collect();
        let label = if differing.is_empty() { format!(" [{}]", runs[i].name) } else { chosen(&runs[i], &differing) };
        runs[i].label = label;
    }
    Ok(())
}

/// Files `write_comparison` wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub files: Vec<PathBuf>,
}

/// Writes `compare.csv`, `compare.png` (bars with the spread over seeds) and, per task,
/// `curves-<task>.png` (success per version) and `rewards-<task>.png` (mean local
/// reward per iteration and agent), each averaged over seeds per method.
pub fn write_comparison(runs: &[RunResults], table: &Table, dir: &Path) -> Result<Written, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Write { path: dir.display().to_string(), source })?;
    let mut files = Vec::new();
    let path = dir.join("compare.csv");
    std::fs::write(&path, csv(table)).map_err(|source| Error::Write { path: path.display().to_string(), source })?;
    files.push(path);

    let bars: Vec<Bars> = table
        .rows
        .iter()
        .map(|(row, cells)| Bars {
            name: row.label.clone(),
            values: cells.iter().map(|c| c.map(|c| (c.mean, c.std))).collect(),
        })
        .collect();
    let path = dir.join("compare.png");
    let chart = BarChart {
        title: "Held-out success (mean ± std over seeds)",
        y_label: "success rate",
        groups: &table.tasks,
        series: &bars,
    };
    chart::draw_bars_png(&chart, &path)?;
    files.push(path);

    for task in &table.tasks {
        let of_task: Vec<&RunResults> = runs.iter().filter(|r| r.task == *task).collect();
        let success = mean_curves(&of_task, |r| &r.success, |r, mode| r.method.row(true, mode).label);
        let reward = mean_curves(
            &of_task,
            |r| &r.reward,
            |r, agent| format!("{}: {agent}", r.method.row(true, "multi_agent").label),
        );
        for (file, title, y_label, curves, y_range) in [
            (format!("curves-{task}.png"), "Held-out success per version", "success rate", success, Some(0.0..1.0)),
            (format!("rewards-{task}.png"), "Mean local reward per iteration", "local reward", reward, None),
        ] {
            if curves.is_empty() {
                continue;
            }
            let title = format!("{task}: {title}");
            let path = dir.join(file);
            let chart = LineChart { title: &title, x_label: "iteration", y_label, y_range, series: &curves };
            chart::draw_png(&chart, &path)?;
            files.push(path);
        }
    }
    Ok(Written { files })
}

/// Series averaged over runs by name: the mean of the runs' values at each x.
fn mean_curves(
    runs: &[&RunResults],
    series_of: impl Fn(&RunResults) -> &Vec<Series>,
    name: impl Fn(&RunResults, &str) -> String,
) -> Vec<Series> {
    let mut sums: BTreeMap<String, BTreeMap<i64, (f64, usize)>> = BTreeMap::new();
    for run in runs {
        for s in series_of(run) {
            let points = sums.entry(name(run, &s.name)).or_default();
            for &(x, y) in &s.points {
                let (sum, n) = points.entry(x).or_default();
                *sum += y;
                *n += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(name, points)| Series {
            name,
            points: points.into_iter().map(|(x, (sum, n))| (x, sum / n as f64)).collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(single_agent: bool, algorithm: Algorithm, specialisation: Specialisation) -> Method {
        Method { single_agent, algorithm, specialisation, alpha: 1.0, alone: false, centralised_critic: false }
    }

    fn run(method: Method, seed: u64, forked: bool, success: &[(&str, &[(i64, f64)])]) -> RunResults {
        RunResults {
            url: format!("runs/{seed}"),
            name: seed.to_string(),
            task: "plan_path".into(),
            seed,
            iterations: 30,
            method,
            forked,
            success: success
                .iter()
                .map(|(mode, points)| Series { name: mode.to_string(), points: points.to_vec() })
                .collect(),
            reward: Vec::new(),
            settings: BTreeMap::new(),
            label: String::new(),
        }
    }

    #[test]
    fn rows_are_named_after_the_method_and_mode() {
        let shared = method(false, Algorithm::AtGrpo, Specialisation::Shared);
        assert_eq!(shared.row(false, "multi_agent").label, "MAS");
        assert_eq!(shared.row(true, "multi_agent").label, "MAS + AT-GRPO (shared)");
        assert_eq!(shared.row(true, "single_agent").label, "MAS + AT-GRPO (shared), first role alone");
        let per_role = method(false, Algorithm::AtGrpo, Specialisation::PerRole);
        assert_eq!(per_role.row(false, "multi_agent").label, "MAS (per-role)");
        assert_eq!(per_role.row(true, "swapped").label, "MAS + AT-GRPO (per-role), swapped");
        let alone = method(true, Algorithm::Grpo, Specialisation::Shared);
        assert_eq!(alone.row(false, "single_agent").label, "single agent");
        assert_eq!(alone.row(true, "multi_agent").label, "single agent + GRPO");
        let half = Method { alpha: 0.5, ..method(false, Algorithm::Magrpo, Specialisation::PerRoleLora) };
        assert_eq!(half.row(true, "multi_agent").label, "MAS + MAGRPO (per-role LoRA) α=0.5");
        let ppo = method(false, Algorithm::Ppo, Specialisation::Shared);
        assert_eq!(ppo.row(true, "multi_agent").label, "MAS + PPO (GAE) (shared)");
        let mappo = Method { centralised_critic: true, ..ppo };
        assert_eq!(mappo.row(true, "multi_agent").label, "MAS + MAPPO (shared)");
        let apart = Method { alone: true, ..per_role };
        assert_eq!(apart.row(false, "multi_agent").label, "MAS (per-role)", "its untrained policies are the team's");
        assert_eq!(apart.row(true, "multi_agent").label, "MAS + AT-GRPO (per-role, trained alone)");
        assert_eq!(apart.row(true, "alone").label, "MAS + AT-GRPO (per-role, trained alone), the planner alone");
        assert_eq!(
            apart.row(true, "tool_alone").label,
            "MAS + AT-GRPO (per-role, trained alone), the tool agent alone"
        );
    }

    #[test]
    fn cells_average_seeds_count_forked_duplicates_once_and_measure_delta() {
        let alone = method(true, Algorithm::AtGrpo, Specialisation::Shared);
        let team = method(false, Algorithm::AtGrpo, Specialisation::Shared);
        let grpo = method(false, Algorithm::Grpo, Specialisation::Shared);
        let runs = [
            run(alone.clone(), 1, false, &[("single_agent", &[(0, 0.1), (10, 0.2), (30, 0.3)])]),
            run(alone, 2, false, &[("single_agent", &[(0, 0.3), (30, 0.5)])]),
            // Forked from seed 1's version 0: its version 0 is that run's, already counted.
            run(grpo, 1, true, &[("multi_agent", &[(0, 0.25), (30, 0.6)])]),
            run(team.clone(), 1, false, &[("multi_agent", &[(0, 0.2), (30, 0.9)])]),
            // Unfinished: only its untrained row counts.
            run(team, 2, false, &[("multi_agent", &[(0, 0.4), (10, 0.7)])]),
        ];
        assert_eq!(table(&runs, Some(10)).rows[1].1[0].unwrap().mean, 0.2, "single agent + AT-GRPO at v10");
        let table = table(&runs, None);
        let labels: Vec<&str> = table.rows.iter().map(|(r, _)| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["single agent", "single agent + AT-GRPO", "MAS", "MAS + AT-GRPO (shared)", "MAS + GRPO (shared)"]
        );
        let cell = |row: usize| table.rows[row].1[0].unwrap();
        assert!((cell(0).mean - 0.2).abs() < 1e-12 && (cell(0).std - 0.02f64.sqrt()).abs() < 1e-12);
        assert_eq!(cell(2).seeds, 2);
        assert!((cell(2).mean - 0.3).abs() < 1e-12);
        assert_eq!((cell(3).seeds, cell(3).std), (1, 0.0));
        assert!((table.delta(3, 0).unwrap() - 0.7).abs() < 1e-12);
        assert!((table.delta(0, 0).unwrap()).abs() < 1e-12);
        let text = render(&table);
        assert!(text.contains("MAS + AT-GRPO (shared)  90.0 ± 0.0 (1)  Δ +70.0"), "{text}");
        assert!(csv(&table).contains("\"MAS + GRPO (shared)\",plan_path,0.6000,0.0000,1,0.4000\n"));
    }

    #[test]
    fn runs_of_one_method_and_seed_are_told_apart_by_the_settings_that_differ() {
        let team = method(false, Algorithm::Grpo, Specialisation::Shared);
        let with = |url: &str, credit: &str, success: f64| {
            let mut r = run(team.clone(), 1, false, &[("multi_agent", &[(0, 0.1), (30, success)])]);
            r.name = url.trim_start_matches("runs/").into();
            r.settings = [("algorithm.credit", credit), ("iterations", "30")].map(|(k, v)| (k.into(), v.into())).into();
            r
        };
        let mut runs =
            [with("runs/return", "return", 0.5), with("runs/turn", "turn", 0.7), with("runs/again", "turn", 0.9)];
        label_runs(&mut runs[..2], &[]).unwrap();
        let labels: Vec<String> = table(&runs[..2], None).rows.iter().map(|(r, _)| r.label.clone()).collect();
        assert_eq!(
            labels,
            [
                "MAS [algorithm.credit=return]",
                "MAS [algorithm.credit=turn]",
                "MAS + GRPO (shared) [algorithm.credit=return]",
                "MAS + GRPO (shared) [algorithm.credit=turn]"
            ]
        );
        // A rerun with the same settings is named by its run.
        label_runs(&mut runs[1..], &[]).unwrap();
        assert_eq!((runs[1].label.as_str(), runs[2].label.as_str()), (" [turn]", " [again]"));
        label_runs(&mut runs, &["iterations".into()]).unwrap();
        assert!(runs.iter().all(|r| r.label == " [iterations=30]"));
        let unknown = label_runs(&mut runs, &["algorithm.creditt".into()]).unwrap_err().to_string();
        assert!(unknown.contains("--label algorithm.creditt"), "{unknown}");
    }

    #[test]
    fn a_key_the_frozen_config_leaves_out_has_its_documented_default() {
        let text = "store: runs/x\niterations: 2\nenv: {name: plan_path}\nworkflow: {kind: tool_planner}\n\
                    agents: {tool: {policy: p}, planner: {policy: p}}\npolicies: {p: {model: m}}\n";
        let on_policy = crate::config::parse(text, std::path::Path::new("a.yaml")).unwrap();
        let stale = crate::config::parse(&format!("{text}rollout: {{max_staleness: 1}}\n"), "b.yaml".as_ref()).unwrap();
        assert_eq!(settings_of(&on_policy)["rollout.max_staleness"], "0");
        assert_eq!(settings_of(&stale)["rollout.max_staleness"], "1");
        assert_eq!(settings_of(&on_policy)["rollout.select"], "best_reward", "a string default, unquoted");
    }
}
