//! Agent programs play the episodes: `env: {name: agent_program, command: […]}`.
//!
//! ```text
//!  per episode (K per task, `env.concurrency` at once): the user's program, with
//!      OPENAI_BASE_URL=http://127.0.0.1:<port>/v1, OPENAI_API_KEY (the episode's own key),
//!      PETTING_TASK_FILE (and PETTING_TASK, the row itself, where it fits an environment variable)
//!  endpoint.rs   its calls (model = a role) ──► Event::Call ──► the dispatcher (here)
//!  dispatcher    renders each call with the role's policy (tokens.rs: a conversation that
//!                goes on keeps the ids sampled before), waits until every running program
//!                is waiting on a call or none has come for BATCH_WAIT, then samples the
//!                waiting calls in one batch per policy and answers them
//!  exit          the last stdout line is the verdict (envs::agent_program::Verdict); a
//!                crash, a timeout, no verdict, an unknown role or an overlong prompt
//!                fails the episode, with its reason
//! ```
//!
//! Each call is a candidate of its role, its turn the role's call index in the episode;
//! every candidate of an episode carries the verdict's rewards. A program cannot be
//! forked, so programs play independent episodes only.

mod endpoint;
mod tokens;

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use crate::engine::{Prompt, Reply, Responder};
use crate::envs::agent_program::{AgentProgramConfig, Verdict, names};
use crate::progress::Progress;
use crate::rng::{stream, text_key};
use crate::workflows::{Agent, TurnOutcome};

use super::{Candidate, Error, Finished, Played, Setup};
use endpoint::{Answered, Call, Endpoint, Refusal, Request};
use tokens::Sampled;

/// How long the dispatcher waits for more calls while some programs are busy working
/// between calls before it samples the calls it has.
const BATCH_WAIT: Duration = Duration::from_millis(50);

/// How long a started program that has not called yet is waited for: programs start
/// together (Python and a framework take a second or more to import), and their first
/// calls are best sampled in one batch.
const STARTUP_WAIT: Duration = Duration::from_secs(10);

/// The most of a program's stdout and stderr kept (the verdict is its last line).
const KEPT_OUTPUT: usize = 1 << 20;
const KEPT_STDERR: usize = 2000;

/// The tasks an agent program plays.
#[derive(Debug, Clone)]
pub struct Programs {
    pub config: AgentProgramConfig,
    /// (task id, the task row as JSON), in batch order.
    pub tasks: Vec<(String, String)>,
    pub team: Vec<Agent>,
    pub limits: crate::limits::Limits,
}

/// What reaches the dispatcher.
#[derive(Debug)]
pub enum Event {
    Call(Call),
    Exited { episode: usize, status: std::io::Result<ExitStatus>, stdout: String, stderr: String },
}

/// One episode: a run of the program on one task.
struct Episode {
    task_index: usize,
    episode_index: u32,
    /// The running program's process group and when it started.
    running: Option<(i32, Instant)>,
    /// Killed for running past its deadline.
    killed: bool,
    calls: Vec<AnsweredCall>,
    failure: Option<String>,
    verdict: Option<Verdict>,
}

/// One answered call: a future candidate.
struct AnsweredCall {
    agent: Agent,
    turn: u32,
    seed: u64,
    message: String,
    reply: Reply,
}

impl AnsweredCall {
    /// The call as a later call of the episode may continue it.
    fn sampled<'a>(&'a self, policy: &'a str) -> Sampled<'a> {
        let reply = &self.reply;
        Sampled {
            policy,
            prompt_text: &reply.prompt_text,
            prompt_ids: &reply.prompt_tokens,
            reply_text: &reply.text,
            response_ids: &reply.tokens,
        }
    }
}

/// A call rendered and waiting for its batch.
struct Waiting {
    call: Call,
    agent: Agent,
    policy: String,
    /// The role's call index in the episode.
    turn: u32,
    prompt: Prompt,
}

