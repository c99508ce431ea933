//! The OpenAI-compatible endpoint agent programs call: `POST /v1/chat/completions`,
//! `POST /v1/completions` and `GET /v1/models`, on 127.0.0.1 only. Every episode gets a
//! key of its own, made fresh when its program starts and revoked when it ends, and the
//! episode a call belongs to is the one its key was made for: nothing in the request (its
//! path, its body) can name another episode, so a program cannot write into another
//! episode's trajectory, by mistake or on purpose. A program needs nothing but the
//! `OPENAI_BASE_URL` and `OPENAI_API_KEY` it is given.
//!
//! A request body is refused past `limits.request_bytes` before it is read whole: by its
//! `Content-Length`, or as it streams in.
//!
//! The endpoint only speaks HTTP: each call goes to the dispatcher (`super`) as an
//! [`Event::Call`] and waits for its answer there, where calls are batched into the
//! engine. The request's sampling parameters (temperature, max_tokens, …) are ignored:
//! what the update trains must be sampled as the run's `rollout.sampling` says.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::Event;

/// What a call asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A conversation (content parts joined into text) and the tools offered, if any.
    Chat { messages: Value, tools: Option<Value> },
    /// A raw prompt, tokenised as it is.
    Completion { prompt: String },
}

/// One call of a program, waiting for its answer.
#[derive(Debug)]
pub struct Call {
    pub episode: usize,
    /// The role the call names as its `model`.
    pub model: String,
    pub request: Request,
    pub answer: oneshot::Sender<Result<Answered, Refusal>>,
}

/// A sampled answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The engine's: eos, stop or length.
    pub finish_reason: String,
}

/// A call the dispatcher or the endpoint turns down, as an OpenAI error.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal { status, message: message.into() }
    }
}

/// A running endpoint; it stops when dropped.
pub struct Endpoint {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// The key of each running episode.
    keys: Mutex<HashMap<String, usize>>,
    roles: Vec<String>,
    events: Sender<Event>,
    next_id: AtomicU64,
    request_bytes: usize,
}

impl Shared {
    fn episode_of(&self, key: &str) -> Option<usize> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied()
    }
}

impl Endpoint {
    /// Listens on a free port of 127.0.0.1, on a thread of its own; request bodies past
    /// `request_bytes` are refused.
    pub fn start(roles: Vec<String>, events: Sender<Event>, request_bytes: u64) -> std::io::Result<Endpoint> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            keys: Mutex::new(HashMap::new()),
            roles,
            events,
            next_id: AtomicU64::new(0),
            request_bytes: usize::try_from(request_bytes).unwrap_or(usize::MAX),
        });
        let served = Arc::clone(&shared);
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let thread = std::thread::Builder::new().name("petting-endpoint".into()).spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, served, stopped).await,
                    Err(e) => tracing::error!("the agent endpoint cannot listen: {e}"),
                }
            })
        })?;
        Ok(Endpoint { port, shared, stop: Some(stop), thread: Some(thread) })
    }

    /// The base URL of every episode's calls, as `OPENAI_BASE_URL` gives it.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// A new key for `episode`, the only one its calls are taken with.
    pub fn admit(&self, episode: usize) -> String {
        let key = format!("petting-{}", uuid::Uuid::new_v4().simple());
        self.shared.keys.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), episode);
        key
    }

    /// Revokes `episode`'s key: anything its program left running can call no more.
    pub fn dismiss(&self, episode: usize) {
        self.shared.keys.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, e| *e != episode);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stopped: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| answer(request, Arc::clone(&shared)));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        }
    }
}

type Reply = Response<Full<Bytes>>;

async fn answer(request: hyper::Request<Incoming>, shared: Arc<Shared>) -> Result<Reply, Infallible> {
    Ok(match route(request, &shared).await {
        Ok(reply) => reply,
        Err(refusal) => error_reply(&refusal),
    })
}

