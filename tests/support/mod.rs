//! Helpers shared by the integration tests and the benchmarks.
#![allow(dead_code)]

pub mod synthetic;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `petting` binary built for these tests.
pub fn petting() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_petting"));
    command.env_remove("PETTING_LOG");
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

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A single-threaded runtime for tests that call the async library directly.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
}
