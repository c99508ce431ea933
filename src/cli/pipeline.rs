use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use petting::config::{self, ForkConfig, RunConfig};
use petting::pipeline;
use petting::sql::RunSql;
use petting::stages::update;
use petting::store::layout::RUN_CONFIG;
use petting::store::{RunStore, Stage};

use super::args::{PipelinePlanArgs, PipelineRunArgs};

pub async fn run(args: PipelineRunArgs) -> anyhow::Result<()> {
    let mut loaded = config::load_with(&args.config, &args.overrides)?;
    if let Some(fork) = &args.from {
        loaded.config.fork = Some(fork_from_here(fork)?);
        fork_checks(&loaded.resolved()).await?;
    }
    let store = RunStore::open(&loaded.store_url())?;
    let stored = store.init_config(&loaded.frozen_yaml()).await?;
    let previous = config::parse(&stored, &Path::new(store.url()).join(RUN_CONFIG))?;
    if args.from.is_none() && loaded.config.fork.is_none() {
        // A fork resumes like any run: its origin is in run.yaml.
        loaded.config.fork = previous.fork.clone();
    }
    let config = &loaded.resolved();
    if previous.sha256() != config.sha256() {
        if !args.allow_config_change {
            bail!(
                "{} was started with a different config (sha256 {} there, {} in {}); \
                 resume with the new one by adding --allow-config-change",
                store.url(),
                &previous.sha256()[..12],
                &config.sha256()[..12],
                args.config.display()
            );
        }
        let path = store.record_config_change(&loaded.frozen_yaml(), &previous.sha256()).await?;
        println!("config changed since the run started; recorded as {path}");
    }
    println!("run {} ({}), config sha256 {}", store.url(), config.run_name(), &config.sha256()[..12]);
    let pending = pipeline::pending(&store, config).await?;
    let total = pipeline::schedule(config).len();
    if pending.len() < total {
        println!("resuming: {} of {total} stages already committed", total - pending.len());
    }
    let started = Instant::now();
    let progress = super::progress::for_stderr();
    if let Some(worker) = args.worker {
        println!("worker {} of {}", worker.index, worker.count);
    }
    for id in pending {
        if args.until.as_deref() == Some(&stop_name(id)) {
            println!("stopping before {id} (--until)");
            return Ok(());
        }
        let part = args.worker.map_or(Some(id), |worker| pipeline::worker_part(id, worker));
        if let Some(part) = part
            && store.marker(&part).await?.is_none()
        {
            let stage_started = Instant::now();
            let marker = pipeline::run_stage(&store, config, part, &*progress)
                .await
                .with_context(|| format!("{part} failed"))?;
            println!(
                "{part}: {} rows, {:.1} s (total {:.0} s)",
                marker.rows(),
                stage_started.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            if let (Stage::Update, Some(k)) = (id.stage, id.iteration) {
                println!("{}", summary(&store, config, k).await?);
            }
        }
        if args.worker.is_some() {
            pipeline::wait_until_committed(&store, id, Duration::from_millis(500)).await?;
        }
    }
    println!("{}", final_line(&store).await?);
    Ok(())
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
    let name = |id| if id == pipeline::INITIAL_UPDATE { "init".to_string() } else { stop_name(id) };
    for id in pipeline::schedule(&config) {
        let after = Some(pipeline::needs(&config, id).map_or("create".to_string(), name));
        let shards = if id.stage.runs_in_shards() { args.shards } else { 1 };
        for index in 0..shards {
            let mut command = match id.iteration {
                None if id.stage == Stage::Update => format!("petting stage init --run {url}"),
                None => format!("petting stage {} --run {url}", id.stage),
                Some(k) => format!("petting stage {} --run {url} --iteration {k}", id.stage),
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
        if args.json {
            let after: Vec<String> = after.into_iter().collect();
            println!("{}", serde_json::json!({"step": step, "after": after, "command": command}));
        } else {
            println!("{step:<16} {:<24} {command}", after.map_or(String::new(), |a| format!("after {a}")));
        }
    }
    Ok(())
}

/// The fork with a local source path made absolute against the working directory.
fn fork_from_here(fork: &ForkConfig) -> anyhow::Result<ForkConfig> {
    if fork.from.contains("://") {
        return Ok(fork.clone());
    }
    let path = petting::store::absolute_path(Path::new(&fork.from)).with_context(|| format!("--from {}", fork.from))?;
    Ok(ForkConfig { from: path.to_string_lossy().into_owned(), ..fork.clone() })
}

/// Refuses a fork into its own source or from a missing iteration, before the new run exists.
async fn fork_checks(config: &RunConfig) -> anyhow::Result<()> {
    let fork = config.fork.as_ref().expect("a fork");
    let (source, target) = (RunStore::open(&fork.from)?, RunStore::open(&config.store)?);
    if source.url() == target.url() {
        bail!("--from names the run's own store {}; a fork needs a new store", target.url());
    }
    update::check_fork(config).await?;
    if fork.replay {
        petting::stages::replay::check(config, fork).await?;
    }
    Ok(())
}

/// `rollout:3` for rollout of iteration 3, `update` for the run-level one.
fn stop_name(id: petting::store::StageId) -> String {
    match id.iteration {
        Some(k) => format!("{}:{k}", id.stage),
        None => id.stage.to_string(),
    }
}

/// One line per iteration: reward per agent, clip fraction, drift, eval success, seconds per stage.
async fn summary(store: &RunStore, config: &RunConfig, k: u32) -> anyhow::Result<String> {
    let sql = RunSql::open(store).await?;
    let rewards = scalar(
        &sql,
        &format!(
            "select string_agg(agent || ' ' || round(r, 3), ', ' order by agent) from \
             (select agent, avg(local_reward + {alpha} * team_reward) as r from turns where iteration = {k} group by agent)",
            alpha = config.algorithm.alpha
        ),
    )
    .await?;
    let update = scalar(
        &sql,
        &format!(
            "select 'clip ' || round(avg(clip_fraction), 3) || ', drift ' || round(max(logprob_drift_max), 4) \
             from updates where iteration = {k} and mode = 'ppo'"
        ),
    )
    .await?;
    let eval = scalar(
        &sql,
        &format!(
            "select string_agg(mode || ' ' || round(s * 100, 1) || '%', ', ' order by mode) from \
             (select mode, avg(case when success then 1.0 else 0.0 end) as s from evals where iteration = {k} group by mode)"
        ),
    )
    .await?;
    let timing = scalar(
        &sql,
        &format!(
            "select string_agg(stage || ' ' || round(seconds, 1) || 's', ', ' order by finished_at) \
             from commits where iteration = {k}"
        ),
    )
    .await?;
    let eval = if eval.is_empty() { String::new() } else { format!(" | eval v{k}: {eval}") };
    Ok(format!("iteration {k}: reward {rewards} | {update}{eval} | {timing}"))
}

async fn final_line(store: &RunStore) -> anyhow::Result<String> {
    let sql = RunSql::open(store).await?;
    let curve = scalar(
        &sql,
        "select string_agg(mode || ': ' || curve, '; ' order by mode) from \
         (select mode, string_agg('v' || iteration || ' ' || round(s * 100, 1) || '%', ', ' order by iteration) as curve \
          from (select mode, iteration, avg(case when success then 1.0 else 0.0 end) as s from evals \
                group by mode, iteration) group by mode)",
    )
    .await?;
    let time = scalar(
        &sql,
        "select round(sum(seconds)) || ' s in stages: model ' || round(100 * sum(model_seconds) / sum(seconds), 1) \
         || '%, sandbox ' || round(100 * sum(sandbox_seconds) / sum(seconds), 1) || '%, the rest ' \
         || round(100 * (1 - sum(model_seconds + sandbox_seconds) / sum(seconds)), 1) || '%' from commits",
    )
    .await?;
    Ok(format!("held-out success: {curve}\n{time}"))
}

/// The first cell of a one-row query, as text ("" when there is none).
async fn scalar(sql: &RunSql, query: &str) -> anyhow::Result<String> {
    let (_, batches) = sql.query(query).await?;
    let Some(batch) = batches.iter().find(|b| b.num_rows() > 0) else { return Ok(String::new()) };
    let formatter = ArrayFormatter::try_new(batch.column(0).as_ref(), &FormatOptions::default())?;
    Ok(formatter.value(0).to_string())
}
