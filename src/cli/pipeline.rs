use petting::config;
use petting::pipeline::{self, Lane, driver};
use petting::store::{RunStore, Stage};

use super::args::{Format, PipelinePlanArgs, PipelineRunArgs};
use super::lanes::Lanes;
use super::ranks::{Role, join, role};

pub async fn run(args: PipelineRunArgs) -> anyhow::Result<()> {
    let world = match role(&args.ranks)? {
        Role::Launched => return Ok(()),
        Role::Rank(world) if args.worker.is_some() => {
            anyhow::bail!(
                "--worker: rank {} of {} is a worker already (rank r of N plays shard r/N)",
                world.rank,
                world.size
            )
        }
        Role::Rank(world) => Some(world),
        Role::Alone => None,
    };
    let draft = config::read(&args.config, &args.overrides)?;
    // Rank 0 speaks for all.
    let speaks = world.as_ref().is_none_or(|w| w.rank == 0);
    let print = &mut |event: driver::Event| {
        if speaks {
            print(event)
        }
    };
    if speaks {
        for renamed in draft.renamed() {
            eprintln!("warning: {}: {renamed}", args.config.display());
        }
    }
    let mut options = driver::Options {
        from: args.from.clone(),
        allow_config_change: args.allow_config_change,
        until: args.until.clone(),
        worker: args.worker,
        ranks: None,
        lane: args.lane,
    };
    if args.lane.is_some() && std::env::var_os(super::lanes::STARTED_BY_RUN).is_some() {
        // The run that started this lane draws the progress on the terminal they share.
        super::progress::hide();
    }
    let opened = driver::open(draft, &options, print).await?;
    let (store, config) = (&opened.store, &opened.config);
    if let Some(world) = &world {
        super::ranks::check_pools(config, world.size, &args.config)?;
        let digest = format!("config {} of run {}", &config.sha256()[..12], store.url());
        options.ranks = Some(join(world, &digest, &args.ranks)?);
    }
    let started_by_run = args.lane.is_some() && std::env::var_os(super::lanes::STARTED_BY_RUN).is_some();
    if speaks && !started_by_run {
        println!("run {} ({}), config sha256 {}", store.url(), config.run_name(), &config.sha256()[..12]);
    }
    if let Some(worker) = args.worker {
        println!("worker {} of {}", worker.index, worker.count);
    }
    if let Some(lane) = args.lane.filter(|_| !started_by_run) {
        println!("lane {lane}");
    }
    // A run that overlaps by itself starts its other lanes and is the train lane.
    let others = match (args.lane, args.worker, &world, &args.until) {
        (None, None, None, None) => Lane::others(config),
        _ => Vec::new(),
    };
    if !others.is_empty() {
        let names: Vec<String> = others.iter().map(Lane::to_string).collect();
        println!("lanes: train here, {} beside it", names.join(" and "));
        options.lane = Some(Lane::Train);
        let mut lanes = Lanes::start(&others)?;
        let progress = super::progress::for_stderr();
        tokio::select! {
            done = driver::run(&opened, &options, &*progress, print) => done?,
            failed = lanes.first_failure() => return Err(failed),
        }
        return lanes.wait();
    }
    if let Some(world) = world.as_ref().filter(|_| speaks) {
        println!(
            "{} ranks: each update data-parallel over all, rollouts and evaluations in {} shards",
            world.size, world.size
        );
    }
    driver::run(&opened, &options, &*super::progress::for_stderr(), print).await?;
    Ok(())
}

fn print(event: driver::Event) {
    match event {
        driver::Event::ConfigChanged { recorded_as } => {
            println!("config changed since the run started; recorded as {recorded_as}")
        }
        driver::Event::Resuming { committed, total } => {
            println!("resuming: {committed} of {total} stages already committed")
        }
        driver::Event::StoppedBefore(id) => println!("stopping before {id} (--until)"),
        driver::Event::Committed { stage, marker, seconds, elapsed } => {
            println!("{stage}: {} rows, {seconds:.1} s (total {elapsed:.0} s)", marker.rows())
        }
        driver::Event::Pruned { files, bytes } if files > 0 => {
            println!("retention: pruned {files} checkpoint files, {}", super::human_bytes(bytes))
        }
        driver::Event::Pruned { .. } => {}
        driver::Event::IterationDone { summary, .. } | driver::Event::Finished { summary } => println!("{summary}"),
    }
}

/// Prints the run's steps in schedule order: each `petting stage` command, the stage
/// whose every part (all shards) must be committed before it starts, and its lane (the
/// devices a scheduler may give it: sampling or training). The first step creates
/// the run (freezing its config), which `petting stage` needs.
pub fn plan(args: &PipelinePlanArgs) -> anyhow::Result<()> {
    let config = config::load(&args.config)?.resolved();
    let url = RunStore::open(&config.store)?.url().to_string();
    let create = format!("petting pipeline run {} --until prepare-data", args.config.display());
    let mut steps = vec![("create".to_string(), None, create, Lane::Train)];
    // The run-level update is `petting stage init`, and named so here.
    let name = |id| if id == pipeline::INITIAL_UPDATE { "init".to_string() } else { driver::stop_name(id) };
    for id in pipeline::schedule(&config) {
        let after = Some(pipeline::needs(&config, id).map_or("create".to_string(), name));
        let shards = if id.stage.runs_in_shards() { args.shards } else { 1 };
        for index in 0..shards {
            let mut command = match id.iteration {
                None if id.stage == Stage::Update => format!("petting stage init {url}"),
                None => format!("petting stage {} {url}", id.stage),
                Some(k) => format!("petting stage {} {url} --iteration {k}", id.stage),
            };
            let mut step = name(id);
            if shards > 1 {
                command.push_str(&format!(" --shard {index}/{shards}"));
                step.push_str(&format!("#{index}"));
            }
            steps.push((step, after.clone(), command, Lane::of(&config, id.stage)));
        }
    }
    for (step, after, command, lane) in steps {
        if args.json || args.format == Format::Json {
            let after: Vec<String> = after.into_iter().collect();
            println!(
                "{}",
                serde_json::json!({"step": step, "after": after, "command": command, "lane": lane.to_string()})
            );
        } else {
            let after = after.map_or(String::new(), |a| format!("after {a}"));
            println!("{step:<16} {after:<24} {:<8} {command}", lane.to_string());
        }
    }
    Ok(())
}
