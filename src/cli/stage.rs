use anyhow::Context;
use petting::stages::{self, advantage, group, prepare_data};
use petting::store::RunStore;

use super::args::{StageArgs, StageName};

pub async fn run(args: StageArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    let config = stages::run_config(&store).await?;
    let iteration = || args.iteration.context("this stage runs per iteration: give --iteration K");
    let marker = match args.stage {
        StageName::PrepareData => {
            let prepared = prepare_data::run(&store, &config).await?;
            println!(
                "prepare-data: {} train and {} test {} tasks, {} demonstrations",
                prepared.train,
                prepared.test,
                config.env.name(),
                prepared.demonstrations,
            );
            prepared.marker
        }
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
