//! Tic-tac-toe: two players, X and O, alternate on a 3×3 board; three in a row wins.
//!
//! * Instance: a starting position reached by 0–4 random opening moves without a winner
//!   (so train and test positions can differ); the player to move is the one with fewer
//!   marks (X on a tie).
//! * Action: a cell `row, column` (0-based, e.g. `#### 1,2`) or a number 1–9 in reading order.
//! * Reward for the player who moved: +1 for a winning move, +0.5 for the move that
//!   fills the board in a draw, 0 otherwise; an illegal move (taken cell) −1 and the
//!   game is lost for that player. The team reward is the outcome for X: 1 win,
//!   0.5 draw, 0 loss or unfinished.
//! * [`minimax`] is the perfect opponent used for evaluation and the solver.

use serde::{Deserialize, Serialize};

use super::{Env, Error, Step, after_marker};
use crate::rng::{SplitMix64, stream};
use crate::sandbox::Sandbox;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TicTacToeConfig {
    /// Opponent of the trained player at evaluation.
    pub eval_opponent: Opponent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Opponent {
    /// The trained policy plays both sides.
    #[default]
    SelfPlay,
    /// A perfect minimax player takes O; the trained policy plays X.
    Minimax,
}

/// A position as stored in the `tasks` table: three rows of 'X', 'O' and '.'.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub board: [String; 3],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mark {
    X,
    O,
}

impl Mark {
    pub fn other(self) -> Mark {
        match self {
            Mark::X => Mark::O,
            Mark::O => Mark::X,
        }
    }

    fn symbol(self) -> char {
        match self {
            Mark::X => 'X',
            Mark::O => 'O',
        }
    }
}

/// The game's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Win(Mark),
    Draw,
}

const LINES: [[usize; 3]; 8] = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]];

/// One game.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicTacToe {
    cells: [Option<Mark>; 9],
    to_move: Mark,
    outcome: Option<Outcome>,
}

fn winner(cells: &[Option<Mark>; 9]) -> Option<Mark> {
    LINES.iter().find_map(|l| {
        let m = cells[l[0]]?;
        (cells[l[1]] == Some(m) && cells[l[2]] == Some(m)).then_some(m)
    })
}

/// Value of the position for the player to move (1 win, 0 draw, −1 loss) and its best
/// cell (the lowest-numbered among equals).
pub fn minimax(cells: &[Option<Mark>; 9], to_move: Mark) -> (i32, Option<usize>) {
    if winner(cells).is_some() {
        return (-1, None); // the previous player just won
    }
    let mut best: (i32, Option<usize>) = (i32::MIN, None);
    for cell in 0..9 {
        if cells[cell].is_none() {
            let mut next = *cells;
            next[cell] = Some(to_move);
            let value = -minimax(&next, to_move.other()).0;
            if value > best.0 {
                best = (value, Some(cell));
            }
        }
    }
    if best.1.is_none() { (0, None) } else { best }
}

impl TicTacToe {
    /// A start position from `seed`: 0–4 random opening moves, no winner yet.
    pub fn generate(seed: u64) -> TicTacToe {
        let mut rng = SplitMix64::new(seed);
        let mut game = TicTacToe { cells: [None; 9], to_move: Mark::X, outcome: None };
        for _ in 0..rng.below(5) {
            let free: Vec<usize> = (0..9).filter(|&c| game.cells[c].is_none()).collect();
            let cell = *rng.choose(&free);
            game.cells[cell] = Some(game.to_move);
            game.to_move = game.to_move.other();
        }
        game
    }

    pub fn from_instance(json: &str) -> Result<TicTacToe, Error> {
        let bad = |reason: String| Error::Instance { env: "tic_tac_toe", reason };
        let instance: Instance = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let mut cells = [None; 9];
        for (r, row) in instance.board.iter().enumerate() {
            if row.chars().count() != 3 {
                return Err(bad(format!("row {r} is not 3 cells")));
            }
            for (c, ch) in row.chars().enumerate() {
                cells[r * 3 + c] = match ch {
                    'X' => Some(Mark::X),
                    'O' => Some(Mark::O),
                    '.' => None,
                    other => return Err(bad(format!("unknown mark {other:?}"))),
                };
            }
        }
        let xs = cells.iter().filter(|c| **c == Some(Mark::X)).count();
        let os = cells.iter().filter(|c| **c == Some(Mark::O)).count();
        if !(xs == os || xs == os + 1) || winner(&cells).is_some() {
            return Err(bad("not a reachable, unfinished position".into()));
        }
        let to_move = if xs == os { Mark::X } else { Mark::O };
        Ok(TicTacToe { cells, to_move, outcome: None })
    }

