//! The documents stay true to the code: the configuration reference is the one the code
//! generates and covers every key a run file can have, the CLI page names every command,
//! the files the documents name exist, and `init`'s run files pass `config check`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::{files_under, full_suite, petting, repo_root, run};

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn stdout_of(args: &[&str]) -> String {
    let (ok, stdout, stderr) = run(args);
    assert!(ok, "{args:?}: {stderr}");
    stdout
}

#[test]
fn the_committed_configuration_reference_is_the_generated_one() {
    let regenerate = "regenerate: petting config schema --format markdown > docs/configuration.md; \
                      petting config schema > docs/petting.schema.json";
    assert!(stdout_of(&["config", "schema", "--format", "markdown"]) == read("docs/configuration.md"), "{regenerate}");
    assert!(stdout_of(&["config", "schema"]) == read("docs/petting.schema.json"), "{regenerate}");
}

/// The reference's rows: key path → (type, meaning).
fn documented_keys() -> BTreeMap<String, (String, String)> {
    let mut keys = BTreeMap::new();
    for line in read("docs/configuration.md").lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 4, "{line}");
        keys.insert(cells[0].trim_matches('`').to_string(), (cells[1].to_string(), cells[3].to_string()));
    }
    keys
}

#[test]
fn every_key_of_the_run_file_has_a_meaning() {
    let keys = documented_keys();
    assert!(keys.len() > 150, "{} keys", keys.len());
    let undocumented: Vec<&String> =
        keys.iter().filter(|(_, (_, meaning))| meaning.is_empty()).map(|(k, _)| k).collect();
    assert!(undocumented.is_empty(), "keys without a doc comment: {undocumented:?}");
}

