use anyhow::bail;
use petting::schema::Table;

pub fn run(name: Option<&str>) -> anyhow::Result<()> {
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