    pub fn instance(&self) -> Instance {
        let row = |r: usize| (0..3).map(|c| self.cells[r * 3 + c].map_or('.', Mark::symbol)).collect();
        Instance { board: [row(0), row(1), row(2)] }
    }

    pub fn to_move(&self) -> Mark {
        self.to_move
    }

    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    pub fn cells(&self) -> &[Option<Mark>; 9] {
        &self.cells
    }

    /// The player to move gives up (an unreadable reply): the other player wins.
    pub fn forfeit(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some(Outcome::Win(self.to_move.other()));
        }
    }

    /// The cell the answer format's example shows: a taken cell whenever the board has
    /// one, drawn from the position. A fixed example (`#### 1,2`) became the players'
    /// favourite move, and one drawn from all cells still made "copy the example" a
    /// fixed policy that the trained players settled on (results/tic-tac-toe-smollm2/README.md).
    /// Copying a taken cell loses the game, so the format is learnt without a move.
    pub fn example_cell(&self) -> usize {
        let position = self.cells.iter().fold(0u64, |key, cell| key * 3 + cell.map_or(0, |mark| mark as u64 + 1));
        let taken: Vec<usize> = (0..9).filter(|&c| self.cells[c].is_some()).collect();
        let draw = stream(&[position]);
        if taken.is_empty() { (draw % 9) as usize } else { taken[(draw % taken.len() as u64) as usize] }
    }

    /// `mark`'s result: 1 for a win, 0.5 for a draw, 0 for a loss or a game not over.
    pub fn result_for(&self, mark: Mark) -> f64 {
        match self.outcome {
            Some(Outcome::Win(winner)) if winner == mark => 1.0,
            Some(Outcome::Draw) => 0.5,
            _ => 0.0,
        }
    }

    /// The perfect move for the player to move.
    pub fn best_move(&self) -> Option<usize> {
        minimax(&self.cells, self.to_move).1
    }
}

impl Env for TicTacToe {
    /// A cell 0–8 in reading order.
    type Action = usize;

    fn rules(&self) -> String {
        "Tic-tac-toe on a 3x3 board: X and O take turns marking an empty cell ('.'); three marks in a row, column or \
         diagonal win. Answer with the cell as row,column counted from 0 at the top left."
            .to_string()
    }

    fn observation(&self) -> String {
        // The legal moves spelled out, so a small model can copy one instead of
        // working out coordinates from the grid.
        let rows = self.instance().board.join("\n");
        let empty: Vec<String> =
            (0..9).filter(|&c| self.cells[c].is_none()).map(|c| format!("{},{}", c / 3, c % 3)).collect();
        format!("{rows}\nEmpty cells: {}\nYou play {}.", empty.join("  "), self.to_move.symbol())
    }

    fn parse(&self, text: &str) -> Result<usize, String> {
        // The answer line only: small models write the move, then go on (often
        // restating the rules, whose digits would spoil the cell).
        let region = match after_marker(text) {
            Some(after) => after.lines().next().unwrap_or(""),
            None => text,
        };
        let digits: Vec<u32> = region.chars().filter_map(|c| c.to_digit(10)).collect();
        let cell = match digits.as_slice() {
            [r, c] if *r < 3 && *c < 3 => (r * 3 + c) as usize,
            [k] if (1..=9).contains(k) => (k - 1) as usize,
            _ => return Err("expected a cell as row,column after ####".to_string()),
        };
        Ok(cell)
    }

    fn step(&mut self, cell: &usize, _sandbox: &Sandbox) -> Step {
        let mover = self.to_move;
        if self.outcome.is_some() {
            return Step { reward: 0.0, done: true, success: self.success(), feedback: "The game is over.".into() };
        }
        let (r, c) = (cell / 3, cell % 3);
        if self.cells[*cell].is_some() {
            self.outcome = Some(Outcome::Win(mover.other()));
            let feedback = format!("{} tried the taken cell {r},{c} and loses.", mover.symbol());
            return Step { reward: -1.0, done: true, success: self.success(), feedback };
        }
        self.cells[*cell] = Some(mover);
        self.to_move = mover.other();
        let (reward, feedback) = if winner(&self.cells) == Some(mover) {
            self.outcome = Some(Outcome::Win(mover));
            (1.0, format!("{} played {r},{c} and wins.", mover.symbol()))
        } else if self.cells.iter().all(Option::is_some) {
            self.outcome = Some(Outcome::Draw);
            (0.5, format!("{} played {r},{c}; the board is full: a draw.", mover.symbol()))
        } else {
            (0.0, format!("{} played {r},{c}.", mover.symbol()))
        };
        Step { reward, done: self.outcome.is_some(), success: self.success(), feedback }
    }

