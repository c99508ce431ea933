//! Which prompt tokens a prefill computes, and in which slot, when prompts share prefixes.
//!
//! The prompts of one rollout call repeat long prefixes: every prompt of an agent starts
//! with the same system and instruction text, and the K trajectories of a task share the
//! task's text before their histories part. Prefilling each prompt whole computes those
//! tokens once per prompt. The plan computes each shared run once, in the slot of the
//! first prompt that has it, and copies the cached keys and values of that run to the
//! slots of the other prompts before their own tokens are computed on top of it:
//!
//! ```text
//!  prompt 0  s s s s t t t a a        level 0   s s s s          slot 0
//!  prompt 1  s s s s t t t b b b                        u u c    slot 2 ← slot 0's 0..4
//!  prompt 2  s s s s u u c            level 1   t t t            slot 0
//!                                     level 2   a a              slot 0
//!                                               b b b            slot 1 ← slot 0's 0..7
//! ```
//!
//! A level's segments only need the levels before it, so each level is one batch of
//! forwards. The keys and values a token gets do not depend on the slot that computes
//! it, so every prompt ends with the cache it would have alone (up to float summation
//! order). Only prompts of the same adapter share (an adapter changes keys and values),
//! and a run shorter than [`MIN_SHARED`] tokens is computed per prompt: the copy and the
//! extra forward would cost more than it saves.

/// Tokens a run must have to be computed once for several prompts.
pub(crate) const MIN_SHARED: usize = 16;

/// Tokens `start..end` of prompt `prompt`, computed in that prompt's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub prompt: usize,
    pub start: usize,
    pub end: usize,
    /// The prompt whose slot holds columns `0..start` for this one, to copy first.
    pub copy_from: Option<usize>,
}

/// The segments to compute, by level: every token of every prompt is in exactly one
/// segment of a prompt that shares it, and each prompt's last token in its own.
/// `groups[i]` says which prompts may share (the adapter).
pub(crate) fn plan<G: PartialEq>(prompts: &[&[i64]], groups: &[G]) -> Vec<Vec<Segment>> {
    let mut levels = Vec::new();
    let mut by_group: Vec<Vec<usize>> = Vec::new();
    for i in 0..prompts.len() {
        match by_group.iter_mut().find(|members| groups[members[0]] == groups[i]) {
            Some(members) => members.push(i),
            None => by_group.push(vec![i]),
        }
    }
    for members in by_group {
        split(prompts, &members, 0, 0, None, &mut levels);
    }
    levels
}

/// The forwards of one level, in order: its segments cut into pieces of at most `tokens`
/// tokens (a segment's later pieces attend to its earlier ones, so each round of pieces
/// runs after the one before), each round's pieces grouped longest first into forwards of
/// at most `tokens` positions with padding, a row at least 7/8 of its forward's longest so
/// that padding stays under an eighth of the work.
pub(crate) fn forwards(level: &[Segment], tokens: usize) -> Vec<Vec<Segment>> {
    let rounds = level.iter().map(|s| (s.end - s.start).div_ceil(tokens)).max().unwrap_or(0);
    let mut out = Vec::new();
    for round in 0..rounds {
        let mut pieces: Vec<Segment> = level
            .iter()
            .filter(|s| s.start + round * tokens < s.end)
            .map(|s| {
                let start = s.start + round * tokens;
                Segment { start, end: s.end.min(start + tokens), ..s.clone() }
            })
            .collect();
        pieces.sort_by_key(|p| std::cmp::Reverse(p.end - p.start));
        let mut forward: Vec<Segment> = Vec::new();
        for piece in pieces {
            let longest = forward.first().map_or(0, |f| f.end - f.start);
            let short = 8 * (piece.end - piece.start) < 7 * longest;
            if !forward.is_empty() && ((forward.len() + 1) * longest > tokens || short) {
                out.push(std::mem::take(&mut forward));
            }
            forward.push(piece);
        }
        out.push(forward);
    }
    out
}

