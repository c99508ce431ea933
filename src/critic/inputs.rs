//! The token ids a critic values for each turn.
//!
//! ```text
//!  sees: own     the turn's prompt
//!  sees: joint   for every other agent, in play order, its latest turn before this one
//!                (prompt, then reply), then the turn's prompt
//!  values: token then the reply but its last token: the state before each reply token
//!                is the position before it, the first being the prompt's last
//! ```
//!
//! The joint history is what all agents have seen at this point: each prompt already
//! carries its agent's own past, so the latest turn of each other agent completes it
//! (MAPPO's global state, as the concatenation of the agents' observations). Inputs
//! longer than the limit keep their last tokens, those nearest the decision, and never
//! fewer than the positions valued.

use std::collections::HashMap;

use super::episodes::episodes;
use super::{CriticConfig, Sees, ValuesAt};
use crate::tables::TurnRow;

/// What a critic reads for one turn: token ids, of which the last `positions` are valued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriticInput {
    pub ids: Vec<i64>,
    /// 1 for a turn valued at its state; the reply's length (at least 1) with `values: token`.
    pub positions: usize,
}

/// Each turn's critic input, by candidate id.
pub fn inputs(turns: &[TurnRow], critic: &CriticConfig) -> HashMap<String, CriticInput> {
    let mut inputs = HashMap::with_capacity(turns.len());
    for episode in episodes(turns) {
        for (i, row) in episode.iter().enumerate() {
            let mut ids: Vec<i64> = match critic.sees {
                Sees::Own => Vec::new(),
                Sees::Joint => others_latest(&episode[..i], &row.agent)
                    .into_iter()
                    .flat_map(|t| t.prompt_tokens.iter().chain(&t.response_tokens))
                    .map(|&id| i64::from(id))
                    .collect(),
            };
            ids.extend(row.prompt_tokens.iter().map(|&id| i64::from(id)));
            let positions = match critic.values {
                ValuesAt::Turn => 1,
                ValuesAt::Token => {
                    let reply = &row.response_tokens[..row.response_tokens.len().saturating_sub(1)];
                    ids.extend(reply.iter().map(|&id| i64::from(id)));
                    row.response_tokens.len().max(1)
                }
            };
            let keep_from = ids.len().saturating_sub((critic.max_input_tokens as usize).max(positions));
            inputs.insert(row.candidate_id.clone(), CriticInput { ids: ids.split_off(keep_from), positions });
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
        let critic = |sees, max_input_tokens| CriticConfig { sees, max_input_tokens, ..CriticConfig::default() };
        let ids = |inputs: &HashMap<String, CriticInput>, id: &str| {
            assert_eq!(inputs[id].positions, 1);
            inputs[id].ids.clone()
        };
        let own = inputs(&rows, &critic(Sees::Own, 100));
        assert_eq!(ids(&own, "e0/n4"), [40]);
        let joint = inputs(&rows, &critic(Sees::Joint, 100));
        assert_eq!(ids(&joint, "e0/n0"), [1], "the first turn sees only its prompt");
        assert_eq!(ids(&joint, "e0/n1"), [1, 2, 10]);
        assert_eq!(ids(&joint, "e0/n2"), [10, 11, 20], "a's own earlier turn is in its prompt, not repeated");
        // b at node 4: a's latest (node 2) and c's (node 3), in play order.
        assert_eq!(ids(&joint, "e0/n4"), [20, 21, 30, 31, 40]);
        assert_eq!(ids(&joint, "e1/n0"), [50], "another episode's turns are not seen");
        // Over the limit, the last tokens are kept.
        assert_eq!(ids(&inputs(&rows, &critic(Sees::Joint, 3)), "e0/n4"), [30, 31, 40]);
    }

    #[test]
    fn a_token_level_input_runs_to_the_replys_last_token_but_one_and_values_every_reply_position() {
        let rows = vec![turn(0, 0, "a", &[1, 2], &[3, 4, 5]), turn(0, 1, "b", &[10], &[]), turn(0, 2, "a", &[6], &[7])];
        let critic = CriticConfig { values: ValuesAt::Token, max_input_tokens: 2, ..CriticConfig::default() };
        let got = inputs(&rows, &critic);
        // Positions 2, 3, 4 of [1 2 3 4]: the states before 3, 4 and 5. The limit of 2
        // gives way to the 3 positions valued.
        assert_eq!(got["e0/n0"], CriticInput { ids: vec![2, 3, 4], positions: 3 });
        assert_eq!(got["e0/n1"], CriticInput { ids: vec![10], positions: 1 }, "an empty reply: its state");
        assert_eq!(got["e0/n2"], CriticInput { ids: vec![6], positions: 1 });
    }
}
