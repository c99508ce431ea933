//! The sandbox battery: each threat of the module doc, provoked for real.
//! Tests of what only full isolation promises return early (with a note) when not root.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use super::*;

fn sandbox(timeout_secs: u64) -> Sandbox {
    Sandbox::new(SandboxConfig { timeout: Duration::from_secs(timeout_secs), ..SandboxConfig::default() })
        .expect("python3 runs in the sandbox")
}

// A skipped test says so on the test runner's stderr; the library itself never prints.
#[allow(clippy::print_stderr)]
fn skipped(test: &str, why: &str) {
    eprintln!("{test}: skipped, {why}");
}

fn full(sandbox: &Sandbox, test: &str) -> bool {
    let full = sandbox.isolation() == Isolation::Full;
    if !full {
        skipped(test, "full isolation needs root");
    }
    full
}

/// Live processes (zombies run nothing and are left out) whose real uid is in `uids`,
/// from the host's /proc.
fn processes_in(uids: std::ops::Range<u32>) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|l| l.split_whitespace().next())
                .map(String::from)
        };
        let real = field("Uid:").and_then(|u| u.parse::<u32>().ok());
        if field("State:").as_deref() != Some("Z") && real.is_some_and(|u| uids.contains(&u)) {
            pids.push(pid);
        }
    }
    pids
}

fn processes_of(uid: u32) -> Vec<u32> {
    processes_in(uid..uid + 1)
}

/// The host still runs programs normally.
fn assert_host_works(sandbox: &Sandbox) {
    let out = sandbox.run(&Program::new("print(sum(range(10)))")).unwrap();
    assert_eq!((out.status, out.stdout.as_str()), (Status::Exited(0), "45\n"));
}

#[test]
fn a_program_reads_stdin_and_its_own_files_and_reports_its_exit_code() {
    let sandbox = sandbox(20);
    let mut program = Program::new("import helper\nx = input()\nprint(helper.double(int(x)))\nraise SystemExit(3)")
        .with_stdin("21\n");
    program.files.push(("helper.py".into(), "def double(x):\n    return 2 * x\n".into()));
    // main.py's folder is on sys.path, so sibling files import.
    let out = sandbox.run(&program).unwrap();
    assert_eq!(out.stdout, "42\n");
    assert_eq!(out.status, Status::Exited(3));
    let crash = sandbox.run(&Program::new("1/0")).unwrap();
    assert_eq!(crash.status, Status::Exited(1));
    assert_eq!(crash.error_line(), "ZeroDivisionError: division by zero");
}

/// The CLI runs with SIGPIPE fatal; so does this test's process from here on (no other
/// test here writes to a pipe that may close). Without the writer's blocked SIGPIPE the
/// whole test binary dies on the first run.
#[test]
fn a_program_that_exits_without_reading_its_input_does_not_kill_the_caller() {
    // SAFETY: sets the process's SIGPIPE disposition, as cli::main does.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let sandbox = sandbox(20);
    let input = "1 2 3\n".repeat(200_000);
    for _ in 0..5 {
        let out = sandbox.run(&Program::new("print('bye')").with_stdin(input.clone())).unwrap();
        assert_eq!((out.status, out.stdout.as_str()), (Status::Exited(0), "bye\n"));
    }
}

#[test]
fn string_hashing_is_reproducible() {
    let sandbox = sandbox(20);
    let code = "print(list({'alpha', 'beta', 'gamma', 'delta', 'epsilon'}))";
    let first = sandbox.run(&Program::new(code)).unwrap().stdout;
    for _ in 0..3 {
        assert_eq!(sandbox.run(&Program::new(code)).unwrap().stdout, first);
    }
}

#[test]
fn an_infinite_loop_is_killed_at_the_deadline() {
    let sandbox = sandbox(20);
    let program =
        Program::new("print('started', flush=True)\nwhile True:\n    pass").with_timeout(Duration::from_secs(1));
    let out = sandbox.run(&program).unwrap();
    assert_eq!(out.status, Status::TimedOut);
    assert_eq!(out.stdout, "started\n", "output before the kill is kept");
    assert!(out.elapsed >= Duration::from_secs(1) && out.elapsed < Duration::from_secs(4), "{:?}", out.elapsed);
    assert_eq!(out.error_line(), "timeout");
    assert_host_works(&sandbox);
}