/// A stage's programs, started before its policies are loaded: the endpoint listens and
/// the first `env.concurrency` programs import their interpreter and framework meanwhile;
/// their calls wait for [`play`]. Dropped unplayed, the programs are killed.
pub struct Running<'a> {
    programs: &'a Programs,
    endpoint: Endpoint,
    events: Sender<Event>,
    received: Receiver<Event>,
    episodes: Vec<Episode>,
    launched: usize,
    /// Each task's row as a file, for PETTING_TASK_FILE; removed with the stage.
    task_files: tempfile::TempDir,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        kill_running(&self.episodes);
    }
}

/// Starts the endpoint and the first programs of every task's episodes,
/// `setup.episodes_per_task()` each.
pub fn start<'a>(programs: &'a Programs, setup: &Setup) -> Result<Running<'a>, Error> {
    let episodes: Vec<Episode> = (0..programs.tasks.len())
        .flat_map(|task_index| {
            (0..setup.episodes_per_task()).map(move |episode_index| Episode {
                task_index,
                episode_index,
                running: None,
                killed: false,
                calls: Vec::new(),
                failure: None,
                verdict: None,
            })
        })
        .collect();
    let (events, received) = channel();
    let roles: Vec<String> = programs.team.iter().map(|a| a.to_string()).collect();
    let endpoint = Endpoint::start(roles, events.clone(), programs.limits.request_bytes).map_err(Error::Endpoint)?;
    let task_files = task_files(&programs.tasks).map_err(Error::TaskFiles)?;
    let mut running = Running { programs, endpoint, events, received, episodes, launched: 0, task_files };
    let first = (programs.config.concurrency as usize).min(running.episodes.len());
    for index in 0..first {
        let tasks = running.task_files.path();
        launch(programs, &running.endpoint, &running.events, tasks, &mut running.episodes[index], index);
    }
    running.launched = first;
    Ok(running)
}

/// Plays the started episodes to their end, starting the rest as programs finish.
pub fn play(
    mut running: Running,
    setup: &Setup,
    responder: &mut dyn Responder,
    progress: &dyn Progress,
) -> Result<Played, Error> {
    progress.advance(running.episodes.iter().filter(|e| e.failure.is_some()).count() as f64, 0);
    let programs = running.programs;
    let mut dispatcher = Dispatcher {
        programs,
        setup,
        responder,
        progress,
        endpoint: &running.endpoint,
        events: running.events.clone(),
        task_files: running.task_files.path(),
        model: Duration::ZERO,
    };
    let result = dispatcher.run(&mut running.episodes, &running.received, running.launched);
    let model = dispatcher.model;
    kill_running(&running.episodes);
    result?;
    played(programs, setup, std::mem::take(&mut running.episodes), model)
}

struct Dispatcher<'a> {
    programs: &'a Programs,
    setup: &'a Setup,
    responder: &'a mut dyn Responder,
    progress: &'a dyn Progress,
    endpoint: &'a Endpoint,
    events: Sender<Event>,
    task_files: &'a Path,
    model: Duration,
}

