//! Runs untrusted Python (tool agents, coders, testers) in a separate, contained process.
//!
//! ```text
//!  Sandbox::new                    finds python3, asks it once where it is installed
//!                                  (sys.prefix, sys.base_prefix, the real executable)
//!  Sandbox::run(program)           (any thread; at most `max_parallel` at once)
//!    ├─ fresh temp dir, files written, owned by a throw-away uid
//!    ├─ spawn  python3 -s -B -u main.py   env cleared, cwd = temp dir
//!    │    full isolation (root):   new PID + mount + network + IPC + UTS namespaces,
//!    │                             a minimal root (pivot_root, old root detached):
//!    │                               /usr /bin /lib /lib64 /sbin, the interpreter's
//!    │                               prefixes                    read-only
//!    │                               /etc: ld.so.cache localtime alternatives only
//!    │                               /dev: null zero random urandom; /dev/shm, /tmp tmpfs
//!    │                               /proc: the run's own PID namespace only
//!    │                               the temp dir, at its own path     read-write
//!    │                             unprivileged uid, no_new_privs, rlimits (CPU, address
//!    │                             space, processes, file size, open files, core)
//!    │    basic isolation (other): own process group, rlimits except processes, and a
//!    │                             new user + network namespace when the kernel allows it
//!    ├─ stdin written, stdout/stderr read concurrently and capped
//!    └─ wall-clock deadline: the whole process tree is killed
//! ```
//!
//! How each threat is met with full isolation (the tests in `tests.rs` prove each one):
//! * **Reading the answers**: no host path is reachable but the system folders, the
//!   interpreter's own and the run's folder. The run's dataset files (every task's
//!   reference answer), the repository, other runs' folders, the host's accounts
//!   (/etc/passwd) and the host's processes (/proc shows only the run's) are not there.
//! * **Infinite loop**: the wall-clock deadline kills it (and RLIMIT_CPU backs it up).
//! * **Memory bomb**: RLIMIT_AS makes allocations fail; Python raises `MemoryError`.
//! * **Fork bomb**: RLIMIT_NPROC counts the processes of the run's uid, which no other
//!   run shares, so forks fail past `max_processes`. The program is PID 1 of its own PID
//!   namespace; when it exits or is killed the kernel kills everything left inside.
//! * **Outliving petting**: each process between petting and the program has a
//!   parent-death signal, so a kill -9 of petting ends the run's whole namespace too.
//! * **Writes outside the temp dir**: the root is read-only and holds no host folder
//!   that may be written to (no /run/lock, /var/tmp); /tmp and /dev/shm are private
//!   tmpfs mounts that vanish with the run, and the uid owns nothing but the temp dir.
//!   RLIMIT_FSIZE caps each file it writes.
//! * **Network**: the new network namespace has only a loopback interface that is down,
//!   so even 127.0.0.1 is unreachable.
//! * **Output floods**: at most `output_limit` bytes of each stream are kept; the rest is
//!   read and dropped so the program never blocks on a full pipe.
//!
//! Full isolation needs root (CI and the project's machines run as root). Otherwise the
//! sandbox is best effort and says so ([`Isolation::Basic`]): the process group is
//! killed at the deadline, memory, CPU and file size are limited, and the network is
//! cut where unprivileged user namespaces are allowed; forks are not limited (RLIMIT_NPROC
//! would count all of the user's own processes), and reads and writes are limited only
//! by the user's own permissions (the whole file system is visible).
//!
//! Programs run with `PYTHONHASHSEED=0`, so a program's output is reproducible.

mod isolate;
#[cfg(test)]
mod tests;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A problem setting up or starting a sandboxed run. What the program itself does
/// (errors, timeouts, crashes) is a [`RunOutput`], not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("no Python interpreter found: {tried}; install python3 or set the sandbox's python path")]
    NoPython { tried: String },

    #[error("cannot prepare the sandbox directory {dir}: {source}")]
    WorkDir { dir: PathBuf, source: std::io::Error },

    #[error("cannot start {python} in the sandbox: {source}")]
    Spawn { python: PathBuf, source: std::io::Error },

    #[error("the sandbox's self-test failed ({python} printing a line): {detail}")]
    SelfTest { python: PathBuf, detail: String },

    #[error("cannot ask {python} where it is installed: {detail}")]
    Prefixes { python: PathBuf, detail: String },

    #[error("cannot prepare the sandbox's root: {source}")]
    Root { source: std::io::Error },
}

