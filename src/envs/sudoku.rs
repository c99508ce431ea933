//! Sudoku n×n (n = 4 by default, any square size): fill the grid so that every row,
//! column and box holds 1..n once.
//!
//! * Generation: a solved grid from a pattern shuffled by the seed (digits, rows within
//!   bands, bands, columns within stacks, stacks), then cells are blanked in a random
//!   order as long as the solution stays unique, until `blanks` cells are empty.
//! * Action: the whole grid (a JSON list of rows, 0 or '.' for a cell left alone, or
//!   rows of digits) or a list of fills `[[row, column, value], …]` (0-based).
//!   A grid is applied as the fills of the cells it changes, row by row.
//! * Reward per fill: −0.01; changing a given clue −0.5 (refused); a value already in
//!   the cell's row, column or box −0.3 (refused); filling an empty cell legally +0.1;
//!   solving the puzzle +2 and done. The clues always stay (the reference forgot that).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Env, Error, Step, after_marker};
use crate::rng::SplitMix64;
use crate::sandbox::Sandbox;
use crate::validate::{Invalid, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SudokuConfig {
    /// Side of the grid (a square number: 4 or 9).
    pub size: u32,
    /// Empty cells in a generated puzzle.
    pub blanks: u32,
}

impl SudokuConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let root = (self.size as f64).sqrt() as u32;
        check(
            root * root == self.size && self.size >= 4,
            "env.size",
            format!("{} is not a square of at least 4 (4, 9, …)", self.size),
        )?;
        check(
            self.blanks >= 1 && self.blanks < self.size * self.size,
            "env.blanks",
            "must leave at least one blank and one clue",
        )
    }
}

impl Default for SudokuConfig {
    fn default() -> Self {
        SudokuConfig { size: 4, blanks: 8 }
    }
}

/// A Sudoku instance as stored in the `tasks` table: 0 marks a blank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub puzzle: Vec<Vec<u8>>,
}

/// A parsed reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Action {
    Grid(Vec<Vec<u8>>),
    Fills(Vec<[usize; 3]>),
}

type Board = Vec<Vec<u8>>;

/// One Sudoku episode.
#[derive(Debug, Clone)]
pub struct Sudoku {
    n: usize,
    clues: Arc<Board>,
    board: Board,
    done: bool,
    success: bool,
}

fn box_side(n: usize) -> usize {
    (n as f64).sqrt().round() as usize
}

/// Whether `v` may go at (r, c): not elsewhere in its row, column or box.
fn allowed(board: &Board, r: usize, c: usize, v: u8) -> bool {
    let n = board.len();
    let b = box_side(n);
    let in_row = board[r].iter().enumerate().any(|(j, &x)| j != c && x == v);
    let in_column = board.iter().enumerate().any(|(i, row)| i != r && row[c] == v);
    if in_row || in_column {
        return false;
    }
    let (r0, c0) = (r / b * b, c / b * b);
    let in_box = board[r0..r0 + b]
        .iter()
        .enumerate()
        .any(|(di, row)| row[c0..c0 + b].iter().enumerate().any(|(dj, &x)| (r0 + di, c0 + dj) != (r, c) && x == v));
    !in_box
}

/// Counts solutions up to `limit`, filling `first` with the first one found.
fn count_solutions(board: &mut Board, limit: usize, first: &mut Option<Board>) -> usize {
    let n = board.len();
    // The empty cell with the fewest candidates.
    let mut best: Option<(usize, usize, Vec<u8>)> = None;
    for r in 0..n {
        for c in 0..n {
            if board[r][c] == 0 {
                let candidates: Vec<u8> = (1..=n as u8).filter(|&v| allowed(board, r, c, v)).collect();
                if best.as_ref().is_none_or(|b| candidates.len() < b.2.len()) {
                    best = Some((r, c, candidates));
                }
            }
        }
    }
    let Some((r, c, candidates)) = best else {
        if first.is_none() {
            *first = Some(board.clone());
        }
        return 1;
    };
    let mut found = 0;
    for v in candidates {
        board[r][c] = v;
        found += count_solutions(board, limit - found, first);
        board[r][c] = 0;
        if found >= limit {
            break;
        }
    }
    found
}

