//! The exit status says what kind of failure it was, for scripts and schedulers:
//!
//! | status | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | the command failed while it ran (I/O, a model, a crashed program, out of memory) |
//! | 2 | usage: the command line is wrong (clap's status) |
//! | 3 | refused by a check before anything was changed: an invalid run file, a stage already committed or not ready, a changed config, a corrupt or pruned file, an on-policy check, ranks that would run different configs or inputs |

use petting::{config, pipeline, ranks, stages, store};

const FAILED: u8 = 1;
const REFUSED: u8 = 3;

/// The status for `error`: refused when any cause in its chain is a check's refusal.
pub fn code(error: &anyhow::Error) -> u8 {
    if error.chain().any(refused) { REFUSED } else { FAILED }
}

fn refused(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<stages::update::Error>() {
        return update_refused(e);
    }
    if cause.is::<Refused>() {
        return true;
    }
    if let Some(e) = cause.downcast_ref::<ranks::Error>() {
        return ranks_refused(e);
    }
    // Transparent wrappers hide the error they wrap from the chain: look inside.
    if let Some(e) = cause.downcast_ref::<config::Error>() {
        return config_refused(e);
    }
    if let Some(e) = cause.downcast_ref::<store::Error>() {
        return store_refused(e);
    }
    if let Some(e) = cause.downcast_ref::<stages::Error>() {
        return stage_refused(e);
    }
    // A missing or unreadable model folder or data file, as `pipeline run` refuses it
    // (driver::Error::Inputs below); `config check` reports it bare.
    if cause.is::<pipeline::inputs::Error>() {
        return true;
    }
    if let Some(e) = cause.downcast_ref::<pipeline::driver::Error>() {
        use pipeline::driver::Error as E;
        return match e {
            E::ConfigChanged { .. } | E::EnvironmentChanged { .. } | E::ForkIntoItself { .. } | E::Inputs { .. } => {
                true
            }
            E::Store(e) => store_refused(e),
            E::Stage(e) => stage_refused(e),
            E::StageFailed { source, .. } => stage_refused(source),
            E::Config(e) => config_refused(e),
            _ => false,
        };
    }
    false
}

/// A run file that does not parse or validate is refused; a store it could not be read
/// from is whatever that store error is.
fn config_refused(e: &config::Error) -> bool {
    match e {
        config::Error::Store(e) => store_refused(e),
        _ => true,
    }
}

fn store_refused(e: &store::Error) -> bool {
    matches!(
        e,
        store::Error::AlreadyCommitted { .. }
            | store::Error::Corrupt { .. }
            | store::Error::MissingFile { .. }
            | store::Error::Pruned { .. }
            | store::Error::RunNotFound { .. }
            | store::Error::NotAStore { .. }
            | store::Error::NestedStore { .. }
    )
}

/// An update's refusals are its checks; ranks that fell apart failed.
fn update_refused(e: &stages::update::Error) -> bool {
    match e {
        stages::update::Error::Ranks(e) => ranks_refused(e),
        _ => true,
    }
}

/// Ranks that disagree on what to run, or a launcher environment that is wrong, are
/// refused before anything is done, as is a local rank that was; a rank lost on the way
/// is a failure.
fn ranks_refused(e: &ranks::Error) -> bool {
    matches!(
        e,
        ranks::Error::Differs { .. }
            | ranks::Error::Env { .. }
            | ranks::Error::MissingEnv { .. }
            | ranks::Error::RankFailed { code: Some(3), .. }
    )
}

fn stage_refused(e: &stages::Error) -> bool {
    use petting::{engine, policies, sql, tasks};
    let wrapped = match e {
        stages::Error::Tasks(tasks::Error::Store(e))
        | stages::Error::Policy(policies::Error::Store(e))
        | stages::Error::PrepareData(stages::prepare_data::Error::Store(e))
        | stages::Error::Sql(sql::Error::Store(e))
        | stages::Error::Engine(engine::Error::Store(e)) => Some(e),
        _ => None,
    };
    if let Some(e) = wrapped {
        return store_refused(e);
    }
    match e {
        stages::Error::NotReady { .. }
        | stages::Error::ShardLayout { .. }
        | stages::Error::Reward { .. }
        | stages::Error::NotFinite { .. } => true,
        stages::Error::Update(e) => update_refused(e),
        stages::Error::Store(e) => store_refused(e),
        stages::Error::Config(e) => config_refused(e),
        _ => false,
    }
}

/// A check of the command line's own that failed (`doctor`, `init` over a file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);
