//! The process-level part of the sandbox: what happens between `fork` and `exec`.
//!
//! Everything in the `pre_exec` closures runs in the child of a multi-threaded parent,
//! so it only makes raw system calls on data prepared before the fork (no allocation,
//! no locks).
//!
//! Full isolation, as root:
//! ```text
//!  petting ──fork──► intermediate (root)                    ──waits, exits with the same status
//!                     parent-death signal = SIGKILL
//!                     unshare(PID, mount, net, IPC, UTS)
//!                     / private; tmpfs on /tmp, /var/tmp, /dev/shm
//!                     ──fork──► PID 1 of the new namespace
//!                                parent-death signal = SIGKILL
//!                                rlimits, groups = [], gid = uid = throw-away, no_new_privs
//!                                exec python3
//! ```
//! Killing petting kills the intermediate (parent-death signal), killing the intermediate
//! kills PID 1 (likewise), and the kernel then kills every process left in the
//! namespace, so nothing a program starts outlives its run or petting.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::{Isolation, Status};

/// Resource limits of one run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub cpu_seconds: u64,
    pub memory_bytes: u64,
    pub max_processes: u64,
    pub file_size_bytes: u64,
    pub uid: u32,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Gives the run's directory to its uid, readable by nobody else.
pub fn hand_over(dir: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        std::os::unix::fs::chown(entry?.path(), Some(uid), Some(uid))?;
    }
    Ok(())
}

/// Scratch dirs every user may write to; each gets a private tmpfs in the run's mount
/// namespace, so what a program writes there vanishes with it.
const SCRATCH_DIRS: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// What the full-isolation child needs, prepared before the fork.
struct Mounts {
    scratch: Vec<CString>,
    /// The run's directory, which may lie inside a scratch dir the tmpfs hides: it is
    /// opened before the tmpfs is mounted and bound back at the same path.
    work: CString,
    /// Folders to create inside the tmpfs so that `work` has a place to be bound to.
    work_parents: Vec<CString>,
}

/// Sets up the command for the isolation level; `work` is the run's directory.
pub fn configure(command: &mut Command, isolation: Isolation, limits: Limits, work: &Path) {
    match isolation {
        Isolation::Full => {
            let c_path = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
            let scratch: Vec<&Path> = SCRATCH_DIRS.iter().map(Path::new).filter(|d| d.is_dir()).collect();
            let covering = scratch.iter().find(|d| work.starts_with(d));
            let work_parents = match covering {
                Some(top) => work.ancestors().skip(1).take_while(|a| a != top).map(c_path).collect::<Vec<_>>(),
                None => Vec::new(),
            };
            let mounts = Mounts {
                scratch: scratch.iter().map(|d| c_path(d)).collect(),
                work: c_path(work),
                work_parents: work_parents.into_iter().rev().collect(),
            };
            // The intermediate's parent-death signal fires when the *thread* that forked
            // it ends, not the process: `Sandbox::run` blocks its calling thread until
            // the child has been waited for, so that thread outlives the child unless
            // petting dies.
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: the closure only makes async-signal-safe system calls on data
            // allocated before the fork.
            unsafe {
                command.pre_exec(move || enter_full(&mounts, limits, parent));
            }
        }
        Isolation::Basic => {
            command.process_group(0);
            // SAFETY: as above.
            unsafe {
                command.pre_exec(move || enter_basic(limits));
            }
        }
    }
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: a valid pointer to a local struct.
    check(unsafe { libc::setrlimit(resource, &limit) })
}

fn set_common_limits(limits: Limits) -> io::Result<()> {
    set_limit(libc::RLIMIT_CPU, limits.cpu_seconds)?;
    set_limit(libc::RLIMIT_AS, limits.memory_bytes)?;
    set_limit(libc::RLIMIT_FSIZE, limits.file_size_bytes)?;
    set_limit(libc::RLIMIT_NOFILE, 256)?;
    set_limit(libc::RLIMIT_CORE, 0)
}

fn set_parent_death_signal() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) })
}