/// The unique (or first) solution of a puzzle, if any.
pub fn solve(puzzle: &Board) -> Option<Board> {
    let mut first = None;
    count_solutions(&mut puzzle.clone(), 1, &mut first);
    first
}

/// Fills empty cells in reading order with the smallest value that fits, without
/// backtracking (a weak heuristic: it may leave cells at 0 or fill them wrongly).
pub fn first_fit(puzzle: &Board) -> Board {
    let mut board = puzzle.clone();
    let n = board.len();
    for r in 0..n {
        for c in 0..n {
            if board[r][c] == 0 {
                board[r][c] = (1..=n as u8).find(|&v| allowed(&board, r, c, v)).unwrap_or(0);
            }
        }
    }
    board
}

fn solved(board: &Board) -> bool {
    let n = board.len();
    (0..n).all(|r| (0..n).all(|c| board[r][c] != 0 && allowed(board, r, c, board[r][c])))
}

impl Sudoku {
    /// A new puzzle with a unique solution from `seed` (deterministic).
    pub fn generate(config: &SudokuConfig, seed: u64) -> Sudoku {
        let n = config.size as usize;
        let b = box_side(n);
        let mut rng = SplitMix64::new(seed);
        loop {
            let mut digits: Vec<u8> = (1..=n as u8).collect();
            rng.shuffle(&mut digits);
            let order = |rng: &mut SplitMix64| {
                let mut bands: Vec<usize> = (0..b).collect();
                rng.shuffle(&mut bands);
                let mut lines = Vec::new();
                for band in bands {
                    let mut inner: Vec<usize> = (0..b).collect();
                    rng.shuffle(&mut inner);
                    lines.extend(inner.into_iter().map(|i| band * b + i));
                }
                lines
            };
            let (rows, cols) = (order(&mut rng), order(&mut rng));
            let pattern = |r: usize, c: usize| (b * (r % b) + r / b + c) % n;
            let solution: Board = rows.iter().map(|&r| cols.iter().map(|&c| digits[pattern(r, c)]).collect()).collect();
            let mut puzzle = solution.clone();
            let mut cells: Vec<(usize, usize)> = (0..n * n).map(|k| (k / n, k % n)).collect();
            rng.shuffle(&mut cells);
            let mut blanks = 0;
            for (r, c) in cells {
                if blanks == config.blanks as usize {
                    break;
                }
                let keep = puzzle[r][c];
                puzzle[r][c] = 0;
                if count_solutions(&mut puzzle.clone(), 2, &mut None) == 1 {
                    blanks += 1;
                } else {
                    puzzle[r][c] = keep;
                }
            }
            if blanks == config.blanks as usize {
                return Sudoku::new(puzzle);
            }
        }
    }

    fn new(puzzle: Board) -> Sudoku {
        Sudoku { n: puzzle.len(), board: puzzle.clone(), clues: Arc::new(puzzle), done: false, success: false }
    }

    pub fn from_instance(json: &str) -> Result<Sudoku, Error> {
        let bad = |reason: String| Error::Instance { env: "sudoku", reason };
        let instance: Instance = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let n = instance.puzzle.len();
        let b = box_side(n);
        if b * b != n
            || n < 4
            || instance.puzzle.iter().any(|row| row.len() != n || row.iter().any(|&v| v as usize > n))
        {
            return Err(bad(format!("the puzzle must be n x n with n a square >= 4 and values 0..=n, got {n} rows")));
        }
        Ok(Sudoku::new(instance.puzzle))
    }

    pub fn instance(&self) -> Instance {
        Instance { puzzle: (*self.clues).clone() }
    }

    pub fn board(&self) -> &Board {
        &self.board
    }

    pub fn blanks(&self) -> usize {
        self.board.iter().flatten().filter(|&&v| v == 0).count()
    }