#[test]
fn the_reference_covers_every_key_config_show_prints() {
    let keys = documented_keys();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("pipelines"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.push(repo_root().join("examples/agent_programs/team.yaml"));
    let mut shown = 0;
    for file in &files {
        // A few run files are valid only as forks (a LoRA adapter on a scratch model).
        let (ok, yaml, _) = run(&["config", "show", file.to_str().unwrap()]);
        if !ok {
            continue;
        }
        shown += 1;
        let tree: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let mut missing = Vec::new();
        walk(&tree, "", &keys, &mut missing);
        assert!(missing.is_empty(), "{}: keys not in docs/configuration.md: {missing:?}", file.display());
    }
    assert!(shown >= 25, "only {shown} of {} run files shown", files.len());
}

/// Checks every key under `path` against the reference; a map's keys are `<name>`, a free
/// object's (`env.config`) are not looked into.
fn walk(node: &serde_json::Value, path: &str, keys: &BTreeMap<String, (String, String)>, missing: &mut Vec<String>) {
    if !path.is_empty() && !path.ends_with("<name>") && !keys.contains_key(path) {
        missing.push(path.to_string());
        return;
    }
    let child = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    match node {
        serde_json::Value::Object(map) => {
            let kind = keys.get(path).map_or("section", |(kind, _)| kind.as_str());
            if kind.starts_with("object") && !kind.contains("by `name`") {
                return;
            }
            let by_name = keys.contains_key(&child("<name>")) || keys.keys().any(|k| k.starts_with(&child("<name>.")));
            for (name, value) in map {
                let name = if by_name { "<name>" } else { name };
                walk(value, &child(name), keys, missing);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items.iter().filter(|i| i.is_object()) {
                walk(item, &format!("{path}[]"), keys, missing);
            }
        }
        _ => {}
    }
}

fn commands() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let commands = help.split("Commands:").nth(1).unwrap().split("Options:").next().unwrap();
    commands.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

#[test]
fn the_cli_page_names_every_command() {
    let page = read("docs/cli.md");
    for command in commands().iter().filter(|c| *c != "help") {
        assert!(page.contains(&format!("`petting {command}")), "docs/cli.md does not name `petting {command}`");
    }
}

#[test]
fn the_commands_the_documents_name_exist() {
    let commands = commands();
    let mut unknown = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for (at, _) in text.match_indices("petting ") {
            let rest = &text[at + "petting ".len()..];
            let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
            let ends = rest[word.len()..].starts_with([' ', '`', '\n']);
            // `petting` in prose ("as petting prints them") is not a command line.
            let flag = word.starts_with('-');
            if word.len() > 1 && !flag && ends && looks_like_a_command(&text[..at]) && !commands.contains(&word) {
                unknown.push(format!("{}: petting {word}", document.display()));
            }
        }
    }
    assert!(unknown.is_empty(), "commands that do not exist: {unknown:#?}");
}

/// Whether the `petting` after `before` starts a command line: in backticks, or in a
/// code block at a line's start or after `$`, `(`, `|`, `;` or `&&`.
fn looks_like_a_command(before: &str) -> bool {
    let in_code_block = before.matches("```").count() % 2 == 1;
    let last = before.trim_end_matches(' ').chars().last().unwrap_or('\n');
    before.ends_with('`') || (in_code_block && matches!(last, '\n' | '(' | '$' | '|' | ';' | '&'))
}

/// Repository paths a document names: backticked words and link targets that start with
/// one of the checkout's folders or name one of its top-level files.
fn named_paths(text: &str) -> Vec<String> {
    const FOLDERS: [&str; 15] = [
        "src/",
        "tests/",
        "scripts/",
        "pipelines/",
        "docs/",
        "examples/",
        "python/",
        "datasets/",
        "models/",
        "results/",
        "benches/",
        "deploy/",
        "schemas/",
        ".ci/",
        "checkpoints/",
    ];
    const FILES: [&str; 8] = [
        "README.md",
        "RESULTS.md",
        "BENCHMARKS.md",
        "ARCHITECTURE.md",
        "LICENSE",
        "CITATION.cff",
        "Cargo.toml",
        ".gitignore",
    ];
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let backticked = prose.split('`').skip(1).step_by(2);
    let linked = prose.split("](").skip(1).filter_map(|rest| rest.split(')').next());
    backticked
        .chain(linked)
        .filter_map(|word| word.split_whitespace().next())
        .map(|word| word.split(['#', ':']).next().unwrap_or_default().trim_end_matches(['.', ',', ';']))
        .filter(|word| !word.contains(['<', '*', '{', '…']) && !word.contains("://"))
        .filter(|word| FOLDERS.iter().any(|f| word.starts_with(f)) || FILES.contains(word))
        .map(str::to_owned)
        .collect()
}

/// A path set-up makes (an ignored folder such as a model `scripts/install/models.sh`
/// writes) is named but not committed.
fn made_by_set_up(path: &Path) -> bool {
    std::process::Command::new("git")
        .args(["check-ignore", "-q", "--no-index"])
        .arg(path)
        .current_dir(repo_root())
        .status()
        .is_ok_and(|s| s.success())
}

/// The documents: the top-level pages, docs/, the experiments' READMEs, the run files.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut documents: Vec<PathBuf> =
        ["README.md", "RESULTS.md", "BENCHMARKS.md", "ARCHITECTURE.md", "scripts/README.md", "models/README.md"]
            .iter()
            .map(|d| root.join(d))
            .collect();
    for folder in ["docs", "results", "pipelines"] {
        for entry in files_under(&root.join(folder)) {
            let name = entry.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".md") || name.ends_with(".yaml") {
                documents.push(entry);
            }
        }
    }
    documents
}