fn enter_full(mounts: &Mounts, limits: Limits, parent: libc::pid_t) -> io::Result<()> {
    // Should petting die, the intermediate dies with it, and PID 1 after it. Should
    // petting have died before the prctl, the parent is no longer petting: give up.
    set_parent_death_signal()?;
    // SAFETY (whole block): raw system calls with valid, NUL-terminated arguments.
    unsafe {
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        let flags =
            libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        check(libc::unshare(flags))?;
        let root = c"/";
        check(libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        // Opened inside the new mount namespace: a bind mount's source must be in it.
        let work_fd = libc::open(mounts.work.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC);
        check(work_fd)?;
        let tmpfs = c"tmpfs";
        let options = c"size=64m,mode=1777";
        for dir in &mounts.scratch {
            check(libc::mount(
                tmpfs.as_ptr(),
                dir.as_ptr(),
                tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            ))?;
        }
        // Bind the run's directory back where the program expects it.
        for dir in &mounts.work_parents {
            libc::mkdir(dir.as_ptr(), 0o755);
        }
        libc::mkdir(mounts.work.as_ptr(), 0o700);
        let mut fd_path = [0u8; 32];
        fd_link(work_fd, &mut fd_path);
        check(libc::mount(
            fd_path.as_ptr().cast(),
            mounts.work.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ))?;
        libc::close(work_fd);
        check(libc::chdir(mounts.work.as_ptr()))?;
        // Closes the window in which PID 1 has no parent-death signal (setuid clears
        // it): the intermediate holds the write end until it dies, so PID 1 sees the
        // read end hang up if the intermediate died before PID 1's final prctl.
        let mut alive = [0; 2];
        check(libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC))?;
        let pid = libc::fork();
        if pid == -1 {
            return Err(io::Error::last_os_error());
        }
        if pid > 0 {
            libc::close(alive[0]);
            intermediate(pid, alive[1]);
        }
        // PID 1 of the new namespace.
        libc::close(alive[1]);
        set_parent_death_signal()?;
        set_common_limits(limits)?;
        set_limit(libc::RLIMIT_NPROC, limits.max_processes)?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(limits.uid))?;
        check(libc::setuid(limits.uid))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        // Again after setuid, which clears the parent-death signal.
        set_parent_death_signal()?;
        let mut poll = libc::pollfd { fd: alive[0], events: libc::POLLIN, revents: 0 };
        if libc::poll(&mut poll, 1, 0) == -1 || poll.revents & libc::POLLHUP != 0 {
            libc::_exit(1);
        }
    }
    Ok(())
}

/// Writes `/proc/self/fd/<fd>` and a NUL into `out` without allocating.
fn fd_link(fd: libc::c_int, out: &mut [u8; 32]) {
    let prefix = b"/proc/self/fd/";
    out[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[prefix.len() + i] = digits[len - 1 - i];
    }
    out[prefix.len() + len] = 0;
}

/// PID 1 of the namespace, as the intermediate sees it (set in the intermediate only).
static NAMESPACE_INIT: AtomicI32 = AtomicI32::new(0);

/// The intermediate's SIGTERM handler: kill PID 1, whose end the intermediate then
/// waits for. The kernel lets PID 1 finish dying only once every other process of the
/// namespace is gone, so when the intermediate exits, nothing of the run is left.
extern "C" fn kill_namespace(_: libc::c_int) {
    let pid = NAMESPACE_INIT.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The intermediate process: closes everything but `alive` (so the parent sees EOF and
/// `exec` success as soon as the program has them), waits for the program and exits
/// the same way. `alive` stays open until it exits (see `enter_full`).
fn intermediate(pid: libc::pid_t, alive: libc::c_int) -> ! {
    NAMESPACE_INIT.store(pid, Ordering::Relaxed);
    // SAFETY: raw system calls; this process never returns to Rust code after the fork.
    unsafe {
        let handler: extern "C" fn(libc::c_int) = kill_namespace;
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        let alive = alive as u32;
        if alive > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, alive - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, alive + 1, u32::MAX, 0u32);
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) == -1 {
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &limit);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

fn enter_basic(limits: Limits) -> io::Result<()> {
    set_common_limits(limits)?;
    // Best effort: an unprivileged user namespace brings its own, empty network
    // namespace. Kernels or containers that forbid it leave the network as it is.
    // SAFETY: unshare has no memory-safety preconditions.
    unsafe {
        libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET);
    }
    Ok(())
}

/// Kills every process of a run.
pub fn kill_tree(child: &mut Child, isolation: Isolation) {
    match isolation {
        // The intermediate kills PID 1 and exits once the namespace is empty. Should it
        // not (it died early), killing it still kills PID 1 by the parent-death signal.
        Isolation::Full => {
            // SAFETY: signals our own child, which has not been reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
        }
        Isolation::Basic => {
            // SAFETY: signals the process group the child leads (process_group(0)).
            unsafe {
                libc::killpg(child.id() as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}

pub fn status_of(status: ExitStatus) -> Status {
    match (status.code(), status.signal()) {
        (Some(code), _) => Status::Exited(code),
        (None, Some(signal)) => Status::Signaled(signal),
        (None, None) => Status::Signaled(0),
    }
}
