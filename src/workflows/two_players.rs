//! Two players take turns (tic-tac-toe, self-play): each move earns the mover's reward
//! from the game, and a reply without a readable move forfeits.

use crate::envs::AnyEnv;
use crate::envs::tic_tac_toe::{Mark, TicTacToe};
use crate::sandbox::Sandbox;

use super::{Role, TurnOutcome, WorkflowKind, env_step};

/// The roles in the order they move: the player whose mark moves first in the start
/// position opens every turn.
pub(super) fn turn_order(game: &TicTacToe) -> Vec<Role> {
    let mut roles = WorkflowKind::TwoPlayers.roles().to_vec();
    if game.to_move() == Mark::O {
        roles.reverse();
    }
    roles
}

pub(super) fn step(env: &mut AnyEnv, agent: Role, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
    let mut outcome = env_step(env, agent, reply, sandbox);
    if outcome.action.is_none()
        && let AnyEnv::TicTacToe(game) = env
    {
        game.forfeit();
        outcome.feedback = Some("The reply held no move: forfeit.".into());
    }
    outcome
}
