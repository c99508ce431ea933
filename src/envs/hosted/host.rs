//! The environment host: a long-lived process that holds the episodes of a hosted
//! environment, spoken to in JSON lines (protocol 2, or 1 with a host that speaks only
//! that; `python/petting_env/host.py` is its Python end and documents every request).
//!
//! One request is written on the host's stdin, one response line is read from its
//! stdout, in order; batch requests carry many episodes, so a rollout of hundreds of
//! episodes makes a few round trips per step, not hundreds. The host's stderr (its
//! tracebacks, a user's prints) is kept, its last lines quoted in errors.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::agent::Agent;

/// The protocol versions this side speaks. Hello offers them all in `protocols` and
/// names the first in `protocol`, which a host written for protocol 1 checks; the
/// host answers the version it speaks. Protocol 2 lets several agents act in one step.
pub const PROTOCOLS: [u32; 2] = [1, 2];

/// Lines of the host's stderr kept for error messages.
const STDERR_KEPT: usize = 20;

/// A problem with the host process or one of its answers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("could not start the environment host `{command}`: {source}")]
    Start { command: String, source: std::io::Error },

    #[error("the environment host `{command}` {what}{}", stderr_tail(.stderr))]
    Died { command: String, what: String, stderr: String },

    #[error("the environment host `{command}` did not answer `{op}` within {seconds} s (env.host.timeout_seconds){}", stderr_tail(.stderr))]
    Timeout { command: String, op: String, seconds: f64, stderr: String },

    #[error("the environment host `{command}` refused `{op}`: {message}{}", install_hint(.command, .message))]
    Refused { command: String, op: String, message: String },

    #[error("the environment host `{command}` answered `{op}` with {reason}: {line}")]
    Malformed { command: String, op: String, reason: String, line: String },

    #[error("the environment's agents are {named:?}, but the run file's `agents:` are {expected:?}")]
    Agents { named: Vec<Agent>, expected: Vec<Agent> },

    #[error("the environment host `{command}` failed `{op}` for episode {episode}: {message}")]
    Episode { command: String, op: String, episode: String, message: String },
}

/// The Python modules petting's adapters and examples import, with the PyPI package
/// that provides each; `scripts/install/python-tools.sh` installs them all into `.venv`.
pub const INTEGRATIONS: &[(&str, &str)] = &[
    ("textarena", "textarena"),
    ("reasoning_gym", "reasoning-gym"),
    ("openai", "openai"),
    ("agents", "openai-agents"),
    ("langgraph", "langgraph"),
    ("autogen_agentchat", "autogen-agentchat"),
];

/// How to install what a host could not import (Python's "No module named 'x.y'"), into
/// the interpreter that ran it (the first word of `command`); empty for other refusals.
fn install_hint(command: &str, message: &str) -> String {
    let Some(module) = message.split("No module named '").nth(1).and_then(|rest| rest.split(['\'', '.']).next()) else {
        return String::new();
    };
    let package = INTEGRATIONS.iter().find(|(m, _)| *m == module).map_or(module, |(_, package)| package);
    let python = command.split_whitespace().next().unwrap_or("python3");
    format!(
        "; install it into the Python that runs the host with `{python} -m pip install {package}`, or run \
         `scripts/install/python-tools.sh` (textarena, reasoning-gym and the agent frameworks, into the checkout's \
         .venv, the Python petting uses when neither PETTING_PYTHON nor env.host.python is set)"
    )
}

fn stderr_tail(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!("; its stderr ends:\n{stderr}") }
}

/// What starts a host: the program and its arguments, its folder and environment.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub workdir: PathBuf,
    pub env: Vec<(String, String)>,
    /// Longest wait for one answer.
    pub timeout: Duration,
    /// Longest answer (one line), in bytes (`limits.host_message_bytes`).
    pub message_bytes: u64,
}