/// Plans `members`, which share tokens `0..start`; `parent` holds those columns.
fn split(
    prompts: &[&[i64]],
    members: &[usize],
    start: usize,
    level: usize,
    parent: Option<usize>,
    levels: &mut Vec<Vec<Segment>>,
) {
    let mut push = |level: usize, segment: Segment| {
        if levels.len() <= level {
            levels.resize(level + 1, Vec::new());
        }
        levels[level].push(segment);
    };
    let copy_into = |prompt: usize| parent.filter(|&p| p != prompt);
    if let [only] = members {
        let segment = Segment { prompt: *only, start, end: prompts[*only].len(), copy_from: copy_into(*only) };
        return push(level, segment);
    }
    // Each prompt keeps at least its last token: its hidden state gives the first logits.
    let shortest = members.iter().map(|&m| prompts[m].len()).min().expect("members is not empty");
    let shared = common_prefix(prompts, members).min(shortest - 1);
    if shared - start >= MIN_SHARED {
        let first = members[0];
        push(level, Segment { prompt: first, start, end: shared, copy_from: copy_into(first) });
        for part in partition_at(prompts, members, shared) {
            split(prompts, &part, shared, level + 1, Some(first), levels);
        }
        return;
    }
    let parts = partition_at(prompts, members, shared);
    if parts.len() == 1 {
        // Only where one prompt is a prefix of the rest: each computes its own tokens.
        for &m in members {
            push(level, Segment { prompt: m, start, end: prompts[m].len(), copy_from: copy_into(m) });
        }
        return;
    }
    for part in parts {
        split(prompts, &part, start, level, parent, levels);
    }
}

/// Tokens every member has in common from the start.
fn common_prefix(prompts: &[&[i64]], members: &[usize]) -> usize {
    let first = prompts[members[0]];
    members[1..].iter().map(|&m| first.iter().zip(prompts[m]).take_while(|(a, b)| a == b).count()).min().unwrap_or(0)
}

