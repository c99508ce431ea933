use std::time::Instant;

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
    let mut pace = Pace::new();
    let print = &mut |event: driver::Event| {
        if speaks {
            print(event, &mut pace)
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

fn print(event: driver::Event, pace: &mut Pace) {
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
        driver::Event::TrackerFailed { stage, reason } => eprintln!("warning: tracking of {stage}: {reason}"),
        driver::Event::IterationDone { iteration, iterations, summary } => {
            println!("{}\n{summary}", pace.iteration_done(iteration, iterations))
        }
        driver::Event::Finished { summary } => println!("{summary}"),
    }
}

/// Where a run is and when it will end, at the pace of the iterations this process
/// finished (a resumed run's earlier ones ran at another time, maybe on another machine).
struct Pace {
    started: Instant,
    finished_here: u32,
}

impl Pace {
    fn new() -> Pace {
        Pace { started: Instant::now(), finished_here: 0 }
    }

    fn iteration_done(&mut self, iteration: u32, iterations: u32) -> String {
        self.finished_here += 1;
        let now = chrono::Utc::now().format("%H:%M:%S UTC");
        pace_line(iteration + 1, iterations, self.started.elapsed().as_secs_f64(), self.finished_here, &now.to_string())
    }
}

/// `[21:43:05 UTC] 3/10 iterations done · elapsed 14m 02s · ETA 32m 45s`: `done` of `total`
/// iterations, the last `finished_here` of them in `elapsed` seconds.
fn pace_line(done: u32, total: u32, elapsed: f64, finished_here: u32, now: &str) -> String {
    let left = total.saturating_sub(done);
    let eta = match left {
        0 => "done".to_string(),
        _ => format!("ETA {}", super::human_seconds(elapsed / f64::from(finished_here.max(1)) * f64::from(left))),
    };
    format!("[{now}] {done}/{total} iterations done · elapsed {} · {eta}", super::human_seconds(elapsed))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_line_projects_the_iterations_left_at_this_process_pace() {
        assert_eq!(
            pace_line(3, 10, 842.0, 3, "21:43:05 UTC"),
            "[21:43:05 UTC] 3/10 iterations done · elapsed 14m 02s · ETA 32m 45s"
        );
        // Resumed at iteration 8: two iterations here, 100 s each.
        assert_eq!(pace_line(9, 10, 200.0, 2, "t"), "[t] 9/10 iterations done · elapsed 3m 20s · ETA 1m 40s");
        assert_eq!(pace_line(30, 30, 7500.0, 30, "t"), "[t] 30/30 iterations done · elapsed 2h 05m · done");
    }
}