impl Launch {
    fn shown(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The turn an episode is at: who acts and what it sees (`agent` and `observation`, or
/// in protocol 2 `acting`, several agents at once), or that it is over.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Turn {
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub observation: Option<String>,
    #[serde(default)]
    pub acting: Vec<Acting>,
    #[serde(default)]
    pub done: bool,
}

/// One of the agents a protocol 2 turn asks to act at once, and what it alone sees.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Acting {
    pub agent: String,
    pub observation: String,
}

/// Which replies of a step were not valid moves: all of them (`true`), or in a step of
/// several agents, the named agents'.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum InvalidReplies {
    All(bool),
    Of(Vec<String>),
}

impl Default for InvalidReplies {
    fn default() -> Self {
        InvalidReplies::All(false)
    }
}

impl InvalidReplies {
    pub fn of(&self, agent: &str) -> bool {
        match self {
            InvalidReplies::All(all) => *all,
            InvalidReplies::Of(agents) => agents.iter().any(|a| a == agent),
        }
    }
}

/// What one reply did to an episode.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Stepped {
    /// The local reward this step credits to each agent, by name.
    #[serde(default)]
    pub rewards: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    pub team_reward: f64,
    pub done: bool,
    #[serde(default)]
    pub success: bool,
    #[serde(default)]
    pub feedback: String,
    /// The replies that were not valid moves.
    #[serde(default)]
    pub invalid: InvalidReplies,
    pub next: Option<Turn>,
}

/// A running host.
pub struct Host {
    command: String,
    timeout: Duration,
    agents: Vec<Agent>,
    connection: Mutex<Connection>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

struct Connection {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("command", &self.command).field("agents", &self.agents).finish()
    }
}

