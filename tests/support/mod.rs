//! Helpers shared by the integration tests and the benchmarks.
#![allow(dead_code)]

pub mod browser;
pub mod faulty_proxy;
pub mod synthetic;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `petting` binary built for these tests, on one libtorch thread: the suite runs a
/// test per core, and two runs each given every core spin against each other (the
/// shipped code pipeline's test took 4.4x its time alone beside another real-model run).
/// A test that sets OMP_NUM_THREADS itself overrides it.
pub fn petting() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_petting"));
    command.env_remove("PETTING_LOG").env("OMP_NUM_THREADS", "1");
    command
}

/// Runs the binary and returns (exit success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    output_of(petting().args(args).output().expect("petting runs"))
}

pub fn output_of(output: Output) -> (bool, String, String) {
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Every file under `path` (the file itself if it is one), depth first.
pub fn files_under(path: &std::path::Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        files.extend(files_under(&entry.unwrap().path()));
    }
    files
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Hugging Face fixture made by `transformers` (`tests/fixtures/README.md`): the tiny
/// `hf-tiny-{family}` checkpoints, or any other file there.
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// Whether the tests that need what scripts/test.sh installs (the real models, the Python
/// tools) run. scripts/test.sh sets PETTING_FULL_SUITE; plain `cargo test`, the quick
/// tier, skips them and says so.
pub fn full_suite(test: &str) -> bool {
    let full = std::env::var_os("PETTING_FULL_SUITE").is_some();
    if !full {
        eprintln!("{test}: needs the real models and Python tools of scripts/test.sh: skipped");
    }
    full
}

/// The S3-compatible test server that scripts/test.sh starts, if any: (endpoint, bucket).
/// With PETTING_REQUIRE_S3 set (scripts/test.sh sets it), a missing server fails the test.
pub fn s3_server() -> Option<(String, String)> {
    match (std::env::var("PETTING_TEST_S3_ENDPOINT"), std::env::var("PETTING_TEST_S3_BUCKET")) {
        (Ok(endpoint), Ok(bucket)) => Some((endpoint, bucket)),
        _ if std::env::var_os("PETTING_REQUIRE_S3").is_some() => {
            panic!("PETTING_REQUIRE_S3 is set but no S3 test server is")
        }
        _ => {
            eprintln!("no S3 test server (scripts/test.sh starts one): S3 checks skipped");
            None
        }
    }
}

/// Credentials and endpoint for a `petting` process talking to the test server.
pub fn s3_env(endpoint: &str) -> [(&'static str, String); 4] {
    [
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", "petting".into()),
        ("AWS_SECRET_ACCESS_KEY", "petting".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// A fresh run under a unique prefix of the S3 test server.
pub fn s3_run_store() -> Option<petting::store::RunStore> {
    let (endpoint, bucket) = s3_server()?;
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_bucket_name(&bucket)
        .with_region("us-east-1")
        .with_access_key_id("petting")
        .with_secret_access_key("petting")
        .with_allow_http(true)
        .build()
        .unwrap();
    let prefix = format!("runs/{}", uuid::Uuid::new_v4().simple());
    let url = format!("s3://{bucket}/{prefix}");
    Some(petting::store::RunStore::from_object_store(std::sync::Arc::new(store), &prefix, &url))
}

/// A single-threaded runtime for tests that call the async library directly.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    // Multi-threaded, as the binary's: stages train and sample under block_in_place.
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(future)
}

/// The vLLM test server that scripts/test.sh starts, once it answers /health (it takes
/// about a minute to load; the tests that need it wait here). With PETTING_REQUIRE_VLLM
/// set, a missing or dead server fails the test.
pub fn vllm_server() -> Option<String> {
    let Ok(url) = std::env::var("PETTING_TEST_VLLM_URL") else {
        if std::env::var_os("PETTING_REQUIRE_VLLM").is_some() {
            panic!("PETTING_REQUIRE_VLLM is set but no vLLM test server is");
        }
        eprintln!("no vLLM test server (scripts/test.sh starts one): vLLM checks skipped");
        return None;
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !healthy(&url) {
        let log = std::env::var("PETTING_TEST_VLLM_LOG").unwrap_or_default();
        assert!(
            std::time::Instant::now() < deadline,
            "the vLLM test server at {url} is not up after 10 min; see {log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    Some(url)
}

/// Whether GET {url}/health answers 200.
pub fn healthy(url: &str) -> bool {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let Ok(mut stream) = std::net::TcpStream::connect(address) else { return false };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let request = format!("GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// A free port on loopback, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A test's run file, whose keys a test sets as `--set` does (`set("algorithm.name", "grpo")`)
/// rather than by editing text.
#[derive(Debug, Clone)]
pub struct RunFile(serde_json::Value);

impl RunFile {
    /// A run file's YAML text.
    pub fn new(yaml: &str) -> RunFile {
        RunFile(serde_saphyr::from_str(yaml).expect("a test's run file is YAML"))
    }

    /// Sets the dotted `key` to the YAML `value`, making the mappings on its way.
    pub fn set(mut self, key: &str, value: &str) -> RunFile {
        let mut node = &mut self.0;
        for part in key.split('.') {
            if node.is_null() {
                *node = serde_json::Value::Object(Default::default());
            }
            node = node.as_object_mut().expect("a key inside a mapping").entry(part).or_insert(serde_json::Value::Null);
        }
        *node = serde_saphyr::from_str(value).expect("a YAML value");
        self
    }

    pub fn text(&self) -> String {
        serde_saphyr::to_string(&self.0).unwrap()
    }

    /// Writes the file at `path` and returns its path.
    pub fn write(&self, path: &std::path::Path) -> String {
        std::fs::write(path, self.text()).unwrap();
        path.to_string_lossy().into_owned()
    }
}
