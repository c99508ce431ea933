//! The process-level part of the sandbox: what happens between `fork` and `exec`.
//!
//! Everything in the `pre_exec` closures runs in the child of a multi-threaded parent,
//! so it only makes raw system calls on data prepared before the fork (no allocation,
//! no locks): every path is a `CString` of a [`Step`] listed beforehand.
//!
//! Full isolation, as root:
//! ```text
//!  petting ──fork──► intermediate (root)                    ──waits, exits with the same status
//!                     parent-death signal = SIGKILL
//!                     unshare(PID, mount, net, IPC, UTS)
//!                     / private; tmpfs on the staging folder, and in it the new root:
//!                       /usr /bin /lib … (read-only binds, or the symlinks they are)
//!                       the interpreter's own folders (read-only binds)
//!                       /etc: ld.so.cache, localtime, alternatives only
//!                       /dev: null zero random urandom, fd/std* links, tmpfs on /dev/shm
//!                       tmpfs on /tmp, an empty /proc, the run's folder (read-write)
//!                     new root read-only; pivot_root into it; old root detached
//!                     ──fork──► PID 1 of the new namespace
//!                                parent-death signal = SIGKILL
//!                                fresh procfs on /proc (this namespace's processes only)
//!                                rlimits, groups = [], gid = uid = throw-away, no_new_privs
//!                                exec python3
//! ```
//! Killing petting kills the intermediate (parent-death signal), killing the intermediate
//! kills PID 1 (likewise), and the kernel then kills every process left in the
//! namespace, so nothing a program starts outlives its run or petting.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
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

/// The host's top-level system folders, bound read-only (or recreated as the symlinks
/// they are on merged-/usr systems, e.g. /bin -> usr/bin): the interpreter, its
/// libraries and the commands a program may run (`sleep`, `python3 -c`).
const SYSTEM_DIRS: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// The only entries of the host's /etc in the new root, all free of host secrets:
/// ld.so.cache (how the dynamic linker finds libraries), localtime (`time.localtime`)
/// and alternatives (Debian's symlinks behind commands such as `awk`). Left out on
/// purpose: passwd, group and shadow (the host's accounts; the throw-away uid has
/// none, and Python needs none to start), hostname, hosts and resolv.conf (the host's
/// name and network, of which a run has none).
const ETC_ENTRIES: [&str; 3] = ["/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"];

