//! A vLLM server petting starts for a run (`vllm.command`) and stops when the run's
//! process is done with it: one server per `pipeline run`, shared by its stages.
//!
//! The server gets a process group of its own, so stopping it stops the engine
//! processes it spawned; it is told to die with petting (PR_SET_PDEATHSIG), so a killed
//! petting leaves no server holding the port. Its output goes to a log file.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Error, LogHint, VllmClient, VllmConfig};

/// A started server process.
#[derive(Debug)]
pub struct ManagedServer {
    child: Child,
    log: PathBuf,
}

impl ManagedServer {
    /// Starts `config.command` with its output in `log`, and waits until `config.url`
    /// answers /health (an exit or the startup timeout is an error naming the log).
    pub async fn start(config: &VllmConfig, log: &Path) -> Result<ManagedServer, Error> {
        let command_line = config.command.join(" ");
        let start_error = |reason: String| Error::Start {
            command: command_line.clone(),
            reason,
            log: LogHint(Some(log.to_path_buf())),
        };
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| start_error(format!("cannot create {}: {e}", dir.display())))?;
        }
        let file = std::fs::File::create(log).map_err(|e| start_error(format!("cannot write its log: {e}")))?;
        let output = file.try_clone().map_err(|e| start_error(e.to_string()))?;
        let mut command = Command::new(&config.command[0]);
        command.args(&config.command[1..]).envs(&config.env).stdin(Stdio::null()).stdout(file).stderr(output);
        command.process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| start_error(e.to_string()))?;
        let mut server = ManagedServer { child, log: log.to_path_buf() };
        tracing::info!(command = command_line, log = %log.display(), "started the vLLM server");
        let client = VllmClient::new(&config.url, Duration::from_secs(5), LogHint::default());
        let started = Instant::now();
        let limit = Duration::from_secs(config.startup_timeout_seconds);
        while !client.healthy().await {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(start_error(format!("it exited ({status}) before answering {}/health", config.url)));
            }
            if started.elapsed() > limit {
                return Err(start_error(format!(
                    "{}/health did not answer within vllm.startup_timeout_seconds = {}",
                    config.url, config.startup_timeout_seconds
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "the vLLM server is up");
        Ok(server)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM to its process group, then SIGKILL after a grace period.
    fn stop(&mut self) {
        let group = -(self.child.id() as i32);
        // SAFETY: kill(2) with our own child's process group id.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if !self.running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above; the group may hold engine processes still shutting down.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for ManagedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The server a process keeps between its stages: started by the first stage that
/// samples through vLLM, stopped when the process drops the slot.
#[derive(Debug, Default)]
pub struct ServerSlot(tokio::sync::Mutex<Option<ManagedServer>>);

impl ServerSlot {
    /// A client of the run's server: the one at `vllm.url`, started first when the
    /// config gives a command and no live server of ours is there. `log_dir` holds the
    /// started server's log.
    pub async fn client(&self, config: &VllmConfig, log_dir: &Path) -> Result<VllmClient, Error> {
        let timeout = Duration::from_secs(config.request_timeout_seconds);
        if config.command.is_empty() {
            return Ok(VllmClient::new(&config.url, timeout, LogHint::default()));
        }
        let mut slot = self.0.lock().await;
        if slot.as_mut().is_none_or(|s| !s.running()) {
            // A server of ours that died is replaced; its log stays.
            drop(slot.take());
            let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S");
            let log = log_dir.join(format!("vllm-{stamp}-{}.log", std::process::id()));
            *slot = Some(ManagedServer::start(config, &log).await?);
        }
        let log = slot.as_ref().map(|s| s.log().to_path_buf());
        Ok(VllmClient::new(&config.url, timeout, LogHint(log)))
    }
}