impl Dispatcher<'_> {
    /// Runs until every episode ended; `next` is the first episode not started yet.
    fn run(&mut self, episodes: &mut [Episode], received: &Receiver<Event>, mut next: usize) -> Result<(), Error> {
        let timeout = Duration::from_secs_f64(self.programs.config.timeout_seconds);
        // Programs started while the policies loaded are waited for from now on.
        let since = Instant::now();
        let mut waiting: Vec<Waiting> = Vec::new();
        let mut last_call = Instant::now();
        loop {
            let running = episodes.iter().filter(|e| e.running.is_some()).count();
            if running < self.programs.config.concurrency as usize && next < episodes.len() {
                self.launch(episodes, next);
                next += 1;
                continue;
            }
            if running == 0 && next == episodes.len() {
                return Ok(());
            }
            let deadline = episodes.iter().filter_map(|e| Some(e.running?.1 + timeout)).min();
            let starting = awaited_first_call(episodes, &waiting, since);
            let wake = match (waiting.is_empty(), starting) {
                (true, _) => deadline,
                (false, Some(until)) => deadline.map_or(Some(until), |d| Some(d.min(until))),
                (false, None) => Some(last_call + BATCH_WAIT),
            };
            let wait = wake.map_or(Duration::from_secs(1), |w| w.saturating_duration_since(Instant::now()));
            let mut event = match received.recv_timeout(wait) {
                Ok(event) => Some(event),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => unreachable!("the dispatcher holds a sender"),
            };
            while let Some(e) = event {
                match e {
                    Event::Call(call) => {
                        tracing::debug!(episode = call.episode, role = call.model, "call");
                        last_call = Instant::now();
                        if let Some(w) = self.prepare(episodes, call, &waiting)? {
                            waiting.push(w);
                        }
                    }
                    Event::Exited { episode, status, stdout, stderr } => {
                        tracing::debug!(episode, ?status, "exited");
                        self.endpoint.dismiss(episode);
                        waiting.retain(|w| w.call.episode != episode);
                        self.exited(&mut episodes[episode], status, &stdout, &stderr);
                    }
                }
                event = received.try_recv().ok();
            }
            time_out(episodes, timeout);
            let running = episodes.iter().filter(|e| e.running.is_some()).count();
            let callers = waiting.iter().map(|w| w.call.episode).collect::<std::collections::BTreeSet<_>>().len();
            let quiet = last_call.elapsed() >= BATCH_WAIT && awaited_first_call(episodes, &waiting, since).is_none();
            if !waiting.is_empty() && (callers >= running || quiet) {
                tracing::debug!(calls = waiting.len(), callers, running, "sampling");
                self.sample(episodes, std::mem::take(&mut waiting))?;
            }
        }
    }

    /// Starts episode `index`'s program; one that cannot start has failed.
    fn launch(&self, episodes: &mut [Episode], index: usize) {
        if !launch(self.programs, self.endpoint, &self.events, self.task_files, &mut episodes[index], index) {
            self.progress.advance(1.0, 0);
        }
    }

    /// Renders a call for its batch; a call the run cannot answer is refused, and fails
    /// its episode.
    fn prepare(&mut self, episodes: &mut [Episode], call: Call, waiting: &[Waiting]) -> Result<Option<Waiting>, Error> {
        let Some(episode) = episodes.get_mut(call.episode).filter(|e| e.running.is_some()) else {
            let _ = call.answer.send(Err(Refusal::new(404, "no such running episode")));
            return Ok(None);
        };
        let refuse = |episode: &mut Episode, call: Call, refusal: Refusal| {
            episode.failure.get_or_insert_with(|| refusal.message.clone());
            let _ = call.answer.send(Err(refusal));
            Ok(None)
        };
        let Some(agent) = self.programs.team.iter().copied().find(|a| a.as_str() == call.model) else {
            let message =
                format!("no role {:?}: `model` must be one of the agents ({})", call.model, names(&self.programs.team));
            return refuse(episode, call, Refusal::new(404, message));
        };
        let policy = self.setup.policies.get(&agent).ok_or(Error::NoPolicy { agent })?.clone();
        let sampled = episode.calls.iter().map(|c| c.sampled(&self.setup.policies[&c.agent]));
        let (text, ids) = match render(self.responder, &policy, &call.request, sampled) {
            Ok(rendered) => rendered,
            Err(e) => return refuse(episode, call, Refusal::new(400, format!("cannot render the prompt: {e}"))),
        };
        let limit = self.responder.prompt_limit();
        if ids.len() > limit {
            let message =
                format!("the prompt of {agent} is {} tokens, over the limit of {limit} (max_prompt_tokens)", ids.len());
            return refuse(episode, call, Refusal::new(400, message));
        }
        // A role that calls again before its first call is answered (agents running in
        // parallel) gets the next turn.
        let earlier = episode.calls.iter().filter(|c| c.agent == agent).count()
            + waiting.iter().filter(|w| w.call.episode == call.episode && w.agent == agent).count();
        let turn = earlier as u32;
        let task_id = &self.programs.tasks[episode.task_index].0;
        let mut keys = self.setup.seed_keys.clone();
        keys.extend([text_key(task_id), episode.episode_index as u64, text_key(agent.as_str()), turn as u64]);
        let prompt = Prompt { text, tokens: Some(ids), seed: stream(&keys) };
        Ok(Some(Waiting { call, agent, policy, turn, prompt }))
    }

    /// Samples the waiting calls, one batch per policy, and answers them.
    fn sample(&mut self, episodes: &mut [Episode], mut waiting: Vec<Waiting>) -> Result<(), Error> {
        // In episode order, as the built-in rollout batches, not in the order the calls
        // happened to arrive: the same calls then make the same batch (the same padding,
        // the same float summation order).
        waiting.sort_by_key(|w| (w.call.episode, w.turn));
        let mut by_policy: Vec<(String, Vec<Waiting>)> = Vec::new();
        for w in waiting {
            match by_policy.iter_mut().find(|(p, _)| *p == w.policy) {
                Some((_, batch)) => batch.push(w),
                None => by_policy.push((w.policy.clone(), vec![w])),
            }
        }
        let mut tokens = 0;
        for (policy, batch) in by_policy {
            let prompts: Vec<Prompt> = batch.iter().map(|w| w.prompt.clone()).collect();
            let started = Instant::now();
            let replies = self.responder.respond(&policy, &prompts)?;
            self.model += started.elapsed();
            if replies.len() != prompts.len() {
                return Err(Error::ReplyCount { asked: prompts.len(), got: replies.len() });
            }
            for (w, reply) in batch.into_iter().zip(replies) {
                tokens += reply.tokens.len() as u64;
                let episode = &mut episodes[w.call.episode];
                let answered = Answered {
                    text: reply.text.clone(),
                    prompt_tokens: reply.prompt_tokens.len(),
                    completion_tokens: reply.tokens.len(),
                    finish_reason: reply.finish_reason.clone(),
                };
                let message = match &w.call.request {
                    Request::Chat { messages, .. } => messages.to_string(),
                    Request::Completion { prompt } => prompt.clone(),
                };
                episode.calls.push(AnsweredCall { agent: w.agent, turn: w.turn, seed: w.prompt.seed, message, reply });
                let _ = w.call.answer.send(Ok(answered));
            }
        }
        self.progress.advance(0.0, tokens);
        Ok(())
    }

    /// Reads the verdict of a program that ended.
    fn exited(&self, episode: &mut Episode, status: std::io::Result<ExitStatus>, stdout: &str, stderr: &str) {
        episode.running = None;
        self.progress.advance(1.0, 0);
        let stderr = stderr_tail(stderr);
        let failure = match status {
            _ if episode.failure.is_some() => return,
            Err(e) => format!("cannot wait for the program: {e}"),
            Ok(s) if !s.success() => format!("the program failed ({s}){stderr}"),
            Ok(_) => match Verdict::parse(stdout, &self.programs.team, self.programs.limits.reward) {
                Ok(verdict) => {
                    episode.verdict = Some(verdict);
                    return;
                }
                Err(reason) => format!("{reason}{stderr}"),
            },
        };
        episode.failure = Some(failure);
    }
}

