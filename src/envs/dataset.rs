//! Math and code tasks from a user's JSONL or Parquet file, with a column mapping.
//!
//! Each [`DatasetField`] is read from the column the config maps it to, or from the
//! column of its own name (`problem`, `answer`, `tests`, `public_tests`, `solution`, `entry_point`,
//! `id`). Math needs `problem` and `answer`; code needs `problem` and `tests`.
//! Tests may be written as
//! * a list of `{"input": …, "output": …}` objects,
//! * an object of parallel lists, `{"inputs": […], "outputs": […]}` (APPS
//!   `input_output`) or `{"input": […], "output": […]}` (CodeContests), or
//! * a JSON string holding either of those.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::code::{self, TestCase};
use super::{EnvConfig, Error, math};
use crate::validate::{Invalid, check};

/// Where tasks come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Training tasks (generated, or the first N of the train file).
    pub train_tasks: u32,
    /// Test tasks, disjoint from the training tasks.
    pub test_tasks: u32,
    /// Dataset file for the training split (math, code); generated when absent.
    pub train_file: Option<DatasetFile>,
    /// Dataset file for the test split (math, code); generated when absent.
    pub test_file: Option<DatasetFile>,
}

impl DataConfig {
    /// Task counts, and the files of the environments that read their tasks from files.
    pub fn validate(&self, env: &EnvConfig) -> Result<(), Invalid> {
        check(self.train_tasks >= 1, "data.train_tasks", "must be at least 1")?;
        check(self.test_tasks >= 1, "data.test_tasks", "must be at least 1")?;
        check(
            !env.source().reads_files() || (self.train_file.is_some() && self.test_file.is_some()),
            "data",
            format!("{} reads its tasks from files: set data.train_file and data.test_file", env.name()),
        )?;
        check(
            !env.source().host_makes_tasks() || (self.train_file.is_none() && self.test_file.is_none()),
            "data",
            "a hosted environment's tasks come from its host (the class's tasks()); data files are not read for it",
        )
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig { train_tasks: 640, test_tasks: 200, train_file: None, test_file: None }
    }
}

/// A user's JSONL or Parquet file and which of its columns hold what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetFile {
    /// Path of the file, relative to this config file.
    pub path: PathBuf,
    /// jsonl or parquet; taken from the extension when absent.
    #[serde(default)]
    pub format: Option<DatasetFormat>,
    /// Column of the file for each field the environment reads (e.g. problem: question).
    #[serde(default)]
    #[schemars(schema_with = "columns_schema")]
    pub columns: BTreeMap<DatasetField, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetFormat {
    Jsonl,
    Parquet,
}

/// A field an environment reads from a dataset row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetField {
    Id,
    Problem,
    Answer,
    Tests,
    PublicTests,
    Solution,
    EntryPoint,
}

pub type Row = Map<String, Value>;

/// One task read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<I> {
    /// The row's id column, or its row number.
    pub id: String,
    pub instance: I,
    /// A reference solution, when the file has one.
    pub solution: Option<String>,
}

impl DatasetField {
    const ALL: [DatasetField; 7] = [
        DatasetField::Id,
        DatasetField::Problem,
        DatasetField::Answer,
        DatasetField::Tests,
        DatasetField::PublicTests,
        DatasetField::Solution,
        DatasetField::EntryPoint,
    ];

    /// What the field is, for the configuration reference.
    fn meaning(self) -> &'static str {
        match self {
            DatasetField::Id => "the task's id (the row number when the file has none)",
            DatasetField::Problem => "the problem text",
            DatasetField::Answer => "the expected answer (math)",
            DatasetField::Tests => "the hidden tests a program is scored on (code)",
            DatasetField::PublicTests => "tests shown in the prompt (code)",
            DatasetField::Solution => "a reference solution",
            DatasetField::EntryPoint => "the function the tests call (code)",
        }
    }
}