#[test]
fn a_memory_bomb_fails_cleanly() {
    let sandbox = sandbox(20);
    let code = "chunks = []\nwhile True:\n    chunks.append(bytearray(256 << 20))";
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(1), "{}", out.stderr);
    assert!(out.stderr.contains("MemoryError"), "{}", out.stderr);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    assert_host_works(&sandbox);
}

#[test]
fn a_fork_bomb_is_contained_and_leaves_nothing_behind() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "fork bomb") {
        return;
    }
    // Counts how many processes it managed to start, then keeps them all alive.
    let code = "import os, sys, time\nuid = os.getuid()\nn = 0\nfor _ in range(10000):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n    n += 1\nprint(uid, n, flush=True)\ntime.sleep(600)";
    let out = sandbox.run(&Program::new(code).with_timeout(Duration::from_secs(3))).unwrap();
    assert_eq!(out.status, Status::TimedOut);
    let fields: Vec<u64> = out.stdout.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (uid, forks) = (fields[0] as u32, fields[1]);
    assert!(forks < sandbox.config().max_processes, "{forks} forks succeeded");
    assert!(forks >= 5, "forking works up to the limit, got {forks}");
    assert_eq!(processes_of(uid), Vec::<u32>::new(), "processes of uid {uid} outlived the run");

    // The classic bomb, which never stops trying.
    let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";
    let out = sandbox.run(&Program::new(bomb).with_timeout(Duration::from_secs(2))).unwrap();
    assert_eq!(out.status, Status::TimedOut);
    assert_eq!(processes_of(uid), Vec::<u32>::new());
    assert_host_works(&sandbox);
}

#[test]
fn a_background_process_dies_with_its_program() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "background process") {
        return;
    }
    let code = "import os, subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nprint(os.getuid())";
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    let uid: u32 = out.stdout.trim().parse().unwrap();
    assert_eq!(processes_of(uid), Vec::<u32>::new());
}

#[test]
fn writes_outside_the_temp_dir_are_refused_or_vanish() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "writes") {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let host_file = host.path().join("escape.txt");
    let scratch_name = format!("petting-escape-{}.txt", std::process::id());
    let code = format!(
        "import os\n\
         open('mine.txt', 'w').write('ok')\n\
         print('own dir', open('mine.txt').read())\n\
         for path in [{host:?}, '/etc/petting-escape.txt', '/root/petting-escape.txt']:\n\
         \x20   try:\n\
         \x20       open(path, 'w').write('x')\n\
         \x20       print('wrote', path)\n\
         \x20   except OSError:\n\
         \x20       print('refused')\n\
         open('/tmp/{scratch_name}', 'w').write('x')\n\
         print('scratch', os.path.exists('/tmp/{scratch_name}'))",
        host = host_file.to_str().unwrap()
    );
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    assert_eq!(out.stdout, "own dir ok\nrefused\nrefused\nrefused\nscratch True\n");
    assert!(!host_file.exists());
    assert!(!Path::new("/etc/petting-escape.txt").exists());
    assert!(!std::env::temp_dir().join(&scratch_name).exists(), "the scratch write reached the host's /tmp");
}

#[test]
fn the_network_is_unreachable_even_on_loopback() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "network") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('connected')\nexcept OSError as e:\n    print('blocked', e.errno)"
    );
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert!(out.stdout.starts_with("blocked"), "{} {}", out.stdout, out.stderr);
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection arrived");
}

#[test]
fn an_output_flood_is_truncated() {
    let sandbox = sandbox(20);
    let code = "import sys\nchunk = 'x' * 65536\nfor _ in range(1600):\n    sys.stdout.write(chunk)\n    sys.stderr.write(chunk)\nprint('end')";
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0));
    let limit = sandbox.config().output_limit;
    assert_eq!((out.stdout.len(), out.stderr.len()), (limit, limit));
    assert!(out.stdout_truncated && out.stderr_truncated);
    assert!(out.stdout.bytes().all(|b| b == b'x'));
    assert_host_works(&sandbox);
}

