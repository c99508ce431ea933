//! Exact tokens for a conversation that goes on: when a program resends an earlier
//! call's messages followed by the reply petting sampled for it, the new prompt's ids
//! are that call's prompt ids and sampled ids, then the rest of the conversation
//! tokenised on its own. Nothing the model already saw or said is re-tokenised, so the
//! ids the update trains on are the ids that were sampled (re-tokenising a decoded
//! reply can give other ids for the same text).

/// One sampled call of an episode, as the next call may continue it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub policy: String,
    pub prompt_text: String,
    pub prompt_ids: Vec<i64>,
    pub reply_text: String,
    pub response_ids: Vec<i64>,
}

/// The earlier call that `rendered` (a conversation rendered with `policy`'s chat
/// template) continues, the longest if several do, and the text after its reply.
pub fn continued<'a>(calls: &'a [Sampled], policy: &str, rendered: &'a str) -> Option<(&'a Sampled, &'a str)> {
    calls
        .iter()
        .filter(|c| c.policy == policy)
        .filter_map(|c| {
            let after_prompt = rendered.strip_prefix(c.prompt_text.as_str())?;
            let rest = after_prompt.strip_prefix(c.reply_text.as_str())?;
            Some((c, rest))
        })
        .min_by_key(|(_, rest)| rest.len())
}

/// The ids of a prompt that continues `call`: its prompt and sampled ids, then
/// `rest_ids`, the tokens of the text after its reply. That text opens with the
/// template's end of turn; where the sampled reply already ended with that token (the
/// model's own stop), it is not repeated.
pub fn joined(call: &Sampled, rest_ids: &[i64]) -> Vec<i64> {
    let rest = match (call.response_ids.last(), rest_ids.first()) {
        (Some(stop), Some(first)) if stop == first => &rest_ids[1..],
        _ => rest_ids,
    };
    [call.prompt_ids.as_slice(), &call.response_ids, rest].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: i64 = 2;

    fn call(policy: &str, prompt: &str, reply: &str, response_ids: Vec<i64>) -> Sampled {
        Sampled {
            policy: policy.into(),
            prompt_text: prompt.into(),
            prompt_ids: vec![10, 11],
            reply_text: reply.into(),
            response_ids,
        }
    }

    #[test]
    fn a_conversation_continues_the_longest_earlier_call_of_its_policy() {
        let first = call("p", "<u>q1</u><a>", "42", vec![52, END]);
        let second = call("p", "<u>q1</u><a>42</a><u>sure?</u><a>", "yes", vec![60, END]);
        let other = call("q", "<u>q1</u><a>", "42", vec![52, END]);
        let calls = [first.clone(), second.clone(), other];
        let rendered = "<u>q1</u><a>42</a><u>sure?</u><a>yes</a><u>why?</u><a>";
        let (found, rest) = continued(&calls, "p", rendered).unwrap();
        assert_eq!((found, rest), (&second, "</a><u>why?</u><a>"));
        assert!(continued(&calls, "p", "<u>q2</u><a>").is_none(), "another conversation");
        assert!(continued(&calls, "p", "<u>q1</u><a>41</a><u>sure?</u><a>").is_none(), "an edited reply");
        assert!(continued(&calls, "r", rendered).is_none(), "another policy's tokenizer");
    }

    #[test]
    fn the_sampled_stop_token_is_not_repeated_and_a_cut_reply_keeps_the_templates() {
        let stopped = call("p", "x", "42", vec![52, END]);
        assert_eq!(joined(&stopped, &[END, 7, 8]), [10, 11, 52, END, 7, 8]);
        let cut = call("p", "x", "42", vec![52, 53]);
        assert_eq!(joined(&cut, &[END, 7, 8]), [10, 11, 52, 53, END, 7, 8]);
    }
}
