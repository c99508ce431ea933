//! `petting report`: one HTML page about a run, with PNG charts and the sampling trees of
//! the most informative groups of its last iteration beside it, all in one folder that
//! needs no network to view. Every figure comes from SQL over the committed tables; the
//! page shows each chart's query, so a reader can take it to `petting sql`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use arrow::array::{Array, Float64Array, Int64Array, StringArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use super::chart::{self, LineChart, Series};
use super::panels::{OVERLAP, Panel, SPANS, panels};
use super::tree::{self, RenderOptions};
use super::{Error, task_tree};
use crate::sql::RunSql;
use crate::store::RunStore;

const SUCCESS: &str = "CASE WHEN success THEN 1.0 ELSE 0.0 END";

/// One row per iteration: when its rollout, its training steps and its evaluation ran.
const TIME_LINE: &str = "SELECT iteration, \
       round(min(CASE WHEN stage = 'rollout' THEN start_s END), 1) AS rollout_from, \
       round(max(CASE WHEN stage = 'rollout' THEN end_s END), 1) AS rollout_to, \
       round(min(CASE WHEN lane = 'train' THEN start_s END), 1) AS train_from, \
       round(max(CASE WHEN lane = 'train' THEN end_s END), 1) AS train_to, \
       round(min(CASE WHEN stage = 'evaluate' THEN start_s END), 1) AS evaluate_from, \
       round(max(CASE WHEN stage = 'evaluate' THEN end_s END), 1) AS evaluate_to \
     FROM spans WHERE iteration IS NOT NULL GROUP BY iteration ORDER BY iteration";

/// How many groups each table of groups lists.
const GROUPS_LISTED: usize = 5;

/// What [`write_report`] wrote.
#[derive(Debug)]
pub struct Report {
    pub index: PathBuf,
    pub charts: Vec<PathBuf>,
    pub trees: Vec<PathBuf>,
}

/// Writes `index.html`, `charts/*.png` and `trees/*.html` for the run into `dir`.
pub async fn write_report(store: &RunStore, dir: &Path) -> Result<Report, Error> {
    let sql = RunSql::open(store).await?;
    for sub in ["charts", "trees"] {
        create_dir(&dir.join(sub))?;
    }
    let mut page = Page::new(store.url());
    page.summary(&sql).await?;

    let mut charts = Vec::new();
    page.heading("Charts");
    for spec in panels() {
        let series = series(&sql.query(spec.query).await?.1);
        if series.is_empty() {
            page.missing_chart(&spec);
            continue;
        }
        let path = dir.join("charts").join(spec.file);
        let chart = LineChart {
            title: spec.title,
            x_label: spec.x_label,
            y_label: spec.y_label,
            y_range: spec.y_range.clone(),
            series: &series,
        };
        chart::draw_png(&chart, &path)?;
        page.chart(&spec);
        charts.push(path);
    }

    let trees = page.groups(&sql, store, dir).await?;
    page.stage_times(&sql).await?;
    page.run_config(store.run_config().await?.as_deref());
    let index = dir.join("index.html");
    write_file(&index, page.finish().as_bytes())?;
    Ok(Report { index, charts, trees })
}

/// The HTML page, built section by section.
struct Page {
    html: String,
}

