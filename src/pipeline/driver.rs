//! Running a run from its config file, as `petting pipeline run` does: create or resume
//! the run (refusing a changed config unless allowed), check a fork before the new run
//! exists, then run every pending stage in schedule order, or this worker's part of it
//! while other workers run the rest.
//!
//! ```text
//!  open(loaded, options) ──► Opened { store, config, pending, … }   run.yaml frozen or compared
//!  run(opened, options, progress, events)                           stage by stage, resumable
//! ```
//!
//! The driver never prints: what a person wants to hear about comes to the caller as
//! [`Event`]s.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Lane, inputs, lanes};
use crate::config::{self, ForkConfig, RunConfig};
use crate::inspect::summary;
use crate::policies;
use crate::progress::Progress;
use crate::ranks::Ranks;
use crate::stages::{self, Session, replay, update};
use crate::store::layout::RUN_CONFIG;
use crate::store::{self, CommitMarker, RunStore, Shard, Stage, StageId};
use crate::tracking;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),

    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(transparent)]
    Stage(#[from] stages::Error),

    #[error("{stage} failed")]
    StageFailed { stage: StageId, source: Box<stages::Error> },

    #[error(
        "{url} was started with a different config (sha256 {stored} there, {given} in {file}); \
         resume with the new one by adding --allow-config-change"
    )]
    ConfigChanged { url: String, stored: String, given: String, file: String },

    #[error(
        "{url} was started with {file} of sha256 {stored}; it is now {given}: the environment the run trains on \
         changed. Restore the file, or resume with the new one by adding --allow-config-change (the change is \
         recorded under _config_history/)"
    )]
    EnvironmentChanged { url: String, file: String, stored: String, given: String },

    #[error("cannot read a file of the environment: {reason}")]
    EnvironmentFile { reason: String },

    #[error("--from names the run's own store {url}; a fork needs a new store")]
    ForkIntoItself { url: String },

    #[error("--from {from}: {source}")]
    ForkSource { from: String, source: std::io::Error },

    #[error(transparent)]
    Summary(#[from] crate::inspect::Error),

    #[error("{}: {source}", file.display())]
    Inputs { file: std::path::PathBuf, source: Box<inputs::Error> },
}

/// How `petting pipeline run` was asked to run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Start the run from a stored iteration of another (`--from URL@K[:group]`).
    pub from: Option<ForkConfig>,
    /// Resume even though the config differs from the one the run started with.
    pub allow_config_change: bool,
    /// Stop before this stage (`rollout:3`, `update` for the run-level one).
    pub until: Option<String>,
    /// Run only this worker's part of each stage, waiting for the others' commits.
    pub worker: Option<Shard>,
    /// The ranks this process joined: each is a worker (rank r of N is worker r/N), and
    /// all run every update together, data-parallel.
    pub ranks: Option<Arc<Ranks>>,
    /// Run only this lane's stages, each once what it needs is committed, while other
    /// processes run the other lanes.
    pub lane: Option<Lane>,
}

