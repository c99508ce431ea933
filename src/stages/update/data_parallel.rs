//! A mini-batch split over the ranks of a data-parallel update, and what each rank
//! computed of it brought back to all.
//!
//! Each rank forwards whole prompt groups (a shared prompt is forwarded once), given out
//! largest first to the rank with the fewest tokens so far: every rank computes the
//! same split from the same mini-batch. Per-sequence results (logprobs) come back by an
//! all-reduce of a zero-filled buffer where each rank wrote only its own sequences: a
//! sum with zeros, so every value arrives exactly.

use std::sync::Arc;

use tch::Tensor;

use crate::model::{ScoreRequest, prompt_groups};
use crate::ranks::{self, Ranks};

/// The sequences of `chunk` (indices into `requests`) that rank `rank` of `world` takes,
/// in `chunk`'s order; all of `chunk` for a world of one.
pub(super) fn shard(chunk: &[usize], requests: &[ScoreRequest], world: u32, rank: u32) -> Vec<usize> {
    if world <= 1 {
        return chunk.to_vec();
    }
    let local: Vec<ScoreRequest> = chunk.iter().map(|&i| requests[i].clone()).collect();
    let mut groups = prompt_groups(&local);
    let cost = |group: &[usize]| -> usize {
        local[group[0]].prompt_ids.len() + group.iter().map(|&j| local[j].response_ids.len()).sum::<usize>()
    };
    // Largest first; a tie keeps the chunk's order.
    groups.sort_by_key(|g| (std::cmp::Reverse(cost(g)), g[0]));
    let mut load = vec![0usize; world as usize];
    let mut mine = Vec::new();
    for group in &groups {
        let lightest = (0..world as usize).min_by_key(|&r| (load[r], r)).expect("a world has a rank");
        load[lightest] += cost(group);
        if lightest == rank as usize {
            mine.extend_from_slice(group);
        }
    }
    mine.sort_unstable();
    mine.into_iter().map(|j| chunk[j]).collect()
}

/// Every sequence's values of `order` (indices into `lengths`), given this rank's
/// `values` of the sequences `mine` (a subset of `order`): gathered over `ranks`, or
/// `values` themselves without ranks (then `mine` is `order`).
pub(super) fn gather(
    ranks: Option<&Arc<Ranks>>,
    order: &[usize],
    lengths: &dyn Fn(usize) -> usize,
    mine: &[usize],
    values: Vec<Vec<f32>>,
    what: &str,
) -> Result<Vec<Vec<f32>>, ranks::Error> {
    let Some(ranks) = ranks else { return Ok(values) };
    let mut offsets = std::collections::HashMap::with_capacity(order.len());
    let mut total = 0;
    for &i in order {
        offsets.insert(i, total);
        total += lengths(i);
    }
    let mut flat = vec![0f32; total];
    for (i, v) in mine.iter().zip(&values) {
        flat[offsets[i]..offsets[i] + v.len()].copy_from_slice(v);
    }
    let buffer = Tensor::from_slice(&flat);
    ranks.sum(&buffer, what)?;
    let flat = Vec::<f32>::try_from(&buffer).expect("a float32 buffer");
    Ok(order.iter().map(|i| flat[offsets[i]..offsets[i] + lengths(*i)].to_vec()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt: i64, prompt_len: usize, response_len: usize) -> ScoreRequest {
        ScoreRequest {
            prompt_ids: vec![prompt; prompt_len],
            response_ids: vec![1; response_len],
            adapter: None,
            images: None,
        }
    }

    #[test]
    fn a_shard_holds_whole_groups_and_the_shards_balance_the_tokens() {
        // Groups (prompt tokens + response tokens): A = 10 + 3·30 = 100, B = 10 + 2·5 = 20,
        // C = 50 + 40 = 90, D = 10 + 10 = 20.
        let requests = vec![
            request(1, 10, 30),
            request(2, 10, 5),
            request(1, 10, 30),
            request(3, 50, 40),
            request(1, 10, 30),
            request(2, 10, 5),
            request(4, 10, 10),
        ];
        let chunk: Vec<usize> = (0..7).collect();
        let shards: Vec<Vec<usize>> = (0..2).map(|r| shard(&chunk, &requests, 2, r)).collect();
        // Largest first to the lightest: A → 0 (100), C → 1 (90), B → 1 (110), D → 0 (120).
        assert_eq!(shards, vec![vec![0, 2, 4, 6], vec![1, 3, 5]]);
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        assert_eq!(all, chunk, "every sequence once");
        assert_eq!(shard(&chunk, &requests, 1, 0), chunk, "a world of one keeps the order");
        // More ranks than groups: some shards are empty.
        assert!(shard(&[1, 5], &requests, 3, 2).is_empty());
    }
}