/// Starts the program of `episode` (number `index`); one that cannot start has failed.
/// Returns whether it started.
fn launch(
    programs: &Programs,
    endpoint: &Endpoint,
    events: &Sender<Event>,
    task_files: &Path,
    episode: &mut Episode,
    index: usize,
) -> bool {
    let (task_id, row) = &programs.tasks[episode.task_index];
    let url = endpoint.base_url();
    let key = endpoint.admit(index);
    let (program, args) = programs.config.program();
    let mut command = Command::new(&program);
    command
        .args(&args)
        .current_dir(programs.config.workdir())
        .env("OPENAI_BASE_URL", &url)
        .env("OPENAI_API_BASE", &url)
        .env("OPENAI_API_KEY", &key)
        .env("PETTING_TASK_FILE", task_file(task_files, episode.task_index))
        .env("PETTING_TASK_ID", task_id)
        .env("PETTING_EPISODE", episode.episode_index.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A timeout, the stage's end and petting's death kill whatever it started too.
    crate::contain::contain(&mut command);
    if row.len() <= TASK_IN_ENVIRONMENT {
        command.env("PETTING_TASK", row);
    } else {
        command.env_remove("PETTING_TASK");
    }
    match command.spawn() {
        Ok(child) => {
            episode.running = Some((child.id() as i32, Instant::now()));
            watch(child, index, events.clone());
            true
        }
        Err(e) => {
            endpoint.dismiss(index);
            episode.failure = Some(format!("cannot start {}: {e}", program.display()));
            false
        }
    }
}

/// The longest task row also given in PETTING_TASK: Linux refuses to start a program
/// with an environment string past 128 KiB; PETTING_TASK_FILE has every row.
const TASK_IN_ENVIRONMENT: usize = 64 << 10;

/// Writes each task's row as `task-<index>.json` of a new folder.
fn task_files(tasks: &[(String, String)]) -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("petting-tasks-").tempdir()?;
    for (index, (_, row)) in tasks.iter().enumerate() {
        std::fs::write(task_file(dir.path(), index), row)?;
    }
    Ok(dir)
}

