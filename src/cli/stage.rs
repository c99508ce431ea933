use anyhow::Context;
use petting::pipeline::{INITIAL_UPDATE, run_stage};
use petting::stages::{Session, prepare_data, update};
use petting::store::{RunStore, StageId};

use super::args::{StageArgs, StageName};
use super::ranks::{Role, join, role};

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
    let role = role_for(&args)?;
    let mut session = Session::default();
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
        StageName::Init => run_stage(&store, &config, INITIAL_UPDATE, progress, &session).await?,
        // Rank 0 has said what it committed.
        StageName::Update if matches!(role, Role::Launched) => return Ok(()),
        per_iteration => {
            let id = at(per_iteration.stage())?;
            if let Role::Rank(world) = &role {
                super::ranks::check_pools(
                    &config,
                    world.size,
                    std::path::Path::new(&format!("{}/run.yaml", store.url())),
                )?;
                let digest = update::rendezvous_digest(&store, &config, id.iteration.expect("per iteration")).await?;
                session.ranks = Some(join(world, &digest, &args.ranks)?);
            }
            run_stage(&store, &config, id, progress, &session).await?
        }
    };
    if session.ranks.as_ref().is_some_and(|r| !r.is_leader()) {
        return Ok(());
    }
    println!(
        "committed {}: {} rows in {} files, {:.2} s",
        marker.stage_id(),
        marker.rows(),
        marker.files.len(),
        marker.seconds()
    );
    Ok(())
}

/// Only an update runs as ranks (`pipeline run` gives the others' work to ranks itself).
fn role_for(args: &StageArgs) -> anyhow::Result<Role> {
    if args.stage == StageName::Update {
        return role(&args.ranks);
    }
    if args.ranks.ranks.is_some() {
        anyhow::bail!("--ranks: only `petting stage update` runs as ranks (`pipeline run --ranks` shards the rest)");
    }
    if let Some(world) = petting::ranks::World::from_env()? {
        anyhow::bail!(
            "`petting stage {}` runs in one process, but this is rank {} of {} (RANK, WORLD_SIZE): launch \
             `petting stage update` or `petting pipeline run` as ranks, or give a rollout its `--shard`",
            args.stage.stage(),
            world.rank,
            world.size
        );
    }
    Ok(Role::Alone)
}
