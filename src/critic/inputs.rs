//! The token ids a critic values for each turn.
//!
//! ```text
//!  sees: own     the turn's prompt
//!  sees: joint   for every other agent, in play order, its latest turn before this one
//!                (prompt, then reply), then the turn's prompt
//! ```
//!
//! The joint history is what all agents have seen at this point: each prompt already
//! carries its agent's own past, so the latest turn of each other agent completes it
//! (MAPPO's global state, as the concatenation of the agents' observations). Inputs
//! longer than the limit keep their last tokens, those nearest the decision.

use std::collections::HashMap;

use super::Sees;
use super::episodes::episodes;
use crate::tables::TurnRow;

/// Each turn's critic input, by candidate id.
pub fn inputs(turns: &[TurnRow], sees: Sees, max_tokens: usize) -> HashMap<String, Vec<i64>> {
    let mut inputs = HashMap::with_capacity(turns.len());
    for episode in episodes(turns) {
        for (i, row) in episode.iter().enumerate() {
            let mut ids: Vec<i64> = match sees {
                Sees::Own => Vec::new(),
                Sees::Joint => others_latest(&episode[..i], &row.agent)
                    .into_iter()
                    .flat_map(|t| t.prompt_tokens.iter().chain(&t.response_tokens))
                    .map(|&id| i64::from(id))
                    .collect(),
            };
            ids.extend(row.prompt_tokens.iter().map(|&id| i64::from(id)));
            let keep_from = ids.len().saturating_sub(max_tokens);
            inputs.insert(row.candidate_id.clone(), ids.split_off(keep_from));
        }
    }
    inputs
}

/// The latest turn of every agent but `agent` among `earlier`, in play order.
fn others_latest<'a>(earlier: &[&'a TurnRow], agent: &str) -> Vec<&'a TurnRow> {
    let mut latest: Vec<&TurnRow> = Vec::new();
    for row in earlier.iter().rev().filter(|r| r.agent != agent) {
        if !latest.iter().any(|l| l.agent == row.agent) {
            latest.push(row);
        }
    }
    latest.reverse();
    latest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(episode: u32, node_id: u32, agent: &str, prompt: &[i32], response: &[i32]) -> TurnRow {
        TurnRow {
            candidate_id: format!("e{episode}/n{node_id}"),
            task_id: "t".into(),
            episode,
            node_id,
            agent: agent.into(),
            prompt_tokens: prompt.to_vec(),
            response_tokens: response.to_vec(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn a_joint_input_is_the_other_agents_latest_turns_then_the_own_prompt() {
        // Episode 0: a, b, a, c, b (stored out of order); episode 1 stands alone.
        let rows = vec![
            turn(0, 2, "a", &[20], &[21]),
            turn(0, 0, "a", &[1], &[2]),
            turn(0, 1, "b", &[10], &[11]),
            turn(0, 3, "c", &[30], &[31]),
            turn(0, 4, "b", &[40], &[41]),
            turn(1, 0, "b", &[50], &[51]),
        ];
        let own = inputs(&rows, Sees::Own, 100);
        assert_eq!(own["e0/n4"], [40]);
        let joint = inputs(&rows, Sees::Joint, 100);
        assert_eq!(joint["e0/n0"], [1], "the first turn sees only its prompt");
        assert_eq!(joint["e0/n1"], [1, 2, 10]);
        assert_eq!(joint["e0/n2"], [10, 11, 20], "a's own earlier turn is in its prompt, not repeated");
        // b at node 4: a's latest (node 2) and c's (node 3), in play order.
        assert_eq!(joint["e0/n4"], [20, 21, 30, 31, 40]);
        assert_eq!(joint["e1/n0"], [50], "another episode's turns are not seen");
        // Over the limit, the last tokens are kept.
        assert_eq!(inputs(&rows, Sees::Joint, 3)["e0/n4"], [30, 31, 40]);
    }
}
