use anyhow::bail;
use petting::config;
use petting::store::RunStore;

use super::args::PipelineRunArgs;

pub async fn run(args: PipelineRunArgs) -> anyhow::Result<()> {
    let loaded = config::load(&args.config)?;
    let store = RunStore::open(&loaded.store_url())?;
    let stored = store.init_config(&loaded.text).await?;
    if stored != loaded.text {
        let previous = config::parse(&stored, std::path::Path::new("run.yaml"))?;
        if previous.sha256() != loaded.config.sha256() && !args.allow_config_change {
            bail!(
                "{} was started with a different config (sha256 {} there, {} in {}); \
                 resume with the new one by adding --allow-config-change",
                store.url(),
                &previous.sha256()[..12],
                &loaded.config.sha256()[..12],
                args.config.display()
            );
        }
    }
    println!("run {} ({}), config sha256 {}", store.url(), loaded.config.run_name(), &loaded.config.sha256()[..12]);
    super::status::run(store.url()).await?;
    println!("no pipeline stage is built into this version of petting yet; the run holds its frozen config");
    Ok(())
}