impl Host {
    /// Starts the host and says hello: `env` is the environment's mapping as the host
    /// reads it. The host answers with its agents.
    pub fn start(launch: &Launch, env: Value, reward: Option<&str>) -> Result<Host, Error> {
        let command = launch.shown();
        let mut process = Command::new(&launch.program);
        process
            .args(&launch.args)
            .current_dir(&launch.workdir)
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The host, and whatever it starts, ends with it and with petting.
        crate::contain::contain(&mut process);
        let mut child = process.spawn().map_err(|source| Error::Start { command: command.clone(), source })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let stderr_pipe = child.stderr.take().expect("piped");
        let (sender, lines) = channel();
        let limit = launch.message_bytes;
        std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            loop {
                let line = read_line(&mut stdout, limit);
                let end = !matches!(line, Ok(Some(_)));
                if let Some(line) = line.transpose()
                    && sender.send(line).is_err()
                {
                    break;
                }
                if end {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let kept = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                let mut kept = kept.lock().expect("stderr lines");
                if kept.len() == STDERR_KEPT {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let mut host = Host {
            command,
            timeout: launch.timeout,
            agents: Vec::new(),
            connection: Mutex::new(Connection { child, stdin, lines }),
            stderr,
        };
        let workdir = launch.workdir.display().to_string();
        let offer =
            json!({"protocol": PROTOCOLS[0], "protocols": PROTOCOLS, "env": env, "workdir": workdir, "reward": reward});
        let hello = host.request("hello", offer)?;
        // A host of protocol 1 may answer no version.
        let protocol: Option<u32> = host.field(&hello, "hello", "protocol")?;
        if let Some(protocol) = protocol.filter(|p| !PROTOCOLS.contains(p)) {
            return Err(host.malformed("hello", format!("protocol {protocol} was not offered"), &hello));
        }
        let names: Vec<String> = host.field(&hello, "hello", "agents")?;
        host.agents = names
            .iter()
            .map(|name| Agent::named(name))
            .collect::<Result<_, _>>()
            .map_err(|reason| host.malformed("hello", reason, &hello))?;
        Ok(host)
    }

    /// The agents of the environment, as the host named them.
    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }

    /// `count` task rows of `split` ("train" or "test"), reproducible from `seed`.
    pub fn tasks(&self, split: &str, count: usize, seed: u64) -> Result<Vec<Value>, Error> {
        let answer = self.request("tasks", json!({"split": split, "count": count, "seed": seed}))?;
        self.field(&answer, "tasks", "tasks")
    }

    /// Starts episodes: (id, task row, seed) each; their first turns.
    pub fn make(&self, items: &[(String, Value, u64)]) -> Result<Vec<Turn>, Error> {
        let items: Vec<Value> =
            items.iter().map(|(id, task, seed)| json!({"id": id, "task": task, "seed": seed})).collect();
        self.batch("make", items)
    }

    /// Applies replies: (id, each acting agent's reply) each; one agent's goes as
    /// `reply`, several agents' as `replies`, by agent.
    pub fn step(&self, items: &[(String, Vec<(Agent, String)>)]) -> Result<Vec<Stepped>, Error> {
        let items: Vec<Value> = items
            .iter()
            .map(|(id, replies)| match replies.as_slice() {
                [(_, reply)] => json!({"id": id, "reply": reply}),
                _ => {
                    let by_agent: serde_json::Map<String, Value> =
                        replies.iter().map(|(agent, reply)| (agent.as_str().to_string(), json!(reply))).collect();
                    json!({"id": id, "replies": by_agent})
                }
            })
            .collect();
        self.batch("step", items)
    }

    /// Copies episodes: (id, new id) each; stepping a copy never moves its original.
    pub fn fork(&self, items: &[(String, String)]) -> Result<(), Error> {
        let items: Vec<Value> = items.iter().map(|(id, new)| json!({"id": id, "new": new})).collect();
        let _: Vec<Value> = self.batch("fork", items)?;
        Ok(())
    }

    /// Scores replies to tasks: (task row, the whole reply, the answer extracted from it).
    pub fn score(&self, items: &[(Value, String, Option<String>)]) -> Result<Vec<f64>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let body: Vec<Value> =
            items.iter().map(|(task, reply, answer)| json!({"task": task, "reply": reply, "answer": answer})).collect();
        let answer = self.request("score", json!({"items": body}))?;
        let scores: Vec<Value> = self.field(&answer, "score", "scores")?;
        if scores.len() != items.len() {
            return Err(self.malformed("score", format!("{} scores for {} asked", scores.len(), items.len()), &answer));
        }
        scores
            .iter()
            .enumerate()
            .map(|(i, score)| match score {
                Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN)),
                other => Err(Error::Episode {
                    command: self.command.clone(),
                    op: "score".into(),
                    episode: format!("(item {i})"),
                    message: other.get("error").and_then(Value::as_str).unwrap_or("not a number").to_string(),
                }),
            })
            .collect()
    }

    /// Forgets episodes (unknown ids are ignored).
    pub fn drop_episodes(&self, ids: &[String]) -> Result<(), Error> {
        if !ids.is_empty() {
            self.request("drop", json!({"ids": ids}))?;
        }
        Ok(())
    }

    /// A batch request whose answer holds one item per request item; an item's error
    /// names its episode.
    fn batch<T: DeserializeOwned>(&self, op: &str, items: Vec<Value>) -> Result<Vec<T>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = items.iter().map(|i| i["id"].as_str().unwrap_or_default().to_string()).collect();
        let answer = self.request(op, json!({"items": items}))?;
        let answered: Vec<Value> = self.field(&answer, op, "items")?;
        if answered.len() != ids.len() {
            let reason = format!("{} items for {} asked", answered.len(), ids.len());
            return Err(self.malformed(op, reason, &answer));
        }
        answered
            .into_iter()
            .zip(ids)
            .map(|(item, episode)| {
                if let Some(message) = item.get("error") {
                    let message = message.as_str().map_or_else(|| message.to_string(), str::to_owned);
                    return Err(Error::Episode { command: self.command.clone(), op: op.into(), episode, message });
                }
                serde_json::from_value(item.clone()).map_err(|e| self.malformed(op, e.to_string(), &item))
            })
            .collect()
    }

    fn field<T: DeserializeOwned>(&self, answer: &Value, op: &str, key: &str) -> Result<T, Error> {
        let value = answer.get(key).cloned().unwrap_or(Value::Null);
        serde_json::from_value(value).map_err(|e| self.malformed(op, format!("`{key}`: {e}"), answer))
    }

    fn malformed(&self, op: &str, reason: String, answer: &Value) -> Error {
        let mut line = answer.to_string();
        line.truncate(300);
        Error::Malformed { command: self.command.clone(), op: op.into(), reason, line }
    }

    /// Writes one request and reads its answer; an answer that is not ok is refused.
    fn request(&self, op: &str, mut body: Value) -> Result<Value, Error> {
        body["op"] = Value::String(op.into());
        let mut connection = self.connection.lock().expect("one request at a time");
        let mut line = body.to_string();
        line.push('\n');
        let written = match connection.stdin.as_mut() {
            Some(stdin) => stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("its stdin is closed")),
        };
        if let Err(e) = written {
            return Err(self.died(&mut connection, format!("stopped reading requests ({e})")));
        }
        let answer = match connection.lines.recv_timeout(self.timeout) {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(self.died(&mut connection, format!("could not be read ({e})"))),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(self.died(&mut connection, format!("ended before answering `{op}`")));
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = connection.child.kill();
                return Err(Error::Timeout {
                    command: self.command.clone(),
                    op: op.into(),
                    seconds: self.timeout.as_secs_f64(),
                    stderr: self.stderr_text(),
                });
            }
        };
        let parsed: Value = serde_json::from_str(&answer).map_err(|e| Error::Malformed {
            command: self.command.clone(),
            op: op.into(),
            reason: format!("a line that is not JSON ({e}); only protocol lines may go to stdout"),
            line: answer.chars().take(300).collect(),
        })?;
        match parsed.get("ok") {
            Some(Value::Bool(true)) => Ok(parsed),
            Some(Value::Bool(false)) => Err(Error::Refused {
                command: self.command.clone(),
                op: op.into(),
                message: parsed.get("error").and_then(Value::as_str).unwrap_or("no reason given").to_string(),
            }),
            _ => Err(self.malformed(op, "no `ok`".into(), &parsed)),
        }
    }

    fn died(&self, connection: &mut Connection, what: String) -> Error {
        // Give its stderr a moment to arrive: the reason is usually its last lines.
        let status = (0..20).find_map(|_| {
            let status = connection.child.try_wait().ok().flatten();
            if status.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            status
        });
        let what = match status {
            Some(status) => format!("{what}: it exited ({status})"),
            None => what,
        };
        Error::Died { command: self.command.clone(), what, stderr: self.stderr_text() }
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().expect("stderr lines").iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// One line of `reader` without its newline, None at its end; a line over `limit`
/// bytes is an error before more than `limit` bytes of it are held.
fn read_line(reader: &mut impl BufRead, limit: u64) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    if reader.take(limit + 1).read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message over limits.host_message_bytes ({limit} bytes) of the run file"),
        ));
    }
    String::from_utf8(line).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

impl Drop for Host {
    /// Closing stdin ends the host; one that does not end soon is killed.
    fn drop(&mut self) {
        let connection = self.connection.get_mut().expect("not poisoned");
        connection.stdin.take();
        for _ in 0..40 {
            if let Ok(Some(_)) = connection.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = connection.child.kill();
        let _ = connection.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_module_is_answered_with_the_command_that_installs_it() {
        let refused = |message: &str| {
            Error::Refused {
                command: "/opt/py/bin/python -m petting_env.host".into(),
                op: "hello".into(),
                message: message.into(),
            }
            .to_string()
        };
        let gym = refused("ModuleNotFoundError: No module named 'reasoning_gym.factory'");
        assert!(gym.contains("`/opt/py/bin/python -m pip install reasoning-gym`"), "{gym}");
        assert!(gym.contains("scripts/install/python-tools.sh"), "{gym}");
        let own = refused("No module named 'my_env'");
        assert!(own.contains("pip install my_env`"), "{own}");
        let other = refused("TicTacToe-v9 is not a TextArena game");
        assert!(!other.contains("pip install"), "{other}");
    }
}