#[test]
fn the_files_the_documents_name_exist() {
    let root = repo_root();
    let mut missing = Vec::new();
    for document in &documents() {
        let text = std::fs::read_to_string(document).unwrap();
        // A run file's comments name files as words, not in backticks.
        let text = if document.extension().is_some_and(|e| e == "yaml") {
            text.lines()
                .filter_map(|l| l.split_once('#').map(|(_, c)| c))
                .flat_map(str::split_whitespace)
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            text
        };
        for named in named_paths(&text) {
            let from_root = root.join(&named);
            let from_document = document.parent().unwrap().join(&named);
            if !from_root.exists() && !from_document.exists() && !made_by_set_up(&from_root) {
                missing.push(format!("{}: {named}", document.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(missing.is_empty(), "named but missing: {missing:#?}");
}

#[test]
fn the_path_check_finds_a_missing_file() {
    let named = named_paths(
        "see `scripts/nope.sh`, [this](docs/gone.md#part) and `src/lib.rs:12`\n```\n`src/in-a-fence.rs`\n```",
    );
    assert_eq!(named, ["scripts/nope.sh", "src/lib.rs", "docs/gone.md"]);
}

#[test]
fn init_writes_run_files_that_config_check_accepts() {
    let full = full_suite("init_writes_run_files_that_config_check_accepts: the real-model templates");
    let dir = tempfile::tempdir().unwrap();
    for template in ["plan-path", "math", "code", "tic-tac-toe", "textarena", "reasoning-gym", "agent-program"] {
        let folder = dir.path().join(template);
        let (ok, stdout, stderr) = run(&["init", template, folder.to_str().unwrap()]);
        assert!(ok && stdout.contains("iteration.yaml"), "{template}: {stderr}");
        let file = folder.join("iteration.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("# Written by `petting init`") && text.contains("store: runs/"), "{text}");
        assert!(!text.contains("../"), "{template}: a path relative to the checkout is left: {text}");
        // The real models and the Python tools are installed by the full suite's set-up.
        let checked = petting().args(["config", "check", file.to_str().unwrap()]).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
        if matches!(template, "plan-path" | "tic-tac-toe") || full {
            assert!(checked.status.success() && said.contains(": ok: "), "{template}: {said}");
        } else {
            // Whatever this machine lacks, the header and the refusal name the install.
            let install = format!("{}/scripts/install/", env!("CARGO_MANIFEST_DIR"));
            assert!(text.contains("(first") && text.contains(&install), "{template}: {text}");
            let refused_with_the_command = checked.status.code() == Some(3) && said.contains("scripts/install/");
            assert!(checked.status.success() || refused_with_the_command, "{template}: {said}");
        }
    }
    assert!(dir.path().join("agent-program/plain_http.py").is_file());
    let again = petting().args(["init", "math", dir.path().join("math").to_str().unwrap()]).output().unwrap();
    assert_eq!(again.status.code(), Some(3), "init never overwrites");
}

#[test]
fn exit_statuses_say_usage_refusal_or_failure() {
    let status = |args: &[&str]| petting().args(args).output().unwrap().status.code();
    assert_eq!(status(&["no-such-command"]), Some(2));
    assert_eq!(status(&["status", "/nonexistent/run"]), Some(3), "no run there");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "store: x\niterations: -1\n").unwrap();
    assert_eq!(status(&["config", "check", bad.to_str().unwrap()]), Some(3), "an invalid run file");
    if option_env!("PETTING_LIBTORCH_VARIANT") != Some("cuda") {
        let cuda = ["config", "check", "pipelines/plan-path.yaml", "--set", "policies.shared.device=cuda"];
        assert_eq!(status(&cuda), Some(3), "a CUDA device for a CPU build");
    }
    let model = dir.path().join("not-a-model");
    std::fs::create_dir(&model).unwrap();
    assert_eq!(status(&["model", "info", model.to_str().unwrap()]), Some(1), "a failure");
}

#[test]
fn completions_are_printed_for_the_usual_shells() {
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef petting"), ("fish", "complete -c petting")] {
        let script = stdout_of(&["completions", shell]);
        assert!(
            script.contains(marker) && script.contains("pipeline"),
            "{shell}: {}",
            &script[..200.min(script.len())]
        );
    }
}

#[test]
fn doctor_reports_libtorch_python_and_disk() {
    let checks: serde_json::Value = serde_json::from_str(&stdout_of(&["doctor", "--format", "json"])).unwrap();
    let names: Vec<&str> = checks.as_array().unwrap().iter().map(|c| c["check"].as_str().unwrap()).collect();
    for name in ["libtorch", "CUDA", "Python", "disk: temporary files"] {
        assert!(names.contains(&name), "{names:?}");
    }
    let libtorch = &checks[0];
    assert_eq!(libtorch["status"], "ok");
    assert!(libtorch["detail"].as_str().unwrap().starts_with("2.11"), "{libtorch}");
    // A vLLM server the run file names and that does not answer fails the check.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.yaml");
    let plan_path = std::fs::read_to_string(repo_root().join("pipelines/plan-path.yaml")).unwrap();
    let model = repo_root().join("models/petting-tiny-qwen3");
    let text = plan_path.replace("../models/petting-tiny-qwen3", model.to_str().unwrap())
        + "vllm: {url: \"http://127.0.0.1:9\"}\n";
    std::fs::write(&config, text).unwrap();
    let out = petting().args(["doctor", config.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("fail  vLLM"), "{stdout}");
}

#[test]
fn the_results_tables_are_what_the_table_script_prints_from_the_committed_csvs() {
    let results = std::fs::read_to_string(repo_root().join("RESULTS.md")).unwrap();
    for args in [&[][..], &["--paper"][..]] {
        let out = std::process::Command::new("python3")
            .arg(repo_root().join("results/table.py"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "results/table.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let printed = String::from_utf8(out.stdout).unwrap();
        assert!(
            results.contains(&printed),
            "RESULTS.md does not hold what results/table.py {args:?} prints:\n{printed}"
        );
    }
}
