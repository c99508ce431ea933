use anyhow::Context;
use petting::pipeline::{INITIAL_UPDATE, run_stage};
use petting::stages::{self, prepare_data};
use petting::store::{RunStore, Stage, StageId};

use super::args::{StageArgs, StageName};

pub async fn run(args: StageArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    let config = stages::run_config(&store).await?;
    let at = |stage| -> anyhow::Result<StageId> {
        let k = args.iteration.context("this stage runs per iteration: give --iteration K")?;
        Ok(StageId { shard: args.shard, ..StageId::at(stage, k) })
    };
    let progress = &*super::progress::for_stderr();
    if args.shard.is_some() && !matches!(args.stage, StageName::Rollout | StageName::Evaluate) {
        anyhow::bail!("--shard: only rollout and evaluate run in shards");
    }
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
        StageName::Init => run_stage(&store, &config, INITIAL_UPDATE, progress).await?,
        StageName::Rollout => run_stage(&store, &config, at(Stage::Rollout)?, progress).await?,
        StageName::Group => run_stage(&store, &config, at(Stage::Group)?, progress).await?,
        StageName::Advantage => run_stage(&store, &config, at(Stage::Advantage)?, progress).await?,
        StageName::Update => run_stage(&store, &config, at(Stage::Update)?, progress).await?,
        StageName::Evaluate => run_stage(&store, &config, at(Stage::Evaluate)?, progress).await?,
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
