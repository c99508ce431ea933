//! `petting ui` in a real browser (Debian's Chromium over WebDriver) against real runs:
//! a run's new iteration appears without a reload, two runs overlay, a task's tree shows
//! each token's logprob, and the time line and config pages load. With
//! PETTING_WRITE_SCREENSHOTS=1 it writes docs/ui-*.png, the screenshots docs/dashboard.md shows.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::Value;

use crate::pipeline::{run_file, sql_rows};
use crate::support::browser::Browser;
use crate::support::{petting, repo_root, run};

/// `petting ui` serving `sources`, stopped on drop.
struct Dashboard {
    process: Child,
    url: String,
}

impl Dashboard {
    fn start(sources: &[&Path]) -> Dashboard {
        let mut process =
            petting().arg("ui").args(sources).args(["--port", "0"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut first = String::new();
        std::io::BufReader::new(process.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let url = first.trim().strip_prefix("petting ui: ").unwrap_or_else(|| panic!("no address: {first:?}")).into();
        Dashboard { process, url }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Where a screenshot goes: docs/ when asked for, else a scratch folder.
fn screenshot(browser: &Browser, name: &str, scratch: &Path) {
    let png = browser.screenshot();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name} is a PNG");
    let dir = if std::env::var_os("PETTING_WRITE_SCREENSHOTS").is_some() {
        repo_root().join("docs")
    } else {
        scratch.to_path_buf()
    };
    std::fs::write(dir.join(name), png).unwrap();
}

fn pipeline_run(config: &str, until: Option<&str>) {
    let mut args = vec!["pipeline", "run", config];
    if let Some(until) = until {
        args.extend(["--until", until]);
    }
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "{stdout}{stderr}");
}

/// The page's URL showing `runs` (their store URLs) on `tab`.
fn page(dashboard: &Dashboard, runs: &[&str], tab: &str) -> String {
    let runs: Vec<String> = runs.iter().map(|u| u.replace('/', "%2F").replace(':', "%3A")).collect();
    // A query of its own per view, so going to it loads the page anew.
    format!("{}?{tab}#runs={}&tab={tab}", dashboard.url, runs.join(","))
}

#[test]
fn the_dashboard_follows_a_live_run_overlays_runs_and_colours_each_token_by_its_logprob() {
    let Some(browser) = Browser::start(1400, 1600) else { return };
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let (a, b): (PathBuf, PathBuf) = (runs.join("a"), runs.join("b"));
    let config_a = run_file(a.to_str().unwrap(), 1).write(&dir.path().join("a.yaml"));
    let config_b = run_file(b.to_str().unwrap(), 2).write(&dir.path().join("b.yaml"));
    pipeline_run(&config_a, Some("rollout:1"));
    pipeline_run(&config_b, None);
    let dashboard = Dashboard::start(&[&runs]);

    // A live run: iteration 1 of a commits while the page is open, and shows without a reload.
    browser.goto(&dashboard.url);
    let rows = browser.wait_for(
        "const rows = [...document.querySelectorAll('tr.run')].map(r => [r.dataset.url, r.dataset.iterationsDone]); \
         return rows.some(r => r[1] === '1') && rows.some(r => r[1] === '2') ? rows : null",
        60,
    );
    let url_a = rows.as_array().unwrap().iter().find(|r| r[1] == "1").unwrap()[0].as_str().unwrap().to_string();
    let url_b = rows.as_array().unwrap().iter().find(|r| r[1] == "2").unwrap()[0].as_str().unwrap().to_string();
    browser.wait_for("return document.getElementById('panel-reward')?.dataset.xs", 60);
    browser.eval("window.stayed = true; return 0");
    pipeline_run(&config_a, None);
    browser.wait_for(
        "return [...document.querySelectorAll('tr.run')].every(r => r.dataset.iterationsDone === '2') \
         && document.getElementById('panel-reward')?.dataset.xs === '0,1'",
        60,
    );
    assert_eq!(browser.eval("return window.stayed === true"), Value::Bool(true), "the page reloaded");

    // Two runs overlaid: each chart holds both runs' series, named by run.
    browser.goto(&page(&dashboard, &[&url_a, &url_b], "charts"));
    let names = browser.wait_for(
        "const s = document.getElementById('panel-eval-success')?.dataset.series; \
         return s && s.includes('a · ') && s.includes('b · ') ? s : ''",
        60,
    );
    let names: Vec<&str> = names.as_str().unwrap().lines().collect();
    assert_eq!(names.len(), 4, "two modes of two runs: {names:?}");
    screenshot(&browser, "ui-charts.png", dir.path());

    // The comparison of the two runs: one method, two seeds, untrained and trained rows.
    browser.eval("document.querySelector('[data-tab=compare]').click(); return 0");
    let rows =
        browser.wait_for("return [...document.querySelectorAll('#compare .compare-row')].map(r => r.textContent)", 30);
    let rows: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(!rows.is_empty() && rows.iter().all(|r| r.contains("(2)")), "both seeds in every cell: {rows:?}");
    screenshot(&browser, "ui-compare.png", dir.path());

    // The tree of a task: every response token with the logprob it was sampled at.
    browser.goto(&page(&dashboard, &[&url_a], "tree"));
    let shown = browser.wait_for(
        "const t = [...document.querySelectorAll('#tree-view .candidate')][0]; \
         return t ? [document.getElementById('tree-iteration').value, document.getElementById('tree-task').value, \
                     [...t.querySelectorAll('.tok')].map(s => Number(s.dataset.logprob))] : null",
        60,
    );
    let (iteration, task) = (shown[0].as_str().unwrap(), shown[1].as_str().unwrap());
    assert_eq!(iteration, "1", "the last iteration is shown first");
    let stored = sql_rows(
        &a,
        &format!(
            "SELECT array_to_string(response_logprobs, ' ') FROM turns \
             WHERE iteration = {iteration} AND task_id = '{task}' ORDER BY episode, node_id LIMIT 1"
        ),
    );
    let stored: Vec<f64> = stored[0].trim_matches('"').split(' ').map(|x| x.parse().unwrap()).collect();
    let page_logprobs: Vec<f64> = shown[2].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(page_logprobs.len(), stored.len(), "one span per response token");
    for (page, stored) in page_logprobs.iter().zip(&stored) {
        assert!((page - stored).abs() < 1e-4, "{page_logprobs:?} vs {stored:?}");
    }
    let decoded = browser.eval("return document.querySelector('#tree-view .tok').textContent");
    assert!(!decoded.as_str().unwrap().starts_with('['), "tokens are text, not ids: {decoded}");
    screenshot(&browser, "ui-tree.png", dir.path());

    // The time line and the config.
    browser.eval("document.querySelector('[data-tab=timeline]').click(); return 0");
    let bars = browser.wait_for("return document.querySelectorAll('#timeline .bar').length", 30);
    let commits = sql_rows(&a, "SELECT count(*) FROM commits");
    assert_eq!(bars.as_u64().unwrap().to_string(), commits[0], "one bar per commit");
    screenshot(&browser, "ui-timeline.png", dir.path());
    browser.eval("document.querySelector('[data-tab=config]').click(); return 0");
    let yaml = browser.wait_for("const p = document.querySelector('#config pre'); return p && p.textContent", 30);
    assert!(yaml.as_str().unwrap().contains("seed: 1"), "{yaml}");
    screenshot(&browser, "ui-config.png", dir.path());
}
