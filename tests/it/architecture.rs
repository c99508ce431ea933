//! ARCHITECTURE.md draws which module may import which; these tests hold the code to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::support::{files_under, repo_root};

/// The "may import" table of ARCHITECTURE.md: module → modules it may import.
fn drawn() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let mut rules = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let module = cells[1].trim_matches('`').to_string();
        let allowed = cells[2].split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_string).collect();
        rules.insert(module, allowed);
    }
    assert!(rules.len() > 10, "ARCHITECTURE.md lost its table: {rules:?}");
    rules
}

/// The library's top-level modules (the binary's `cli` is free to use any) and their files.
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let src = repo_root().join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if ["lib", "main", "cli"].contains(&name.as_str()) {
            continue;
        }
        modules.insert(name, files_under(&path));
    }
    modules
}

/// The top-level modules `source` names through `crate::`, outside comments: `crate::a::b`
/// and every path of `crate::{a, b::c}`.
fn crate_imports(source: &str) -> BTreeSet<String> {
    let code: String = source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(top_level_paths(group).iter().map(|p| first_segment(p.trim())));
        } else {
            found.insert(first_segment(rest));
        }
    }
    // Items of the crate root (`CODE_VERSION`) are not modules.
    found.retain(|name| name.starts_with(|c: char| c.is_ascii_lowercase()));
    found
}

/// The comma-separated paths of a `{…}` group whose opening brace is already consumed,
/// up to its closing brace; nested groups stay inside their path.
fn top_level_paths(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut paths) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                paths.push(&group[start..i]);
                return paths;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                paths.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    paths
}

fn first_segment(path: &str) -> String {
    path.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

#[test]
fn every_module_is_drawn_and_every_drawn_module_exists() {
    let drawn: BTreeSet<String> = drawn().into_keys().collect();
    let real: BTreeSet<String> = modules().into_keys().collect();
    assert_eq!(real.difference(&drawn).collect::<Vec<_>>(), Vec::<&String>::new(), "modules ARCHITECTURE.md omits");
    assert_eq!(drawn.difference(&real).collect::<Vec<_>>(), Vec::<&String>::new(), "drawn modules that do not exist");
}

#[test]
fn every_import_runs_the_way_architecture_md_draws() {
    let rules = drawn();
    let mut against = Vec::new();
    for (module, files) in modules() {
        let Some(allowed) = rules.get(&module) else { continue };
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap();
            for import in crate_imports(&source) {
                if import != module && !allowed.contains(&import) {
                    against.push(format!("{} imports {import}", file.strip_prefix(repo_root()).unwrap().display()));
                }
            }
        }
    }
    assert!(against.is_empty(), "imports against ARCHITECTURE.md:\n{}", against.join("\n"));
}

/// A right drawn but unused would let a layer's imports drift back up unseen (as `config`
/// once sat below the modules it configures), so the table says exactly what is imported.
#[test]
fn every_drawn_import_is_used() {
    let mut unused = Vec::new();
    for (module, files) in modules() {
        let used: BTreeSet<String> =
            files.iter().flat_map(|f| crate_imports(&std::fs::read_to_string(f).unwrap())).collect();
        for allowed in drawn().get(&module).into_iter().flatten() {
            if !used.contains(allowed) {
                unused.push(format!("{module} may import {allowed} but does not"));
            }
        }
    }
    assert!(unused.is_empty(), "ARCHITECTURE.md grants more than the code uses:\n{}", unused.join("\n"));
}

#[test]
fn no_stage_imports_another() {
    let stages: BTreeMap<String, PathBuf> = std::fs::read_dir(repo_root().join("src/stages"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|path| (path.file_stem().unwrap().to_str().unwrap().to_string(), path))
        .filter(|(name, _)| name != "mod")
        .collect();
    let mut against = Vec::new();
    for (stage, path) in &stages {
        for file in files_under(path) {
            let source = std::fs::read_to_string(&file).unwrap();
            for other in stages.keys().filter(|o| *o != stage) {
                if source.contains(&format!("stages::{other}")) || source.contains(&format!("super::{other}")) {
                    against.push(format!("{} imports the {other} stage", file.display()));
                }
            }
        }
    }
    assert!(against.is_empty(), "{}", against.join("\n"));
}

#[test]
fn the_import_reader_sees_grouped_and_nested_paths_but_not_comments() {
    let source = "use crate::{config::{self, RunConfig}, engine};\nuse crate::store::Stage;\n/// [x](crate::model)\n";
    let found: Vec<String> = crate_imports(source).into_iter().collect();
    assert_eq!(found, ["config", "engine", "store"]);
}