    fn done(&self) -> bool {
        self.outcome.is_some()
    }

    /// X won (self-play is scored from X's side).
    fn success(&self) -> bool {
        self.outcome == Some(Outcome::Win(Mark::X))
    }

    /// X's result, as [`TicTacToe::result_for`].
    fn team_reward(&self) -> f64 {
        self.result_for(Mark::X)
    }

    fn solve(&self) -> Option<usize> {
        self.best_move()
    }

    fn format_action(&self, cell: &usize) -> String {
        format!("{},{}", cell / 3, cell % 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::stream;
    use crate::sandbox::SandboxConfig;

    fn sandbox() -> Sandbox {
        Sandbox::new(SandboxConfig::default()).unwrap()
    }

    fn game(rows: [&str; 3]) -> TicTacToe {
        TicTacToe::from_instance(&format!(r#"{{"board": ["{}", "{}", "{}"]}}"#, rows[0], rows[1], rows[2])).unwrap()
    }

    #[test]
    fn a_win_a_draw_and_an_illegal_move_are_scored() {
        let sb = sandbox();
        let mut g = game(["XX.", "OO.", "..."]);
        let step = g.step(&2, &sb);
        assert_eq!((step.reward, step.done, step.success), (1.0, true, true));
        assert_eq!(step.feedback, "X played 0,2 and wins.");
        assert_eq!(g.team_reward(), 1.0);

        let mut g = game(["XOX", "XOO", "OX."]);
        let step = g.step(&8, &sb);
        assert_eq!((step.reward, step.done, g.team_reward()), (0.5, true, 0.5));

        let mut g = game(["X..", "...", "..."]);
        let step = g.step(&0, &sb);
        assert_eq!((step.reward, step.done, step.success), (-1.0, true, true), "O's illegal move hands X the win");
    }

    #[test]
    fn minimax_blocks_and_wins() {
        assert_eq!(game(["XX.", "OO.", "..."]).best_move(), Some(2), "X wins at once");
        assert_eq!(game(["XX.", "O..", "..."]).best_move(), Some(2), "O must block");
        assert_eq!(minimax(game(["...", "...", "..."]).cells(), Mark::X).0, 0, "perfect play draws");
    }

    #[test]
    fn replies_parse() {
        let g = game(["...", "...", "..."]);
        assert_eq!(g.parse("#### 1,2").unwrap(), 5);
        assert_eq!(g.parse("I take (2, 0)").unwrap(), 6);
        assert_eq!(g.parse("#### 9").unwrap(), 8);
        assert!(g.parse("#### 3,3").is_err());
        assert_eq!(g.parse("#### 0,2\n\nTic-tac-toe on a 3x3 board").unwrap(), 2, "the answer line only");
    }

    #[test]
    fn the_example_cell_is_taken_whenever_the_board_has_a_mark() {
        let mut seen = [false; 9];
        for i in 0..200 {
            let g = TicTacToe::generate(stream(&[23, i]));
            let cell = g.example_cell();
            assert_eq!(cell, g.clone().example_cell(), "one position, one example");
            seen[cell] = true;
            let marks = g.cells().iter().filter(|c| c.is_some()).count();
            assert_eq!(g.cells()[cell].is_some(), marks > 0, "{:?}", g.instance());
        }
        assert!(seen.iter().all(|&s| s), "every cell is someone's example: {seen:?}");
    }

    #[test]
    fn generation_is_deterministic_and_minimax_never_loses() {
        let sb = sandbox();
        for i in 0..500 {
            let seed = stream(&[17, i]);
            let start = TicTacToe::generate(seed);
            assert_eq!(start, TicTacToe::generate(seed));
            // Minimax for both sides reaches the position's game-theoretic value.
            let value = minimax(start.cells(), start.to_move()).0;
            let mover = start.to_move();
            let mut g = start.clone();
            while !g.done() {
                let cell = g.solve().unwrap();
                g.step(&cell, &sb);
            }
            let expected = match value {
                1 => Some(Outcome::Win(mover)),
                -1 => Some(Outcome::Win(mover.other())),
                _ => Some(Outcome::Draw),
            };
            assert_eq!(g.outcome(), expected, "seed {seed}");
        }
    }

    #[test]
    fn clones_are_independent() {
        let sb = sandbox();
        let g = game(["...", "...", "..."]);
        let mut a = g.clone();
        a.step(&4, &sb);
        assert_eq!(g.instance().board[1], "...");
        assert_eq!(a.instance().board[1], ".X.");
    }
}
