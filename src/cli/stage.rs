use anyhow::Context;
use petting::pipeline::{INITIAL_UPDATE, run_stage};
use petting::stages::{Session, prepare_data};
use petting::store::{RunStore, StageId};

use super::args::{StageArgs, StageName};

pub async fn run(args: StageArgs) -> anyhow::Result<()> {
    let store = RunStore::open(args.run())?;
    let config = petting::config::of_run(&store).await?;
    let at = |stage| -> anyhow::Result<StageId> {
        let k = args.iteration.context("this stage runs per iteration: give --iteration K")?;
        Ok(StageId { shard: args.shard, ..StageId::at(stage, k) })
    };
    let progress = &*super::progress::for_stderr();
    if args.shard.is_some() && !args.stage.stage().runs_in_shards() {
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
        StageName::Init => run_stage(&store, &config, INITIAL_UPDATE, progress, &Session::default()).await?,
        per_iteration => run_stage(&store, &config, at(per_iteration.stage())?, progress, &Session::default()).await?,
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