    /// Python that defines the instance and helpers for the tool agent's program.
    pub fn tool_preamble(&self) -> String {
        format!("N = {}\ngrid = {:?}\n{}", self.n, self.board, PYTHON_HELPERS)
    }

    fn parse_grid_lines(&self, text: &str) -> Option<Board> {
        let rows: Vec<Vec<u8>> = text
            .lines()
            .map(|l| l.chars().filter(|c| !c.is_whitespace() && *c != '|' && *c != ','))
            .map(|cells| cells.map(|c| if c == '.' { Some(0) } else { c.to_digit(10).map(|d| d as u8) }).collect())
            .filter_map(|row: Option<Vec<u8>>| row.filter(|r| r.len() == self.n))
            .collect();
        (rows.len() >= self.n).then(|| rows[rows.len() - self.n..].to_vec())
    }
}

/// The helpers every Sudoku tool program can call (documented in the tool prompt).
const PYTHON_HELPERS: &str = r#"
def _allowed(g, r, c, v):
    n = len(g)
    b = int(round(n ** 0.5))
    if any(g[r][i] == v for i in range(n) if i != c) or any(g[i][c] == v for i in range(n) if i != r):
        return False
    r0, c0 = r // b * b, c // b * b
    return not any(g[i][j] == v for i in range(r0, r0 + b) for j in range(c0, c0 + b) if (i, j) != (r, c))

def solve(grid):
    """The solved grid (a list of rows) by backtracking, or None if there is none."""
    g = [list(row) for row in grid]
    n = len(g)
    def search():
        best = None
        for r in range(n):
            for c in range(n):
                if g[r][c] == 0:
                    cand = [v for v in range(1, n + 1) if _allowed(g, r, c, v)]
                    if best is None or len(cand) < len(best[2]):
                        best = (r, c, cand)
        if best is None:
            return True
        r, c, cand = best
        for v in cand:
            g[r][c] = v
            if search():
                return True
        g[r][c] = 0
        return False
    return g if search() else None

def first_fit(grid):
    """Fills each empty cell, in reading order, with the smallest value that fits; no backtracking."""
    g = [list(row) for row in grid]
    n = len(g)
    for r in range(n):
        for c in range(n):
            if g[r][c] == 0:
                g[r][c] = next((v for v in range(1, n + 1) if _allowed(g, r, c, v)), 0)
    return g
"#;

impl Env for Sudoku {
    type Action = Action;

    fn rules(&self) -> String {
        let b = box_side(self.n);
        format!(
            "Sudoku {n}x{n}: fill the empty cells ('.') with digits 1-{n} so that every row, every column and every \
             {b}x{b} box holds each digit once. The given digits must not change. Answer with the completed grid as a \
             JSON list of rows, e.g. #### [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]], or with a list of fills \
             [row, column, value] counted from 0, e.g. #### [[0,1,2],[3,3,4]].",
            n = self.n
        )
    }

    fn observation(&self) -> String {
        let rows: Vec<String> = self
            .board
            .iter()
            .map(|row| row.iter().map(|&v| if v == 0 { '.' } else { char::from(b'0' + v) }).collect())
            .collect();
        rows.join("\n")
    }

