//! Table schemas, built from the JSON files in `schemas/`.
//!
//! Those files are the single source of truth for every table a run holds: each
//! column's name, Arrow type, nullability and a one-line meaning. They are compiled
//! into the binary, and `tables.rs` checks at test time that the Rust row types agree
//! with them, so a column cannot change in one place only.
//!
//! A column marked `"partition": true` is not stored inside the Parquet files: it is
//! the hive partition of the file's path (`turns/iteration=7/part-….parquet`), which
//! DataFusion, DuckDB, Polars and pyarrow all turn back into a column.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::Deserialize;

/// Every table a run has, stored as Parquet or derived from commit markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Tasks,
    /// Warm-start demonstrations (embedded-default runs only).
    Demonstrations,
    Turns,
    Groups,
    Samples,
    Updates,
    /// Engine-vs-trainer logprob gap per trained sample.
    LogprobGaps,
    Evals,
    /// Derived from the commit markers, never written as Parquet.
    Commits,
    /// Derived from the commit markers, never written as Parquet.
    Checkpoints,
}

impl Table {
    /// All tables, in pipeline order.
    pub const ALL: [Table; 10] = [
        Table::Tasks,
        Table::Turns,
        Table::Groups,
        Table::Samples,
        Table::Updates,
        Table::LogprobGaps,
        Table::Evals,
        Table::Demonstrations,
        Table::Commits,
        Table::Checkpoints,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Tasks => "tasks",
            Table::Demonstrations => "demonstrations",
            Table::Turns => "turns",
            Table::Groups => "groups",
            Table::Samples => "samples",
            Table::Updates => "updates",
            Table::LogprobGaps => "logprob_gaps",
            Table::Evals => "evals",
            Table::Commits => "commits",
            Table::Checkpoints => "checkpoints",
        }
    }

    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether stages write this table as Parquet parts.
    pub fn is_stored(self) -> bool {
        !matches!(self, Table::Commits | Table::Checkpoints)
    }

    fn json(self) -> &'static str {
        match self {
            Table::Tasks => include_str!("../schemas/tasks.json"),
            Table::Demonstrations => include_str!("../schemas/demonstrations.json"),
            Table::Turns => include_str!("../schemas/turns.json"),
            Table::Groups => include_str!("../schemas/groups.json"),
            Table::Samples => include_str!("../schemas/samples.json"),
            Table::Updates => include_str!("../schemas/updates.json"),
            Table::LogprobGaps => include_str!("../schemas/logprob_gaps.json"),
            Table::Evals => include_str!("../schemas/evals.json"),
            Table::Commits => include_str!("../schemas/commits.json"),
            Table::Checkpoints => include_str!("../schemas/checkpoints.json"),
        }
    }

    /// The table's definition as written in `schemas/<name>.json`.
    pub fn definition(self) -> TableDef {
        // The files are compiled in and checked by the tests below, so a failure here is a
        // bug in this build, not bad input.
        TableDef::from_json(self.json()).unwrap_or_else(|e| panic!("schemas/{}.json is invalid: {e}", self.name()))
    }

    /// Schema of the Parquet files: every column but the partition columns.
    pub fn file_schema(self) -> SchemaRef {
        self.definition().file_schema()
    }

    /// Schema seen by SQL: the file columns followed by the partition columns.
    pub fn table_schema(self) -> SchemaRef {
        self.definition().table_schema()
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A table as described by its JSON file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableDef {
    pub name: String,
    pub doc: String,
    pub columns: Vec<ColumnDef>,
}

/// One column of a table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnDef {
    pub name: String,
    #[serde(rename = "type", deserialize_with = "deserialize_type")]
    pub data_type: DataType,
    pub nullable: bool,
    /// Stored in the file's path (hive style), not in the file.
    #[serde(default)]
    pub partition: bool,
    pub doc: String,
}

impl ColumnDef {
    pub fn field(&self) -> Field {
        Field::new(&self.name, self.data_type.clone(), self.nullable)
    }
}

impl TableDef {
    pub fn from_json(json: &str) -> Result<TableDef, String> {
        let def: TableDef = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = def.columns.iter().find(|c| !seen.insert(c.name.as_str())) {
            return Err(format!("column {} appears twice", dup.name));
        }
        Ok(def)
    }

    pub fn partition_columns(&self) -> impl Iterator<Item = &ColumnDef> {
        self.columns.iter().filter(|c| c.partition)
    }

    pub fn file_schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self.columns.iter().filter(|c| !c.partition).map(ColumnDef::field).collect();
        Arc::new(Schema::new(fields))
    }

    pub fn table_schema(&self) -> SchemaRef {
        let file = self.columns.iter().filter(|c| !c.partition);
        let fields: Vec<Field> = file.chain(self.partition_columns()).map(ColumnDef::field).collect();
        Arc::new(Schema::new(fields))
    }
}

fn deserialize_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DataType, D::Error> {
    let text = String::deserialize(d)?;
    parse_type(&text).ok_or_else(|| serde::de::Error::custom(format!("unknown Arrow type {text:?}")))
}

/// Parses the small type grammar of `schemas/*.json`: a primitive name, `List<T>`, or
/// `Timestamp(Microsecond, UTC)`. List items are never null.
pub fn parse_type(text: &str) -> Option<DataType> {
    let text = text.trim();
    if let Some(inner) = text.strip_prefix("List<").and_then(|t| t.strip_suffix('>')) {
        return Some(DataType::List(Arc::new(Field::new_list_field(parse_type(inner)?, false))));
    }
    Some(match text {
        "Boolean" => DataType::Boolean,
        "Int32" => DataType::Int32,
        "Int64" => DataType::Int64,
        "UInt32" => DataType::UInt32,
        "UInt64" => DataType::UInt64,
        "Float32" => DataType::Float32,
        "Float64" => DataType::Float64,
        "Utf8" => DataType::Utf8,
        "Timestamp(Microsecond, UTC)" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_parses_and_is_named_after_its_table() {
        for table in Table::ALL {
            let def = table.definition();
            assert_eq!(def.name, table.name());
            assert!(!def.columns.is_empty(), "{table} has no columns");
            for column in &def.columns {
                assert!(!column.doc.trim().is_empty(), "{table}.{} has no doc line", column.name);
            }
        }
    }

    #[test]
    fn partition_columns_leave_the_file_schema_and_end_the_table_schema() {
        let file = Table::Turns.file_schema();
        let table = Table::Turns.table_schema();
        assert!(file.field_with_name("iteration").is_err());
        assert_eq!(table.fields().last().unwrap().name(), "iteration");
        assert_eq!(table.fields().len(), file.fields().len() + 1);
        assert_eq!(Table::Tasks.table_schema().fields().last().unwrap().name(), "split");
    }

    #[test]
    fn the_type_grammar_covers_lists_and_timestamps_and_rejects_the_rest() {
        assert_eq!(
            parse_type("List<Float32>"),
            Some(DataType::List(Arc::new(Field::new_list_field(DataType::Float32, false))))
        );
        assert_eq!(
            parse_type("Timestamp(Microsecond, UTC)"),
            Some(DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())))
        );
        assert_eq!(parse_type("Utf9"), None);
        assert_eq!(parse_type("List<Nope>"), None);
    }

    #[test]
    fn a_duplicate_column_is_rejected() {
        let json = r#"{"name":"t","doc":"d","columns":[
            {"name":"a","type":"Utf8","nullable":false,"doc":"x"},
            {"name":"a","type":"Utf8","nullable":false,"doc":"y"}]}"#;
        assert_eq!(TableDef::from_json(json).unwrap_err(), "column a appears twice");
    }
}