impl Page {
    fn new(url: &str) -> Page {
        let title = format!("petting report: {}", escape(url));
        let html = format!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
             <style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
        );
        Page { html }
    }

    fn heading(&mut self, text: &str) {
        let _ = writeln!(self.html, "<h2>{}</h2>", escape(text));
    }

    fn paragraph(&mut self, text: &str) {
        let _ = writeln!(self.html, "<p>{}</p>", escape(text));
    }

    async fn summary(&mut self, sql: &RunSql) -> Result<(), Error> {
        self.heading("Held-out success, first and last evaluated version");
        let query = format!(
            "SELECT mode, version, episodes, success_pct FROM (\
               SELECT mode, iteration AS version, count(*) AS episodes, \
                 round(avg({SUCCESS}) * 100, 1) AS success_pct, \
                 min(iteration) OVER (PARTITION BY mode) AS first, max(iteration) OVER (PARTITION BY mode) AS last \
               FROM evals GROUP BY mode, iteration) \
             WHERE version = first OR version = last ORDER BY mode, version"
        );
        let table = grid(sql, &query).await?;
        self.table(&table, |_, _| None, "No evaluation is committed yet.");
        Ok(())
    }

    fn chart(&mut self, spec: &Panel) {
        let _ = writeln!(
            self.html,
            "<figure>\n<img src=\"charts/{file}\" alt=\"{title}\" width=\"960\" height=\"480\">\n\
             <figcaption><details><summary>query</summary><code>{query}</code></details></figcaption>\n</figure>",
            file = spec.file,
            title = escape(spec.title),
            query = escape(spec.query),
        );
    }

    fn missing_chart(&mut self, spec: &Panel) {
        self.paragraph(&format!("{}: no data committed yet.", spec.title));
    }

    /// The groups of the last grouped iteration whose rewards spread the most (they carry
    /// the update's signal; a group of equal rewards teaches nothing), then the lowest by
    /// mean among those that spread at all, each linked to its task's tree. Returns the
    /// tree pages written.
    async fn groups(&mut self, sql: &RunSql, store: &RunStore, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        let last = grid(sql, "SELECT max(iteration) AS last FROM groups").await?;
        let Some(iteration) = last.rows.first().and_then(|r| r[0].parse::<u32>().ok()) else {
            self.heading("Groups");
            self.paragraph("No group stage is committed yet.");
            return Ok(Vec::new());
        };
        let mut tasks = Vec::new();
        for (label, order) in [
            ("the widest reward spread", "std DESC, mean DESC"),
            ("the lowest mean reward that spreads", "mean ASC, std DESC"),
        ] {
            self.heading(&format!("Groups of iteration {iteration} with {label}"));
            let query = format!(
                "SELECT group_id, task_id, agent, turn, size, round(mean, 3) AS mean_reward, round(std, 3) AS std_reward \
                 FROM groups WHERE iteration = {iteration} AND std > 0 ORDER BY {order}, group_id LIMIT {GROUPS_LISTED}"
            );
            let table = grid(sql, &query).await?;
            let task_column = table.columns.iter().position(|c| c == "task_id");
            self.table(
                &table,
                |row, column| {
                    (Some(column) == task_column).then(|| format!("trees/{}", tree_file(iteration, &row[column])))
                },
                "Every group's rewards were equal.",
            );
            tasks.extend(task_column.into_iter().flat_map(|c| table.rows.iter().map(move |r| r[c].clone())));
        }
        tasks.sort();
        tasks.dedup();
        let mut written = Vec::new();
        for task in tasks {
            let path = dir.join("trees").join(tree_file(iteration, &task));
            write_file(&path, tree_page(store, iteration, &task).await?.as_bytes())?;
            written.push(path);
        }
        Ok(written)
    }

    /// The run's frozen config, every default filled in, as the run read it.
    fn run_config(&mut self, yaml: Option<&str>) {
        self.heading("Run config (run.yaml)");
        match yaml {
            Some(yaml) => {
                let _ =
                    writeln!(self.html, "<details><summary>run.yaml</summary><pre>{}</pre></details>", escape(yaml));
            }
            None => self.paragraph("The run has no run.yaml."),
        }
    }

    async fn stage_times(&mut self, sql: &RunSql) -> Result<(), Error> {
        self.heading("Time per stage, whole run");
        let query = "SELECT stage, count(*) AS commits, round(sum(seconds), 1) AS seconds, \
                     round(sum(model_seconds), 1) AS model_seconds, round(sum(sandbox_seconds), 1) AS sandbox_seconds \
                     FROM commits GROUP BY stage ORDER BY 3 DESC";
        let table = grid(sql, query).await?;
        self.table(&table, |_, _| None, "Nothing is committed yet.");
        self.time_line(sql).await
    }

    /// When each iteration sampled, trained and was evaluated, in seconds from the run's
    /// first commit, and how long sampling and training ran at once (rollout.max_staleness,
    /// evaluation.beside, or lanes run by hand).
    async fn time_line(&mut self, sql: &RunSql) -> Result<(), Error> {
        self.heading("Time line, seconds from the first stage's start");
        let overlap = grid(sql, &format!("{SPANS} {OVERLAP}")).await?;
        if let Some(row) = overlap.rows.first() {
            self.paragraph(&format!(
                "Sampling (rollouts, evaluations) ran beside training (group, advantage, update) for {} s \
                 of the run's {} s.",
                row[0], row[1]
            ));
        }
        let table = grid(sql, &format!("{SPANS} {TIME_LINE}")).await?;
        self.table(&table, |_, _| None, "Nothing is committed yet.");
        Ok(())
    }

    /// An HTML table; `link(row, column)` may give a cell a relative link.
    fn table(&mut self, table: &Grid, link: impl Fn(&[String], usize) -> Option<String>, empty: &str) {
        if table.rows.is_empty() {
            self.paragraph(empty);
            return;
        }
        self.html.push_str("<table>\n<tr>");
        for column in &table.columns {
            let _ = write!(self.html, "<th>{}</th>", escape(column));
        }
        self.html.push_str("</tr>\n");
        for row in &table.rows {
            self.html.push_str("<tr>");
            for (column, cell) in row.iter().enumerate() {
                match link(row, column) {
                    Some(href) => {
                        let _ = write!(self.html, "<td><a href=\"{}\">{}</a></td>", escape(&href), escape(cell));
                    }
                    None => {
                        let _ = write!(self.html, "<td>{}</td>", escape(cell));
                    }
                }
            }
            self.html.push_str("</tr>\n");
        }
        self.html.push_str("</table>\n");
    }

    fn finish(mut self) -> String {
        self.html.push_str("</body>\n</html>\n");
        self.html
    }
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
th{background:#f3f3f3}figure{margin:1.5em 0}img{max-width:100%;height:auto}code{font-size:90%}\
pre{white-space:pre-wrap;font-size:85%}";

/// One task's sampling tree, as `petting show --full` prints it.
async fn tree_page(store: &RunStore, iteration: u32, task: &str) -> Result<String, Error> {
    let found = task_tree(store, iteration, task).await?;
    let text = tree::render(&found.turns, &found.advantages, RenderOptions { full: true, color: false });
    let title = format!("task {task} · iteration {iteration}");
    Ok(format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<p><a href=\"../index.html\">back to the report</a></p>\n\
         <h1>{title}</h1>\n<p><code>petting show {url} --iteration {iteration} --task {task} --full</code></p>\n\
         <pre>{text}</pre>\n</body>\n</html>\n",
        title = escape(&title),
        url = escape(store.url()),
        task = escape(task),
        text = escape(&text),
    ))
}