/// Limits of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    /// Wall-clock limit of a run that sets none (math tool programs and code tests set
    /// their own: `env.tool_timeout_seconds`, `env.test_timeout_seconds`).
    pub timeout: Duration,
    /// Address-space limit of every process of a run.
    pub memory_bytes: u64,
    /// Processes and threads a run may have at once (full isolation only).
    pub max_processes: u64,
    /// Largest file a run may write.
    pub file_size_bytes: u64,
    /// Bytes of stdout and of stderr kept; the rest is dropped.
    pub output_limit: usize,
    /// Runs allowed at once; further calls wait for a free slot.
    pub max_parallel: usize,
    /// The interpreter; when None, /usr/bin/python3, else the first python3 on PATH.
    pub python: Option<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            timeout: Duration::from_secs(20),
            memory_bytes: 1 << 30,
            max_processes: 32,
            file_size_bytes: 16 << 20,
            output_limit: 64 << 10,
            max_parallel: std::thread::available_parallelism().map_or(2, |n| n.get()).max(2),
            python: None,
        }
    }
}

/// How strongly runs are contained (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Root: namespaces, a throw-away uid, all rlimits.
    Full,
    /// Not root: process group, rlimits except processes, network cut where allowed.
    Basic,
}

/// One program to run.
#[derive(Debug, Clone, Default)]
pub struct Program {
    /// The Python source run as `main.py`.
    pub code: String,
    /// Other files written next to it (name, contents); names must be plain file names.
    pub files: Vec<(String, String)>,
    /// Standard input.
    pub stdin: String,
    /// Overrides the sandbox's wall-clock limit for this run.
    pub timeout: Option<Duration>,
}

impl Program {
    pub fn new(code: impl Into<String>) -> Program {
        Program { code: code.into(), ..Program::default() }
    }

