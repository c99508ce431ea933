//! `pools:`: which ranks update which policy. With ranks (`--ranks`, torchrun, srun),
//! the ranks are dealt to the pools in the order of their names, and each policy's update
//! runs data-parallel over its pool's ranks only, every pool at the same time: the
//! policies of a per-role team update side by side (PettingLLMs' resource pools).

use std::collections::BTreeMap;
use std::ops::Range;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policies::PolicyConfig;
use crate::validate::{Invalid, check};

/// One pool of ranks (`pools.<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Ranks in the pool; a policy of the pool trains data-parallel over them.
    pub ranks: u32,
}

/// The ranks of each pool: the pools in the order of their names, each taking the next
/// `ranks` ranks.
pub fn members(pools: &BTreeMap<String, PoolConfig>) -> Vec<(String, Range<u32>)> {
    let mut next = 0;
    pools
        .iter()
        .map(|(name, pool)| {
            let range = next..next + pool.ranks;
            next = range.end;
            (name.clone(), range)
        })
        .collect()
}

/// Every pool has ranks and policies, and with pools every policy is in one.
pub(super) fn validate(
    pools: &BTreeMap<String, PoolConfig>,
    policies: &BTreeMap<String, PolicyConfig>,
) -> Result<(), Invalid> {
    for (name, pool) in pools {
        check(pool.ranks >= 1, format!("pools.{name}.ranks"), "must be at least 1")?;
        check(
            policies.values().any(|p| p.pool.as_deref() == Some(name.as_str())),
            format!("pools.{name}"),
            "no policy names this pool (policies.<name>.pool)",
        )?;
    }
    for (name, policy) in policies {
        let key = format!("policies.{name}.pool");
        match &policy.pool {
            Some(pool) => check(
                pools.contains_key(pool),
                key,
                format!("names no pool; the pools are: {}", pools.keys().cloned().collect::<Vec<_>>().join(", ")),
            )?,
            None => check(pools.is_empty(), key, "is missing: with pools, every policy is in one")?,
        }
    }
    Ok(())
}

/// An error unless the pools' ranks add up to a world of `world` ranks.
pub fn check_world(pools: &BTreeMap<String, PoolConfig>, world: u32) -> Result<(), Invalid> {
    let total: u32 = pools.values().map(|p| p.ranks).sum();
    let each: Vec<String> = pools.iter().map(|(name, p)| format!("{name}: {}", p.ranks)).collect();
    check(
        pools.is_empty() || total == world,
        "pools",
        format!(
            "name {total} ranks in all ({}), but the run has {world}: give the ranks the pools add up to",
            each.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_take_the_ranks_in_the_order_of_their_names() {
        let pools = BTreeMap::from([
            ("tool".to_string(), PoolConfig { ranks: 1 }),
            ("planner".to_string(), PoolConfig { ranks: 3 }),
        ]);
        assert_eq!(members(&pools), vec![("planner".to_string(), 0..3), ("tool".to_string(), 3..4)]);
        assert!(check_world(&pools, 4).is_ok());
        let error = check_world(&pools, 2).unwrap_err();
        assert!(error.message.contains("name 4 ranks in all (planner: 3, tool: 1), but the run has 2"), "{error:?}");
        assert!(check_world(&BTreeMap::new(), 7).is_ok(), "no pools: every rank trains every policy");
    }
}
