//! The lanes `pipeline run` starts beside itself when a run overlaps (pipeline::lanes):
//! copies of this very command line with `--lane`, which outlive no parent.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use petting::pipeline::Lane;

/// Set in a lane's environment: it was started by `pipeline run`, whose terminal it shares.
pub const STARTED_BY_RUN: &str = "PETTING_LANE_OF_RUN";

/// The lane processes of a run; those still running are killed when it is dropped.
pub struct Lanes {
    children: Vec<(Lane, Option<Child>)>,
}

impl Lanes {
    /// Starts `lanes`, each as this command line with `--lane`, sharing the cores with
    /// this process unless OMP_NUM_THREADS says otherwise.
    pub fn start(lanes: &[Lane]) -> anyhow::Result<Lanes> {
        let exe = std::env::current_exe()?;
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads =
            std::env::var("OMP_NUM_THREADS").unwrap_or_else(|_| (cores / (lanes.len() + 1)).max(1).to_string());
        let mut started = Lanes { children: Vec::new() };
        for &lane in lanes {
            let mut command = Command::new(&exe);
            command.args(&args).arg("--lane").arg(lane.to_string()).env("OMP_NUM_THREADS", &threads);
            command.env(STARTED_BY_RUN, "1");
            // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = command.spawn().map_err(|e| anyhow::anyhow!("cannot start the {lane} lane: {e}"))?;
            started.children.push((lane, Some(child)));
        }
        Ok(started)
    }

    /// Resolves when a lane fails, with an error naming it; never while all succeed.
    pub async fn first_failure(&mut self) -> anyhow::Error {
        loop {
            for (lane, slot) in &mut self.children {
                let Some(child) = slot else { continue };
                match child.try_wait() {
                    Ok(Some(status)) => {
                        *slot = None;
                        if !status.success() {
                            return failed(*lane, status);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return anyhow::anyhow!("the {lane} lane: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for every lane to end; an error names the first that failed.
    pub fn wait(mut self) -> anyhow::Result<()> {
        for (lane, slot) in &mut self.children {
            if let Some(mut child) = slot.take() {
                let status = child.wait()?;
                if !status.success() {
                    return Err(failed(*lane, status));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        for (_, slot) in &mut self.children {
            if let Some(mut child) = slot.take() {
                drop(child.kill());
                drop(child.wait());
            }
        }
    }
}

/// A lane's failure, refused (exit status 3) as the lane's own was.
fn failed(lane: Lane, status: ExitStatus) -> anyhow::Error {
    let message = format!(
        "the {lane} lane of the run failed ({status}); its error is above, and the run resumes from its commits"
    );
    match status.code() {
        Some(3) => super::exit::Refused(message).into(),
        _ => anyhow::Error::msg(message),
    }
}