    pub fn with_stdin(mut self, stdin: impl Into<String>) -> Program {
        self.stdin = stdin.into();
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Program {
        self.timeout = Some(timeout);
        self
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The program exited with this code.
    Exited(i32),
    /// The program was killed by this signal (e.g. 9 by RLIMIT_CPU's hard limit).
    Signaled(i32),
    /// The wall-clock limit passed and the program was killed.
    TimedOut,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutput {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
    /// More stdout was written than `output_limit`.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub elapsed: Duration,
}

impl RunOutput {
    /// Exited with code 0.
    pub fn ok(&self) -> bool {
        self.status == Status::Exited(0)
    }

    /// The last line of stderr (a traceback's error line), for short feedback.
    pub fn error_line(&self) -> String {
        match self.status {
            Status::TimedOut => "timeout".to_string(),
            _ => self.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string(),
        }
    }
}

/// A bounded pool of sandboxed Python runs. Cheap to share (`Arc<Sandbox>`); `run` may
/// be called from many threads at once.
#[derive(Debug)]
pub struct Sandbox {
    config: SandboxConfig,
    python: PathBuf,
    isolation: Isolation,
    /// The minimal root of each run (full isolation only).
    root: Option<isolate::Root>,
    /// Free slots; a slot's index picks the run's uid, so concurrent runs never share one.
    free: Mutex<Vec<usize>>,
    freed: Condvar,
    uid_base: u32,
}

/// The uids of the throw-away users start here (far above normal accounts).
const UID_RANGE_START: u32 = 200_000;
/// Slots of one sandbox; more parallel runs than this wait.
const MAX_SLOTS: u32 = 64;
/// Sandboxes of one process with distinct uid ranges.
const SANDBOXES_PER_PROCESS: u32 = 16;

/// Numbers the sandboxes of this process, so that each gets its own uid range.
static SANDBOXES_CREATED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Sandbox {
    /// Finds the interpreter, picks the isolation level and checks that a program runs.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, Error> {
        let python = find_python(config.python.as_deref())?;
        let slots = config.max_parallel.clamp(1, MAX_SLOTS as usize);
        // Distinct processes and sandboxes get distinct uid ranges, so no two runs at
        // once share a uid (and with it an RLIMIT_NPROC count).
        let instance = SANDBOXES_CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let uid_base = uid_base(std::process::id(), instance);
        let (isolation, root) = if isolate::is_root() {
            let dirs = interpreter_dirs(&python)?;
            (Isolation::Full, Some(isolate::Root::new(&dirs).map_err(|source| Error::Root { source })?))
        } else {
            (Isolation::Basic, None)
        };
        let sandbox = Sandbox {
            config,
            python,
            isolation,
            root,
            free: Mutex::new((0..slots).rev().collect()),
            freed: Condvar::new(),
            uid_base,
        };
        let probe = sandbox.run(&Program::new("print('ok')").with_timeout(Duration::from_secs(20)))?;
        if probe.stdout.trim() != "ok" {
            return Err(Error::SelfTest {
                python: sandbox.python.clone(),
                detail: format!("{:?}, stderr: {}", probe.status, probe.stderr.trim()),
            });
        }
        Ok(sandbox)
    }

    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    pub fn python(&self) -> &Path {
        &self.python
    }

    /// Runs a program to completion or to its deadline. Blocks while all slots are busy.
    pub fn run(&self, program: &Program) -> Result<RunOutput, Error> {
        let slot = self.acquire();
        let result = self.run_in_slot(program, slot);
        self.release(slot);
        result
    }

    fn acquire(&self) -> usize {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(slot) = free.pop() {
                return slot;
            }
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, slot: usize) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        self.freed.notify_one();
    }

    fn run_in_slot(&self, program: &Program, slot: usize) -> Result<RunOutput, Error> {
        let uid = self.uid_base + slot as u32;
        let dir = tempfile::Builder::new()
            .prefix("petting-sandbox-")
            .tempdir()
            .map_err(|source| Error::WorkDir { dir: std::env::temp_dir(), source })?;
        let work = dir.path().to_path_buf();
        let work_error = |source| Error::WorkDir { dir: work.clone(), source };
        write_files(&work, program).map_err(work_error)?;
        if self.isolation == Isolation::Full {
            isolate::hand_over(&work, uid).map_err(work_error)?;
        }

        let timeout = program.timeout.unwrap_or(self.config.timeout);
        let limits = isolate::Limits {
            cpu_seconds: timeout.as_secs() + 2,
            memory_bytes: self.config.memory_bytes,
            max_processes: self.config.max_processes,
            file_size_bytes: self.config.file_size_bytes,
            uid,
        };
        let mut command = Command::new(&self.python);
        command
            .args(["-s", "-B", "-u", "main.py"])
            .current_dir(&work)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &work)
            .env("LANG", "C.UTF-8")
            .env("PYTHONHASHSEED", "0")
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match &self.root {
            Some(root) => isolate::configure_full(&mut command, limits, root, &work),
            None => isolate::configure_basic(&mut command, limits),
        }

        let started = Instant::now();
        let mut child = command.spawn().map_err(|source| Error::Spawn { python: self.python.clone(), source })?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let input = program.stdin.clone();
        // Written from its own thread: a program that never reads must not block us.
        std::thread::spawn(move || {
            // The CLI makes SIGPIPE fatal (`petting sql … | head`); a program that exits
            // without reading its input must only fail this write, not end petting.
            block_sigpipe_in_this_thread();
            let mut stdin = stdin;
            let _ = stdin.write_all(input.as_bytes());
        });
        let limit = self.config.output_limit;
        let stdout = spawn_reader(child.stdout.take().expect("stdout is piped"), limit);
        let stderr = spawn_reader(child.stderr.take().expect("stderr is piped"), limit);

        let status = wait_until(&mut child, started + timeout);
        let status = match status {
            Some(status) => status,
            None => {
                isolate::kill_tree(&mut child, self.isolation);
                let _ = child.wait();
                Status::TimedOut
            }
        };
        // Anything the program left behind dies with it (the PID namespace does this in
        // full isolation; the process group here covers basic isolation).
        if self.isolation == Isolation::Basic {
            isolate::kill_tree(&mut child, self.isolation);
        }
        let elapsed = started.elapsed();
        let (stdout, stdout_truncated) = collect(stdout);
        let (stderr, stderr_truncated) = collect(stderr);
        Ok(RunOutput { status, stdout, stderr, stdout_truncated, stderr_truncated, elapsed })
    }
}

