//! Keys that have a new name. A file (or a run's frozen run.yaml) that uses the old
//! name keeps working: the key is moved to its new name before the file is parsed, and
//! `config check` says what to write instead.

use serde_json::{Map, Value};

use crate::validate::Invalid;

/// One key of a file that was moved to its new name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    pub old: String,
    pub new: String,
}

impl std::fmt::Display for Renamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` is deprecated: write `{}` (the old name still works)", self.old, self.new)
    }
}

/// Moves every old key of `tree` (a parsed run file) to its new name, and returns what
/// was moved. A file that writes both names is refused: which one was meant (a `--set` of
/// the old name over a file with the new one?) cannot be told.
pub fn rename_old_keys(tree: &mut Value) -> Result<Vec<Renamed>, Invalid> {
    let mut renamed = Vec::new();
    let Value::Object(root) = tree else { return Ok(renamed) };
    if let Some(Value::Object(update)) = root.get_mut("update") {
        renamed.extend(rename(update, "update", "gradient_checkpointing", "recompute_activations")?);
    }
    if let Some(Value::Object(rollout)) = root.get_mut("rollout") {
        // `k` was both tree mode's branches per node and independent mode's episodes per task.
        let independent = rollout.get("mode").and_then(Value::as_str) == Some("independent");
        let new = if independent { "episodes_per_task" } else { "branches" };
        renamed.extend(rename(rollout, "rollout", "k", new)?);
    }
    Ok(renamed)
}

fn rename(section: &mut Map<String, Value>, prefix: &str, old: &str, new: &str) -> Result<Option<Renamed>, Invalid> {
    let Some(value) = section.remove(old) else { return Ok(None) };
    let renamed = Renamed { old: format!("{prefix}.{old}"), new: format!("{prefix}.{new}") };
    if section.contains_key(new) {
        return Err(Invalid {
            key: renamed.old.clone(),
            message: format!("is the old name of {}, which is written too; keep only {}", renamed.new, renamed.new),
        });
    }
    section.insert(new.to_string(), value);
    Ok(Some(renamed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(yaml: &str) -> Value {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn k_becomes_branches_in_tree_mode_and_episodes_per_task_in_independent_mode() {
        let mut tree_mode = tree("rollout: {k: 8}");
        let renamed = rename_old_keys(&mut tree_mode).unwrap();
        assert_eq!(tree_mode, tree("rollout: {branches: 8}"));
        assert_eq!(
            renamed[0].to_string(),
            "`rollout.k` is deprecated: write `rollout.branches` (the old name still works)"
        );
        let mut independent = tree("rollout: {k: 2, mode: independent}");
        rename_old_keys(&mut independent).unwrap();
        assert_eq!(independent, tree("rollout: {episodes_per_task: 2, mode: independent}"));
    }

    #[test]
    fn both_names_written_is_an_error_naming_the_old_one() {
        let mut both = tree("update: {gradient_checkpointing: true, recompute_activations: false}");
        let error = rename_old_keys(&mut both).unwrap_err();
        assert_eq!(error.key, "update.gradient_checkpointing");
        assert!(error.message.contains("keep only update.recompute_activations"), "{}", error.message);
    }

    #[test]
    fn a_file_without_old_keys_is_left_as_it_is() {
        let mut current = tree("rollout: {branches: 4}\nupdate: {recompute_activations: auto}");
        let before = current.clone();
        assert!(rename_old_keys(&mut current).unwrap().is_empty());
        assert_eq!(current, before);
    }
}