#[test]
fn runs_in_parallel_are_bounded_and_all_complete() {
    let sandbox = Sandbox::new(SandboxConfig { max_parallel: 2, ..SandboxConfig::default() }).unwrap();
    let started = Instant::now();
    let outputs: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let sandbox = &sandbox;
                scope.spawn(move || {
                    sandbox.run(&Program::new(format!("import time\ntime.sleep(0.5)\nprint({i})"))).unwrap().stdout
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(outputs, (0..6).map(|i| format!("{i}\n")).collect::<Vec<_>>());
    // Six half-second runs, two at a time: at least three rounds.
    assert!(started.elapsed() >= Duration::from_millis(1500), "{:?}", started.elapsed());
}

#[test]
fn odd_file_names_are_refused() {
    let sandbox = sandbox(20);
    let mut program = Program::new("print(1)");
    program.files.push(("../evil.py".into(), String::new()));
    assert!(matches!(sandbox.run(&program), Err(Error::WorkDir { .. })));
}

#[test]
fn the_hosts_accounts_and_name_are_not_there() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "host accounts") {
        return;
    }
    let code = "for path in ['/etc/passwd', '/etc/group', '/etc/shadow', '/etc/hostname', '/etc/hosts']:\n\
                \x20   try:\n\
                \x20       open(path).read()\n\
                \x20       print(path, 'read')\n\
                \x20   except FileNotFoundError:\n\
                \x20       print(path, 'absent')\n\
                \x20   except PermissionError:\n\
                \x20       print(path, 'refused')";
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "/etc/passwd absent\n/etc/group absent\n/etc/shadow absent\n/etc/hostname absent\n/etc/hosts absent\n"
    );
}

#[test]
fn only_the_runs_own_processes_are_in_proc() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "proc") {
        return;
    }
    // The test's own pid exists in the host's /proc; the sandbox's PID namespace
    // numbers from 1, so it could only be there if the host's /proc were.
    let host_pid = std::process::id();
    let code = format!(
        "import os\n\
         print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n\
         print(open('/proc/1/cmdline').read().split('\\0')[1:-1])\n\
         print(os.path.exists('/proc/{host_pid}'))"
    );
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    // The program itself is PID 1 and the only process.
    assert_eq!(out.stdout, "['1']\n['-s', '-B', '-u', 'main.py']\nFalse\n");
}

#[test]
fn files_outside_the_runs_folder_are_not_there() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "outside files") {
        return;
    }
    // A world-readable answer in a fresh folder: permissions alone would let the
    // throw-away uid read it.
    let host = tempfile::tempdir().unwrap();
    let folder = host.path().join("answers");
    std::fs::create_dir(&folder).unwrap();
    let answer = folder.join("answer.txt");
    std::fs::write(&answer, "42").unwrap();
    for path in [host.path(), &folder] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let datasets = repo.join("datasets");
    assert!(datasets.is_dir(), "the repository has a datasets folder to hide");
    let paths = [&answer, &folder, &datasets, &repo.join("Cargo.toml"), &repo.to_path_buf()];
    let code = format!(
        "import os\nfor path in {:?}:\n    print(os.path.exists(path))",
        paths.iter().map(|p| p.to_str().unwrap()).collect::<Vec<_>>()
    );
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    assert_eq!(out.stdout, "False\n".repeat(paths.len()));
}

#[test]
fn nothing_written_outside_the_runs_folder_persists() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "persistent writes") {
        return;
    }
    let name = format!("petting-persist-{}.txt", std::process::id());
    let dirs = ["/run/lock", "/var/tmp", "/tmp", "/dev/shm", "/", "/etc", "/usr/local"];
    let code = format!(
        "import os\n\
         for folder in {dirs:?}:\n\
         \x20   try:\n\
         \x20       os.makedirs(folder, exist_ok=True)\n\
         \x20       open(os.path.join(folder, {name:?}), 'w').write('x')\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print('done')"
    );
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!((out.status, out.stdout.as_str()), (Status::Exited(0), "done\n"), "{}", out.stderr);
    let left: Vec<PathBuf> = dirs.iter().map(|d| Path::new(d).join(&name)).filter(|p| p.exists()).collect();
    for path in &left {
        let _ = std::fs::remove_file(path);
    }
    assert_eq!(left, Vec::<PathBuf>::new(), "files the run left on the host");
}