/// Device nodes a program may use, each bound onto an empty file.
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// The usual /dev symlinks into the run's own procfs (`open('/dev/stdout', 'w')`).
const DEV_LINKS: [(&str, &str); 4] = [
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// Scratch folders: a private tmpfs each, so what a program writes there vanishes
/// with the run.
const SCRATCH_DIRS: [&str; 2] = ["/tmp", "/dev/shm"];
const SCRATCH_OPTIONS: &CStr = c"size=64m,mode=1777";
/// The new root itself holds only mount points and empty files.
const ROOT_OPTIONS: &CStr = c"size=1m,mode=0755";

/// One step of building the new root, run in order in the child. Paths are inside the
/// staging folder (the new root before pivot_root); sources are host paths.
#[derive(Debug, Clone)]
enum Step {
    /// A folder (already existing is fine: a mount point made by an earlier step).
    Dir(CString),
    /// An empty file, for a file or device to be bound onto.
    File(CString),
    Symlink {
        target: CString,
        link: CString,
    },
    /// A bind mount, not recursive (mounts below the source stay hidden). `remount` is
    /// the flags of the read-only remount that follows, None for a writable bind.
    Bind {
        source: CString,
        target: CString,
        remount: Option<libc::c_ulong>,
    },
    Tmpfs(CString),
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL in a path")
}

/// The steps of a new root being planned (before any fork).
#[derive(Debug, Clone)]
struct Plan {
    staging: PathBuf,
    steps: Vec<Step>,
    /// Paths of the new root that exist once the steps so far have run.
    created: HashSet<PathBuf>,
}

impl Plan {
    /// `path` (absolute, as the program sees it) inside the staging folder.
    fn inside(&self, path: &Path) -> CString {
        c_path(&self.staging.join(path.strip_prefix("/").unwrap_or(path)))
    }

    /// Creates `path` and its missing ancestors, like `mkdir -p`.
    fn dir_all(&mut self, path: &Path) {
        let missing: Vec<&Path> = path.ancestors().take_while(|a| !self.created.contains(*a)).collect();
        for dir in missing.into_iter().rev() {
            self.steps.push(Step::Dir(self.inside(dir)));
            self.created.insert(dir.to_path_buf());
        }
    }

    /// Binds the host's `path` at the same path, read-only unless `writable`.
    fn bind(&mut self, path: &Path, writable: bool) {
        if path.is_dir() {
            self.dir_all(path);
        } else {
            self.dir_all(path.parent().unwrap_or(Path::new("/")));
            self.steps.push(Step::File(self.inside(path)));
            self.created.insert(path.to_path_buf());
        }
        let source = c_path(path);
        let remount = (!writable).then(|| read_only_remount_flags(&source));
        self.steps.push(Step::Bind { source, target: self.inside(path), remount });
    }

    /// Recreates the host's entry at `path` as it is: a symlink as the same symlink,
    /// anything else bound read-only. Absent entries are skipped.
    fn copy_or_bind(&mut self, path: &Path) {
        let Ok(meta) = path.symlink_metadata() else { return };
        if meta.file_type().is_symlink() {
            let Ok(target) = std::fs::read_link(path) else { return };
            self.symlink(path, &target);
        } else {
            self.bind(path, false);
        }
    }

    fn symlink(&mut self, link: &Path, target: &Path) {
        self.dir_all(link.parent().unwrap_or(Path::new("/")));
        self.steps.push(Step::Symlink { target: c_path(target), link: self.inside(link) });
        self.created.insert(link.to_path_buf());
    }

    fn tmpfs(&mut self, path: &Path) {
        self.dir_all(path);
        self.steps.push(Step::Tmpfs(self.inside(path)));
    }
}

/// A read-only remount of a bind must repeat the source mount's nodev, noexec and atime
/// flags: the kernel refuses to clear them where they are locked (in a user namespace).
/// nosuid is added; nodev is not, so the bound device nodes keep working.
fn read_only_remount_flags(source: &CStr) -> libc::c_ulong {
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID;
    // SAFETY: statvfs is plain old data, for which all zeroes is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a pointer to a local struct.
    if unsafe { libc::statvfs(source.as_ptr(), &mut stat) } == 0 {
        let kept = [
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ];
        for (st, ms) in kept {
            if stat.f_flag & st != 0 {
                flags |= ms;
            }
        }
    }
    flags
}

/// The minimal root every run of a sandbox gets, planned once in `Sandbox::new`; each
/// run adds its own folder ([`Root::mounts`]).
#[derive(Debug)]
pub struct Root {
    /// An empty host folder that each run's new root is mounted on, inside the run's
    /// mount namespace only: the host always sees it empty.
    _staging: tempfile::TempDir,
    plan: Plan,
}

impl Root {
    /// Plans the root; `interpreter_dirs` are the folders the interpreter needs beside
    /// the system folders (a venv, a pyenv prefix), bound read-only.
    pub fn new(interpreter_dirs: &[PathBuf]) -> io::Result<Root> {
        let staging = tempfile::Builder::new().prefix("petting-root-").tempdir()?;
        let mut plan =
            Plan { staging: staging.path().to_path_buf(), steps: Vec::new(), created: HashSet::from(["/".into()]) };
        for dir in SYSTEM_DIRS {
            plan.copy_or_bind(Path::new(dir));
        }
        for entry in ETC_ENTRIES {
            plan.copy_or_bind(Path::new(entry));
        }
        for device in DEVICES.map(Path::new).into_iter().filter(|d| d.exists()) {
            plan.bind(device, false);
        }
        for (link, target) in DEV_LINKS {
            plan.symlink(Path::new(link), Path::new(target));
        }
        for dir in SCRATCH_DIRS {
            plan.tmpfs(Path::new(dir));
        }
        // The mount point of the procfs that PID 1 mounts.
        plan.dir_all(Path::new("/proc"));
        // After the scratch tmpfs mounts, so that a folder below /tmp is created in the
        // new /tmp rather than hidden under it.
        for dir in uncovered(interpreter_dirs) {
            plan.bind(&dir, false);
        }
        Ok(Root { _staging: staging, plan })
    }

    /// What the child of one run needs: the root's steps and `work` bound read-write
    /// at its own path.
    fn mounts(&self, work: &Path) -> Mounts {
        let mut plan = self.plan.clone();
        plan.bind(work, true);
        Mounts { staging: c_path(&plan.staging), steps: plan.steps, work: c_path(work) }
    }
}

/// The interpreter folders that exist and are not already inside a system folder or
/// another of them, ancestors first. The host root itself is never bound: that would
/// undo the sandbox.
fn uncovered(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<&PathBuf> =
        dirs.iter().filter(|d| d.is_absolute() && d.parent().is_some() && d.is_dir()).collect();
    dirs.sort_by_key(|d| d.components().count());
    let mut kept: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let covered = SYSTEM_DIRS.iter().any(|s| dir.starts_with(s)) || kept.iter().any(|k| dir.starts_with(k));
        if !covered {
            kept.push(dir.clone());
        }
    }
    kept
}

