//! Programs petting starts (agent programs, environment hosts) and everything they
//! start, ended together, and ended when petting dies, however it dies.
//!
//! ```text
//!  petting ──spawn──► supervisor                  keeps only the lifeline's read end
//!                       unshare(PID namespace)     (and a user namespace when not root)
//!                       fork ──► the program       PID 1 of the new namespace,
//!                       │                          parent-death signal SIGKILL, exec
//!                       ├─ waits for it, exits as it did
//!                       └─ the lifeline hangs up (petting died) ─► SIGKILL to the program
//! ```
//!
//! * When PID 1 of a namespace ends, the kernel kills every process left in it, whatever
//!   session or process group it made for itself: nothing the program started outlives
//!   it, and nothing it started can hold its stdout open after it.
//! * Killing the supervisor (a timeout, the end of a stage) kills the program by its
//!   parent-death signal. The supervisor is single-threaded, so that signal, which Linux
//!   ties to the thread that forked, fires exactly when the supervisor ends.
//! * The lifeline is a pipe whose write end petting alone holds and never writes: when
//!   petting ends, even by SIGKILL, the kernel closes it and every supervisor sees it
//!   hang up. A parent-death signal on the supervisor would not do: it fires when the
//!   thread that spawned it ends, and tokio ends idle threads.
//!
//! Where no PID namespace can be made (not root, and the kernel forbids unprivileged
//! user namespaces), the program stays in the supervisor's process group, which the
//! supervisor kills when petting dies; a process that leaves that group can then
//! outlive the program.
//!
//! Everything between fork and exec makes raw system calls on data prepared before the
//! fork: the parent is multi-threaded, so the child may not allocate or lock.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::OnceLock;

/// The read end of the lifeline; its write end stays open in petting until it ends.
fn lifeline() -> RawFd {
    static LIFELINE: OnceLock<RawFd> = OnceLock::new();
    *LIFELINE.get_or_init(|| {
        let mut fds = [0; 2];
        // SAFETY: a valid pointer to two ints. Both ends close on exec, so no program
        // inherits the write end; the supervisors close it themselves.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(made, 0, "cannot make the lifeline pipe: {}", io::Error::last_os_error());
        fds[0]
    })
}

/// What the supervisor writes to map the program's user to itself in a new user
/// namespace (not root), prepared before the fork.
struct UserMaps {
    uid_map: CString,
    gid_map: CString,
}

/// Makes `command` start under a supervisor, as the module doc says. Call before spawn;
/// the spawned child is the supervisor, and killing it (or its process group) kills the
/// program and everything it started.
pub fn contain(command: &mut Command) {
    let lifeline = lifeline();
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let maps = (uid != 0).then(|| UserMaps {
        uid_map: CString::new(format!("{uid} {uid} 1\n")).expect("no NUL"),
        gid_map: CString::new(format!("{gid} {gid} 1\n")).expect("no NUL"),
    });
    command.process_group(0);
    // SAFETY: the closure only makes async-signal-safe system calls on data prepared
    // before the fork.
    unsafe {
        command.pre_exec(move || supervise(lifeline, maps.as_ref()));
    }
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Runs in the spawned child: returns (and so execs) only in the program's process.
fn supervise(lifeline: RawFd, maps: Option<&UserMaps>) -> io::Result<()> {
    // SAFETY (whole function): raw system calls with valid arguments.
    unsafe {
        let flags = if maps.is_some() { libc::CLONE_NEWUSER | libc::CLONE_NEWPID } else { libc::CLONE_NEWPID };
        if libc::unshare(flags) == 0
            && let Some(maps) = maps
        {
            write_file(c"/proc/self/setgroups", c"deny");
            write_file(c"/proc/self/uid_map", &maps.uid_map);
            write_file(c"/proc/self/gid_map", &maps.gid_map);
        }
        let program = libc::fork();
        if program == -1 {
            return Err(io::Error::last_os_error());
        }
        if program == 0 {
            // The program (PID 1 of the namespace, where one was made) dies with its
            // supervisor. Should the supervisor die before this line, which only a kill
            // in these microseconds could do, the program is still in its group.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
            return Ok(());
        }
        watch(program, lifeline)
    }
}

/// Writes `text` to `path`; best effort (a map that cannot be written leaves the
/// program as the overflow user, which the fallback then covers).
unsafe fn write_file(path: &std::ffi::CStr, text: &std::ffi::CStr) {
    // SAFETY: NUL-terminated paths and a buffer of its own length.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, text.as_ptr().cast(), text.to_bytes().len());
            libc::close(fd);
        }
    }
}

