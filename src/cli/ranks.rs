//! `--ranks N`, and joining the ranks a launcher started.
//!
//! `--ranks N` without a launcher's environment starts N copies of this very command
//! line with that environment (ranks::launch), as torchrun would; each copy sees it and
//! joins the others instead.

use std::path::Path;
use std::sync::Arc;

use petting::config::RunConfig;
use petting::ranks::{self, Ranks, World};

use super::args::RankArgs;

/// What this process is among ranks.
pub enum Role {
    /// The command runs alone, as ever.
    Alone,
    /// The command ran as local ranks, which have finished.
    Launched,
    /// This process is one rank of `World`.
    Rank(World),
}

/// Starts the local ranks `--ranks N` asks for unless this process is a rank already.
pub fn role(args: &RankArgs) -> anyhow::Result<Role> {
    let world = World::from_env()?;
    match (args.ranks, world) {
        (Some(n), Some(world)) if n != world.size => {
            anyhow::bail!("--ranks {n}, but the launcher's WORLD_SIZE is {}: give one or the other", world.size)
        }
        (_, Some(world)) => Ok(Role::Rank(world)),
        (Some(n), None) if n > 1 => {
            let command: Vec<_> = std::env::args_os().skip(1).collect();
            ranks::launch::run_local(n, &command)?;
            Ok(Role::Launched)
        }
        _ => Ok(Role::Alone),
    }
}

/// Joins the ranks of `world`, all of which must present the same `digest`; a rank
/// other than 0 reports no progress (rank 0 speaks for all).
pub fn join(world: &World, digest: &str, args: &RankArgs) -> anyhow::Result<Arc<Ranks>> {
    if world.rank != 0 {
        super::progress::hide();
    }
    Ok(Arc::new(ranks::join(world, digest, args.timeouts())?))
}

/// An error unless the run's pools add up to `ranks` ranks (`file` is where it says so).
pub fn check_pools(config: &RunConfig, ranks: u32, file: &Path) -> anyhow::Result<()> {
    petting::config::pools::check_world(&config.pools, ranks).map_err(|invalid| petting::config::Error::Invalid {
        file: file.to_path_buf(),
        key: invalid.key,
        message: invalid.message,
    })?;
    Ok(())
}