/// `columns` as the reference documents it: a key per field (the map's keys are fields).
fn columns_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let properties: Map<String, Value> = DatasetField::ALL
        .iter()
        .map(|&f| {
            let name = field_name(f);
            let meaning = format!("The column holding {} (default: `{name}`).", f.meaning());
            (name.to_string(), serde_json::json!({"type": "string", "description": meaning}))
        })
        .collect();
    schemars::json_schema!({"type": "object", "additionalProperties": false, "properties": properties})
}

fn field_name(field: DatasetField) -> &'static str {
    match field {
        DatasetField::Id => "id",
        DatasetField::Problem => "problem",
        DatasetField::Answer => "answer",
        DatasetField::Tests => "tests",
        DatasetField::PublicTests => "public_tests",
        DatasetField::Solution => "solution",
        DatasetField::EntryPoint => "entry_point",
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Every row of the file as a JSON object. A row over `row_limit` bytes
/// (`limits.task_bytes`) is refused before it is read whole or parsed.
pub fn read_rows(file: &DatasetFile, row_limit: u64) -> Result<Vec<Row>, Error> {
    let name = display(&file.path);
    let format = file.format.or_else(|| match file.path.extension().and_then(|e| e.to_str()) {
        Some("jsonl") | Some("json") => Some(DatasetFormat::Jsonl),
        Some("parquet") => Some(DatasetFormat::Parquet),
        _ => None,
    });
    let bad = |reason: String| Error::Dataset { file: name.clone(), reason };
    let too_long = |row: usize| Error::DatasetRow {
        file: name.clone(),
        row,
        reason: format!("the row is over limits.task_bytes ({row_limit} bytes) of the run file"),
    };
    match format {
        None => Err(bad("unknown format; name it .jsonl or .parquet, or set `format`".into())),
        Some(DatasetFormat::Jsonl) => {
            let handle = std::fs::File::open(&file.path).map_err(|e| bad(e.to_string()))?;
            let mut reader = std::io::BufReader::new(handle);
            let mut rows = Vec::new();
            let mut line = Vec::new();
            for i in 1.. {
                line.clear();
                let read = std::io::BufRead::read_until(
                    &mut std::io::Read::take(&mut reader, row_limit + 1),
                    b'\n',
                    &mut line,
                );
                if read.map_err(|e| bad(e.to_string()))? == 0 {
                    break;
                }
                let text = line.strip_suffix(b"\n").unwrap_or(&line);
                if text.len() as u64 > row_limit {
                    return Err(too_long(i));
                }
                let text = std::str::from_utf8(text).map_err(|e| Error::DatasetRow {
                    file: name.clone(),
                    row: i,
                    reason: e.to_string(),
                })?;
                if text.trim().is_empty() {
                    continue;
                }
                let value: Value = serde_json::from_str(text).map_err(|e| Error::DatasetRow {
                    file: name.clone(),
                    row: i,
                    reason: e.to_string(),
                })?;
                match value {
                    Value::Object(row) => rows.push(row),
                    _ => {
                        return Err(Error::DatasetRow {
                            file: name.clone(),
                            row: i,
                            reason: "not a JSON object".into(),
                        });
                    }
                }
            }
            Ok(rows)
        }
        Some(DatasetFormat::Parquet) => {
            let handle = std::fs::File::open(&file.path).map_err(|e| bad(e.to_string()))?;
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(handle)
                .and_then(|b| b.build())
                .map_err(|e| bad(e.to_string()))?;
            let mut rows = Vec::new();
            for batch in reader {
                let batch = batch.map_err(|e| bad(e.to_string()))?;
                let mut writer = arrow::json::ArrayWriter::new(Vec::new());
                writer.write(&batch).map_err(|e| bad(e.to_string()))?;
                writer.finish().map_err(|e| bad(e.to_string()))?;
                let json = writer.into_inner();
                let part: Vec<Row> = if json.is_empty() {
                    Vec::new()
                } else {
                    serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?
                };
                for row in part {
                    if Value::Object(row.clone()).to_string().len() as u64 > row_limit {
                        return Err(too_long(rows.len() + 1));
                    }
                    rows.push(row);
                }
            }
            Ok(rows)
        }
    }
}

fn column(file: &DatasetFile, field: DatasetField) -> &str {
    file.columns.get(&field).map_or(field_name(field), String::as_str)
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn get<'a>(row: &'a Row, file: &DatasetFile, field: DatasetField) -> Option<&'a Value> {
    row.get(column(file, field)).filter(|v| !v.is_null())
}

