use anyhow::bail;
use petting::schema::Table;
use serde_json::json;

use super::args::Format;

pub fn run(name: Option<&str>, format: Format) -> anyhow::Result<()> {
    let tables: Vec<Table> = match name {
        None => Table::ALL.to_vec(),
        Some(name) => match Table::from_name(name) {
            Some(table) => vec![table],
            None => {
                let names: Vec<&str> = Table::ALL.iter().map(|t| t.name()).collect();
                bail!("no table {name:?}; the tables are {}", names.join(", "))
            }
        },
    };
    if format == Format::Json {
        let tables: Vec<_> = tables
            .iter()
            .map(|table| {
                let def = table.definition();
                let columns: Vec<_> = def
                    .columns
                    .iter()
                    .map(|c| {
                        json!({"name": c.name, "type": c.data_type.to_string(), "nullable": c.nullable,
                               "partition": c.partition, "doc": c.doc})
                    })
                    .collect();
                json!({"table": def.name, "doc": def.doc, "columns": columns})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&tables)?);
        return Ok(());
    }
    for table in tables {
        let def = table.definition();
        println!("{}: {}", def.name, def.doc);
        for column in &def.columns {
            let null = if column.nullable { " (nullable)" } else { "" };
            let partition = if column.partition { " [partition]" } else { "" };
            println!("  {:<22} {:<28} {}{null}{partition}", column.name, column.data_type.to_string(), column.doc);
        }
        println!();
    }
    Ok(())
}
