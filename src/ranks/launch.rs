//! `--ranks N`: N local ranks of one petting command, started as `torchrun --standalone`
//! starts them (the same environment variables, a free port on loopback).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::Error;

/// How long the other ranks get to stop by themselves once one has failed (they fail
/// their next collective as soon as its connections close) before they are killed.
const GRACE: Duration = Duration::from_secs(30);

/// Runs `args` (a petting command line) as `ranks` local processes and waits for all;
/// an error names the first rank that failed. Each gets an equal share of the cores
/// unless OMP_NUM_THREADS is set.
pub fn run_local(ranks: u32, args: &[OsString]) -> Result<(), Error> {
    let port = free_port().map_err(|source| Error::Spawn { rank: 0, source })?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = std::env::var("OMP_NUM_THREADS").unwrap_or_else(|_| (cores / ranks as usize).max(1).to_string());
    let exe = std::env::current_exe().map_err(|source| Error::Spawn { rank: 0, source })?;
    let mut children = Vec::with_capacity(ranks as usize);
    for rank in 0..ranks {
        let mut command = Command::new(&exe);
        command
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_WORLD_SIZE", ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OMP_NUM_THREADS", &threads);
        // A rank outlives no launcher.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        match command.spawn() {
            Ok(child) => children.push(child),
            Err(source) => {
                kill_all(&mut children);
                return Err(Error::Spawn { rank, source });
            }
        }
    }
    wait_all(children)
}

/// Waits for every rank; after the first failure the rest get [`GRACE`] to stop.
fn wait_all(mut children: Vec<Child>) -> Result<(), Error> {
    let world = children.len() as u32;
    let mut running: Vec<Option<Child>> = children.drain(..).map(Some).collect();
    let mut failed: Option<(u32, ExitStatus)> = None;
    let mut deadline: Option<Instant> = None;
    while running.iter().any(Option::is_some) {
        for (rank, slot) in running.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Ok(Some(status)) = child.try_wait() {
                *slot = None;
                if !status.success() && failed.is_none() {
                    failed = Some((rank as u32, status));
                    deadline = Some(Instant::now() + GRACE);
                }
            }
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            running.iter_mut().flatten().for_each(|c| drop(c.kill()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match failed {
        None => Ok(()),
        Some((rank, status)) => Err(Error::RankFailed { rank, world, status: describe(status), code: status.code() }),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

fn kill_all(children: &mut [Child]) {
    for child in children {
        drop(child.kill());
        drop(child.wait());
    }
}

/// A port on loopback that was free a moment ago (torchrun --standalone picks its own
/// the same way).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