fn required(row: &Row, file: &DatasetFile, field: DatasetField, index: usize) -> Result<String, Error> {
    get(row, file, field).map(text).ok_or_else(|| Error::DatasetRow {
        file: display(&file.path),
        row: index + 1,
        reason: format!(
            "no column `{}` for {}; map it with data.*_file.columns.{}",
            column(file, field),
            field_name(field),
            field_name(field)
        ),
    })
}

fn id_of(row: &Row, file: &DatasetFile, index: usize) -> String {
    get(row, file, DatasetField::Id).map(text).unwrap_or_else(|| format!("row{index}"))
}

/// Math tasks of a file.
pub fn math_records(file: &DatasetFile, row_limit: u64) -> Result<Vec<Record<math::Instance>>, Error> {
    read_rows(file, row_limit)?
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let problem = required(row, file, DatasetField::Problem, i)?;
            let answer = required(row, file, DatasetField::Answer, i)?;
            let solution = get(row, file, DatasetField::Solution).map(text);
            Ok(Record { id: id_of(row, file, i), instance: math::Instance { problem, answer, entry: None }, solution })
        })
        .collect()
}

/// An agent program's tasks: every row as it is, handed to the program whole.
pub fn program_records(file: &DatasetFile, row_limit: u64) -> Result<Vec<Record<Row>>, Error> {
    Ok(read_rows(file, row_limit)?
        .into_iter()
        .enumerate()
        .map(|(i, row)| Record { id: id_of(&row, file, i), instance: row, solution: None })
        .collect())
}

/// Tests in any of the documented shapes.
pub fn parse_tests(value: &Value) -> Result<Vec<TestCase>, String> {
    let as_text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(lines) if lines.iter().all(Value::is_string) => {
            lines.iter().map(text).collect::<Vec<_>>().join("\n")
        }
        other => other.to_string(),
    };
    match value {
        Value::String(s) => {
            let inner: Value = serde_json::from_str(s).map_err(|e| format!("tests are a string but not JSON: {e}"))?;
            parse_tests(&inner)
        }
        Value::Array(items) => items
            .iter()
            .map(|item| {
                let input = item.get("input").ok_or("a test has no `input`")?;
                let output = item.get("output").ok_or("a test has no `output`")?;
                Ok(TestCase { input: as_text(input), output: as_text(output) })
            })
            .collect(),
        Value::Object(map) => {
            let inputs = map.get("inputs").or_else(|| map.get("input")).and_then(Value::as_array);
            let outputs = map.get("outputs").or_else(|| map.get("output")).and_then(Value::as_array);
            match (inputs, outputs) {
                (Some(i), Some(o)) if i.len() == o.len() => {
                    Ok(i.iter().zip(o).map(|(i, o)| TestCase { input: as_text(i), output: as_text(o) }).collect())
                }
                _ => Err("expected parallel lists `inputs`/`outputs` (or `input`/`output`) of equal length".into()),
            }
        }
        _ => Err("tests must be a list of {input, output} or an object of parallel lists".into()),
    }
}