#[test]
fn the_standard_library_and_subprocesses_work_in_the_minimal_root() {
    let sandbox = sandbox(20);
    let code = "import json, math, re, subprocess, sys, tempfile, time\n\
                print(json.dumps({'x': math.sqrt(16)}), re.sub('a+', 'b', 'caat'))\n\
                for python in ['python3', sys.executable]:\n\
                \x20   child = subprocess.run([python, '-c', 'print(6 * 7)'], capture_output=True, text=True)\n\
                \x20   print(child.returncode, child.stdout.strip(), child.stderr.strip())\n\
                with tempfile.TemporaryDirectory() as scratch:\n\
                \x20   open(scratch + '/f', 'w').write('y')\n\
                \x20   print(open(scratch + '/f').read())\n\
                open('/dev/null', 'w').write('z')\n\
                print(len(open('/dev/urandom', 'rb').read(8)), time.localtime(0).tm_year)\n\
                print(subprocess.run(['sleep', '0'], capture_output=True).returncode)";
    let out = sandbox.run(&Program::new(code)).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    assert_eq!(out.stdout, "{\"x\": 4.0} cbt\n0 42 \n0 42 \ny\n8 1970\n0\n");
}

#[test]
fn an_interpreter_outside_usr_runs_with_its_own_prefix() {
    let host = tempfile::tempdir().unwrap();
    let venv = host.path().join("venv");
    let made = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .is_ok_and(|o| o.status.success());
    if !made {
        // Not a failure of the sandbox: this machine's Python has no venv module.
        skipped("interpreter outside /usr", "python3 -m venv is not available");
        return;
    }
    // The venv lies in a folder only root may enter (tempdir's 0700): only the bind
    // mount of its prefix lets the throw-away uid run it.
    let python = venv.join("bin/python3");
    let sandbox = Sandbox::new(SandboxConfig { python: Some(python), ..SandboxConfig::default() })
        .expect("the venv's python runs in the sandbox");
    if !full(&sandbox, "interpreter outside /usr") {
        return;
    }
    let out = sandbox.run(&Program::new("import sys\nprint(sys.prefix)\nprint(sys.base_prefix)")).unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", out.stderr);
    assert_eq!(out.stdout, format!("{}\n/usr\n", venv.display()));
}

/// Set for the helper process of `nothing_of_a_run_outlives_its_killed_caller`.
const HELPER_ENV: &str = "PETTING_SANDBOX_TEST_HELPER";

/// Runs only as the helper process of `nothing_of_a_run_outlives_its_killed_caller`,
/// which kills it while this program and its three children sleep.
#[test]
#[ignore = "a helper process of nothing_of_a_run_outlives_its_killed_caller"]
fn helper_running_a_program_until_killed() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let sandbox = sandbox(120);
    let code = "import os, time\n\
                for _ in range(3):\n\
                \x20   if os.fork() == 0:\n\
                \x20       time.sleep(60)\n\
                \x20       os._exit(0)\n\
                time.sleep(60)";
    let _ = sandbox.run(&Program::new(code));
}

#[test]
fn nothing_of_a_run_outlives_its_killed_caller() {
    let sandbox = sandbox(20);
    if !full(&sandbox, "killed caller") {
        return;
    }
    // The killed helper cannot remove its sandbox's folders; they go with this one.
    let scratch = tempfile::tempdir().unwrap();
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "sandbox::tests::helper_running_a_program_until_killed"])
        .env(HELPER_ENV, "1")
        .env("TMPDIR", scratch.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The helper's only sandbox is its process's first, so its runs have these uids.
    let first = uid_base(helper.id(), 0);
    let uids = first..first + MAX_SLOTS;
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_in(uids.clone()).len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let running = processes_in(uids.clone()).len();
    // The intermediate, which runs as root: the helper's only child process.
    let children: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after_name.split_whitespace().nth(1) == Some(helper.id().to_string().as_str())
        })
        .collect();
    helper.kill().unwrap();
    helper.wait().unwrap();
    assert_eq!(running, 4, "the program and its three children were running");
    assert_eq!(children.len(), 1, "one intermediate: {children:?}");

    let alive = |pid: &u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().any(|l| l.starts_with("State:") && !l.contains("Z"))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while (!processes_in(uids.clone()).is_empty() || children.iter().any(alive)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_in(uids.clone());
    // Leave no sleepers behind should the assertion fail.
    for pid in left.iter().chain(children.iter().filter(|p| alive(p))) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    assert_eq!(left, Vec::<u32>::new(), "processes of the run outlived its killed caller");
    assert!(!children.iter().any(alive), "the intermediate outlived its killed caller");
}