fn task_file(dir: &Path, task_index: usize) -> std::path::PathBuf {
    dir.join(format!("task-{task_index}.json"))
}

/// Until when the first call of a running program that has not called yet is waited
/// for, if there is one: `STARTUP_WAIT` from its start, or from `since` if it started earlier.
fn awaited_first_call(episodes: &[Episode], waiting: &[Waiting], since: Instant) -> Option<Instant> {
    let silent = |i: usize, e: &Episode| e.calls.is_empty() && !waiting.iter().any(|w| w.call.episode == i);
    let started = episodes.iter().enumerate().filter(|(i, e)| e.running.is_some() && silent(*i, e));
    let until = |e: &Episode| Some(e.running?.1.max(since) + STARTUP_WAIT);
    started.filter_map(|(_, e)| until(e)).filter(|until| *until > Instant::now()).min()
}

/// A call's prompt as the model sees it: (text, ids).
fn render<'a>(
    responder: &mut dyn Responder,
    policy: &str,
    request: &Request,
    sampled: impl IntoIterator<Item = Sampled<'a>>,
) -> Result<(String, Vec<i64>), crate::engine::Error> {
    match request {
        Request::Completion { prompt } => Ok((prompt.clone(), responder.encode(policy, prompt)?)),
        Request::Chat { messages, tools } => {
            let text = responder.chat_text(policy, messages, tools.as_ref())?;
            let ids = match tokens::continued(sampled, policy, &text) {
                Some((call, rest)) => tokens::joined(call, &responder.encode(policy, rest)?),
                None => responder.encode(policy, &text)?,
            };
            Ok((text, ids))
        }
    }
}

/// Waits for a started program on threads of its own (its stdout and stderr are read
/// as it writes them, so that it never blocks on a full pipe) and reports its end.
fn watch(mut child: std::process::Child, episode: usize, events: Sender<Event>) {
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    std::thread::spawn(move || {
        let status = child.wait();
        // Containment ends whatever held the pipes with the program; where it could
        // not, what is left is given up on after a moment rather than waited for.
        let collect = |read: Receiver<String>| read.recv_timeout(PIPES_AFTER_EXIT).unwrap_or_default();
        let (stdout, stderr) = (collect(stdout), collect(stderr));
        let _ = events.send(Event::Exited { episode, status, stdout, stderr });
    });
}

/// How long a program's pipes are read after it exited.
const PIPES_AFTER_EXIT: Duration = Duration::from_secs(2);

/// The tail of a stream, read to its end on a thread of its own.
fn read_in_background(stream: Option<impl Read + Send + 'static>) -> Receiver<String> {
    let (send, receive) = channel();
    std::thread::spawn(move || {
        let _ = send.send(stream.map(|s| read_tail(s, KEPT_OUTPUT)).unwrap_or_default());
    });
    receive
}

