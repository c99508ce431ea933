//! Ranks: N processes that run one update data-parallel over libtorch's own c10d
//! (the TCPStore rendezvous and the Gloo process group torch.distributed uses).
//!
//! ```text
//!  launcher (torchrun, srun, a PyTorchJob, or `--ranks N`: launch.rs)
//!    └─ sets RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT for each process
//!  every rank: World::from_env ──► rendezvous::join (rendezvous.rs)
//!    connect to the TCPStore rank 0 serves, publish a digest of what it will run,
//!    wait for every rank (naming the missing ones at the timeout), refuse a differing
//!    digest, then open the Gloo group (group.rs)
//!  the update (stages/update) then sums gradients with Ranks::sum (over a pool's
//!  ranks: Ranks::pool), gives a sharded optimiser's weights with Ranks::broadcast,
//!  and compares the trained weights' digests with Ranks::agree before rank 0 commits
//! ```

mod group;
pub mod launch;
mod rendezvous;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tch::Tensor;

pub use group::C10dError;
use group::{ProcessGroup, Store};
pub use rendezvous::join;

/// Why ranks could not meet or stay together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{var}={value:?}: expected {expected} (set by torchrun, srun or a PyTorchJob; docs/cluster.md)")]
    Env { var: &'static str, value: String, expected: String },

    #[error("{var} is not set: ranks launched by {launcher} need it (docs/cluster.md)")]
    MissingEnv { var: &'static str, launcher: &'static str },

    #[error("rank 0 could not serve the rendezvous store at {address}: {source}")]
    Serve { address: String, source: C10dError },

    #[error(
        "rank {rank} could not reach the rendezvous store at {address} (rank 0 serves it) within {seconds} s: {source}"
    )]
    Unreachable { rank: u32, address: String, seconds: u64, source: C10dError },

    #[error("the rendezvous at {address} timed out after {seconds} s: rank {missing} of a world of {world} never joined", missing = list(missing))]
    Missing { address: String, missing: Vec<u32>, world: u32, seconds: u64 },

    #[error("rank {rank} runs {theirs}, rank {me} runs {ours}: every rank must run the same {what}")]
    Differs { what: String, rank: u32, me: u32, theirs: String, ours: String },

    #[error("rank {rank}: {what} failed{}: {source}", suspects_text(suspects))]
    Collective { rank: u32, what: String, suspects: Vec<u32>, source: C10dError },

    #[error("rank {rank} of {world} failed: {status}")]
    RankFailed { rank: u32, world: u32, status: String, code: Option<i32> },

    #[error("could not start rank {rank}: {source}")]
    Spawn { rank: u32, source: std::io::Error },
}

