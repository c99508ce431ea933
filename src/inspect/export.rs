//! Selected trajectories as chat transcripts: one record per agent turn on the selected
//! path, the workflow's prompt as the user message and the reply as the assistant's,
//! with its rewards and provenance. Every agent prompt is complete on its own (history
//! is written into it), so one exchange is exactly what the model saw and answered.
//! JSON Lines in the `messages` layout that TRL and Hugging Face `datasets` read, or
//! Parquet with the same columns.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{FieldRef, Schema};
use serde::{Deserialize, Serialize};
use serde_arrow::schema::{SchemaLike, TracingOptions};

use crate::tables::TurnRow;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub run: String,
    pub iteration: u32,
    pub task_id: String,
    pub episode: u32,
    pub turn: u32,
    pub agent: String,
    pub policy: String,
    pub policy_version: u32,
    pub messages: Vec<Message>,
    pub local_reward: f64,
    pub team_reward: f64,
    /// Whether the episode this turn belongs to ended in success.
    pub episode_success: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The selected candidates of `turns` (one iteration's) as transcripts, in (task,
/// episode, turn, node) order.
pub fn transcripts(turns: &[TurnRow], iteration: u32) -> Vec<Transcript> {
    let succeeded: HashSet<(&str, u32)> =
        turns.iter().filter(|t| t.selected && t.success).map(|t| (t.task_id.as_str(), t.episode)).collect();
    let mut selected: Vec<&TurnRow> = turns.iter().filter(|t| t.selected).collect();
    selected
        .sort_by(|a, b| (&a.task_id, a.episode, a.turn, a.node_id).cmp(&(&b.task_id, b.episode, b.turn, b.node_id)));
    selected
        .into_iter()
        .map(|t| Transcript {
            run: t.run.clone(),
            iteration,
            task_id: t.task_id.clone(),
            episode: t.episode,
            turn: t.turn,
            agent: t.agent.clone(),
            policy: t.policy.clone(),
            policy_version: t.policy_version,
            messages: vec![
                Message { role: "user".into(), content: t.prompt_message.clone() },
                Message { role: "assistant".into(), content: t.response_text.clone() },
            ],
            local_reward: t.local_reward,
            team_reward: t.team_reward,
            episode_success: succeeded.contains(&(t.task_id.as_str(), t.episode)),
        })
        .collect()
}

/// One JSON object per line.
pub fn to_jsonl(transcripts: &[Transcript]) -> String {
    let mut out = String::new();
    for t in transcripts {
        out.push_str(&serde_json::to_string(t).expect("a transcript always serialises"));
        out.push('\n');
    }
    out
}

/// A zstd Parquet file with the transcript's columns (`messages` a list of structs).
pub fn to_parquet(transcripts: &[Transcript]) -> Result<Vec<u8>, super::Error> {
    let fields = Vec::<FieldRef>::from_type::<Transcript>(TracingOptions::default())
        .map_err(|e| super::Error::Export(e.to_string()))?;
    let batch = serde_arrow::to_record_batch(&fields, &transcripts).map_err(|e| super::Error::Export(e.to_string()))?;
    crate::store::parquet_io::encode(Arc::new(Schema::new(fields)), &[batch])
        .map_err(|e| super::Error::Export(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::tree::tests::turn;

    #[test]
    fn only_the_selected_path_becomes_transcripts_with_the_raw_prompt() {
        let tool = TurnRow { selected: true, ..turn(0, 0, "tool", "```python\nprint(bfs(grid, S, G))\n```") };
        let unselected = turn(1, 1, "tool", "no idea");
        let planner = TurnRow { selected: true, success: true, ..turn(2, 0, "planner", "#### tool") };
        let other_episode = TurnRow { episode: 1, selected: true, ..turn(0, 0, "planner", "#### R") };
        let got = transcripts(&[planner, unselected, other_episode, tool], 4);
        let agents: Vec<(u32, &str)> = got.iter().map(|t| (t.episode, t.agent.as_str())).collect();
        assert_eq!(agents, [(0, "tool"), (0, "planner"), (1, "planner")]);
        assert_eq!(
            got[0].messages[0],
            Message { role: "user".into(), content: "You are the tool agent.\nGrid: ...".into() }
        );
        assert_eq!(got[0].messages[1].content, "```python\nprint(bfs(grid, S, G))\n```");
        assert!(got[0].episode_success && got[1].episode_success && !got[2].episode_success);
        assert!(got.iter().all(|t| t.iteration == 4));

        let lines: Vec<serde_json::Value> = to_jsonl(&got).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["messages"][1]["content"], "#### tool");
        assert_eq!(lines[1]["messages"][0]["role"], "user");
    }

    #[test]
    fn parquet_holds_the_same_records() {
        let rows = [TurnRow { selected: true, ..turn(0, 0, "tool", "x") }];
        let bytes = to_parquet(&transcripts(&rows, 0)).unwrap();
        let batches = crate::store::parquet_io::decode(bytes.into()).unwrap();
        let back: Vec<Transcript> = serde_arrow::from_record_batch(&batches[0]).unwrap();
        assert_eq!(back, transcripts(&rows, 0));
    }
}
