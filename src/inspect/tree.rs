//! One task's sampling tree as text: per (episode, turn, agent) the K candidates with
//! their rewards and advantages, the selected one marked, prompts and responses folded
//! unless asked for in full, parse errors, cut-off and empty replies, tool output and
//! environment feedback.
//!
//! ```text
//! episode 0 · turn 0 · tool · policy shared v3 · 8 candidates
//!   prompt (157 tokens): You are the tool agent of a team of two. Write a short Python…
//! ▶ b3  r +1.200 (team +1.000, local +0.200)  A +1.351  12 tokens, eos
//!       ```python⏎print(bfs(grid, S, G))⏎```
//!       feedback: RRDDLL
//! ```

use std::collections::HashMap;
use std::fmt::Write;

use crate::tables::TurnRow;

/// How much to show.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Whole prompts and responses instead of their first characters.
    pub full: bool,
    /// ANSI colours (a terminal).
    pub color: bool,
}

/// Characters of a folded prompt, response or feedback.
const FOLDED_CHARS: usize = 100;

/// Renders the candidates of one task. `advantages` maps candidate ids to the advantage
/// the update trained them with (candidates of filtered groups have none).
pub fn render(turns: &[TurnRow], advantages: &HashMap<String, f64>, options: RenderOptions) -> String {
    let mut sorted: Vec<&TurnRow> = turns.iter().collect();
    // Node ids grow step by step, so this is the order the turns were played in (for an
    // agent program, the order of its calls).
    sorted.sort_by_key(|t| (t.episode, t.node_id));
    let mut out = String::new();
    for group in sorted.chunk_by(|a, b| (a.episode, a.turn, &a.agent) == (b.episode, b.turn, &b.agent)) {
        render_group(&mut out, group, advantages, options);
    }
    out
}

fn render_group(out: &mut String, group: &[&TurnRow], advantages: &HashMap<String, f64>, options: RenderOptions) {
    let first = group[0];
    let header = format!(
        "episode {} · turn {} · {} · policy {} v{} · {} candidate{}",
        first.episode,
        first.turn,
        first.agent,
        first.policy,
        first.policy_version,
        group.len(),
        if group.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "{}", paint(&header, Style::Bold, options));
    // The branches of one step share their prompt (an independent episode has one branch).
    let _ = writeln!(out, "  prompt ({} tokens): {}", first.prompt_tokens.len(), shown(&first.prompt_message, options));
    for turn in group {
        render_candidate(out, turn, advantages.get(&turn.candidate_id), options);
    }
    out.push('\n');
}

fn render_candidate(out: &mut String, turn: &TurnRow, advantage: Option<&f64>, options: RenderOptions) {
    let marker = if turn.selected { "▶" } else { " " };
    let advantage = advantage.map_or("A —".to_string(), |a| format!("A {a:+.3}"));
    let summary = format!(
        "{marker} b{}  r {:+.3} (team {:+.3}, local {:+.3})  {advantage}  {} tokens, {}{}",
        turn.branch,
        turn.team_reward + turn.local_reward,
        turn.team_reward,
        turn.local_reward,
        turn.response_tokens.len(),
        finish(&turn.finish_reason),
        if turn.success { ", success" } else { "" },
    );
    let style = if turn.selected { Style::Selected } else { Style::Plain };
    let _ = writeln!(out, "{}", paint(&summary, style, options));
    let indent = "      ";
    let response = if turn.response_text.trim().is_empty() {
        paint("(empty response)", Style::Warn, options)
    } else {
        shown(&turn.response_text, options)
    };
    let _ = writeln!(out, "{indent}{response}");
    if let Some(error) = &turn.parse_error {
        let _ = writeln!(out, "{indent}{}", paint(&format!("parse error: {error}"), Style::Warn, options));
    }
    if let Some(feedback) = &turn.feedback {
        let _ = writeln!(out, "{indent}feedback: {}", shown(feedback, options));
    }
}

/// Why generation stopped, in words.
fn finish(reason: &str) -> &str {
    match reason {
        "length" => "cut at max_new_tokens",
        "eos" => "eos",
        other => other,
    }
}

/// The text whole (indented) with `full`, else its first characters on one line.
fn shown(text: &str, options: RenderOptions) -> String {
    if options.full {
        return text.replace('\n', "\n      ");
    }
    let one_line = text.trim().replace('\n', "⏎");
    let mut folded: String = one_line.chars().take(FOLDED_CHARS).collect();
    if one_line.chars().count() > FOLDED_CHARS {
        folded.push('…');
    }
    folded
}