async fn route(request: hyper::Request<Incoming>, shared: &Shared) -> Result<Reply, Refusal> {
    let key = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(episode) = key.and_then(|key| shared.episode_of(key)) else {
        return Err(Refusal::new(
            401,
            "the API key is not one of a running episode: use the OPENAI_API_KEY petting set for this episode",
        ));
    };
    let path = request.uri().path().to_string();
    let Some((named, endpoint)) = episode_path(&path) else {
        return Err(Refusal::new(404, format!("no such path {path:?}: use the OPENAI_BASE_URL petting set")));
    };
    if named.is_some_and(|named| named != episode) {
        return Err(Refusal::new(
            403,
            format!("{path} names another episode than this key's: a key calls for its own episode only"),
        ));
    }
    match (request.method(), endpoint) {
        (&Method::GET, "/models") => Ok(json_reply(200, &models(&shared.roles))),
        (&Method::POST, "/chat/completions" | "/completions") => {
            let body = read_body(request.into_body(), shared.request_bytes).await?;
            let body: Value = serde_json::from_slice(&body)
                .map_err(|e| Refusal::new(400, format!("the request body is not JSON: {e}")))?;
            let chat = endpoint == "/chat/completions";
            let (model, call) = parse_call(&body, chat)?;
            let (answer, answered) = oneshot::channel();
            let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
            let sent = Event::Call(Call { episode, model: model.clone(), request: call.clone(), answer });
            shared.events.send(sent).map_err(|_| Refusal::new(503, "the stage is over"))?;
            let answered = answered.await.map_err(|_| Refusal::new(503, "the episode is over"))??;
            let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
            let usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
            let tools = matches!(call, Request::Chat { tools: Some(_), .. });
            let completion = Completion { id, model, chat, tools, answered };
            Ok(if stream { event_stream(&completion.chunks(usage)) } else { json_reply(200, &completion.body()) })
        }
        (_, "/responses") => Err(Refusal::new(
            404,
            "petting serves the chat completions API (/v1/chat/completions), not the responses API: \
             choose your framework's chat completions model (e.g. OpenAIChatCompletionsModel)",
        )),
        _ => Err(Refusal::new(404, format!("petting does not serve {} {path}", request.method()))),
    }
}

/// `/v1/<endpoint>` → (None, `/<endpoint>`); `/e/<episode>/v1/<endpoint>`, the form
/// earlier versions gave, → (Some(episode), `/<endpoint>`).
fn episode_path(path: &str) -> Option<(Option<usize>, &str)> {
    if let Some(endpoint) = path.strip_prefix("/v1") {
        return Some((None, endpoint));
    }
    let rest = path.strip_prefix("/e/")?;
    let (episode, rest) = rest.split_once('/')?;
    Some((Some(episode.parse().ok()?), rest.strip_prefix("v1")?))
}

/// The body, refused past `limit` bytes before it is read whole: by the length it
/// announces, or as it streams in.
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Refusal> {
    use hyper::body::Body;
    let too_large =
        || Refusal::new(413, format!("the request body is over limits.request_bytes ({limit} bytes) of the run file"));
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Refusal::new(400, format!("cannot read the request body: {e}"))),
    }
}

fn models(roles: &[String]) -> Value {
    let data: Vec<Value> =
        roles.iter().map(|r| json!({"id": r, "object": "model", "created": 0, "owned_by": "petting"})).collect();
    json!({"object": "list", "data": data})
}

