use petting::config;
use petting::pipeline::{self, driver};
use petting::store::{RunStore, Stage};

use super::args::{Format, PipelinePlanArgs, PipelineRunArgs};
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
    };
    let opened = driver::open(draft, &options, print).await?;
    let (store, config) = (&opened.store, &opened.config);
    if let Some(world) = &world {
        super::ranks::check_pools(config, world.size, &args.config)?;
        let digest = format!("config {} of run {}", &config.sha256()[..12], store.url());
        options.ranks = Some(join(world, &digest, &args.ranks)?);
    }
    if speaks {
        println!("run {} ({}), config sha256 {}", store.url(), config.run_name(), &config.sha256()[..12]);
    }
    if let Some(worker) = args.worker {
        println!("worker {} of {}", worker.index, worker.count);
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

/// Prints the run's steps in schedule order: each `petting stage` command and the
/// stage whose every part (all shards) must be committed before it starts. The first step creates
/// the run (freezing its config), which `petting stage` needs.
pub fn plan(args: &PipelinePlanArgs) -> anyhow::Result<()> {
    let config = config::load(&args.config)?.resolved();
    let url = RunStore::open(&config.store)?.url().to_string();
    let create = format!("petting pipeline run {} --until prepare-data", args.config.display());
    let mut steps = vec![("create".to_string(), None, create)];
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
            steps.push((step, after.clone(), command));
        }
    }
    for (step, after, command) in steps {
        if args.json || args.format == Format::Json {
            let after: Vec<String> = after.into_iter().collect();
            println!("{}", serde_json::json!({"step": step, "after": after, "command": command}));
        } else {
            println!("{step:<16} {:<24} {command}", after.map_or(String::new(), |a| format!("after {a}")));
        }
    }
    Ok(())
}
