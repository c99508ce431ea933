//! [`Agent`]: one member of a team, by name (a leaf: workflows, environments, the config
//! and the tables all speak of agents).

use std::fmt;

use serde::{Deserialize, Serialize};

/// An agent of a team: the keys of `agents:` and the values of the `agent` column.
/// The built-in workflows name theirs ([`Agent::TOOL`], …); an environment that brings
/// its own team names them when the run starts.
///
/// Agents order by name, as the config's `agents:` mapping and the tables list them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, schemars::JsonSchema)]
pub struct Agent(&'static str);

impl Agent {
    /// The single agent.
    pub const SINGLE: Agent = Agent("agent");
    pub const TOOL: Agent = Agent("tool");
    pub const PLANNER: Agent = Agent("planner");
    pub const REASONER: Agent = Agent("reasoner");
    pub const CODER: Agent = Agent("coder");
    pub const TESTER: Agent = Agent("tester");
    pub const PLAYER_X: Agent = Agent("player_x");
    pub const PLAYER_O: Agent = Agent("player_o");
    pub const HELPER: Agent = Agent("helper");
    pub const MAIN: Agent = Agent("main");

    /// The agent called `name`, or why the name cannot be one: it names table rows,
    /// config keys and files, so it is letters, digits and `_` only.
    pub fn named(name: &str) -> Result<Agent, String> {
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{name:?} is not an agent name: use letters, digits and _"));
        }
        Ok(Agent(intern(name)))
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }
}

/// The one copy of `name` kept for the process's life, so that an [`Agent`] stays a
/// `Copy` value as the built-in ones are; a run names a handful of agents.
fn intern(name: &str) -> &'static str {
    use std::collections::BTreeSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().expect("the name set is never left half-written");
    if let Some(&known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

impl fmt::Display for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Agent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Agent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Agent, D::Error> {
        let name = String::deserialize(d)?;
        Agent::named(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_read_at_run_time_is_the_built_in_agent_of_that_name() {
        assert_eq!(Agent::named("tool").unwrap(), Agent::TOOL);
        assert_eq!(Agent::named("player_0").unwrap(), Agent::named("player_0").unwrap());
        assert!(Agent::named("coder").unwrap() < Agent::named("player_0").unwrap());
    }

    #[test]
    fn a_name_that_cannot_name_rows_and_files_is_refused() {
        for bad in ["", "a b", "x/y", "é"] {
            assert!(Agent::named(bad).is_err(), "{bad:?}");
        }
    }
}