/// What happened, for the caller to report.
#[derive(Debug)]
pub enum Event<'a> {
    /// The run resumes with a changed config, recorded at this path of the store.
    ConfigChanged { recorded_as: &'a str },
    /// Stages already committed when the run started.
    Resuming { committed: usize, total: usize },
    /// `--until` stopped the run before this stage.
    StoppedBefore(StageId),
    /// This process committed a stage (its part, for a worker).
    Committed { stage: StageId, marker: &'a CommitMarker, seconds: f64, elapsed: f64 },
    /// This process committed iteration k's update (of the run's `iterations`): the
    /// iteration's summary line.
    IterationDone { iteration: u32, iterations: u32, summary: &'a str },
    /// A tracker (`tracking:`) could not take a stage's metrics; the run goes on.
    TrackerFailed { stage: StageId, reason: String },
    /// After an update, the retention pruned older checkpoints' files.
    Pruned { files: usize, bytes: u64 },
    /// Every stage is committed: held-out success per version and where the time went.
    Finished { summary: &'a str },
}

/// A run ready to go: its store, its frozen config and the stages left to run.
#[derive(Debug)]
pub struct Opened {
    pub store: RunStore,
    pub config: RunConfig,
    pub pending: Vec<StageId>,
}

/// Creates the run (freezing its config) or resumes it. The fork is `--from`, else the
/// file's `fork:`, else the one the stored run was started with (resuming a fork needs
/// no `--from`); a new fork's source is checked before the run exists, then the config
/// is validated with its fork. A changed config is refused unless
/// `options.allow_config_change`.
pub async fn open(mut draft: config::Draft, options: &Options, events: &mut dyn FnMut(Event)) -> Result<Opened, Error> {
    if let Some(fork) = &options.from {
        draft.set_fork(fork_from_here(fork)?);
    }
    let store = RunStore::open(&draft.store_url())?;
    let run_yaml = Path::new(store.url()).join(RUN_CONFIG);
    let existing = store.run_config().await?;
    let new_fork = draft.fork().is_some() && (existing.is_none() || options.from.is_some());
    if new_fork {
        check_fork(&draft.resolved()).await?;
    } else if let (None, Some(stored)) = (draft.fork(), &existing)
        && let Some(fork) = config::parse(stored, &run_yaml)?.fork
    {
        // A fork resumes like any run: its origin is in run.yaml.
        draft.set_fork(fork);
    }
    let loaded = draft.validate()?;
    let config = loaded.resolved();
    // A whole new run must not fail minutes in for a missing file; `--until` steps
    // (creating a run for workers that hold the models) are left to the stages.
    if existing.is_none() && options.until.is_none() {
        inputs::check(&config).map_err(|e| Error::Inputs { file: loaded.file.clone(), source: Box::new(e) })?;
    }
    if existing.is_none()
        && let Some(outer) = store.enclosing_store().await?
    {
        return Err(store::Error::NestedStore { outer, inner: store.url().to_string() }.into());
    }
    let stored = store.init_config(&loaded.frozen_yaml()).await?;
    let previous = config::parse(&stored, &run_yaml)?;
    if previous.sha256() != config.sha256() {
        if !options.allow_config_change {
            return Err(Error::ConfigChanged {
                url: store.url().to_string(),
                stored: previous.sha256()[..12].to_string(),
                given: config.sha256()[..12].to_string(),
                file: loaded.file.display().to_string(),
            });
        }
        let path = store.record_config_change(&loaded.frozen_yaml(), &previous.sha256()).await?;
        events(Event::ConfigChanged { recorded_as: &path });
    }
    freeze_environment(&store, &config, options.allow_config_change).await?;
    let pending = super::pending(&store, &config).await?;
    Ok(Opened { store, config, pending })
}

/// Runs the pending stages in order: each one, or this worker's part of it, then (for
/// a worker) waits until every part is committed.
pub async fn run(
    opened: &Opened,
    options: &Options,
    progress: &dyn Progress,
    events: &mut dyn FnMut(Event),
) -> Result<(), Error> {
    if let Some(lane) = options.lane {
        return run_lane(opened, lane, options, progress, events).await;
    }
    let Opened { store, config, pending } = opened;
    if pending.is_empty() {
        // Nothing left to run reads the committed files: check them, so a finished run
        // that was damaged says so as a resumed one does.
        store.verify().await?;
    }
    let total = super::schedule(config).len();
    if pending.len() < total {
        events(Event::Resuming { committed: total - pending.len(), total });
    }
    let started = Instant::now();
    let session = Session { ranks: options.ranks.clone(), ..Session::default() };
    let ranks = options.ranks.as_deref();
    let worker = options.worker.or(ranks.map(|r| Shard { index: r.rank(), count: r.size() }));
    let leader = ranks.is_none_or(Ranks::is_leader);
    for &id in pending {
        if options.until.as_deref() == Some(&stop_name(id)) {
            events(Event::StoppedBefore(id));
            return Ok(());
        }
        let part = match worker {
            Some(_) if ranks.is_some() && id.stage == Stage::Update && id.iteration.is_some() => Some(id),
            Some(worker) => super::worker_part(id, worker),
            None => Some(id),
        };
        if let Some(part) = part
            && store.marker(&part).await?.is_none()
        {
            run_one(opened, part, leader, (progress, &session), started, events).await?;
        }
        if worker.is_some() {
            super::wait_until_committed(store, id, Duration::from_millis(500), Duration::from_secs(10)).await?;
        }
    }
    events(Event::Finished { summary: &summary::run(store).await? });
    Ok(())
}

/// Runs lane `lane`'s pending stages, each once what it needs is committed by whichever
/// lane runs that; the train lane then waits for the run's last stage and reports it
/// finished.
async fn run_lane(
    opened: &Opened,
    lane: Lane,
    options: &Options,
    progress: &dyn Progress,
    events: &mut dyn FnMut(Event),
) -> Result<(), Error> {
    let Opened { store, config, pending } = opened;
    // A lane waits on stages that take seconds: it looks often, or the overlap is lost
    // to the waits (looking at most every second cost the embedded default's strictly
    // on-policy lanes 1.2 s an iteration of 7).
    let (started, session) = (Instant::now(), Session::default());
    let wait = |id| super::wait_until_committed(store, id, Duration::from_millis(50), Duration::from_millis(250));
    for id in lanes::order(config, lane, pending) {
        if options.until.as_deref() == Some(&stop_name(id)) {
            events(Event::StoppedBefore(id));
            return Ok(());
        }
        if let Some(need) = super::needs(config, id) {
            wait(need).await?;
        }
        if store.marker(&id).await?.is_none() {
            run_one(opened, id, true, (progress, &session), started, events).await?;
        }
    }
    if lane == Lane::Train {
        let last = *super::schedule(config).last().expect("a schedule ends with an evaluation");
        wait(last).await?;
        events(Event::Finished { summary: &summary::run(store).await? });
    }
    Ok(())
}

/// Runs stage `id` and reports its commit; after an update, the `leader` prunes what
/// the retention drops and reports the iteration.
async fn run_one(
    opened: &Opened,
    id: StageId,
    leader: bool,
    (progress, session): (&dyn Progress, &Session),
    started: Instant,
    events: &mut dyn FnMut(Event),
) -> Result<(), Error> {
    let Opened { store, config, .. } = opened;
    let stage_started = Instant::now();
    let marker = with_heartbeat(store, id, super::run_stage(store, config, id, progress, session))
        .await
        .map_err(|source| Error::StageFailed { stage: id, source: Box::new(source) })?;
    crate::allocator::return_freed_memory();
    events(Event::Committed {
        stage: id,
        marker: &marker,
        seconds: stage_started.elapsed().as_secs_f64(),
        elapsed: started.elapsed().as_secs_f64(),
    });
    let run_done = super::schedule(config).last() == Some(&id);
    if let (true, None, Some(tracking)) = (leader, id.shard, &config.tracking)
        && let Err(e) = tracking::stage_committed(store, tracking, &tracked(config), id, &marker, run_done).await
    {
        events(Event::TrackerFailed { stage: id, reason: e.to_string() });
    }
    if let (Stage::Update, Some(k), true) = (id.stage, id.iteration, leader) {
        if let Some(retention) = &config.retention {
            let doomed = policies::doomed_files(&store.markers().await?, retention);
            let report = store.prune(&doomed, &retention.to_string(), false).await?;
            events(Event::Pruned { files: report.files.len(), bytes: report.bytes() });
        }
        let summary = summary::iteration(store, config.algorithm.alpha, k).await?;
        events(Event::IterationDone { iteration: k, iterations: config.iterations, summary: &summary });
    }
    Ok(())
}

/// Freezes the digests of the environment's own files with the run (the first time),
/// or checks them against the frozen ones: a changed file is refused unless
/// `allow_change`, which records the change.
/// Runs `work`, stage `id`, with its running file kept fresh beside it (store::running),
/// so `status` and the dashboard can tell it runs; the file goes when the stage ends. A
/// heartbeat that fails to write never fails the stage.
async fn with_heartbeat<T>(store: &RunStore, id: StageId, work: impl Future<Output = T>) -> T {
    let started_at = chrono::Utc::now();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    // A task of its own: the stage may hold its thread (block_in_place) for minutes.
    let beating = tokio::spawn({
        let store = store.clone();
        async move {
            loop {
                let _ = store.mark_running(&id, started_at).await;
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(store::running::HEARTBEAT) => {}
                }
            }
        }
    });
    let result = work.await;
    let _ = stop.send(());
    let _ = beating.await;
    let _ = store.clear_running(&id).await;
    result
}

/// What the trackers file a run's stages under.
fn tracked(config: &RunConfig) -> tracking::TrackedRun {
    tracking::TrackedRun {
        name: config.run_name(),
        settings: config::settings(&serde_json::to_value(config).expect("a config serialises")),
        alpha: config.algorithm.alpha,
    }
}

async fn freeze_environment(store: &RunStore, config: &RunConfig, allow_change: bool) -> Result<(), Error> {
    let digests = crate::envs::user_files::digests(&config.env)
        .map_err(|source| Error::EnvironmentFile { reason: source.to_string() })?;
    let stored = match store.environment_files().await? {
        Some(text) => serde_json::from_str::<BTreeMap<String, String>>(&text).unwrap_or_default(),
        None if digests.is_empty() => return Ok(()),
        None => BTreeMap::new(),
    };
    if stored == digests {
        return Ok(());
    }
    if !stored.is_empty() && !allow_change {
        let changed = stored.keys().chain(digests.keys()).find(|f| stored.get(*f) != digests.get(*f));
        let file = changed.cloned().unwrap_or_default();
        let short = |d: Option<&String>| d.map_or_else(|| "none".to_string(), |d| d[..12].to_string());
        return Err(Error::EnvironmentChanged {
            url: store.url().to_string(),
            file: file.clone(),
            stored: short(stored.get(&file)),
            given: short(digests.get(&file)),
        });
    }
    let json = serde_json::to_string_pretty(&digests).expect("a map of strings serialises");
    Ok(store.freeze_environment_files(&json).await?)
}

/// `rollout:3` for rollout of iteration 3, `update` for the run-level one.
pub fn stop_name(id: StageId) -> String {
    match id.iteration {
        Some(k) => format!("{}:{k}", id.stage),
        None => id.stage.to_string(),
    }
}

/// The fork with a local source path made absolute against the working directory.
fn fork_from_here(fork: &ForkConfig) -> Result<ForkConfig, Error> {
    if fork.from.contains("://") {
        return Ok(fork.clone());
    }
    let path = store::absolute_path(Path::new(&fork.from))
        .map_err(|source| Error::ForkSource { from: fork.from.clone(), source })?;
    Ok(ForkConfig { from: path.to_string_lossy().into_owned(), ..fork.clone() })
}

/// Refuses a fork into its own source or from a missing iteration, before the new run exists.
async fn check_fork(config: &RunConfig) -> Result<(), Error> {
    let fork = config.fork.as_ref().expect("a fork");
    let (source, target) = (RunStore::open(&fork.from)?, RunStore::open(&config.store)?);
    if source.url() == target.url() {
        return Err(Error::ForkIntoItself { url: target.url().to_string() });
    }
    update::check_fork(config).await?;
    if fork.replay {
        replay::check(config, fork).await?;
    }
    Ok(())
}
