use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use petting::schema::Table;
use petting::sql::RunSql;
use petting::store::RunStore;
use rustyline::error::ReadlineError;

use super::args::{OutputFormat, SqlArgs};

pub async fn run(args: SqlArgs) -> anyhow::Result<()> {
    if args.format == OutputFormat::Parquet && args.output.is_none() {
        bail!("--format parquet needs --output FILE");
    }
    let store = RunStore::open(&args.run)?;
    if args.verify {
        store.verify().await?;
    }
    let sql = RunSql::open(&store).await?;
    match &args.query {
        Some(query) => {
            let (schema, batches) = sql.query(query).await?;
            write_result(&schema, &batches, args.format, args.output.as_deref())
        }
        None => prompt(&sql, store.url()).await,
    }
}

fn write_result(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: OutputFormat,
    output: Option<&Path>,
) -> anyhow::Result<()> {
    if format == OutputFormat::Parquet {
        let path = output.expect("checked before the query ran");
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None)?;
        for batch in batches {
            writer.write(batch)?;
        }
        writer.close()?;
        return Ok(());
    }
    let mut sink: Box<dyn Write> = match output {
        Some(path) => Box::new(io::BufWriter::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(io::stdout().lock()),
    };
    match format {
        OutputFormat::Table => {
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            writeln!(sink, "{}", arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)?)?;
            writeln!(sink, "({rows} row{})", if rows == 1 { "" } else { "s" })?;
        }
        OutputFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(sink);
            for batch in batches {
                writer.write(batch)?;
            }
            return Ok(());
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::ArrayWriter::new(&mut sink);
            writer.write_batches(&batches.iter().collect::<Vec<_>>())?;
            writer.finish()?;
            writeln!(sink)?;
        }
        OutputFormat::Parquet => unreachable!("written above"),
    }
    sink.flush()?;
    Ok(())
}

/// A psql-like prompt: statements end with `;` and may span lines; `\d` lists tables,
/// `\d NAME` describes one, `\q` quits. History persists across sessions.
async fn prompt(sql: &RunSql, url: &str) -> anyhow::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = history_file();
    if let Some(file) = &history {
        let _ = editor.load_history(file);
    }
    eprintln!("petting sql over {url}. End statements with ';'. \\d lists tables, \\q quits.");
    let mut statement = String::new();
    loop {
        let prompt = if statement.is_empty() { "petting> " } else { "     ..> " };
        match editor.readline(prompt) {
            Ok(line) => {
                let command = line.trim();
                if statement.is_empty() && command.starts_with('\\') {
                    if command == "\\q" {
                        break;
                    }
                    editor.add_history_entry(command)?;
                    meta_command(command);
                    continue;
                }
                if statement.is_empty() && command.is_empty() {
                    continue;
                }
                statement.push_str(&line);
                statement.push('\n');
                if command.ends_with(';') {
                    editor.add_history_entry(statement.trim())?;
                    match sql.query(statement.trim()).await {
                        Ok((schema, batches)) => write_result(&schema, &batches, OutputFormat::Table, None)?,
                        Err(error) => eprintln!("error: {error}"),
                    }
                    statement.clear();
                }
            }
            // Ctrl-C drops the statement being typed, as in psql.
            Err(ReadlineError::Interrupted) => statement.clear(),
            Err(ReadlineError::Eof) => break,
            Err(error) => return Err(error.into()),
        }
    }
    if let Some(file) = &history {
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(file);
    }
    Ok(())
}

fn meta_command(command: &str) {
    match command.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["\\d"] => {
            for table in Table::ALL {
                println!("{:<12} {}", table.name(), table.definition().doc);
            }
        }
        ["\\d", name] => match Table::from_name(name) {
            Some(table) => {
                for column in table.definition().columns {
                    println!("{:<22} {:<28} {}", column.name, column.data_type.to_string(), column.doc);
                }
            }
            None => eprintln!("error: no table {name:?}; \\d lists them"),
        },
        _ => eprintln!("error: unknown command {command:?}; \\d lists tables, \\d NAME describes one, \\q quits"),
    }
}

fn history_file() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))?;
    Some(state.join("petting").join("sql_history"))
}
