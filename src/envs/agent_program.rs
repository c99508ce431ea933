//! `env: {name: agent_program, command: [python, team.py]}`: a user's agent program,
//! written in any framework, plays each episode. petting runs it once per episode with
//! an OpenAI-compatible endpoint to call (`OPENAI_BASE_URL`, `OPENAI_API_KEY`) and the
//! task (`PETTING_TASK_FILE`, a file of the task row as JSON); each call names a role as its `model`.
//! The program's last line on stdout is its [`Verdict`]. Play drives the programs
//! (`play::programs`); this module holds what the run file and the program say.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agent::Agent;
use crate::validate::{Invalid, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentProgramConfig {
    /// The program and its arguments, run in the run file's folder; a first word
    /// `python` is petting's interpreter (`python`, below).
    pub command: Vec<String>,
    /// Programs running at once; their calls are sampled together, in batches.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Longest one episode's program may run; past it the program is killed and the
    /// episode recorded as failed.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// The Python interpreter; unset: `PETTING_PYTHON`, else the checkout's `.venv`,
    /// else `python3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PathBuf>,
    /// The folder the program runs in: the run file's (filled in when it is read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
}

fn default_concurrency() -> u32 {
    32
}

fn default_timeout() -> f64 {
    600.0
}

impl AgentProgramConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(
            self.command.first().is_some_and(|c| !c.is_empty()),
            "env.command",
            "must name a program, e.g. [python, team.py]",
        )?;
        check(self.concurrency >= 1, "env.concurrency", "must be at least 1")?;
        check(
            self.timeout_seconds > 0.0 && self.timeout_seconds.is_finite(),
            "env.timeout_seconds",
            "must be a positive number of seconds",
        )
    }

    /// The program to start and its arguments.
    pub fn program(&self) -> (PathBuf, Vec<String>) {
        let program = match self.command[0].as_str() {
            "python" | "python3" => super::hosted::interpreter(self.python.as_deref()),
            first => PathBuf::from(first),
        };
        (program, self.command[1..].to_vec())
    }

    pub fn workdir(&self) -> &Path {
        self.workdir.as_deref().unwrap_or(Path::new("."))
    }
}

/// What a program says of its episode, as the last line of its standard output:
/// `{"reward": 1.0, "rewards": {"solver": 1.0}, "success": true}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// The team's reward.
    pub reward: f64,
    /// Each role's own (local) reward; a role left out gets none.
    #[serde(default)]
    pub rewards: BTreeMap<String, f64>,
    /// Whether the task was solved; unset: the reward is positive.
    #[serde(default)]
    pub success: Option<bool>,
}

impl Verdict {
    /// The verdict on the last non-empty line of `stdout`, checked against the team.
    /// The verdict of a program's stdout; every reward must be finite and within
    /// `reward_limit` (`limits.reward`).
    pub fn parse(stdout: &str, team: &[Agent], reward_limit: f64) -> Result<Verdict, String> {
        let Some(line) = stdout.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
            return Err("the program printed no verdict: its last line on stdout must be a JSON object such as \
                        {\"reward\": 1.0}"
                .into());
        };
        let verdict: Verdict = serde_json::from_str(line).map_err(|e| {
            let start: String = line.chars().take(120).collect();
            format!(
                "the program's last line is not a verdict ({e}): {start:?}; expected {{\"reward\": <number>, \
                     \"rewards\": {{<role>: <number>}}, \"success\": <bool>}}"
            )
        })?;
        let bounded = |reward: f64| reward.is_finite() && reward.abs() <= reward_limit;
        let out_of_bounds = |whose: String, reward: f64| {
            format!("the verdict's {whose} is {reward}, not a finite number within ±{reward_limit} (limits.reward)")
        };
        if !bounded(verdict.reward) {
            return Err(out_of_bounds("reward".into(), verdict.reward));
        }
        for (role, reward) in &verdict.rewards {
            if !team.iter().any(|a| a.as_str() == role) {
                return Err(format!("the verdict rewards {role:?}, which is not a role of agents: ({})", names(team)));
            }
            if !bounded(*reward) {
                return Err(out_of_bounds(format!("reward of {role:?}"), *reward));
            }
        }
        Ok(verdict)
    }

    pub fn success(&self) -> bool {
        self.success.unwrap_or(self.reward > 0.0)
    }

    pub fn local_reward(&self, agent: Agent) -> f64 {
        self.rewards.get(agent.as_str()).copied().unwrap_or(0.0)
    }
}

/// The roles as a message lists them.
pub fn names(team: &[Agent]) -> String {
    team.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> Vec<Agent> {
        vec![Agent::named("solver").unwrap(), Agent::named("checker").unwrap()]
    }

    #[test]
    fn the_last_line_is_the_verdict_and_success_defaults_to_a_positive_reward() {
        let out = "thinking...\n{\"reward\": 0.5, \"rewards\": {\"solver\": 1}}\n\n";
        let verdict = Verdict::parse(out, &team(), 1e6).unwrap();
        assert_eq!((verdict.reward, verdict.success()), (0.5, true));
        assert_eq!(verdict.local_reward(team()[0]), 1.0);
        assert_eq!(verdict.local_reward(team()[1]), 0.0);
        let failed = Verdict::parse("{\"reward\": 1, \"success\": false}", &team(), 1e6).unwrap();
        assert!(!failed.success());
        assert!(!Verdict::parse("{\"reward\": 0}", &team(), 1e6).unwrap().success());
    }

    #[test]
    fn a_missing_malformed_or_foreign_verdict_says_what_is_expected() {
        for (out, expected) in [
            ("", "printed no verdict"),
            ("done\n", "not a verdict"),
            ("{\"score\": 1}", "not a verdict"),
            ("{\"reward\": 1.7e308}", "reward is 170000000000000000"),
            ("{\"reward\": 1, \"rewards\": {\"solver\": -2e6}}", "reward of \"solver\" is -2000000, not a finite"),
            (
                "{\"reward\": 1, \"rewards\": {\"critic\": 1}}",
                "\"critic\", which is not a role of agents: (solver, checker)",
            ),
        ] {
            let error = Verdict::parse(out, &team(), 1e6).unwrap_err();
            assert!(error.contains(expected), "{out:?}: {error}");
        }
    }
}