/// Everything `reader` gives, keeping the last `keep` bytes.
fn read_tail(mut reader: impl Read, keep: usize) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(n) = reader.read(&mut buffer) {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buffer[..n]);
        if kept.len() > 2 * keep {
            kept.drain(..kept.len() - keep);
        }
    }
    kept.drain(..kept.len().saturating_sub(keep));
    String::from_utf8_lossy(&kept).into_owned()
}

/// The end of a program's stderr, as a failure reason ends.
fn stderr_tail(stderr: &str) -> String {
    let stderr = stderr.trim_end();
    if stderr.is_empty() {
        return String::new();
    }
    let start = stderr.char_indices().rev().nth(KEPT_STDERR).map_or(0, |(i, _)| i);
    format!("; its stderr ends:\n{}", &stderr[start..])
}

/// Kills the programs past their deadline (once); their end is reported as they exit.
fn time_out(episodes: &mut [Episode], timeout: Duration) {
    let now = Instant::now();
    for episode in episodes.iter_mut().filter(|e| !e.killed) {
        let Some((group, launched)) = episode.running else { continue };
        if now >= launched + timeout {
            kill_group(group);
            episode.killed = true;
            let seconds = timeout.as_secs_f64();
            let reason = format!("the program ran past env.timeout_seconds ({seconds} s) and was killed");
            episode.failure.get_or_insert(reason);
        }
    }
}

fn kill_running(episodes: &[Episode]) {
    for (group, _) in episodes.iter().filter_map(|e| e.running) {
        kill_group(group);
    }
}

fn kill_group(group: i32) {
    // SAFETY: kill(2) on a process group petting started; no memory is involved.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

/// The candidates and finished episodes, in (task, episode, call) order.
fn played(programs: &Programs, setup: &Setup, episodes: Vec<Episode>, model: Duration) -> Result<Played, Error> {
    let failed: Vec<&Episode> = episodes.iter().filter(|e| e.failure.is_some()).collect();
    if !episodes.is_empty() && failed.len() == episodes.len() {
        let first = failed[0];
        return Err(Error::ProgramsFailed {
            episodes: episodes.len(),
            task_id: programs.tasks[first.task_index].0.clone(),
            reason: first.failure.clone().unwrap_or_default(),
        });
    }
    let mut candidates = Vec::new();
    let mut finished = Vec::new();
    for episode in episodes {
        let verdict = episode.verdict.as_ref().filter(|_| episode.failure.is_none());
        let team_reward = verdict.map_or(0.0, |v| v.reward);
        let success = verdict.is_some_and(Verdict::success);
        let calls = episode.calls.len();
        let mut tokens = 0;
        for (index, call) in episode.calls.into_iter().enumerate() {
            tokens += call.reply.tokens.len() as u64;
            let done = index + 1 == calls;
            candidates.push(Candidate {
                task_index: episode.task_index,
                episode: episode.episode_index,
                turn: call.turn,
                agent: call.agent,
                policy: setup.policies[&call.agent].clone(),
                branch: 0,
                node_id: index as u32,
                parent_id: index.checked_sub(1).map(|p| p as u32),
                selected: true,
                seed: call.seed,
                message: call.message,
                reply: call.reply,
                outcome: TurnOutcome {
                    turn: call.turn,
                    local_reward: verdict.map_or(0.0, |v| v.local_reward(call.agent)),
                    team_reward,
                    done,
                    success: done && success,
                    ..TurnOutcome::blank(call.agent)
                },
            });
        }
        finished.push(Finished {
            task_index: episode.task_index,
            episode: episode.episode_index,
            success,
            tool_success: false,
            team_reward,
            turns: calls as u32,
            tokens,
            failure: episode.failure,
        });
    }
    Ok(Played { candidates, finished, model_seconds: model.as_secs_f64(), sandbox_seconds: 0.0, skipped: Vec::new() })
}
