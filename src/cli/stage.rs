use anyhow::Context;
use petting::pipeline::{INITIAL_UPDATE, run_stage};
use petting::stages::{self, prepare_data};
use petting::store::{RunStore, Stage, StageId};

use super::args::{StageArgs, StageName};

pub async fn run(args: StageArgs) -> anyhow::Result<()> {
    let store = RunStore::open(&args.run)?;
    let config = stages::run_config(&store).await?;
    let iteration = || args.iteration.context("this stage runs per iteration: give --iteration K");
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
        StageName::Rollout => {
            run_stage(
                &store,
                &config,
                StageId { shard: args.shard, ..StageId::at(Stage::Rollout, iteration()?) },
                progress,
            )
            .await?
        }
        StageName::Group => run_stage(&store, &config, StageId::at(Stage::Group, iteration()?), progress).await?,
        StageName::Advantage => {
            run_stage(&store, &config, StageId::at(Stage::Advantage, iteration()?), progress).await?
        }
        StageName::Update => run_stage(&store, &config, StageId::at(Stage::Update, iteration()?), progress).await?,
        StageName::Evaluate => {
            run_stage(
                &store,
                &config,
                StageId { shard: args.shard, ..StageId::at(Stage::Evaluate, iteration()?) },
                progress,
            )
            .await?
        }
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
