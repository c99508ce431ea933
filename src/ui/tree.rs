//! One task's sampling tree for the page: the steps of its episodes as `petting show`
//! groups them, each candidate's response token by token with the logprob it was
//! sampled at, in the text the run's own tokenizer gives each token.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::inspect::{self, TaskTree};
use crate::model::Tokenizer;
use crate::store::RunStore;
use crate::tables::TurnRow;

/// The candidates of one (episode, turn, agent): they share a prompt.
#[derive(Debug, Serialize)]
pub struct Step {
    episode: u32,
    turn: u32,
    agent: String,
    policy: String,
    policy_version: u32,
    prompt: String,
    prompt_tokens: usize,
    candidates: Vec<Candidate>,
}

#[derive(Debug, Serialize)]
pub struct Candidate {
    branch: u32,
    node_id: u32,
    parent_id: Option<u32>,
    selected: bool,
    local_reward: f64,
    team_reward: f64,
    advantage: Option<f64>,
    staleness: Option<u32>,
    success: bool,
    finish_reason: String,
    parse_error: Option<String>,
    feedback: Option<String>,
    /// (text, logprob) of each response token; the text is the token id in brackets
    /// where the run's store holds no tokenizer.
    tokens: Vec<(String, f32)>,
}

/// The tree of `task` in iteration `iteration` of `store`, steps in the order they ran.
pub async fn task_tree(store: &RunStore, iteration: u32, task: &str) -> Result<Vec<Step>, inspect::Error> {
    let TaskTree { mut turns, advantages } = inspect::task_tree(store, iteration, task).await?;
    turns.sort_by_key(|t| (t.episode, t.node_id));
    let tokenizers = tokenizers(store, &turns).await;
    let mut steps = Vec::new();
    for group in turns.chunk_by(|a, b| (a.episode, a.turn, &a.agent) == (b.episode, b.turn, &b.agent)) {
        let first = &group[0];
        let tokenizer = tokenizers.get(&first.policy);
        steps.push(Step {
            episode: first.episode,
            turn: first.turn,
            agent: first.agent.clone(),
            policy: first.policy.clone(),
            policy_version: first.policy_version,
            prompt: first.prompt_message.clone(),
            prompt_tokens: first.prompt_tokens.len(),
            candidates: group.iter().map(|t| candidate(t, advantages.get(&t.candidate_id), tokenizer)).collect(),
        });
    }
    Ok(steps)
}

fn candidate(turn: &TurnRow, advantage: Option<&f64>, tokenizer: Option<&Tokenizer>) -> Candidate {
    let texts = token_texts(&turn.response_tokens, tokenizer);
    Candidate {
        branch: turn.branch,
        node_id: turn.node_id,
        parent_id: turn.parent_id,
        selected: turn.selected,
        local_reward: turn.local_reward,
        team_reward: turn.team_reward,
        advantage: advantage.copied(),
        staleness: turn.staleness,
        success: turn.success,
        finish_reason: turn.finish_reason.clone(),
        parse_error: turn.parse_error.clone(),
        feedback: turn.feedback.clone(),
        tokens: texts.into_iter().zip(turn.response_logprobs.iter().copied()).collect(),
    }
}

/// The text each token adds to the response: the difference between decoding the tokens
/// up to it and up to the last one that ended on a whole character, so a character split
/// over several byte-level tokens shows on the token that completes it.
fn token_texts(ids: &[i32], tokenizer: Option<&Tokenizer>) -> Vec<String> {
    let Some(tokenizer) = tokenizer else {
        return ids.iter().map(|id| format!("[{id}]")).collect();
    };
    let ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
    let mut texts = Vec::with_capacity(ids.len());
    let mut before = String::new();
    for end in 1..=ids.len() {
        let Ok(text) = tokenizer.decode(&ids[..end], false) else {
            texts.push(format!("[{}]", ids[end - 1]));
            continue;
        };
        if text.ends_with(char::REPLACEMENT_CHARACTER) && end < ids.len() {
            // A character cut short: its bytes show on the token that completes it.
            texts.push(String::new());
            continue;
        }
        texts.push(match text.strip_prefix(before.as_str()) {
            Some(added) => added.to_string(),
            None => tokenizer.decode(&ids[end - 1..end], false).unwrap_or_default(),
        });
        before = text;
    }
    texts
}

/// The tokenizer of each policy in `turns`, from any of its committed checkpoints (a
/// checkpoint carries the tokenizer the policy was loaded with); a policy whose
/// checkpoints are all pruned has none.
async fn tokenizers(store: &RunStore, turns: &[TurnRow]) -> HashMap<String, Tokenizer> {
    let mut policies: Vec<&str> = turns.iter().map(|t| t.policy.as_str()).collect();
    policies.sort();
    policies.dedup();
    let Ok(markers) = store.markers().await else { return HashMap::new() };
    let mut found = HashMap::new();
    for policy in policies {
        let prefix = format!("checkpoints/{policy}/");
        let files = markers.iter().flat_map(|m| &m.marker.files);
        for entry in files.filter(|f| f.path.starts_with(&prefix) && f.path.ends_with("/tokenizer.json")) {
            let Ok(bytes) = store.read_file(entry).await else { continue };
            let text = String::from_utf8_lossy(&bytes);
            if let Ok(tokenizer) = Tokenizer::from_json(&text, Path::new(&entry.path)) {
                found.insert(policy.to_string(), tokenizer);
                break;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_texts_add_up_to_the_response_even_where_a_character_spans_tokens() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-tiny-qwen3/tokenizer.json");
        let tokenizer = Tokenizer::from_file(&file).unwrap();
        let text = "Grüße, 世界! print(bfs(grid))";
        let ids: Vec<i32> = tokenizer.encode(text, false).unwrap().into_iter().map(|id| id as i32).collect();
        let texts = token_texts(&ids, Some(&tokenizer));
        assert_eq!(texts.len(), ids.len());
        assert_eq!(texts.concat(), text);
        assert_eq!(token_texts(&[7, 42], None), ["[7]", "[42]"]);
    }
}
