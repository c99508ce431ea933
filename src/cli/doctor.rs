//! `petting doctor`: what this machine gives petting, checked one by one, so that a
//! missing piece is found before a run needs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::args::{DoctorArgs, Format};
use super::exit::Refused;

/// Free disk below which a folder is worth a warning: a checkpoint of a 0.5B model with its
/// optimiser state is about 6 GiB.
const LOW_DISK_BYTES: u64 = 10 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    /// Works, but something a user may want is missing.
    Note,
    /// What the run file asks for is not there.
    Fail,
}

struct Check {
    what: &'static str,
    status: Status,
    detail: String,
}

fn check(what: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check { what, status, detail: detail.into() }
}

pub async fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(file) => Some(petting::config::load(file)?),
        None => None,
    };
    // The libraries this process loaded say which libtorch it runs on.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut checks = vec![libtorch(&maps), cuda(&maps), gpus(), python()];
    if let Some(vllm) = config.as_ref().and_then(|c| c.config.vllm.as_ref()) {
        checks.push(vllm_server(&vllm.url).await);
    }
    let store = config.as_ref().map(|c| c.store_url()).filter(|url| !url.contains("://"));
    let folders = [
        ("disk: the run's store", store.map(PathBuf::from)),
        ("disk: this folder", std::env::current_dir().ok()),
        ("disk: the machine cache", Some(machine_cache())),
        ("disk: temporary files", Some(std::env::temp_dir())),
    ];
    checks.extend(folders.into_iter().filter_map(|(what, folder)| Some(free_disk(what, &folder?))));
    print(&checks, args.format)?;
    match checks.iter().find(|c| c.status == Status::Fail) {
        Some(failed) => Err(Refused(format!("{}: {}", failed.what, failed.detail)).into()),
        None => Ok(()),
    }
}

fn print(checks: &[Check], format: Format) -> anyhow::Result<()> {
    let name = |s: Status| match s {
        Status::Ok => "ok",
        Status::Note => "note",
        Status::Fail => "fail",
    };
    match format {
        Format::Text => {
            for c in checks {
                println!("{:<5} {:<26} {}", name(c.status), c.what, c.detail);
            }
        }
        Format::Json => {
            let checks: Vec<_> =
                checks.iter().map(|c| json!({"check": c.what, "status": name(c.status), "detail": c.detail})).collect();
            println!("{}", serde_json::to_string_pretty(&checks)?);
        }
    }
    Ok(())
}

/// The libtorch this process loaded (it would not have started without one).
fn libtorch(maps: &str) -> Check {
    let library = maps.split_whitespace().find(|w| w.ends_with("/libtorch_cpu.so")).map(Path::new);
    let folder = library.and_then(Path::parent).and_then(Path::parent);
    let version = folder.and_then(|f| std::fs::read_to_string(f.join("build-version")).ok());
    let detail = match (folder, version) {
        (Some(f), Some(v)) => format!("{} in {}", v.trim(), f.display()),
        (Some(f), None) => f.display().to_string(),
        (None, _) => "loaded (its folder is not in /proc/self/maps)".into(),
    };
    check("libtorch", Status::Ok, detail)
}

fn cuda(maps: &str) -> Check {
    let built = maps.contains("libtorch_cuda.so");
    match (built, tch::Cuda::is_available()) {
        (_, true) => check("CUDA", Status::Ok, format!("{} device(s)", tch::Cuda::device_count())),
        (true, false) => check("CUDA", Status::Note, "libtorch has CUDA, but no device is visible"),
        (false, false) => check("CUDA", Status::Note, "a CPU libtorch (docs/gpu.md builds a CUDA one)"),
    }
}

fn gpus() -> Check {
    let listed = Command::new("nvidia-smi").args(["--query-gpu=name,memory.total", "--format=csv,noheader"]).output();
    match listed {
        Ok(out) if out.status.success() => {
            let names: Vec<_> =
                String::from_utf8_lossy(&out.stdout).lines().map(str::trim).map(str::to_owned).collect();
            check("GPUs", Status::Ok, names.join("; "))
        }
        _ => check("GPUs", Status::Note, "none visible (no nvidia-smi)"),
    }
}

/// The Python that environment hosts and agent programs run with, which of the
/// integrations it can import, and how to install the others.
fn python() -> Check {
    use petting::envs::hosted::host::INTEGRATIONS;
    let python = petting::envs::hosted::interpreter(None);
    let modules: Vec<&str> = INTEGRATIONS.iter().map(|(module, _)| *module).collect();
    let probe = format!(
        "import sys, importlib.util as u\nprint(sys.version.split()[0])\nprint(' '.join(m for m in {modules:?} if u.find_spec(m)))"
    );
    let out = match Command::new(&python).args(["-c", &probe]).output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => return check("Python", Status::Note, format!("{} fails: {}", python.display(), tail(&out.stderr))),
        Err(e) => {
            return check("Python", Status::Note, format!("{} cannot run: {e} (set PETTING_PYTHON)", python.display()));
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let version = lines.next().unwrap_or_default();
    let found: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    let missing: Vec<&str> =
        INTEGRATIONS.iter().filter(|(module, _)| !found.contains(module)).map(|(_, package)| *package).collect();
    let imports = if found.is_empty() { "none of the integrations".to_string() } else { found.join(", ") };
    let mut line = format!("{} {version} (imports: {imports})", python.display());
    if !missing.is_empty() {
        line += &format!(
            "; for the others run scripts/install/python-tools.sh (into the checkout's .venv) or `{} -m pip install {}`",
            python.display(),
            missing.join(" ")
        );
    }
    check("Python", Status::Ok, line)
}

async fn vllm_server(url: &str) -> Check {
    let health = format!("{}/health", url.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build();
    let answer = match client {
        Ok(client) => client.get(&health).send().await.map(|r| r.status()),
        Err(e) => Err(e),
    };
    match answer {
        Ok(status) if status.is_success() => check("vLLM", Status::Ok, format!("{url} answers")),
        Ok(status) => check("vLLM", Status::Fail, format!("{health} answered {status}")),
        Err(e) => check("vLLM", Status::Fail, format!("{health} does not answer: {e}")),
    }
}

fn machine_cache() -> PathBuf {
    match std::env::var_os("PETTING_MACHINE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/petting-machine"),
    }
}

/// Free bytes where `folder` is, or where its nearest existing parent is.
fn free_disk(what: &'static str, folder: &Path) -> Check {
    let existing = folder.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let Ok(path) = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()) else {
        return check(what, Status::Note, format!("{}: not a path", folder.display()));
    };
    // SAFETY: statvfs fills the zeroed struct it is given from a NUL-terminated path.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return check(what, Status::Note, format!("{}: {}", folder.display(), std::io::Error::last_os_error()));
    }
    let free = stats.f_bavail as u64 * stats.f_frsize as u64;
    let status = if free < LOW_DISK_BYTES { Status::Note } else { Status::Ok };
    check(what, status, format!("{} free at {}", super::human_bytes(free), folder.display()))
}

fn tail(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).lines().last().unwrap_or_default().to_string()
}
