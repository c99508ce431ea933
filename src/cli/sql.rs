use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use arrow::array::{ArrayRef, AsArray, StringArray};
use arrow::datatypes::{DataType, Field, Float32Type, Float64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use petting::schema::Table;
use petting::sql::RunSql;
use petting::store::RunStore;
use rustyline::error::ReadlineError;

use super::args::{OutputFormat, SqlArgs};

/// Tables up to this size are checked against their sha256 before every query (about a
/// second); larger ones only with --verify.
const VERIFIED_BY_DEFAULT: u64 = 512 << 20;

/// Rows of the table format printed as one aligned block: a longer result streams as
/// blocks of this many rows, so that no result is held whole in memory.
const TABLE_BLOCK_ROWS: usize = 1000;

pub async fn run(args: SqlArgs) -> anyhow::Result<()> {
    if args.format == OutputFormat::Parquet && args.output.is_none() {
        bail!("--format parquet needs --output FILE");
    }
    let store = RunStore::open(&args.run)?;
    if args.verify {
        store.verify().await?;
    } else if store.verify_tables_within(VERIFIED_BY_DEFAULT).await?.is_none() {
        eprintln!(
            "note: the run's tables are over {} and were not checked against their sha256 (sizes are); \
             --verify checks every file first",
            super::human_bytes(VERIFIED_BY_DEFAULT)
        );
    }
    let sql = RunSql::open(&store).await?;
    match &args.query {
        Some(query) => {
            let (schema, stream) = sql.stream(query).await?;
            write_result(schema, stream, args.format, args.output.as_deref()).await
        }
        None => prompt(&sql, store.url()).await,
    }
}

/// Writes a result as it streams in.
async fn write_result(
    schema: SchemaRef,
    mut stream: SendableRecordBatchStream,
    format: OutputFormat,
    output: Option<&Path>,
) -> anyhow::Result<()> {
    if format == OutputFormat::Parquet {
        let path = output.expect("checked before the query ran");
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None)?;
        while let Some(batch) = stream.next().await {
            writer.write(&batch?)?;
        }
        writer.close()?;
        return Ok(());
    }
    let mut sink: Box<dyn Write> = match output {
        Some(path) => Box::new(io::BufWriter::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(io::BufWriter::new(io::stdout())),
    };
    match format {
        OutputFormat::Table => write_table(&schema, stream, &mut sink).await?,
        OutputFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(&mut sink);
            while let Some(batch) = stream.next().await {
                writer.write(&batch?)?;
            }
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::ArrayWriter::new(&mut sink);
            while let Some(batch) = stream.next().await {
                writer.write(&batch?)?;
            }
            writer.finish()?;
            writeln!(sink)?;
        }
        OutputFormat::Parquet => unreachable!("written above"),
    }
    sink.flush()?;
    Ok(())
}

/// An aligned table per block of [`TABLE_BLOCK_ROWS`] rows, then the row count.
async fn write_table(
    schema: &SchemaRef,
    mut stream: SendableRecordBatchStream,
    sink: &mut dyn Write,
) -> anyhow::Result<()> {
    let shown = shown_schema(schema);
    let print = |sink: &mut dyn Write, block: &[RecordBatch]| -> anyhow::Result<()> {
        let block: Vec<RecordBatch> = block.iter().map(|b| floats_shown(b, &shown)).collect::<Result<_, _>>()?;
        writeln!(sink, "{}", arrow::util::pretty::pretty_format_batches_with_schema(shown.clone(), &block)?)?;
        Ok(())
    };
    let (mut block, mut in_block, mut rows) = (Vec::new(), 0, 0);
    while let Some(batch) = stream.next().await.transpose()? {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let take = (TABLE_BLOCK_ROWS - in_block).min(batch.num_rows() - offset);
            block.push(batch.slice(offset, take));
            (offset, in_block, rows) = (offset + take, in_block + take, rows + take);
            if in_block == TABLE_BLOCK_ROWS {
                print(sink, &std::mem::take(&mut block))?;
                in_block = 0;
            }
        }
    }
    // The last rows, or the header alone of an empty result.
    if in_block > 0 || rows == 0 {
        print(sink, &block)?;
    }
    writeln!(sink, "({rows} row{})", if rows == 1 { "" } else { "s" })?;
    Ok(())
}

/// The table format's columns: floats as the text [`float_shown`] gives, the rest as is.
fn shown_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Float32 | DataType::Float64 => Field::new(f.name(), DataType::Utf8, f.is_nullable()),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

fn floats_shown(batch: &RecordBatch, shown: &SchemaRef) -> arrow::error::Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .map(|column| -> ArrayRef {
            match column.data_type() {
                DataType::Float64 => Arc::new(
                    column
                        .as_primitive::<Float64Type>()
                        .iter()
                        .map(|x| x.map(|x| float_shown(x, 10)))
                        .collect::<StringArray>(),
                ),
                DataType::Float32 => Arc::new(
                    column
                        .as_primitive::<Float32Type>()
                        .iter()
                        .map(|x| x.map(|x| float_shown(x.into(), 7)))
                        .collect::<StringArray>(),
                ),
                _ => column.clone(),
            }
        })
        .collect();
    RecordBatch::try_new(shown.clone(), columns)
}

/// A float to `digits` significant digits without trailing zeros, so that a sum's
/// rounding (`1057.8340150000001`) does not reach the table; CSV, JSON and Parquet keep
/// every bit.
fn float_shown(x: f64, digits: i32) -> String {
    if x == 0.0 || !x.is_finite() {
        return x.to_string();
    }
    let magnitude = x.abs().log10().floor() as i32;
    if !(-5..15).contains(&magnitude) {
        let text = format!("{:.*e}", (digits - 1) as usize, x);
        let (mantissa, exponent) = text.split_once('e').expect("an exponent");
        return format!("{}e{exponent}", trimmed(mantissa));
    }
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    trimmed(&format!("{x:.decimals$}")).to_string()
}

fn trimmed(number: &str) -> &str {
    if number.contains('.') { number.trim_end_matches('0').trim_end_matches('.') } else { number }
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
                    match sql.stream(statement.trim()).await {
                        Ok((schema, stream)) => {
                            if let Err(error) = write_result(schema, stream, OutputFormat::Table, None).await {
                                eprintln!("error: {error}");
                            }
                        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_show_ten_significant_digits_without_trailing_zeros() {
        assert_eq!(float_shown(1057.8340150000001, 10), "1057.834015");
        assert_eq!(float_shown(0.1 + 0.2, 10), "0.3");
        assert_eq!(float_shown(-2.5, 10), "-2.5");
        assert_eq!(float_shown(3.0, 10), "3");
        assert_eq!(float_shown(123456789012.75, 10), "123456789013");
        assert_eq!(float_shown(1.234e-7, 10), "1.234e-7");
        assert_eq!(float_shown(6.02e23, 10), "6.02e23");
        assert_eq!(float_shown(f64::from(0.1f32), 7), "0.1");
        assert_eq!(float_shown(f64::NAN, 10), "NaN");
    }
}