/// The supervisor: closes everything but the lifeline (so petting sees the program's
/// pipes end with the program, and exec succeed once the program has exec'd), then
/// waits for the program and exits as it did; kills it if petting ends first.
fn watch(program: libc::pid_t, lifeline: RawFd) -> ! {
    // SAFETY: raw system calls; this process never returns to Rust code after the fork.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, (lifeline - 1) as u32, 0u32);
        libc::syscall(libc::SYS_close_range, (lifeline + 1) as u32, u32::MAX, 0u32);
        let mut hung_up = false;
        loop {
            if !hung_up {
                let mut poll = libc::pollfd { fd: lifeline, events: libc::POLLIN, revents: 0 };
                if libc::poll(&mut poll, 1, 100) > 0 && poll.revents != 0 {
                    hung_up = true;
                    // The program's group is this one (where no namespace was made, all
                    // the program left in it); the supervisor ends with it.
                    libc::kill(-libc::getpgrp(), libc::SIGKILL);
                }
            } else {
                libc::usleep(10_000);
            }
            let mut status = 0;
            match libc::waitpid(program, &mut status, libc::WNOHANG) {
                0 => continue,
                -1 if *libc::__errno_location() == libc::EINTR => continue,
                -1 => libc::_exit(127),
                _ => exit_as(status),
            }
        }
    }
}

/// Ends this process the way the process whose wait status is `status` ended: by the
/// same signal (without a core dump), or with the same exit code. For a process that
/// stands in for its child, after a fork and before any exec.
///
/// # Safety
/// Only raw system calls: safe in a forked child of a multi-threaded process.
pub unsafe fn exit_as(status: libc::c_int) -> ! {
    // SAFETY: raw system calls on this process.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    /// Whether a process whose command line holds `marker` runs.
    fn running(marker: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // A zombie waits only to be reaped: it runs nothing.
            String::from_utf8_lossy(&cmdline).contains(marker) && !state.contains(") Z ")
        })
    }

    fn wait_until_gone(marker: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(marker) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    #[test]
    fn the_exit_status_and_the_output_are_the_programs() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 7"]).stdout(Stdio::piped()).stderr(Stdio::piped());
        contain(&mut command);
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(7));
        assert_eq!((output.stdout.as_slice(), output.stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
        let mut missing = Command::new("/nonexistent/program");
        contain(&mut missing);
        assert!(missing.spawn().is_err(), "a program that cannot exec is an error of spawn");
    }

    #[test]
    fn what_a_program_starts_in_its_own_session_ends_with_it_and_frees_its_stdout() {
        // The background sleep holds stdout open and leaves the process group.
        let marker = "317.4242";
        let mut command = Command::new("sh");
        command.args(["-c", &format!("setsid sleep {marker} & echo started")]).stdout(Stdio::piped());
        contain(&mut command);
        let output = command.output().unwrap();
        assert_eq!(output.stdout, b"started\n", "stdout ends with the program");
        assert!(wait_until_gone(marker), "the sleep in its own session outlived its program");
    }

    #[test]
    fn killing_the_supervisor_kills_everything_the_program_started() {
        let marker = "318.4242";
        let mut command = Command::new("sh");
        command.args(["-c", &format!("setsid sleep {marker} & sleep {marker}")]);
        contain(&mut command);
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !running(marker) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(wait_until_gone(marker));
    }
}