/// Code tasks of a file.
pub fn code_records(file: &DatasetFile, row_limit: u64) -> Result<Vec<Record<code::Instance>>, Error> {
    let name = display(&file.path);
    read_rows(file, row_limit)?
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let bad = |reason: String| Error::DatasetRow { file: name.clone(), row: i + 1, reason };
            let problem = required(row, file, DatasetField::Problem, i)?;
            required(row, file, DatasetField::Tests, i)?;
            let tests = parse_tests(get(row, file, DatasetField::Tests).expect("checked")).map_err(bad)?;
            if tests.is_empty() {
                return Err(bad("the task has no tests".into()));
            }
            let public_tests = match get(row, file, DatasetField::PublicTests) {
                Some(value) => parse_tests(value).map_err(bad)?,
                None => Vec::new(),
            };
            let solution = get(row, file, DatasetField::Solution).map(text);
            let entry_point = get(row, file, DatasetField::EntryPoint).map(text);
            let instance = code::Instance { problem, public_tests, tests, solution: solution.clone(), entry_point };
            Ok(Record { id: id_of(row, file, i), instance, solution })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn file(path: &Path, columns: &[(DatasetField, &str)]) -> DatasetFile {
        DatasetFile {
            path: path.to_path_buf(),
            format: None,
            columns: columns.iter().map(|(f, c)| (*f, c.to_string())).collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn a_row_over_the_limit_is_refused_before_it_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.jsonl");
        let long = format!("{{\"problem\": \"{}\", \"answer\": 1}}", "x".repeat(5000));
        std::fs::write(&path, format!("{{\"problem\": \"p\", \"answer\": 1}}\n{long}\n")).unwrap();
        let message = math_records(&file(&path, &[]), 4096).unwrap_err().to_string();
        assert!(message.contains("row 2") && message.contains("over limits.task_bytes (4096 bytes)"), "{message}");
        assert_eq!(math_records(&file(&path, &[]), 8192).unwrap().len(), 2);
    }

    #[test]
    fn math_rows_are_read_through_the_column_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aime.jsonl");
        std::fs::write(&path, "{\"ID\": \"2024-I-1\", \"Problem\": \"p1\", \"Answer\": 204}\n\n{\"ID\": \"2024-I-2\", \"Problem\": \"p2\", \"Answer\": \"25\"}\n").unwrap();
        let mapping = [(DatasetField::Id, "ID"), (DatasetField::Problem, "Problem"), (DatasetField::Answer, "Answer")];
        let records = math_records(&file(&path, &mapping), 1 << 20).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].id, "2024-I-1");
        assert_eq!(records[0].instance, math::Instance { problem: "p1".into(), answer: "204".into(), entry: None });
        let message = math_records(&file(&path, &[]), 1 << 20).unwrap_err().to_string();
        assert!(
            message.ends_with("row 1: no column `problem` for problem; map it with data.*_file.columns.problem"),
            "{message}"
        );
    }

    #[test]
    fn tests_come_in_three_shapes() {
        let want = vec![TestCase { input: "1\n".into(), output: "2\n".into() }];
        let list = serde_json::json!([{"input": "1\n", "output": "2\n"}]);
        let apps = serde_json::json!("{\"inputs\": [\"1\\n\"], \"outputs\": [\"2\\n\"]}");
        let contests = serde_json::json!({"input": ["1\n"], "output": ["2\n"]});
        for value in [list, apps, contests] {
            assert_eq!(parse_tests(&value).unwrap(), want);
        }
        assert!(parse_tests(&serde_json::json!({"inputs": ["1"], "outputs": []})).is_err());
    }

    #[test]
    fn parquet_files_are_read_too() {
        use arrow::array::{ArrayRef, StringArray};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("apps.parquet");
        let question: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["add"]));
        let io: ArrayRef =
            std::sync::Arc::new(StringArray::from(vec!["{\"inputs\": [\"1 2\\n\"], \"outputs\": [\"3\\n\"]}"]));
        let batch =
            arrow::record_batch::RecordBatch::try_from_iter([("question", question), ("input_output", io)]).unwrap();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let mapping = [(DatasetField::Problem, "question"), (DatasetField::Tests, "input_output")];
        let records = code_records(&file(&path, &mapping), 1 << 20).unwrap();
        assert_eq!(records[0].instance.problem, "add");
        assert_eq!(records[0].instance.tests, [TestCase { input: "1 2\n".into(), output: "3\n".into() }]);
        assert_eq!(records[0].id, "row0");
    }
}
