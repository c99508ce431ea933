use std::path::Path;

use anyhow::anyhow;
use petting::config;
use petting::stages::prepare_data;
use petting::store::layout::RUN_CONFIG;
use petting::store::RunStore;

/// `petting stage prepare-data --run URL`.
pub async fn prepare_data(run: &str) -> anyhow::Result<()> {
    let store = RunStore::open(run)?;
    let text = store
        .run_config()
        .await?
        .ok_or_else(|| anyhow!("{} has no run.yaml; create the run with `petting pipeline run FILE`", store.url()))?;
    let config = config::parse(&text, &Path::new(store.url()).join(RUN_CONFIG))?;
    let prepared = prepare_data::run(&store, &config).await?;
    println!(
        "prepare-data: {} train and {} test {} tasks, {} demonstrations; committed {} files",
        prepared.train,
        prepared.test,
        config.env.name(),
        prepared.demonstrations,
        prepared.marker.files.len()
    );
    Ok(())
}
