//! Chat templates rendered the way transformers renders them.
//!
//! transformers (`chat_template_utils.py`) compiles the template with Jinja2 in an
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` plus the
//! `loopcontrols` extension, adds `raise_exception` and `strftime_now` as globals and
//! replaces `tojson` with `json.dumps(x, ensure_ascii=False, indent=…)`. Templates call
//! Python string methods (`content.startswith(…)`, `.split('</think>')`), which
//! minijinja-contrib's pycompat provides. The context is the messages, `tools` (when a
//! client offers some), `add_generation_prompt`, the tokenizer's special tokens and any extra keywords
//! (Qwen3's `enable_thinking` is passed only when set, since the template tests
//! `enable_thinking is defined`).
//!
//! The template comes from `chat_template.jinja` (transformers ≥ 4.43 writes it there)
//! or else from `tokenizer_config.json`'s `chat_template` (a string, or a list of named
//! templates of which `default` is used).

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::Error;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_owned(), content: content.to_owned() }
    }
}

/// Options of one rendering (`apply_chat_template`'s keywords).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateOptions {
    /// End with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Qwen3: `Some(false)` writes an empty think block so the model answers directly.
    pub enable_thinking: Option<bool>,
}

/// A compiled chat template and the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template text as found.
    source: String,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as strings, where set.
    special_tokens: Vec<(String, String)>,
}

impl ChatTemplate {
    /// Compiles a template; `special_tokens` are (name, token text) pairs for the context.
    pub fn new(source: &str, special_tokens: Vec<(String, String)>) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| Error::Template { reason: e.to_string() })?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source.to_owned()).map_err(|e| Error::Template { reason: e.to_string() })?;
        Ok(ChatTemplate { env, source: source.to_owned(), special_tokens })
    }

    /// The template of a Hugging Face folder, if it has one.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, Error> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| Error::Format { file: config_path.clone(), reason: format!("not valid JSON: {e}") })?,
            Err(_) => serde_json::Value::Null,
        };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?)
        } else {
            match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
                _ => None,
            }
        };
        let Some(source) = source else { return Ok(None) };
        let special_tokens = special_tokens_of(&config);
        ChatTemplate::new(&source, special_tokens)
            .map(Some)
            .map_err(|e| Error::Format { file: dir.join("chat_template.jinja"), reason: e.to_string() })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation.
    pub fn render(&self, messages: &[ChatMessage], options: &TemplateOptions) -> Result<String, Error> {
        self.render_with(Value::from(minijinja::value::Serde(messages)), None, options)
    }

    /// Renders a conversation as an OpenAI-compatible client sends it: messages with any
    /// fields (`tool_calls`, `tool_call_id`, `name`) and the `tools` offered, for the
    /// templates that use them.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        options: &TemplateOptions,
    ) -> Result<String, Error> {
        let tools = tools.map(|t| Value::from(minijinja::value::Serde(t)));
        self.render_with(Value::from(minijinja::value::Serde(messages)), tools, options)
    }

    fn render_with(&self, messages: Value, tools: Option<Value>, options: &TemplateOptions) -> Result<String, Error> {
        let mut context: std::collections::BTreeMap<String, Value> =
            self.special_tokens.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect();
        context.insert("messages".into(), messages);
        if let Some(tools) = tools {
            context.insert("tools".into(), tools);
        }
        context.insert("add_generation_prompt".into(), Value::from(options.add_generation_prompt));
        if let Some(thinking) = options.enable_thinking {
            context.insert("enable_thinking".into(), Value::from(thinking));
        }
        let context = Value::from(context);
        let template = self.env.get_template("chat").map_err(|e| Error::Template { reason: e.to_string() })?;
        template.render(context).map_err(|e| Error::Template { reason: format!("{e:#}") })
    }
}

/// `bos_token` etc. from `tokenizer_config.json`: strings or `{"content": …}` objects.
fn special_tokens_of(config: &serde_json::Value) -> Vec<(String, String)> {
    ["bos_token", "eos_token", "pad_token", "unk_token"]
        .iter()
        .filter_map(|&key| {
            let v = config.get(key)?;
            let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
            Some((key.to_owned(), text.to_owned()))
        })
        .collect()
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python's `json.dumps` layout: ", " and ": " separators, or one item a line with `indent`.
fn python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e16 => out.push_str(&format!("{f:.1}")),
            _ => out.push_str(&n.to_string()),
        },
        J::String(s) => python_string(s, out),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                python_string(k, out);
                out.push_str(": ");
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_and_lstrip_blocks_apply_as_in_transformers() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}",
            vec![],
        )
        .unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "a"), ChatMessage::new("bot", "b")], &TemplateOptions::default())
            .unwrap();
        assert_eq!(out, "[a]\n");
    }

    #[test]
    fn python_methods_raise_exception_and_tojson_work() {
        let t = ChatTemplate::new(
            "{{ messages[0].content.split('</think>')[-1].lstrip('\\n') }}|{{ {'a': [1, 'é<'], 'b': 2.0} | tojson }}",
            vec![],
        )
        .unwrap();
        let out = t.render(&[ChatMessage::new("user", "x</think>\n\nans")], &TemplateOptions::default()).unwrap();
        assert_eq!(out, "ans|{\"a\": [1, \"é<\"], \"b\": 2.0}");
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", vec![]).unwrap();
        let err = t.render(&[], &TemplateOptions::default()).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn enable_thinking_is_undefined_unless_set() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}undef{% endif %}",
            vec![],
        )
        .unwrap();
        assert_eq!(t.render(&[], &TemplateOptions::default()).unwrap(), "undef");
        let opts = TemplateOptions { enable_thinking: Some(false), ..Default::default() };
        assert_eq!(t.render(&[], &opts).unwrap(), "False", "Jinja2 prints Python booleans");
    }

    #[test]
    fn a_clients_tools_and_tool_calls_reach_a_template_that_uses_them() {
        let t = ChatTemplate::new(
            "{% for tool in tools %}[{{ tool.function.name }}]{% endfor %}\
             {% for m in messages %}{% for call in m.tool_calls or [] %}<{{ call.function.arguments }}>{% endfor %}\
             {% if m.tool_call_id %}({{ m.content }}){% endif %}{% endfor %}",
            vec![],
        )
        .unwrap();
        let tools = serde_json::json!([{"type": "function", "function": {"name": "add", "parameters": {}}}]);
        let messages = serde_json::json!([
            {"role": "user", "content": "1 + 2?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "3"},
        ]);
        let options = TemplateOptions::default();
        assert_eq!(t.render_json(&messages, Some(&tools), &options).unwrap(), "[add]<{\"a\": 1}>(3)");
        assert_eq!(t.render_json(&messages, None, &options).unwrap(), "<{\"a\": 1}>(3)");
    }
}
