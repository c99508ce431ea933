//! How config values are checked: each module validates the section it owns and names
//! the key; `config` runs every check once, right after parsing, so no stage ever meets
//! a half-valid config.

/// A config key and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The dotted key path, e.g. `rollout.sampling.top_p`.
    pub key: String,
    pub message: String,
}

/// `Err` naming `key` with `message` unless `ok`.
pub fn check(ok: bool, key: impl Into<String>, message: impl Into<String>) -> Result<(), Invalid> {
    if ok { Ok(()) } else { Err(Invalid { key: key.into(), message: message.into() }) }
}

pub fn check_probability(value: f64, key: &str) -> Result<(), Invalid> {
    check((0.0..=1.0).contains(&value), key, format!("{value} is not a probability in [0, 1]"))
}