/// What the full-isolation child needs, prepared before the fork.
struct Mounts {
    /// The host folder the new root's tmpfs is mounted on.
    staging: CString,
    steps: Vec<Step>,
    /// The run's folder, the program's working directory.
    work: CString,
}

/// Sets up the command for full isolation; `work` is the run's directory.
pub fn configure_full(command: &mut Command, limits: Limits, root: &Root, work: &Path) {
    let mounts = root.mounts(work);
    // The intermediate's parent-death signal fires when the *thread* that forked it
    // ends, not the process: `Sandbox::run` blocks its calling thread until the child
    // has been waited for, so that thread outlives the child unless petting dies.
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes async-signal-safe system calls on data
    // allocated before the fork.
    unsafe {
        command.pre_exec(move || enter_full(&mounts, limits, parent));
    }
}

/// Sets up the command for basic isolation.
pub fn configure_basic(command: &mut Command, limits: Limits) {
    command.process_group(0);
    // SAFETY: as above.
    unsafe {
        command.pre_exec(move || enter_basic(limits));
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

/// Runs one step of building the new root.
fn run_step(step: &Step) -> io::Result<()> {
    // SAFETY (whole function): raw system calls with valid, NUL-terminated arguments.
    unsafe {
        match step {
            Step::Dir(path) => {
                if libc::mkdir(path.as_ptr(), 0o755) == -1 && *libc::__errno_location() != libc::EEXIST {
                    return Err(io::Error::last_os_error());
                }
            }
            Step::File(path) => {
                let fd = libc::open(path.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                check(fd)?;
                libc::close(fd);
            }
            Step::Symlink { target, link } => check(libc::symlink(target.as_ptr(), link.as_ptr()))?,
            Step::Bind { source, target, remount } => {
                let none = std::ptr::null();
                check(libc::mount(source.as_ptr(), target.as_ptr(), none, libc::MS_BIND, none.cast()))?;
                if let Some(flags) = remount {
                    check(libc::mount(none, target.as_ptr(), none, *flags, none.cast()))?;
                }
            }
            Step::Tmpfs(path) => check(libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                SCRATCH_OPTIONS.as_ptr().cast(),
            ))?,
        }
    }
    Ok(())
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
        let none = std::ptr::null();
        check(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()))?;

        // The new root: a tmpfs on the staging folder, filled by the planned steps, then
        // read-only (the program may write only to its folder and the scratch tmpfs).
        let tmpfs = c"tmpfs";
        let staging = mounts.staging.as_ptr();
        check(libc::mount(
            tmpfs.as_ptr(),
            staging,
            tmpfs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            ROOT_OPTIONS.as_ptr().cast(),
        ))?;
        for step in &mounts.steps {
            run_step(step)?;
        }
        let read_only = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
        check(libc::mount(none, staging, none, read_only, none.cast()))?;

        // pivot_root(".", ".") stacks the old root on the new one; detaching it leaves
        // no path to any host file that was not bound in.
        check(libc::chdir(staging))?;
        check(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int)?;
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
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
        // Only a process inside the new PID namespace mounts a procfs of it; it shows
        // this run's processes and none of the host's.
        check(libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            none.cast(),
        ))?;
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
        crate::contain::exit_as(status)
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
