//! Exact tokens for a conversation that goes on: when a program resends an earlier
//! call's messages followed by the reply petting sampled for it, the new prompt's ids
//! are that call's prompt ids and sampled ids, then the rest of the conversation
//! tokenised on its own. Nothing the model already saw or said is re-tokenised, so the
//! ids the update trains on are the ids that were sampled (re-tokenising a decoded
//! reply can give other ids for the same text).

/// One sampled call of an episode, as the next call may continue it: a view of what
/// the episode keeps of the call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled<'a> {
    pub policy: &'a str,
    pub prompt_text: &'a str,
    pub prompt_ids: &'a [i32],
    pub reply_text: &'a str,
    pub response_ids: &'a [i32],
}

/// The earlier call that `rendered` (a conversation rendered with `policy`'s chat
/// template) continues, the longest if several do, and the text after its reply.
pub fn continued<'a, 'r>(
    calls: impl IntoIterator<Item = Sampled<'a>>,
    policy: &str,
    rendered: &'r str,
) -> Option<(Sampled<'a>, &'r str)> {
    calls
        .into_iter()
        .filter(|c| c.policy == policy)
        .filter_map(|c| {
            let rest = rendered.strip_prefix(c.prompt_text)?.strip_prefix(c.reply_text)?;
            Some((c, rest))
        })
        .min_by_key(|(_, rest)| rest.len())
}

/// The ids of a prompt that continues `call`: its prompt and sampled ids, then
/// `rest_ids`, the tokens of the text after its reply. That text opens with the
/// template's end of turn; where the sampled reply already ended with that token (the
/// model's own stop), it is not repeated.
pub fn joined(call: Sampled, rest_ids: &[i64]) -> Vec<i64> {
    let rest = match (call.response_ids.last(), rest_ids.first()) {
        (Some(&stop), Some(&first)) if i64::from(stop) == first => &rest_ids[1..],
        _ => rest_ids,
    };
    let sampled = call.prompt_ids.iter().chain(call.response_ids).map(|&t| i64::from(t));
    sampled.chain(rest.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: i32 = 2;

    fn call<'a>(policy: &'a str, prompt: &'a str, reply: &'a str, response_ids: &'a [i32]) -> Sampled<'a> {
        Sampled { policy, prompt_text: prompt, prompt_ids: &[10, 11], reply_text: reply, response_ids }
    }

    #[test]
    fn a_conversation_continues_the_longest_earlier_call_of_its_policy() {
        let first = call("p", "<u>q1</u><a>", "42", &[52, END]);
        let second = call("p", "<u>q1</u><a>42</a><u>sure?</u><a>", "yes", &[60, END]);
        let other = call("q", "<u>q1</u><a>", "42", &[52, END]);
        let calls = [first, second, other];
        let rendered = "<u>q1</u><a>42</a><u>sure?</u><a>yes</a><u>why?</u><a>";
        let (found, rest) = continued(calls, "p", rendered).unwrap();
        assert_eq!((found, rest), (second, "</a><u>why?</u><a>"));
        assert!(continued(calls, "p", "<u>q2</u><a>").is_none(), "another conversation");
        assert!(continued(calls, "p", "<u>q1</u><a>41</a><u>sure?</u><a>").is_none(), "an edited reply");
        assert!(continued(calls, "r", rendered).is_none(), "another policy's tokenizer");
    }

    #[test]
    fn the_sampled_stop_token_is_not_repeated_and_a_cut_reply_keeps_the_templates() {
        let end = i64::from(END);
        let stopped = call("p", "x", "42", &[52, END]);
        assert_eq!(joined(stopped, &[end, 7, 8]), [10, 11, 52, end, 7, 8]);
        let cut = call("p", "x", "42", &[52, 53]);
        assert_eq!(joined(cut, &[end, 7, 8]), [10, 11, 52, 53, end, 7, 8]);
    }
}