fn list(ranks: &[u32]) -> String {
    ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

fn suspects_text(suspects: &[u32]) -> String {
    match suspects {
        [] => String::new(),
        ranks => format!(" (rank {} stopped answering)", list(ranks)),
    }
}

/// The fault tests' way to kill a rank mid-update: `PETTING_KILL_RANK_AT_STEP=R:S` makes
/// rank R kill itself (SIGKILL, as an OOM killer would) when it begins step S.
pub fn die_if_told(rank: u32, step: usize) {
    let Ok(told) = std::env::var("PETTING_KILL_RANK_AT_STEP") else { return };
    if told == format!("{rank}:{step}") {
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Where this process stands among the ranks, as the launcher's environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    pub rank: u32,
    pub size: u32,
    pub local_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
}

impl World {
    /// The world torch.distributed would join here: RANK, WORLD_SIZE, LOCAL_RANK,
    /// MASTER_ADDR and MASTER_PORT (torchrun, a PyTorchJob), or Slurm's SLURM_PROCID,
    /// SLURM_NTASKS and SLURM_LOCALID under srun; none for a single process.
    pub fn from_env() -> Result<Option<World>, Error> {
        World::from_vars(|name| std::env::var(name).ok())
    }

    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<World>, Error> {
        let number = |name: &'static str, expected: &str| -> Result<Option<u32>, Error> {
            var(name)
                .map(|value| {
                    value.trim().parse().map_err(|_| Error::Env { var: name, value, expected: expected.to_string() })
                })
                .transpose()
        };
        let (size, rank, local_rank, launcher) = match number("WORLD_SIZE", "a number of ranks")? {
            Some(size) => (size, number("RANK", "this process's rank")?, number("LOCAL_RANK", "a rank")?, "torchrun"),
            None => match number("SLURM_NTASKS", "a number of tasks")? {
                Some(size) => {
                    (size, number("SLURM_PROCID", "a task id")?, number("SLURM_LOCALID", "a task id")?, "srun")
                }
                None => return Ok(None),
            },
        };
        if size <= 1 {
            return Ok(None);
        }
        let rank = rank.ok_or(Error::MissingEnv { var: "RANK", launcher })?;
        if rank >= size {
            return Err(Error::Env { var: "RANK", value: rank.to_string(), expected: format!("a rank below {size}") });
        }
        let master_addr = var("MASTER_ADDR").ok_or(Error::MissingEnv { var: "MASTER_ADDR", launcher })?;
        let port = var("MASTER_PORT").ok_or(Error::MissingEnv { var: "MASTER_PORT", launcher })?;
        let master_port = port.trim().parse().map_err(|_| Error::Env {
            var: "MASTER_PORT",
            value: port.clone(),
            expected: "a TCP port".into(),
        })?;
        Ok(Some(World { rank, size, local_rank: local_rank.unwrap_or(rank), master_addr, master_port }))
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// How long ranks wait for each other.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// For every rank to join the rendezvous.
    pub rendezvous: Duration,
    /// For one collective (a rank that stops answering fails the others after this).
    pub collective: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { rendezvous: Duration::from_secs(300), collective: Duration::from_secs(600) }
    }
}

/// The ranks this process has joined: their store and their Gloo group. A pool's ranks
/// are a `Ranks` too, numbered from 0 within the pool.
pub struct Ranks {
    world: World,
    /// The world rank of this group's rank 0 (0 but for a pool), for messages.
    first: u32,
    store: Store,
    group: ProcessGroup,
    timeouts: Timeouts,
    /// Numbers the store keys of successive agreements.
    agreements: AtomicU64,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks").field("world", &self.world).finish_non_exhaustive()
    }
}

impl Ranks {
    pub fn rank(&self) -> u32 {
        self.world.rank
    }

    pub fn size(&self) -> u32 {
        self.world.size
    }

    /// The rank that commits what the ranks made together.
    pub fn is_leader(&self) -> bool {
        self.world.rank == 0
    }

    /// The ranks `members` of this group, as a group of their own named `name`: every
    /// member calls this (the others need not).
    pub fn pool(&self, name: &str, members: std::ops::Range<u32>) -> Result<Ranks, Error> {
        assert!(members.contains(&self.rank()), "rank {} is not in pool {name} ({members:?})", self.rank());
        let what = format!("pool {name}'s rendezvous");
        let failed = |source| self.collective_failed(&what, source);
        let store = self.store.prefixed(&format!("pool/{name}/")).map_err(failed)?;
        let world = World { rank: self.rank() - members.start, size: members.len() as u32, ..self.world.clone() };
        let group = ProcessGroup::gloo(&store, &world.master_addr, world.rank, world.size, self.timeouts.collective)
            .map_err(failed)?;
        let first = self.first + members.start;
        Ok(Ranks { world, first, store, group, timeouts: self.timeouts, agreements: AtomicU64::new(0) })
    }

