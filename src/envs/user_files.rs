//! The files of a user's own that an environment is made of: its class, the script that
//! hosts it, its reward function, an agent program. A run freezes their digests with its
//! config (`pipeline::driver`), so an edit between iterations (a reward changed) is
//! refused on resume instead of silently training on another environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::EnvConfig;
use super::hosted::{ExternalConfig, PythonReward};

/// Each file of `env` that exists, by path, with its sha256. A module given by its
/// dotted name is found under the environment's folder (`pkg/mod.py` or
/// `pkg/mod/__init__.py`); one installed elsewhere is not a user's file here.
pub fn digests(env: &EnvConfig) -> std::io::Result<BTreeMap<String, String>> {
    let mut digests = BTreeMap::new();
    for file in files(env) {
        if file.is_file() {
            let bytes = std::fs::read(&file)?;
            digests.insert(file.display().to_string(), hex::encode(Sha256::digest(bytes)));
        }
    }
    Ok(digests)
}

/// The files `env` names, whether they exist or not.
fn files(env: &EnvConfig) -> Vec<PathBuf> {
    let here = |dir: &Option<PathBuf>| dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let reward = |dir: &Option<PathBuf>, reward: &Option<PythonReward>| {
        reward.iter().filter_map(|r| module_file(&here(dir), &r.python)).collect::<Vec<_>>()
    };
    match env {
        EnvConfig::External(ExternalConfig { module, command, host, .. }) => {
            let dir = here(&host.workdir);
            let mut files: Vec<PathBuf> = module.iter().filter_map(|m| module_file(&dir, m)).collect();
            files.extend(command.iter().flatten().map(|word| dir.join(word)));
            files
        }
        EnvConfig::TextArena(c) if c.game.contains(':') => {
            module_file(&here(&c.host.workdir), &c.game).into_iter().collect()
        }
        EnvConfig::ReasoningGym(c) => reward(&c.host.workdir, &c.reward),
        EnvConfig::Math(c) => reward(&c.host.workdir, &c.reward),
        EnvConfig::Code(c) => reward(&c.host.workdir, &c.reward),
        EnvConfig::AgentProgram(c) => c.command.iter().map(|word| c.workdir().join(word)).collect(),
        _ => Vec::new(),
    }
}

/// The file of `module:name` or `file.py:name` under `dir`.
fn module_file(dir: &Path, spec: &str) -> Option<PathBuf> {
    let module = spec.split_once(':').map_or(spec, |(module, _)| module);
    if module.ends_with(".py") {
        return Some(dir.join(module));
    }
    let path = dir.join(module.replace('.', "/"));
    let file = path.with_extension("py");
    Some(if file.is_file() { file } else { path.join("__init__.py") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_dotted_modules_are_found_under_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pkg/sub")).unwrap();
        std::fs::write(dir.path().join("pkg/game.py"), "").unwrap();
        assert_eq!(module_file(dir.path(), "game.py:Game"), Some(dir.path().join("game.py")));
        assert_eq!(module_file(dir.path(), "pkg.game:Game"), Some(dir.path().join("pkg/game.py")));
        assert_eq!(module_file(dir.path(), "pkg.sub:Game"), Some(dir.path().join("pkg/sub/__init__.py")));
    }
}
