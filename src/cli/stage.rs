use anyhow::Context;
use petting::stages::{self, advantage, group};
use petting::store::RunStore;

use super::args::{StageArgs, StageName};

pub async fn run(args: StageArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    let config = stages::run_config(&store).await?;
    let iteration = || args.iteration.context("this stage runs per iteration: give --iteration K");
    let marker = match args.stage {
        StageName::Group => group::run(&store, &config, iteration()?).await?,
        StageName::Advantage => advantage::run(&store, &config, iteration()?).await?,
    };
    println!(
        "committed {}: {} rows in {} files, {:.2} s",
        marker.stage_id(),
        marker.rows(),
        marker.files.len(),
        marker.seconds()
    );
    Ok(())
}
