//! How ranks meet: at the TCPStore rank 0 serves (torch.distributed's env:// init), each
//! says what it is about to run, and none goes on until all have come and agree.

use std::time::{Duration, Instant};

use super::{C10dError, Error, ProcessGroup, Ranks, Store, Timeouts, World};

/// Joins the ranks of `world`, refusing any whose `digest` (of the run's config and
/// inputs) differs from this one's.
pub fn join(world: &World, digest: &str, timeouts: Timeouts) -> Result<Ranks, Error> {
    let started = Instant::now();
    let address = world.address();
    let seconds = timeouts.rendezvous.as_secs();
    let store = Store::connect(&world.master_addr, world.master_port, world.rank == 0, world.size, timeouts.rendezvous)
        .map_err(|source| match world.rank {
            0 => Error::Serve { address: address.clone(), source },
            rank => Error::Unreachable { rank, address: address.clone(), seconds, source },
        })?;
    let key = |rank: u32| format!("petting/joined/{rank}");
    let lost = |source: C10dError| Error::Unreachable { rank: world.rank, address: address.clone(), seconds, source };
    store.set(&key(world.rank), digest.as_bytes()).map_err(lost)?;
    let mut differs = None;
    for rank in 0..world.size {
        let left = timeouts.rendezvous.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
        let theirs = match store.get(&key(rank), left) {
            Ok(theirs) => theirs,
            Err(_) if started.elapsed() >= timeouts.rendezvous => {
                let missing = missing(&store, world.size, &key).map_err(lost)?;
                return Err(Error::Missing { address, missing, world: world.size, seconds });
            }
            Err(source) => return Err(lost(source)),
        };
        let theirs = String::from_utf8_lossy(&theirs).into_owned();
        if theirs != digest && differs.is_none() {
            differs = Some(Error::Differs {
                what: "run config and inputs".into(),
                rank,
                me: world.rank,
                theirs,
                ours: digest.to_string(),
            });
        }
    }
    // Rank 0 serves the store: it stays until every rank has read every digest, so that
    // each can tell what differed.
    let checked = |rank: u32| format!("petting/checked/{rank}");
    store.set(&checked(world.rank), b"1").map_err(lost)?;
    if world.rank == 0 {
        for rank in 1..world.size {
            let left = timeouts.rendezvous.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
            store.get(&checked(rank), left).map_err(lost)?;
        }
    }
    if let Some(differs) = differs {
        return Err(differs);
    }
    let group =
        ProcessGroup::gloo(&store, &world.master_addr, world.rank, world.size, timeouts.collective).map_err(lost)?;
    Ok(Ranks { world: world.clone(), first: 0, store, group, timeouts, agreements: Default::default() })
}

/// The ranks that have not joined.
fn missing(store: &Store, world: u32, key: &dyn Fn(u32) -> String) -> Result<Vec<u32>, C10dError> {
    let mut missing = Vec::new();
    for rank in 0..world {
        if !store.has(&key(rank))? {
            missing.push(rank);
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    fn world(rank: u32, size: u32, port: u16) -> World {
        World { rank, size, local_rank: rank, master_addr: "127.0.0.1".into(), master_port: port }
    }

    fn port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn short() -> Timeouts {
        Timeouts { rendezvous: Duration::from_secs(3), collective: Duration::from_secs(10) }
    }

    /// Joins `size` ranks on threads of this process, each with its digest, and runs `f`.
    fn on_threads<T: Send + 'static>(
        digests: &[&str],
        f: impl Fn(Result<Ranks, Error>) -> T + Send + Sync + Copy + 'static,
    ) -> Vec<T> {
        let (size, port) = (digests.len() as u32, port());
        let threads: Vec<_> = digests
            .iter()
            .enumerate()
            .map(|(rank, digest)| {
                let digest = digest.to_string();
                std::thread::spawn(move || f(join(&world(rank as u32, size, port), &digest, short())))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn joined_ranks_sum_a_tensor_and_agree_on_a_digest() {
        let sums = on_threads(&["run a", "run a", "run a"], |ranks| {
            let ranks = ranks.unwrap();
            let t = Tensor::from_slice(&[ranks.rank() as f32 + 1.0, 10.0]);
            ranks.sum(&t, "a test sum").unwrap();
            ranks.agree("weights", "same").unwrap();
            Vec::<f32>::try_from(&t).unwrap()
        });
        assert_eq!(sums, vec![vec![6.0, 30.0]; 3]);
    }

    #[test]
    fn a_rank_that_runs_something_else_is_refused() {
        let errors = on_threads(&["run a", "run b"], |ranks| ranks.unwrap_err().to_string());
        assert!(errors[1].contains("rank 0 runs run a, rank 1 runs run b"), "{}", errors[1]);
    }

    #[test]
    fn a_rendezvous_names_the_ranks_that_never_came() {
        let port = port();
        let started = Instant::now();
        let error = join(&world(0, 3, port), "run a", short()).unwrap_err();
        assert!(matches!(&error, Error::Missing { missing, world: 3, .. } if missing == &[1, 2]), "{error}");
        assert!(error.to_string().contains("rank 1, 2 of a world of 3 never joined"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_weights_digest_that_differs_is_an_error_on_every_rank() {
        let errors = on_threads(&["run", "run"], |ranks| {
            let ranks = ranks.unwrap();
            ranks.agree("weights", &format!("sha{}", ranks.rank())).unwrap_err().to_string()
        });
        assert!(errors.iter().all(|e| e.contains("every rank must run the same weights")), "{errors:?}");
    }
}
