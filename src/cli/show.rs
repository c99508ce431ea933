use std::io::IsTerminal;

use petting::inspect::{self, tree};
use petting::store::RunStore;

use super::args::ShowArgs;

pub async fn run(args: ShowArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    store.ensure_exists().await?;
    let found = inspect::task_tree(&store, args.iteration, &args.task).await?;
    let options = tree::RenderOptions { full: args.full, color: std::io::stdout().is_terminal() };
    println!("task {} · iteration {} · {}", args.task, args.iteration, store.url());
    print!("{}", tree::render(&found.turns, &found.advantages, options));
    Ok(())
}