    /// Leaves `value` under `key` for any rank to [`Ranks::take`].
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        self.store.set(&format!("petting/put/{key}"), value).map_err(|source| self.collective_failed(key, source))
    }

    /// The value some rank [`Ranks::put`] under `key`, waiting for it.
    pub fn take(&self, key: &str) -> Result<Vec<u8>, Error> {
        let value = self.store.get(&format!("petting/put/{key}"), self.timeouts.collective);
        value.map_err(|source| self.collective_failed(key, source))
    }

    /// Sums `tensor` (contiguous, CPU) over every rank in place; `what` names it in errors.
    pub fn sum(&self, tensor: &Tensor, what: &str) -> Result<(), Error> {
        self.group.all_reduce_sum(tensor).map_err(|source| self.collective_failed(what, source))
    }

    /// Gives every rank `root`'s `tensor` (contiguous, CPU) in place.
    pub fn broadcast(&self, tensor: &Tensor, root: u32, what: &str) -> Result<(), Error> {
        self.group.broadcast(tensor, root).map_err(|source| self.collective_failed(what, source))
    }

    /// Checks that every rank has the same `value` of `what` (a digest), waiting for all.
    pub fn agree(&self, what: &str, value: &str) -> Result<(), Error> {
        let n = self.agreements.fetch_add(1, Ordering::Relaxed);
        let key = |rank: u32| format!("petting/agree/{n}/{rank}");
        let failed = |source| self.collective_failed(what, source);
        self.store.set(&key(self.rank()), value.as_bytes()).map_err(failed)?;
        for rank in 0..self.size() {
            let theirs = self.store.get(&key(rank), self.timeouts.collective).map_err(failed)?;
            let theirs = String::from_utf8_lossy(&theirs).into_owned();
            if theirs != value {
                return Err(Error::Differs {
                    what: what.to_string(),
                    rank,
                    me: self.rank(),
                    theirs,
                    ours: value.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Rank 0's `value` of `what` on every rank: rank 0 gives it, the others wait for it,
    /// and rank 0 returns once all have it (the store it serves ends with it).
    pub fn from_leader(&self, what: &str, value: Option<&str>) -> Result<String, Error> {
        let n = self.agreements.fetch_add(1, Ordering::Relaxed);
        let key = format!("petting/leader/{n}");
        let heard = |rank: u32| format!("petting/leader/{n}/{rank}");
        let failed = |source| self.collective_failed(what, source);
        if let Some(value) = value.filter(|_| self.is_leader()) {
            self.store.set(&key, value.as_bytes()).map_err(failed)?;
            for rank in 1..self.size() {
                self.store.get(&heard(rank), self.timeouts.collective).map_err(failed)?;
            }
            return Ok(value.to_string());
        }
        let value = self.store.get(&key, self.timeouts.collective).map_err(failed)?;
        self.store.set(&heard(self.rank()), b"1").map_err(failed)?;
        Ok(String::from_utf8_lossy(&value).into_owned())
    }

    /// The error of a failed collective, naming the ranks that seem gone: every rank
    /// that sees a failure says so in the store, and those that have not within a few
    /// seconds are the suspects; rank 0 when the store it serves is gone.
    fn collective_failed(&self, what: &str, source: C10dError) -> Error {
        let key = |rank: u32| format!("petting/failed/{rank}");
        let deadline = Instant::now() + Duration::from_secs(3);
        let suspects = loop {
            let silent: Result<Vec<u32>, C10dError> = self.store.set(&key(self.rank()), b"1").and_then(|()| {
                let mut silent = Vec::new();
                for rank in 0..self.size() {
                    if !self.store.has(&key(rank))? {
                        silent.push(rank);
                    }
                }
                Ok(silent)
            });
            match silent {
                // The store is gone: rank 0 serves it.
                Err(_) => break vec![0],
                Ok(silent) if silent.is_empty() || Instant::now() > deadline => break silent,
                Ok(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let suspects = suspects.into_iter().map(|r| r + self.first).collect();
        Error::Collective { rank: self.first + self.rank(), what: what.to_string(), suspects, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(vars: &[(&str, &str)]) -> Result<Option<World>, Error> {
        World::from_vars(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn torchrun_and_srun_environments_give_the_same_world() {
        let torchrun = world(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        let srun = world(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        let expected = World { rank: 3, size: 4, local_rank: 1, master_addr: "node0".into(), master_port: 29500 };
        assert_eq!(torchrun, Some(expected.clone()));
        assert_eq!(srun, Some(expected));
    }

    #[test]
    fn a_single_process_has_no_world_and_a_bad_variable_is_named() {
        assert_eq!(world(&[]).unwrap(), None);
        assert_eq!(world(&[("WORLD_SIZE", "1"), ("RANK", "0")]).unwrap(), None);
        let bad = world(&[("WORLD_SIZE", "two")]).unwrap_err().to_string();
        assert!(bad.contains("WORLD_SIZE=\"two\""), "{bad}");
        let missing = world(&[("WORLD_SIZE", "2"), ("RANK", "1")]).unwrap_err().to_string();
        assert!(missing.contains("MASTER_ADDR is not set"), "{missing}");
        let beyond = world(&[("WORLD_SIZE", "2"), ("RANK", "2")]).unwrap_err().to_string();
        assert!(beyond.contains("a rank below 2"), "{beyond}");
    }
}
