//! The Python environment host (`python/petting_env`): its own tests, which drive the
//! host as a real subprocess over stdio with real TextArena games and reasoning-gym
//! datasets, run by the project's Python environment.

use crate::support::{output_of, repo_root};

#[test]
fn the_environment_hosts_own_tests_pass() {
    if !crate::support::full_suite("the_environment_hosts_own_tests_pass") {
        return;
    }
    let python = std::env::var("PETTING_PYTHON").expect("scripts/test.sh sets PETTING_PYTHON");
    let output = std::process::Command::new(python)
        .args(["-m", "unittest", "discover", "-s", "tests_env"])
        .current_dir(repo_root().join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("the project's Python runs");
    let (ok, stdout, stderr) = output_of(output);
    assert!(ok, "{stdout}{stderr}");
    assert!(stderr.contains("\nOK"), "{stderr}");
}