/// The role and the request of a call's body.
fn parse_call(body: &Value, chat: bool) -> Result<(String, Request), Refusal> {
    let bad = |message: String| Refusal::new(400, message);
    let model = body.get("model").and_then(Value::as_str).ok_or_else(|| bad("`model` must name a role".into()))?;
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n != 1) {
        return Err(bad("`n` must be 1: each call is one sample of its role".into()));
    }
    let request = if chat {
        let messages =
            body.get("messages").and_then(Value::as_array).ok_or_else(|| bad("`messages` must be a list".into()))?;
        let messages = messages.iter().map(text_message).collect::<Result<Vec<_>, _>>().map_err(bad)?;
        let tools = body.get("tools").filter(|t| t.as_array().is_some_and(|t| !t.is_empty())).cloned();
        Request::Chat { messages: Value::Array(messages), tools }
    } else {
        let prompt = match body.get("prompt") {
            Some(Value::String(p)) => p.clone(),
            Some(Value::Array(p)) if p.len() == 1 && p[0].is_string() => p[0].as_str().unwrap_or_default().to_string(),
            _ => return Err(bad("`prompt` must be one string".into())),
        };
        Request::Completion { prompt }
    };
    Ok((model.to_string(), request))
}

/// A message whose content is a list of parts gets their text joined, as chat
/// templates expect a string; a part that is not text cannot reach a text model.
fn text_message(message: &Value) -> Result<Value, String> {
    let mut message = message.clone();
    if let Some(parts) = message.get("content").and_then(Value::as_array) {
        let mut text = String::new();
        for part in parts {
            match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => text.push_str(t),
                (kind, _) => return Err(format!("a message part of type {kind:?}: only text reaches the model")),
            }
        }
        message["content"] = Value::String(text);
    }
    Ok(message)
}

/// An answer in the shape the client asked for.
struct Completion {
    id: u64,
    model: String,
    chat: bool,
    tools: bool,
    answered: Answered,
}

impl Completion {
    fn finish_reason(&self, tool_calls: bool) -> &'static str {
        match self.answered.finish_reason.as_str() {
            "length" => "length",
            _ if tool_calls => "tool_calls",
            _ => "stop",
        }
    }

    fn usage(&self) -> Value {
        let a = &self.answered;
        json!({"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
               "total_tokens": a.prompt_tokens + a.completion_tokens})
    }

    /// The assistant's message: the text, or the text before the tool calls and the
    /// calls (the `<tool_call>{…}</tool_call>` blocks of Hermes-style templates) where
    /// tools were offered.
    fn message(&self) -> (Value, bool) {
        let text = &self.answered.text;
        match tool_calls(text).filter(|_| self.tools) {
            Some((content, calls)) => {
                let content = if content.is_empty() { Value::Null } else { Value::String(content) };
                (json!({"role": "assistant", "content": content, "tool_calls": calls}), true)
            }
            None => (json!({"role": "assistant", "content": text}), false),
        }
    }

    fn body(&self) -> Value {
        let created = chrono::Utc::now().timestamp();
        if !self.chat {
            return json!({"id": format!("cmpl-{}", self.id), "object": "text_completion", "created": created,
                "model": self.model, "choices": [{"index": 0, "text": self.answered.text, "logprobs": null,
                "finish_reason": self.finish_reason(false)}], "usage": self.usage()});
        }
        let (message, calls) = self.message();
        json!({"id": format!("chatcmpl-{}", self.id), "object": "chat.completion", "created": created,
            "model": self.model, "choices": [{"index": 0, "message": message, "logprobs": null,
            "finish_reason": self.finish_reason(calls)}], "usage": self.usage()})
    }

    /// The answer as server-sent events: all of it in one chunk, then the usage if asked.
    fn chunks(&self, usage: bool) -> Vec<Value> {
        let mut body = self.body();
        let mut chunks = Vec::new();
        if self.chat {
            body["object"] = "chat.completion.chunk".into();
            let choice = &mut body["choices"][0];
            choice["delta"] = choice["message"].take();
            choice.as_object_mut().expect("a choice").remove("message");
        }
        let usage_chunk = usage.then(|| {
            let mut last = body.clone();
            last["choices"] = json!([]);
            last
        });
        body.as_object_mut().expect("a body").remove("usage");
        chunks.push(body);
        chunks.extend(usage_chunk);
        chunks
    }
}

