//! Two players take turns (tic-tac-toe, self-play): each move earns the mover's reward
//! from the game, and a reply without a readable move forfeits.

use crate::envs::tic_tac_toe::{Mark, TicTacToe};
use crate::envs::{AnyEnv, Env};
use crate::sandbox::Sandbox;

use super::{Agent, TurnOutcome, WorkflowKind, env_step};

/// The roles in the order they move: the player whose mark moves first in the start
/// position opens every turn.
pub(super) fn turn_order(game: &TicTacToe) -> Vec<Agent> {
    let mut roles = WorkflowKind::TwoPlayers.agents().to_vec();
    if game.to_move() == Mark::O {
        roles.reverse();
    }
    roles
}

pub(super) fn step(env: &mut AnyEnv, agent: Agent, reply: &str, sandbox: &Sandbox) -> TurnOutcome {
    let mut outcome = env_step(env, agent, reply, sandbox);
    let AnyEnv::TicTacToe(game) = env else { unreachable!("two players play tic-tac-toe (Episode::new checks)") };
    match &outcome.action {
        // The move as the players write it: its JSON, the cell index, reads as another
        // cell in the answer format (`5` is 1,2 as an index, 1,1 as a reply).
        Some(cell) => {
            let cell: usize = serde_json::from_str(cell).expect("a move is a cell index");
            outcome.shown = Some(game.format_action(&cell));
        }
        None => {
            game.forfeit();
            outcome.feedback = Some("The reply held no move: forfeit.".into());
        }
    }
    outcome
}

/// The mover's own result, as its team reward: in self-play each player is its own
/// team. Scored from X's side, O's forfeit was X's win and earned O the team reward
/// that cancelled its penalty, so O's groups were flat (results/tic-tac-toe-smollm2/README.md).
pub(super) fn own_result(game: &TicTacToe, agent: Agent) -> f64 {
    game.result_for(if agent == Agent::PLAYER_O { Mark::O } else { Mark::X })
}