    fn parse(&self, text: &str) -> Result<Action, String> {
        let region = after_marker(text).unwrap_or(text);
        let n = self.n;
        if let (Some(open), Some(close)) = (region.find('['), region.rfind(']'))
            && close > open
        {
            let json = region[open..=close].replace('\'', "\"");
            let rows: Vec<Vec<i64>> = serde_json::from_str(&json)
                .map_err(|e| format!("the answer is not a JSON list of lists of numbers: {e}"))?;
            let in_range = |v: i64, hi: usize| v >= 0 && v as usize <= hi;
            if !rows.is_empty() && rows.iter().all(|r| r.len() == 3) && n != 3 {
                let fills: Option<Vec<[usize; 3]>> = rows
                    .iter()
                    .map(|f| {
                        (in_range(f[0], n - 1) && in_range(f[1], n - 1) && f[2] >= 1 && f[2] as usize <= n)
                            .then(|| [f[0] as usize, f[1] as usize, f[2] as usize])
                    })
                    .collect();
                return fills.map(Action::Fills).ok_or_else(|| format!("a fill is outside the {n}x{n} grid or 1..{n}"));
            }
            if rows.len() == n && rows.iter().all(|r| r.len() == n && r.iter().all(|&v| in_range(v, n))) {
                return Ok(Action::Grid(rows.iter().map(|r| r.iter().map(|&v| v as u8).collect()).collect()));
            }
            return Err(format!("expected {n} rows of {n} values 0-{n}, or fills [row, column, value]"));
        }
        self.parse_grid_lines(region)
            .map(Action::Grid)
            .ok_or_else(|| format!("no grid found; end with #### and the {n}x{n} grid as a JSON list of rows"))
    }

