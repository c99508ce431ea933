//! Runs on the S3 test server (SeaweedFS, started by scripts/test.sh): worker processes
//! started the way the deploy/ recipes start them, transient faults between petting and
//! the server, and processes killed in the middle of an upload. Every run is compared
//! with the same config run by one process on a local folder.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pipeline::{content_at, reference_run, sql_at, write_config_for};
use crate::support::faulty_proxy::{Faults, FaultyProxy};
use crate::support::{output_of, petting, repo_root, s3_env, s3_server};

/// The reference: the tiny two-iteration config run by one process on a local store.
fn local_reference() -> String {
    reference_run().to_str().unwrap().to_string()
}

const LOGPROBS: &str = "response_logprobs,";

fn s3_url(bucket: &str) -> String {
    format!("s3://{bucket}/runs/{}", uuid::Uuid::new_v4().simple())
}

/// `petting ARGS` against the S3 server at `endpoint` (the server itself or a proxy).
fn petting_at(endpoint: &str, args: &[&str]) -> Command {
    let mut command = petting();
    command.args(args).envs(s3_env(endpoint)).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn verify(endpoint: &str, url: &str) {
    let (ok, stdout, stderr) = output_of(petting_at(endpoint, &["verify", url]).output().unwrap());
    assert!(ok && stdout.contains("committed files match"), "{stdout}{stderr}");
}

#[test]
fn four_workers_on_s3_write_what_one_local_process_writes() {
    let Some((endpoint, bucket)) = s3_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference();
    let url = s3_url(&bucket);
    let config = write_config_for(dir.path(), "s3", &url, 5);
    // Started as deploy/ starts them: worker.sh maps the scheduler's index to --worker I/N.
    // Four workers and three tasks per iteration: one rollout shard is empty.
    let workers: Vec<Child> = (0..4)
        .map(|index| {
            let mut command = Command::new(repo_root().join("deploy/worker.sh"));
            command
                .arg(&config)
                .env("PETTING", env!("CARGO_BIN_EXE_petting"))
                .env("JOB_COMPLETION_INDEX", index.to_string())
                .env("PETTING_WORKERS", "4")
                .envs(s3_env(&endpoint))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    for worker in workers {
        let (ok, stdout, stderr) = output_of(worker.wait_with_output().unwrap());
        assert!(ok, "{stdout}{stderr}");
    }
    // Shards batch fewer prompts per forward: logprobs may differ in the last bits, so
    // the comparison leaves them out (tests/it/pipeline.rs bounds them).
    assert_eq!(content_at(&url, "", "true"), content_at(&reference, "", "true"));
    let shards =
        sql_at(&url, "select stage, count(*) as n from commits where shards = 4 group by stage order by 1", "csv");
    assert_eq!(shards, "stage,n\nevaluate,12\nrollout,8\n", "three evaluations and two rollouts, four shards each");
    verify(&endpoint, &url);

    // A predicate on iteration lists only that iteration's files; one on agent skips the
    // other agents' row groups.
    let plan = sql_at(&url, "explain select count(*) from turns where iteration = 1 and agent = 'tool'", "csv");
    let scan = plan.lines().find(|l| l.contains("DataSourceExec")).unwrap_or_else(|| panic!("{plan}"));
    assert!(scan.contains("iteration=1/") && !scan.contains("iteration=0/"), "{scan}");
    let analyzed = sql_at(&url, "explain analyze select count(*) from turns where agent = 'tool'", "csv");
    // 2 iterations × 3 shards × 2 agents: each part's footer statistics name its one
    // agent, so only the 6 tool parts' data is read (the empty shard's parts hold none).
    let pruned = analyzed.split(", ").find(|m| m.starts_with("row_groups_pruned_statistics=")).unwrap();
    assert_eq!(pruned, "row_groups_pruned_statistics=12 total → 6 matched", "{analyzed}");
}

#[test]
fn transient_s3_errors_are_retried_and_leave_the_same_tables() {
    let Some((endpoint, bucket)) = s3_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference();
    let proxy = FaultyProxy::start(&endpoint, Faults { every: 6, delay: Duration::ZERO, lose_create_responses: true });
    let url = s3_url(&bucket);
    let config = write_config_for(dir.path(), "s3", &url, 5);
    let (ok, stdout, stderr) = output_of(petting_at(&proxy.endpoint, &["pipeline", "run", &config]).output().unwrap());
    assert!(ok, "{stdout}{stderr}");
    // Every marker and run.yaml create lost its first response, besides every 6th request.
    assert!(proxy.faults() >= 40, "{} faults in {} requests", proxy.faults(), proxy.requests());
    // One process each, unsharded: equal to the last bit of every logprob.
    assert_eq!(content_at(&url, LOGPROBS, "true"), content_at(&reference, LOGPROBS, "true"));
    verify(&endpoint, &url);
}

#[test]
fn processes_killed_mid_upload_leave_nothing_visible_and_resume_to_the_same_tables() {
    let Some((endpoint, bucket)) = s3_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reference = local_reference();
    // Every request takes 30 ms longer, so a kill often lands while one is on the wire.
    let proxy = FaultyProxy::start(&endpoint, Faults { delay: Duration::from_millis(30), ..Faults::default() });
    let url = s3_url(&bucket);
    let config = write_config_for(dir.path(), "s3", &url, 5);
    let mut kills_mid_upload = 0;
    for round in 0..6u64 {
        let mut child = petting_at(&proxy.endpoint, &["pipeline", "run", &config]).spawn().unwrap();
        // Kill at a later upload each round, so the kills spread over the stages.
        let start = proxy.uploads_started();
        let deadline = Instant::now() + Duration::from_secs(120);
        while proxy.uploads_started() < start + 2 + round || proxy.uploads_in_flight() == 0 {
            if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        kills_mid_upload += u32::from(proxy.uploads_in_flight() > 0);
        child.kill().unwrap();
        child.wait().unwrap();
        // Whatever the kill cut off, the committed tables are whole.
        std::thread::sleep(Duration::from_millis(100));
        let (ok, stdout, stderr) = output_of(petting_at(&endpoint, &["verify", &url]).output().unwrap());
        assert!(ok || stderr.contains("no run at"), "{stdout}{stderr}");
    }
    assert!(kills_mid_upload >= 3, "only {kills_mid_upload} kills landed during an upload");
    let (ok, stdout, stderr) = output_of(petting_at(&endpoint, &["pipeline", "run", &config]).output().unwrap());
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(content_at(&url, LOGPROBS, "true"), content_at(&reference, LOGPROBS, "true"));
    verify(&endpoint, &url);
}