/// A file name for a task's tree that is safe on every file system and in a URL, and
/// distinct per task: any character but letters, digits, `-`, `_` and `.` becomes
/// `~<hex>~`.
fn tree_file(iteration: u32, task: &str) -> String {
    let safe: String =
        task.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) { c.to_string() } else { format!("~{:x}~", c as u32) }
            })
            .collect();
    format!("iteration-{iteration}-{safe}.html")
}

/// A query result as text cells.
struct Grid {
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

async fn grid(sql: &RunSql, query: &str) -> Result<Grid, Error> {
    let (schema, batches) = sql.query(query).await?;
    let columns = schema.fields().iter().map(|f| f.name().clone()).collect();
    let options = FormatOptions::default().with_null("");
    let mut rows = Vec::new();
    for batch in &batches {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|a| ArrayFormatter::try_new(a.as_ref(), &options))
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Report(e.to_string()))?;
        for row in 0..batch.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(row).to_string()).collect());
        }
    }
    Ok(Grid { columns, rows })
}

/// Series from batches with columns `x`, `series`, `y`: named in order of first
/// appearance, points sorted by x, null values left out.
pub(crate) fn series(batches: &[RecordBatch]) -> Vec<Series> {
    let mut by_name: Vec<Series> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for batch in batches {
        let column =
            |name: &str, to: &DataType| cast(batch.column_by_name(name).expect("the chart query's column"), to);
        let (Ok(x), Ok(name), Ok(y)) =
            (column("x", &DataType::Int64), column("series", &DataType::Utf8), column("y", &DataType::Float64))
        else {
            continue;
        };
        let x = x.as_any().downcast_ref::<Int64Array>().expect("cast to Int64");
        let name = name.as_any().downcast_ref::<StringArray>().expect("cast to Utf8");
        let y = y.as_any().downcast_ref::<Float64Array>().expect("cast to Float64");
        for row in 0..batch.num_rows() {
            if x.is_null(row) || y.is_null(row) {
                continue;
            }
            let key = if name.is_null(row) { "" } else { name.value(row) };
            let at = *index.entry(key.to_string()).or_insert_with(|| {
                by_name.push(Series { name: key.to_string(), points: Vec::new() });
                by_name.len() - 1
            });
            by_name[at].points.push((x.value(row), y.value(row)));
        }
    }
    for s in &mut by_name {
        s.points.sort_by_key(|p| p.0);
    }
    by_name
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn create_dir(path: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(path).map_err(|source| Error::Write { path: path.display().to_string(), source })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes).map_err(|source| Error::Write { path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};

    use super::*;

    #[test]
    fn rows_become_series_in_order_of_appearance_with_sorted_points() {
        let x: ArrayRef = Arc::new(Int64Array::from(vec![Some(2), Some(0), Some(1), Some(0)]));
        let name: ArrayRef = Arc::new(StringArray::from(vec!["b", "a", "b", "b"]));
        let y: ArrayRef = Arc::new(Float64Array::from(vec![Some(0.5), Some(1.0), None, Some(0.25)]));
        let batch = RecordBatch::try_from_iter([("x", x), ("series", name), ("y", y)]).unwrap();
        assert_eq!(
            series(&[batch]),
            vec![
                Series { name: "b".into(), points: vec![(0, 0.25), (2, 0.5)] },
                Series { name: "a".into(), points: vec![(0, 1.0)] },
            ]
        );
    }

    #[tokio::test]
    async fn seconds_beside_training_count_once_however_many_samplers_ran_at_once() {
        // Two rollout shards at once (0-10 s, 5-15 s) and an evaluation inside them, beside
        // an update from 0 to 20 s: sampling ran beside training for 15 s, not 22.
        let ctx = datafusion::prelude::SessionContext::new();
        let view = "CREATE VIEW commits AS SELECT column1 AS stage, column2 AS iteration, \
                    column3 * 1000000 AS started_at, column4 * 1000000 AS finished_at FROM (VALUES \
                    ('rollout', 1, 0, 10), ('rollout', 1, 5, 15), ('evaluate', 1, 12, 14), \
                    ('update', 0, 0, 20), ('update', 1, 30, 40))";
        ctx.sql(view).await.unwrap().collect().await.unwrap();
        let batches = ctx.sql(&format!("{SPANS} {OVERLAP}")).await.unwrap().collect().await.unwrap();
        let number = |column: usize| {
            let array = batches[0].column(column).as_any().downcast_ref::<Float64Array>().unwrap();
            array.value(0)
        };
        assert_eq!((number(0), number(1)), (15.0, 40.0));
    }

    #[test]
    fn task_ids_become_safe_distinct_file_names() {
        assert_eq!(tree_file(3, "plan-path-0007"), "iteration-3-plan-path-0007.html");
        assert_eq!(tree_file(0, "plan_path/a b"), "iteration-0-plan_path~2f~a~20~b.html");
        assert_ne!(tree_file(0, "a~2f~b"), tree_file(0, "a/b"));
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