    fn step(&mut self, action: &Action, _sandbox: &Sandbox) -> Step {
        let fills: Vec<[usize; 3]> = match action {
            Action::Fills(fills) => fills.clone(),
            Action::Grid(grid) => (0..self.n)
                .flat_map(|r| (0..self.n).map(move |c| (r, c)))
                .filter(|&(r, c)| grid[r][c] != 0 && grid[r][c] != self.board[r][c])
                .map(|(r, c)| [r, c, grid[r][c] as usize])
                .collect(),
        };
        let (mut reward, mut placed, mut conflicts, mut clue_changes) = (0.0, 0, 0, 0);
        for [r, c, v] in fills {
            if self.done {
                break;
            }
            let v = v as u8;
            reward -= 0.01;
            if self.clues[r][c] != 0 {
                reward -= 0.5;
                clue_changes += 1;
            } else if !allowed(&self.board, r, c, v) {
                reward -= 0.3;
                conflicts += 1;
            } else {
                if self.board[r][c] == 0 {
                    reward += 0.1;
                }
                self.board[r][c] = v;
                placed += 1;
                if solved(&self.board) {
                    reward += 2.0;
                    self.done = true;
                    self.success = true;
                }
            }
        }
        let feedback = if self.success {
            format!("Placed {placed}; the puzzle is solved.")
        } else {
            format!(
                "Placed {placed}, refused {conflicts} conflicting and {clue_changes} on given clues; {} cells are empty.",
                self.blanks()
            )
        };
        Step { reward, done: self.done, success: self.success, feedback }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn success(&self) -> bool {
        self.success
    }

    fn solve(&self) -> Option<Action> {
        solve(&self.clues).map(Action::Grid)
    }

    fn format_action(&self, action: &Action) -> String {
        serde_json::to_string(action).expect("actions serialise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::stream;
    use crate::sandbox::{Program, SandboxConfig};

    fn sandbox() -> Sandbox {
        Sandbox::new(SandboxConfig::default()).unwrap()
    }

    /// Solution 1234/3412/2143/4321 with four blanks.
    fn small() -> Sudoku {
        Sudoku::from_instance(r#"{"puzzle": [[1,0,3,4],[3,4,0,2],[2,1,4,0],[0,3,2,1]]}"#).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn fills_earn_the_hand_computed_rewards_and_clues_stay() {
        let sb = sandbox();
        let mut env = small();
        // Legal fill (0,1)=2: −0.01 + 0.1. Clue (0,0): −0.01 − 0.5. Conflict (1,2)=3 (row has 3): −0.01 − 0.3.
        let step = env.step(&Action::Fills(vec![[0, 1, 2], [0, 0, 2], [1, 2, 3]]), &sb);
        assert!(close(step.reward, 0.09 - 0.51 - 0.31), "{}", step.reward);
        assert_eq!(env.board()[0], [1, 2, 3, 4]);
        assert_eq!(env.board()[1][2], 0);
        assert_eq!(step.feedback, "Placed 1, refused 1 conflicting and 1 on given clues; 3 cells are empty.");
        // The rest as a full grid: three legal fills, the last one solves: 3·0.09 + 2.
        let grid = vec![vec![1, 2, 3, 4], vec![3, 4, 1, 2], vec![2, 1, 4, 3], vec![4, 3, 2, 1]];
        let step = env.step(&Action::Grid(grid), &sb);
        assert!(close(step.reward, 0.27 + 2.0), "{}", step.reward);
        assert!(step.done && step.success);
    }

    #[test]
    fn a_full_grid_that_changes_a_clue_does_not_solve() {
        let sb = sandbox();
        let mut env = small();
        // A valid grid (digits 1 and 2 swapped) that contradicts the clues.
        let grid = vec![vec![2, 1, 3, 4], vec![3, 4, 2, 1], vec![1, 2, 4, 3], vec![4, 3, 1, 2]];
        let step = env.step(&Action::Grid(grid), &sb);
        assert!(!step.success);
        assert_eq!(env.board()[0][0], 1);
    }

    #[test]
    fn replies_parse_in_every_documented_form() {
        let env = small();
        let grid = vec![vec![1, 2, 3, 4], vec![3, 4, 1, 2], vec![2, 1, 4, 3], vec![4, 3, 2, 1]];
        assert_eq!(env.parse("#### [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]").unwrap(), Action::Grid(grid.clone()));
        assert_eq!(env.parse("so:\n1234\n3412\n2143\n4321").unwrap(), Action::Grid(grid));
        assert_eq!(env.parse("#### [[0, 1, 2]]").unwrap(), Action::Fills(vec![[0, 1, 2]]));
        assert!(env.parse("#### [[0, 1, 9]]").unwrap_err().contains("outside"));
        assert!(env.parse("I don't know").is_err());
        assert!(env.parse("#### [[1,2],[3,4]]").is_err());
    }

    #[test]
    fn generation_is_deterministic_unique_and_solvable() {
        let sb = sandbox();
        let config = SudokuConfig::default();
        let mut distinct = std::collections::HashSet::new();
        for i in 0..500 {
            let seed = stream(&[3, i]);
            let env = Sudoku::generate(&config, seed);
            assert_eq!(env.instance(), Sudoku::generate(&config, seed).instance());
            assert_eq!(env.blanks(), 8);
            assert_eq!(count_solutions(&mut env.board.clone(), 2, &mut None), 1, "seed {seed}");
            let mut play = env.clone();
            assert!(play.step(&env.solve().unwrap(), &sb).success);
            distinct.insert(env.instance());
        }
        assert!(distinct.len() > 450, "{}", distinct.len());
        let nine = Sudoku::generate(&SudokuConfig { size: 9, blanks: 45 }, 5);
        assert_eq!(nine.blanks(), 45);
        assert!(solved(&solve(&nine.board).unwrap()));
    }

    #[test]
    fn clones_are_independent() {
        let sb = sandbox();
        let env = small();
        let mut a = env.clone();
        a.step(&Action::Fills(vec![[0, 1, 2]]), &sb);
        assert_eq!((a.blanks(), env.blanks()), (3, 4));
    }

    #[test]
    fn the_python_helpers_agree_with_the_rust_ones() {
        let sb = sandbox();
        let envs: Vec<Sudoku> = (0..20).map(|i| Sudoku::generate(&SudokuConfig::default(), stream(&[9, i]))).collect();
        let mut program = Program::new(String::new());
        let mut expected = String::new();
        for (i, env) in envs.iter().enumerate() {
            program.files.push((format!("task{i}.py"), env.tool_preamble()));
            program
                .code
                .push_str(&format!("import task{i} as t\nprint(t.solve(t.grid))\nprint(t.first_fit(t.grid))\n"));
            expected.push_str(&format!("{:?}\n{:?}\n", solve(env.board()).unwrap(), first_fit(env.board())));
        }
        let out = sb.run(&program).unwrap();
        assert!(out.ok(), "{}", out.stderr);
        assert_eq!(out.stdout, expected);
    }
}