/// Hermes-style tool calls in a reply: the text before them and the calls as OpenAI
/// `tool_calls`; None when the reply has none (or one is not JSON with a `name`).
fn tool_calls(text: &str) -> Option<(String, Vec<Value>)> {
    let (content, mut rest) = text.split_once("<tool_call>")?;
    let mut calls = Vec::new();
    loop {
        let (inside, after) = rest.split_once("</tool_call>").unwrap_or((rest, ""));
        let call: Value = serde_json::from_str(inside.trim()).ok()?;
        let name = call.get("name")?.as_str()?;
        let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let arguments = if let Value::String(s) = arguments { s } else { arguments.to_string() };
        calls.push(json!({"id": format!("call_{}", calls.len()), "type": "function",
                          "function": {"name": name, "arguments": arguments}}));
        match after.split_once("<tool_call>") {
            Some((_, next)) => rest = next,
            None => return Some((content.trim().to_string(), calls)),
        }
    }
}

fn json_reply(status: u16, body: &Value) -> Reply {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

fn event_stream(chunks: &[Value]) -> Reply {
    let mut text = String::new();
    for chunk in chunks {
        text.push_str(&format!("data: {chunk}\n\n"));
    }
    text.push_str("data: [DONE]\n\n");
    Response::builder()
        .header(hyper::header::CONTENT_TYPE, "text/event-stream")
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response")
}

fn error_reply(refusal: &Refusal) -> Reply {
    let kind = if refusal.status == 401 { "authentication_error" } else { "invalid_request_error" };
    json_reply(refusal.status, &json!({"error": {"message": refusal.message, "type": kind, "code": refusal.status}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_episode() {
        assert_eq!(episode_path("/v1/chat/completions"), Some((None, "/chat/completions")));
        assert_eq!(episode_path("/e/17/v1/chat/completions"), Some((Some(17), "/chat/completions")));
        assert_eq!(episode_path("/e/3/v1/models"), Some((Some(3), "/models")));
        assert_eq!(episode_path("/models"), None);
        assert_eq!(episode_path("/e/x/v1/models"), None);
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_refused() {
        let body = json!({"model": "solver", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        let (model, request) = parse_call(&body, true).unwrap();
        assert_eq!(model, "solver");
        assert_eq!(request, Request::Chat { messages: json!([{"role": "user", "content": "ab"}]), tools: None });
        let image = json!({"model": "s", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]});
        assert!(parse_call(&image, true).unwrap_err().message.contains("image_url"));
        assert!(parse_call(&json!({"model": "s", "messages": [], "n": 2}), true).unwrap_err().message.contains("`n`"));
        assert!(parse_call(&json!({"messages": []}), true).unwrap_err().message.contains("`model`"));
    }

    #[test]
    fn hermes_tool_calls_become_openai_tool_calls() {
        let text = "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n\
                    <tool_call>{\"name\": \"done\"}</tool_call>";
        let (content, calls) = tool_calls(text).unwrap();
        assert_eq!(content, "Let me add.");
        assert_eq!(calls[0]["function"], json!({"name": "add", "arguments": "{\"a\":1}"}));
        assert_eq!(calls[1]["function"], json!({"name": "done", "arguments": "{}"}));
        assert_eq!(tool_calls("no calls"), None);
        assert_eq!(tool_calls("<tool_call>not json</tool_call>"), None);
    }

    #[test]
    fn a_streamed_answer_is_one_delta_then_the_usage() {
        let answered =
            Answered { text: "42".into(), prompt_tokens: 5, completion_tokens: 2, finish_reason: "eos".into() };
        let completion = Completion { id: 0, model: "solver".into(), chat: true, tools: false, answered };
        let chunks = completion.chunks(true);
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": "42"}));
        assert_eq!(chunks[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[1]["usage"]["total_tokens"], 7);
        assert_eq!(completion.body()["choices"][0]["message"]["content"], "42");
    }
}
