use std::path::Path;

use anyhow::bail;
use petting::config;
use petting::store::layout::RUN_CONFIG;
use petting::store::{RunStore, Stage, StageId};

use super::args::PipelineRunArgs;

pub async fn run(args: PipelineRunArgs) -> anyhow::Result<()> {
    let loaded = config::load(&args.config)?;
    let config = loaded.resolved();
    let store = RunStore::open(&config.store)?;
    let stored = store.init_config(&loaded.frozen_yaml()).await?;
    let previous = config::parse(&stored, &Path::new(store.url()).join(RUN_CONFIG))?;
    if previous.sha256() != config.sha256() && !args.allow_config_change {
        bail!(
            "{} was started with a different config (sha256 {} there, {} in {}); \
             resume with the new one by adding --allow-config-change",
            store.url(),
            &previous.sha256()[..12],
            &config.sha256()[..12],
            args.config.display()
        );
    }
    println!("run {} ({}), config sha256 {}", store.url(), config.run_name(), &config.sha256()[..12]);
    if store.marker(&StageId::run_level(Stage::PrepareData)).await?.is_none() {
        let prepared = petting::stages::prepare_data::run(&store, &config).await?;
        println!(
            "prepare-data: {} train and {} test tasks, {} demonstrations",
            prepared.train, prepared.test, prepared.demonstrations
        );
    }
    super::status::run(store.url()).await?;
    println!("the stages after prepare-data are not built into this version of petting yet");
    Ok(())
}