/// The first uid of the `instance`-th sandbox of process `pid`; its slots use the
/// `MAX_SLOTS` uids from there.
fn uid_base(pid: u32, instance: u32) -> u32 {
    UID_RANGE_START + ((pid % 4096) * SANDBOXES_PER_PROCESS + instance % SANDBOXES_PER_PROCESS) * MAX_SLOTS
}

fn find_python(configured: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(path) = configured {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(Error::NoPython { tried: path.display().to_string() })
        };
    }
    // The system interpreter first: the first python3 on PATH may be a shim (pyenv's
    // is a shell script) rather than an interpreter whose folders the sandbox can bind.
    let system = Path::new("/usr/bin/python3");
    if system.is_file() {
        return Ok(system.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("python3"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::NoPython { tried: "/usr/bin/python3 and python3 on PATH".into() })
}

/// The folders the interpreter needs beyond the system folders (/usr, /lib, …), which
/// are all a run's root has: its own folder, its prefixes (a venv's and the Python it
/// was made from, a pyenv version) and the folder of the real executable, each as
/// Python names it and with symlinks resolved. Asked once, of the interpreter itself,
/// before any isolation: it is the trusted interpreter, not a program.
fn interpreter_dirs(python: &Path) -> Result<Vec<PathBuf>, Error> {
    let code = "import os, sys\n\
                dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]\n\
                dirs.append(os.path.dirname(os.path.realpath(sys.executable)))\n\
                print('\\n'.join(dirs))";
    let failed = |detail: String| Error::Prefixes { python: python.to_path_buf(), detail };
    let output = Command::new(python)
        .args(["-E", "-s", "-B", "-c", code])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(format!("{}, stderr: {}", output.status, String::from_utf8_lossy(&output.stderr).trim())));
    }
    let mut dirs: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout).lines().map(PathBuf::from).collect();
    dirs.extend(python.parent().map(Path::to_path_buf));
    let resolved: Vec<PathBuf> = dirs.iter().filter_map(|d| std::fs::canonicalize(d).ok()).collect();
    dirs.extend(resolved);
    Ok(dirs)
}

fn write_files(dir: &Path, program: &Program) -> std::io::Result<()> {
    std::fs::write(dir.join("main.py"), &program.code)?;
    for (name, contents) in &program.files {
        let plain = !name.is_empty() && !name.contains('/') && name != "." && name != ".." && name != "main.py";
        if !plain {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("sandbox file name {name:?} is not a plain file name"),
            ));
        }
        std::fs::write(dir.join(name), contents)?;
    }
    Ok(())
}

type Captured = mpsc::Receiver<(Vec<u8>, bool)>;

/// A write to a closed pipe from this thread then fails with EPIPE; the SIGPIPE it
/// raises stays pending on the thread and is dropped when the thread ends.
fn block_sigpipe_in_this_thread() {
    // SAFETY: plain calls on a local signal set; changes only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Reads a stream to its end, keeping the first `limit` bytes.
fn spawn_reader(mut stream: impl Read + Send + 'static, limit: usize) -> Captured {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut truncated = false;
        let mut buffer = [0u8; 16 << 10];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    let room = limit.saturating_sub(kept.len());
                    kept.extend_from_slice(&buffer[..n.min(room)]);
                    truncated |= n > room;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = send.send((kept, truncated));
    });
    receive
}

/// Output of a reader; a stream some escaped process still holds open is given up on
/// after a grace period (only possible with basic isolation).
fn collect(captured: Captured) -> (String, bool) {
    match captured.recv_timeout(Duration::from_secs(2)) {
        Ok((bytes, truncated)) => (String::from_utf8_lossy(&bytes).into_owned(), truncated),
        Err(_) => (String::new(), true),
    }
}

/// Waits for the child until `deadline`; None when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<Status> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(isolate::status_of(status)),
            Ok(None) => {}
            Err(_) => return Some(Status::Signaled(0)),
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}
