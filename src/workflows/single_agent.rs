//! One agent does everything: its reply acts on the environment; math and code answer once.

use crate::envs::AnyEnv;
use crate::sandbox::Sandbox;

use super::{Agent, TurnOutcome, env_step};

pub(super) fn step(env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
    let mut outcome = env_step(env, agent, reply, sandbox);
    if matches!(env, AnyEnv::Math(_) | AnyEnv::Code(_)) {
        outcome.done = true;
    }
    outcome
}