/// `members` split by their token at `at` (each has one), in order of first appearance.
fn partition_at(prompts: &[&[i64]], members: &[usize], at: usize) -> Vec<Vec<usize>> {
    let mut parts: Vec<Vec<usize>> = Vec::new();
    for &m in members {
        match parts.iter_mut().find(|part| prompts[part[0]][at] == prompts[m][at]) {
            Some(part) => part.push(m),
            None => parts.push(vec![m]),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(prompt: usize, start: usize, end: usize, copy_from: Option<usize>) -> Segment {
        Segment { prompt, start, end, copy_from }
    }

    /// `shared` tokens of `base`, then `tail`.
    fn prompt(base: i64, shared: usize, tail: &[i64]) -> Vec<i64> {
        (0..shared as i64).map(|t| base + t).chain(tail.iter().copied()).collect()
    }

    /// Every token of every prompt is computed once in a slot that ends up holding it,
    /// and copies only read columns computed at an earlier level.
    fn check_covers(prompts: &[&[i64]], levels: &[Vec<Segment>]) {
        // held[p]: columns of prompt p's slot computed or copied so far.
        let mut held = vec![0usize; prompts.len()];
        for level in levels {
            let before = held.clone();
            for s in level {
                if let Some(from) = s.copy_from {
                    assert!(before[from] >= s.start, "{s:?} copies columns not yet held");
                    assert_eq!(prompts[from][..s.start], prompts[s.prompt][..s.start]);
                    held[s.prompt] = s.start;
                }
                assert_eq!(held[s.prompt], s.start, "{s:?} starts where its slot's columns end");
                held[s.prompt] = s.end;
            }
        }
        for (p, prompt) in prompts.iter().enumerate() {
            assert_eq!(held[p], prompt.len(), "prompt {p}");
        }
    }

    #[test]
    fn a_shared_system_prompt_and_per_task_text_are_computed_once() {
        // Prompts 0 and 1 share 40 tokens (system 20 + task 20); prompt 2 shares the system's 20.
        let p0 = prompt(100, 20, &[(0..20).map(|t| 500 + t).collect::<Vec<_>>(), vec![1, 2]].concat());
        let p1 = prompt(100, 20, &[(0..20).map(|t| 500 + t).collect::<Vec<_>>(), vec![3, 4, 5]].concat());
        let p2 = prompt(100, 20, &[9, 9, 9]);
        let prompts = [p0.as_slice(), p1.as_slice(), p2.as_slice()];
        let levels = plan(&prompts, &[(); 3]);
        assert_eq!(
            levels,
            vec![
                vec![seg(0, 0, 20, None)],
                vec![seg(0, 20, 40, None), seg(2, 20, 23, Some(0))],
                vec![seg(0, 40, 42, None), seg(1, 40, 43, Some(0))],
            ]
        );
        check_covers(&prompts, &levels);
        let computed: usize = levels.iter().flatten().map(|s| s.end - s.start).sum();
        assert_eq!(computed, 20 + 20 + 3 + 2 + 3);
    }

    #[test]
    fn short_common_runs_distinct_prompts_and_other_adapters_are_not_shared() {
        let a = prompt(7, 10, &[1]);
        let b = prompt(7, 10, &[2]);
        let c = prompt(7, 30, &[]);
        let prompts = [a.as_slice(), b.as_slice(), c.as_slice()];
        // 10 common tokens are under MIN_SHARED; c shares 10 with a and b too.
        assert_eq!(
            plan(&prompts, &[0, 0, 0]),
            vec![vec![seg(0, 0, 11, None), seg(1, 0, 11, None), seg(2, 0, 30, None)]]
        );
        // Prompts of other adapters never share, whatever their tokens.
        let same = prompt(7, 30, &[]);
        let prompts = [same.as_slice(), same.as_slice()];
        assert_eq!(plan(&prompts, &[Some(0), Some(1)]), vec![vec![seg(0, 0, 30, None), seg(1, 0, 30, None)]]);
    }

    #[test]
    fn a_prompt_that_is_a_prefix_of_another_keeps_its_last_token() {
        let long = prompt(3, 40, &[]);
        let short = prompt(3, 25, &[]);
        let prompts = [long.as_slice(), short.as_slice()];
        let levels = plan(&prompts, &[(); 2]);
        assert_eq!(levels, vec![vec![seg(0, 0, 24, None)], vec![seg(0, 24, 40, None), seg(1, 24, 25, Some(0))]]);
        check_covers(&prompts, &levels);
    }

    #[test]
    fn forwards_cut_long_segments_and_group_similar_lengths_within_the_budget() {
        let level = [
            seg(0, 0, 10, None),
            seg(1, 5, 8, Some(0)),
            seg(2, 0, 9, None),
            seg(3, 0, 25, None),
            seg(4, 3, 6, None),
            seg(5, 0, 8, None),
        ];
        let forwards = forwards(&level, 20);
        let shapes: Vec<Vec<(usize, usize, usize)>> =
            forwards.iter().map(|f| f.iter().map(|s| (s.prompt, s.start, s.end)).collect()).collect();
        // Round 0, longest first: 20 tokens alone (a second row would pass 20 positions);
        // 10 and 9 together (18 positions), 8 is under 7/8 of 10; 8, 3 and 3 would pad the
        // 3s to 8. Round 1: the rest of prompt 3, after its first 20.
        assert_eq!(
            shapes,
            vec![
                vec![(3, 0, 20)],
                vec![(0, 0, 10), (2, 0, 9)],
                vec![(5, 0, 8)],
                vec![(1, 5, 8), (4, 3, 6)],
                vec![(3, 20, 25)],
            ]
        );
    }

    #[test]
    fn many_prompts_of_many_tasks_cover_every_token_once() {
        // 4 tasks × 4 trajectories: a 30-token system text, 20 per task, a distinct tail.
        let prompts: Vec<Vec<i64>> = (0..16)
            .map(|i| {
                let task: Vec<i64> = (0..20).map(|t| 1000 * (i / 4 + 1) + t).collect();
                let tail: Vec<i64> = (0..(3 + i % 5)).map(|t| 50_000 + 100 * i + t).collect();
                prompt(1, 30, &[task, tail].concat())
            })
            .collect();
        let slices: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
        let levels = plan(&slices, &[(); 16]);
        check_covers(&slices, &levels);
        let computed: usize = levels.iter().flatten().map(|s| s.end - s.start).sum();
        let tails: usize = (0..16).map(|i| 3 + i % 5).sum();
        assert_eq!(computed, 30 + 4 * 20 + tails);
        assert_eq!(levels.len(), 3);
    }
}
