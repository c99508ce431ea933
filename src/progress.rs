//! How far a long stage is. Stages report units of work (episodes, optimiser steps), or
//! parts of them, and the tokens they generated or trained on; the command line draws a
//! bar on a terminal and prints plain lines otherwise, and tests report nowhere.

/// Receives the progress of one phase of a stage at a time.
pub trait Progress: Sync {
    /// A phase of `total` units (`unit` names them, e.g. "episodes") starts.
    fn start(&self, label: &str, total: u64, unit: &'static str);

    /// `units` more units (or parts of one: a rollout counts an episode's turns as they
    /// are sampled) are done and `tokens` more tokens were processed.
    fn advance(&self, units: f64, tokens: u64);

    /// The phase is over (also when it ended early).
    fn finish(&self);
}

/// Runs `work` as one phase of `total` units: started before it, finished after it,
/// whatever it returns.
pub fn phase<R>(progress: &dyn Progress, label: &str, total: u64, unit: &'static str, work: impl FnOnce() -> R) -> R {
    progress.start(label, total, unit);
    let result = work();
    progress.finish();
    result
}

/// Reports nowhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn start(&self, _label: &str, _total: u64, _unit: &'static str) {}
    fn advance(&self, _units: f64, _tokens: u64) {}
    fn finish(&self) {}
}
