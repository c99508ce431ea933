//! The `petting_env` Python package, carried inside the binary so that the host a run
//! starts always speaks this binary's protocol, wherever the binary was copied to.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The package's files (path under `python/`, text).
const FILES: [(&str, &str); 9] = [
    ("petting_env/__init__.py", include_str!("../../../python/petting_env/__init__.py")),
    ("petting_env/__main__.py", include_str!("../../../python/petting_env/__main__.py")),
    ("petting_env/env.py", include_str!("../../../python/petting_env/env.py")),
    ("petting_env/host.py", include_str!("../../../python/petting_env/host.py")),
    ("petting_env/loading.py", include_str!("../../../python/petting_env/loading.py")),
    ("petting_env/reasoning_gym_env.py", include_str!("../../../python/petting_env/reasoning_gym_env.py")),
    ("petting_env/textarena_env.py", include_str!("../../../python/petting_env/textarena_env.py")),
    ("petting_env/examples/__init__.py", include_str!("../../../python/petting_env/examples/__init__.py")),
    ("petting_env/examples/guess_number.py", include_str!("../../../python/petting_env/examples/guess_number.py")),
];

/// A folder holding the package, for `PYTHONPATH`: written once per content under the
/// temporary folder, and rewritten whole if a file of it is missing or differs.
pub fn folder() -> std::io::Result<PathBuf> {
    let mut digest = Sha256::new();
    for (path, text) in FILES {
        digest.update(path.as_bytes());
        digest.update(text.as_bytes());
    }
    let hash: String = digest.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join("petting-python").join(hash);
    if FILES.iter().all(|(path, text)| std::fs::read_to_string(dir.join(path)).is_ok_and(|t| t == *text)) {
        return Ok(dir);
    }
    // Written beside and renamed into place, so a concurrent run never imports half a package.
    let partial = dir.with_extension(format!("partial.{}", std::process::id()));
    for (path, text) in FILES {
        let file = partial.join(path);
        std::fs::create_dir_all(file.parent().expect("a file in a folder"))?;
        std::fs::write(file, text)?;
    }
    replace(&partial, &dir)?;
    Ok(dir)
}

fn replace(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        // Another process put a complete copy there first.
        Err(_) if to.join(FILES[0].0).is_file() => std::fs::remove_dir_all(from),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_package_is_carried() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
        let mut on_disk: Vec<String> = Vec::new();
        let mut folders = vec![root.join("petting_env")];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(folder).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() && path.file_name().is_some_and(|n| n != "__pycache__") {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "py") {
                    on_disk.push(path.strip_prefix(&root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut carried: Vec<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
        carried.sort();
        assert_eq!(carried, on_disk, "add the new file to FILES");
    }

    #[test]
    fn the_package_folder_holds_the_carried_files() {
        let dir = folder().unwrap();
        for (path, text) in FILES {
            assert_eq!(std::fs::read_to_string(dir.join(path)).unwrap(), text);
        }
        assert_eq!(folder().unwrap(), dir, "written once per content");
    }
}