#[derive(Clone, Copy)]
enum Style {
    Plain,
    Bold,
    Selected,
    Warn,
}

fn paint(text: &str, style: Style, options: RenderOptions) -> String {
    let code = match style {
        Style::Plain => return text.to_string(),
        Style::Bold => "1",
        Style::Selected => "1;32",
        Style::Warn => "33",
    };
    if options.color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A candidate row with plain defaults, for tests here and in `export`.
    pub(crate) fn turn(node_id: u32, branch: u32, agent: &str, response: &str) -> TurnRow {
        TurnRow {
            candidate_id: format!("t/e0/t0/{agent}/b{branch}"),
            run: "r".into(),
            task_id: "t".into(),
            episode: 0,
            turn: 0,
            agent: agent.into(),
            policy: "shared".into(),
            policy_version: 3,
            weights_sha256: "ab".repeat(32),
            engine: "tch".into(),
            engine_model: "p".into(),
            branch,
            node_id,
            parent_id: None,
            selected: false,
            prompt_message: "You are the tool agent.\nGrid: ...".into(),
            prompt_text: "<|im_start|>user\nYou are the tool agent.\nGrid: ...".into(),
            prompt_tokens: vec![1; 12],
            response_text: response.into(),
            response_tokens: vec![5; 4],
            response_logprobs: vec![-0.1; 4],
            finish_reason: "eos".into(),
            action: None,
            parse_error: None,
            feedback: None,
            local_reward: 0.0,
            team_reward: 0.0,
            done: false,
            success: false,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            sampling_seed: 7,
            generation_seconds: 0.1,
            failure: None,
            credited_reward: None,
            staleness: None,
            trainable: None,
        }
    }

    #[test]
    fn every_kind_of_failed_reply_is_legible() {
        let good = TurnRow {
            selected: true,
            local_reward: 0.2,
            team_reward: 1.0,
            success: true,
            feedback: Some("RRDD".into()),
            ..turn(0, 0, "tool", "```python\nprint(bfs(grid, S, G))\n```")
        };
        let cut = TurnRow { finish_reason: "length".into(), ..turn(1, 1, "tool", &"R".repeat(300)) };
        let empty = TurnRow { parse_error: Some("no ```python block".into()), ..turn(2, 2, "tool", "  ") };
        let timeout =
            TurnRow { feedback: Some("error: timeout".into()), ..turn(3, 3, "tool", "```python\nwhile 1: pass\n```") };
        let advantages = HashMap::from([(good.candidate_id.clone(), 1.5), (cut.candidate_id.clone(), -0.5)]);
        let text = render(&[timeout, empty, cut, good], &advantages, RenderOptions::default());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "episode 0 · turn 0 · tool · policy shared v3 · 4 candidates");
        assert_eq!(lines[1], "  prompt (12 tokens): You are the tool agent.⏎Grid: ...");
        assert_eq!(lines[2], "▶ b0  r +1.200 (team +1.000, local +0.200)  A +1.500  4 tokens, eos, success");
        assert_eq!(lines[3], "      ```python⏎print(bfs(grid, S, G))⏎```");
        assert_eq!(lines[4], "      feedback: RRDD");
        assert!(lines[5].ends_with("A -0.500  4 tokens, cut at max_new_tokens"), "{}", lines[5]);
        assert_eq!(lines[6], format!("      {}…", "R".repeat(FOLDED_CHARS)));
        assert!(lines[7].contains("A —"), "no advantage: {}", lines[7]);
        assert_eq!(lines[8], "      (empty response)");
        assert_eq!(lines[9], "      parse error: no ```python block");
        assert_eq!(lines[12], "      feedback: error: timeout");
        assert!(!text.contains('\x1b'), "no colours unless asked");
    }

    #[test]
    fn full_shows_whole_texts_and_colour_marks_the_selected_branch() {
        let long = format!("{}\nsecond line", "x".repeat(300));
        let selected = TurnRow { selected: true, ..turn(0, 0, "planner", &long) };
        let text = render(&[selected], &HashMap::new(), RenderOptions { full: true, color: true });
        assert!(text.contains("prompt (12 tokens): You are the tool agent."), "the message, not the template: {text}");
        assert!(text.contains(&"x".repeat(300)) && text.contains("\n      second line"), "{text}");
        assert!(text.contains("\x1b[1;32m▶ b0"), "{text}");
    }
}
