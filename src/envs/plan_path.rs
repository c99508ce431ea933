//! Plan-Path: walk a grid from the current position to the goal around walls.
//!
//! * Generation: each cell is a wall with `wall_probability`; start and goal are two
//!   distinct free cells; the instance is redrawn (same seed stream) until the goal is
//!   reachable by BFS.
//! * Action: a list of moves U/D/L/R (see [`super::moves`]), executed in order until the
//!   goal is reached.
//! * Reward per move: −0.01, or −0.1 for an invalid move (wall, off the grid, unknown
//!   token; the position does not change); plus shaping 0.99·φ(next) − φ(current) with
//!   φ = −Manhattan distance to the goal; reaching the goal +1 and done, +0.5 more when
//!   the moves taken so far equal the BFS shortest length. After `max_moves` moves the
//!   episode ends unsolved.
//! * The prompt shows the *current* position (the reference showed the original start).
//!
//! The tool agent's programs get the instance and three helpers predefined
//! ([`PlanPath::tool_preamble`]); [`bfs`], [`greedy`] and [`random_walk`] here are the
//! same functions in Rust (a test runs both and compares), used for demonstrations.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::moves::{Move, format_moves, parse_moves};
use super::{Env, Error, Step};
use crate::rng::SplitMix64;
use crate::sandbox::Sandbox;
use crate::validate::{Invalid, check, check_probability};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PlanPathConfig {
    /// Grid side length.
    pub size: u32,
    /// Probability that a cell is a wall.
    pub wall_probability: f64,
    /// Moves allowed in one episode before it ends unsolved.
    pub max_moves: u32,
    /// How the warm-start demonstrations choose tools and whether the planner trusts them.
    pub demonstrations: PlanPathDemonstrations,
}

impl Default for PlanPathConfig {
    fn default() -> Self {
        PlanPathConfig {
            size: 10,
            wall_probability: 0.22,
            max_moves: 200,
            demonstrations: PlanPathDemonstrations::default(),
        }
    }
}

/// Choice-level imperfection of the Plan-Path demonstrations (shares must sum to 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PlanPathDemonstrations {
    /// Share of tool programs that call `bfs` (always right).
    pub tool_bfs: f64,
    /// Share that call `greedy`, which stops at the first wall.
    pub tool_greedy: f64,
    /// Share that call `random_walk`.
    pub tool_random_walk: f64,
    /// Share of broken programs (errors, swapped arguments).
    pub tool_broken: f64,
    /// Probability that the planner copies the tool's output rather than writing its own path.
    pub planner_copies_tool: f64,
}

impl PlanPathConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        check(self.size >= 2, "env.size", "must be at least 2")?;
        check((0.0..0.9).contains(&self.wall_probability), "env.wall_probability", "must be in [0, 0.9)")?;
        let d = &self.demonstrations;
        for (value, key) in [
            (d.tool_bfs, "tool_bfs"),
            (d.tool_greedy, "tool_greedy"),
            (d.tool_random_walk, "tool_random_walk"),
            (d.tool_broken, "tool_broken"),
            (d.planner_copies_tool, "planner_copies_tool"),
        ] {
            check_probability(value, &format!("env.demonstrations.{key}"))?;
        }
        let total = d.tool_bfs + d.tool_greedy + d.tool_random_walk + d.tool_broken;
        check((total - 1.0).abs() < 1e-9, "env.demonstrations", format!("the tool_* shares sum to {total}, not 1"))
    }
}

impl Default for PlanPathDemonstrations {
    fn default() -> Self {
        PlanPathDemonstrations {
            tool_bfs: 0.15,
            tool_greedy: 0.45,
            tool_random_walk: 0.30,
            tool_broken: 0.10,
            planner_copies_tool: 0.45,
        }
    }
}

pub type Cell = (usize, usize);

/// A Plan-Path instance as stored in the `tasks` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// Rows of the grid, '#' wall and '.' free.
    pub grid: Vec<String>,
    pub start: [usize; 2],
    pub goal: [usize; 2],
}

/// The walls of a square grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    pub size: usize,
    walls: Vec<bool>,
}

impl Grid {
    pub fn free(&self, r: i64, c: i64) -> bool {
        let n = self.size as i64;
        (0..n).contains(&r) && (0..n).contains(&c) && !self.walls[(r * n + c) as usize]
    }

    pub fn is_wall(&self, (r, c): Cell) -> bool {
        self.walls[r * self.size + c]
    }

    fn rows(&self) -> Vec<String> {
        (0..self.size).map(|r| (0..self.size).map(|c| if self.is_wall((r, c)) { '#' } else { '.' }).collect()).collect()
    }

    fn step(&self, (r, c): Cell, m: &Move) -> Option<Cell> {
        let (dr, dc) = m.delta()?;
        let (nr, nc) = (r as i64 + dr, c as i64 + dc);
        self.free(nr, nc).then_some((nr as usize, nc as usize))
    }
}

fn manhattan(a: Cell, b: Cell) -> usize {
    a.0.abs_diff(b.0) + a.1.abs_diff(b.1)
}

/// Moves of a shortest path from `s` to `g` (neighbours tried U, D, L, R), or None.
pub fn bfs(grid: &Grid, s: Cell, g: Cell) -> Option<Vec<Move>> {
    let n = grid.size;
    let mut previous: Vec<Option<(Cell, usize)>> = vec![None; n * n];
    let mut seen = vec![false; n * n];
    seen[s.0 * n + s.1] = true;
    let mut queue = VecDeque::from([s]);
    while let Some(cell) = queue.pop_front() {
        if cell == g {
            break;
        }
        for (i, m) in Move::ALL.iter().enumerate() {
            if let Some(next) = grid.step(cell, m) {
                let k = next.0 * n + next.1;
                if !seen[k] {
                    seen[k] = true;
                    previous[k] = Some((cell, i));
                    queue.push_back(next);
                }
            }
        }
    }
    if !seen[g.0 * n + g.1] {
        return None;
    }
    let mut path = Vec::new();
    let mut cell = g;
    while let Some((before, i)) = previous[cell.0 * n + cell.1] {
        path.push(Move::ALL[i].clone());
        cell = before;
    }
    path.reverse();
    Some(path)
}

/// The Manhattan-greedy walker: steps along the axis with the larger remaining distance
/// (rows on a tie) and stops at the first wall, with no fallback.
pub fn greedy(grid: &Grid, s: Cell, g: Cell) -> Vec<Move> {
    let mut pos = s;
    let mut path = Vec::new();
    while pos != g {
        let (dr, dc) = (g.0 as i64 - pos.0 as i64, g.1 as i64 - pos.1 as i64);
        let m = if dr.abs() >= dc.abs() {
            if dr > 0 { Move::Down } else { Move::Up }
        } else if dc > 0 {
            Move::Right
        } else {
            Move::Left
        };
        match grid.step(pos, &m) {
            Some(next) => pos = next,
            None => break,
        }
        path.push(m);
    }
    path
}

/// Random valid moves, towards the goal with probability 0.3 when such a move exists,
/// at most 2·Manhattan+2 of them, stopping on arrival. Seeded with splitmix64 exactly
/// like the Python helper.
pub fn random_walk(grid: &Grid, s: Cell, g: Cell, seed: u64) -> Vec<Move> {
    let mut rng = SplitMix64::new(seed);
    let limit = 2 * manhattan(s, g) + 2;
    let mut pos = s;
    let mut path = Vec::new();
    while pos != g && path.len() < limit {
        let options: Vec<(Move, Cell)> =
            Move::ALL.iter().filter_map(|m| grid.step(pos, m).map(|next| (m.clone(), next))).collect();
        if options.is_empty() {
            break;
        }
        let closer: Vec<&(Move, Cell)> =
            options.iter().filter(|(_, next)| manhattan(*next, g) < manhattan(pos, g)).collect();
        let (m, next) = if !closer.is_empty() && rng.unit() < 0.3 {
            closer[rng.below(closer.len())].clone()
        } else {
            options[rng.below(options.len())].clone()
        };
        pos = next;
        path.push(m);
    }
    path
}

/// One Plan-Path episode.
#[derive(Debug, Clone)]
pub struct PlanPath {
    grid: Arc<Grid>,
    start: Cell,
    goal: Cell,
    pos: Cell,
    moves_taken: u32,
    max_moves: u32,
    shortest: usize,
    done: bool,
    success: bool,
}

impl PlanPath {
    /// A new instance from `seed` (deterministic).
    pub fn generate(config: &PlanPathConfig, seed: u64) -> PlanPath {
        let n = config.size as usize;
        let mut rng = SplitMix64::new(seed);
        loop {
            let walls: Vec<bool> = (0..n * n).map(|_| rng.chance(config.wall_probability)).collect();
            let grid = Grid { size: n, walls };
            let free: Vec<Cell> = (0..n * n).map(|k| (k / n, k % n)).filter(|&c| !grid.is_wall(c)).collect();
            if free.len() < 2 {
                continue;
            }
            let start = *rng.choose(&free);
            let goal = *rng.choose(&free);
            if start == goal {
                continue;
            }
            if let Some(path) = bfs(&grid, start, goal) {
                return PlanPath::new(Arc::new(grid), start, goal, config.max_moves, path.len());
            }
        }
    }

    fn new(grid: Arc<Grid>, start: Cell, goal: Cell, max_moves: u32, shortest: usize) -> PlanPath {
        PlanPath { grid, start, goal, pos: start, moves_taken: 0, max_moves, shortest, done: false, success: false }
    }

    pub fn from_instance(config: &PlanPathConfig, json: &str) -> Result<PlanPath, Error> {
        let bad = |reason: String| Error::Instance { env: "plan_path", reason };
        let instance: Instance = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let n = instance.grid.len();
        if n < 2 || instance.grid.iter().any(|row| row.chars().count() != n) {
            return Err(bad(format!("the grid must be square, got {n} rows")));
        }
        let walls = instance.grid.iter().flat_map(|row| row.chars().map(|c| c == '#')).collect();
        let grid = Grid { size: n, walls };
        let [start, goal] = [instance.start, instance.goal].map(|[r, c]| (r, c));
        for cell in [start, goal] {
            if cell.0 >= n || cell.1 >= n || grid.is_wall(cell) {
                return Err(bad(format!("{cell:?} is not a free cell")));
            }
        }
        let shortest = bfs(&grid, start, goal).ok_or_else(|| bad("the goal is unreachable".into()))?.len();
        Ok(PlanPath::new(Arc::new(grid), start, goal, config.max_moves, shortest))
    }

    pub fn instance(&self) -> Instance {
        Instance { grid: self.grid.rows(), start: [self.start.0, self.start.1], goal: [self.goal.0, self.goal.1] }
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    pub fn position(&self) -> Cell {
        self.pos
    }

    pub fn goal(&self) -> Cell {
        self.goal
    }

    /// Length of a shortest path from the start.
    pub fn shortest(&self) -> usize {
        self.shortest
    }

    /// Python that defines the instance and the helpers for the tool agent's program.
    pub fn tool_preamble(&self) -> String {
        let rows: Vec<String> = self.grid.rows().iter().map(|r| format!("    {r:?},")).collect();
        format!("grid = [\n{}\n]\nS = {:?}\nG = {:?}\n{}", rows.join("\n"), self.pos, self.goal, PYTHON_HELPERS)
    }
}

/// The helpers every Plan-Path tool program can call (documented in the tool prompt).
const PYTHON_HELPERS: &str = r#"MOVES = {'U': (-1, 0), 'D': (1, 0), 'L': (0, -1), 'R': (0, 1)}

def _free(grid, r, c):
    return 0 <= r < len(grid) and 0 <= c < len(grid[0]) and grid[r][c] != '#'

def bfs(grid, s, g):
    """Moves of a shortest path from s to g as a string such as 'RRD', or None."""
    from collections import deque
    prev = {tuple(s): None}
    queue = deque([tuple(s)])
    while queue:
        cell = queue.popleft()
        if cell == tuple(g):
            break
        for m, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if _free(grid, *nxt) and nxt not in prev:
                prev[nxt] = (cell, m)
                queue.append(nxt)
    if tuple(g) not in prev:
        return None
    path, cell = [], tuple(g)
    while prev[cell] is not None:
        cell, m = prev[cell]
        path.append(m)
    return ''.join(reversed(path))

def greedy(grid, s, g):
    """Steps along the axis with the larger distance to g; stops at the first wall."""
    pos, path = tuple(s), []
    while pos != tuple(g):
        dr, dc = g[0] - pos[0], g[1] - pos[1]
        m = ('D' if dr > 0 else 'U') if abs(dr) >= abs(dc) else ('R' if dc > 0 else 'L')
        nxt = (pos[0] + MOVES[m][0], pos[1] + MOVES[m][1])
        if not _free(grid, *nxt):
            break
        pos = nxt
        path.append(m)
    return ''.join(path)

class _SplitMix64:
    def __init__(self, seed):
        self.state = seed % (1 << 64)
    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) % (1 << 64)
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
        return z ^ (z >> 31)
    def unit(self):
        return (self.next() >> 11) / float(1 << 53)
    def below(self, n):
        return (self.next() * n) >> 64

def random_walk(grid, s, g, seed=0):
    """Random valid moves (towards g 30% of the time), at most 2*distance+2, seeded."""
    rng = _SplitMix64(seed)
    pos, path = tuple(s), []
    limit = 2 * (abs(g[0] - s[0]) + abs(g[1] - s[1])) + 2
    while pos != tuple(g) and len(path) < limit:
        options = [(m, (pos[0] + d[0], pos[1] + d[1])) for m, d in MOVES.items() if _free(grid, pos[0] + d[0], pos[1] + d[1])]
        if not options:
            break
        dist = abs(g[0] - pos[0]) + abs(g[1] - pos[1])
        closer = [o for o in options if abs(g[0] - o[1][0]) + abs(g[1] - o[1][1]) < dist]
        if closer and rng.unit() < 0.3:
            m, pos = closer[rng.below(len(closer))]
        else:
            m, pos = options[rng.below(len(options))]
        path.append(m)
    return ''.join(path)
"#;

impl Env for PlanPath {
    type Action = Vec<Move>;

    fn rules(&self) -> String {
        format!(
            "Plan-Path: move on a {n}x{n} grid from your position S to the goal G. '.' is free, '#' is a wall. \
             Moves: U (row - 1), D (row + 1), L (column - 1), R (column + 1); rows and columns count from 0 at the top left. \
             A move into a wall or off the grid fails and costs a penalty. Reach G in as few moves as possible.",
            n = self.grid.size
        )
    }

    fn observation(&self) -> String {
        let mut text = String::new();
        for r in 0..self.grid.size {
            for c in 0..self.grid.size {
                text.push(if (r, c) == self.pos {
                    'S'
                } else if (r, c) == self.goal {
                    'G'
                } else if self.grid.is_wall((r, c)) {
                    '#'
                } else {
                    '.'
                });
            }
            text.push('\n');
        }
        text.push_str(&format!("S = {:?} (you), G = {:?}", self.pos, self.goal));
        text
    }

    fn parse(&self, text: &str) -> Result<Vec<Move>, String> {
        parse_moves(text)
    }

    fn step(&mut self, action: &Vec<Move>, _sandbox: &Sandbox) -> Step {
        let mut reward = 0.0;
        let mut invalid = 0;
        let mut executed = 0;
        for m in action {
            if self.done {
                break;
            }
            executed += 1;
            self.moves_taken += 1;
            let before = self.pos;
            match self.grid.step(self.pos, m) {
                Some(next) => {
                    self.pos = next;
                    reward -= 0.01;
                }
                None => {
                    invalid += 1;
                    reward -= 0.1;
                }
            }
            let phi = |cell: Cell| -(manhattan(cell, self.goal) as f64);
            reward += 0.99 * phi(self.pos) - phi(before);
            if self.pos == self.goal {
                reward += 1.0;
                if self.moves_taken as usize == self.shortest {
                    reward += 0.5;
                }
                self.done = true;
                self.success = true;
            } else if self.moves_taken >= self.max_moves {
                self.done = true;
            }
        }
        let mut feedback = format!("Executed {executed} of {} moves", action.len());
        if invalid > 0 {
            feedback.push_str(&format!(", {invalid} invalid"));
        }
        feedback.push_str(&format!("; now at {:?}", self.pos));
        if self.success {
            feedback.push_str("; reached the goal");
        } else if self.done {
            feedback.push_str("; out of moves");
        }
        feedback.push('.');
        Step { reward, done: self.done, success: self.success, feedback }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn success(&self) -> bool {
        self.success
    }

    fn solve(&self) -> Option<Vec<Move>> {
        bfs(&self.grid, self.pos, self.goal)
    }

    fn format_action(&self, action: &Vec<Move>) -> String {
        format_moves(action)
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

    /// . . .
    /// . # .
    /// . . .      S = (0, 0), G = (0, 2)
    fn small() -> PlanPath {
        let json = r#"{"grid": ["...", ".#.", "..."], "start": [0, 0], "goal": [0, 2]}"#;
        PlanPath::from_instance(&PlanPathConfig::default(), json).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn an_optimal_path_earns_the_hand_computed_reward() {
        let sb = sandbox();
        let mut env = small();
        // R: −0.01 + (0.99·(−1) − (−2)) = 1.0
        // R: −0.01 + (0.99·0 − (−1)) + 1 + 0.5 = 2.49
        let step = env.step(&vec![Move::Right, Move::Right], &sb);
        assert!(close(step.reward, 3.49), "{}", step.reward);
        assert!(step.done && step.success);
        assert_eq!(step.feedback, "Executed 2 of 2 moves; now at (0, 2); reached the goal.");
    }

    #[test]
    fn invalid_moves_cost_without_moving_and_detours_lose_the_bonus() {
        let sb = sandbox();
        let mut env = small();
        // U off the grid: −0.1 + (0.99·(−2) + 2) = −0.08, still at (0, 0).
        let step = env.step(&vec![Move::Up], &sb);
        assert!(close(step.reward, -0.08), "{}", step.reward);
        assert_eq!(env.position(), (0, 0));
        // Unknown token: the same as a wall.
        let step = env.step(&vec![Move::Invalid("X".into())], &sb);
        assert!(close(step.reward, -0.08), "{}", step.reward);
        // D (1,0): −0.01 + (0.99·(−3) + 2) = −0.98; R into the wall (1,1): −0.1 + (0.99·(−3) + 3) = −0.07
        let step = env.step(&vec![Move::Down, Move::Right], &sb);
        assert!(close(step.reward, -1.05), "{}", step.reward);
        // U (0,0): −0.01 + (0.99·(−2) + 3) = 1.01; R (0,1): −0.01 + (0.99·(−1) + 2) = 1.0;
        // R (0,2): −0.01 + (0 + 1) + 1 = 1.99, no optimality bonus after 7 moves; L is not executed.
        let step = env.step(&vec![Move::Up, Move::Right, Move::Right, Move::Left], &sb);
        assert!(close(step.reward, 4.0), "{}", step.reward);
        assert_eq!(step.feedback, "Executed 3 of 4 moves; now at (0, 2); reached the goal.");
    }

    #[test]
    fn the_episode_ends_after_max_moves() {
        let sb = sandbox();
        let config = PlanPathConfig { max_moves: 3, ..PlanPathConfig::default() };
        let json = r#"{"grid": ["...", ".#.", "..."], "start": [0, 0], "goal": [0, 2]}"#;
        let mut env = PlanPath::from_instance(&config, json).unwrap();
        let step = env.step(&vec![Move::Down, Move::Up, Move::Down, Move::Up], &sb);
        assert!(step.done && !step.success);
        assert_eq!(step.feedback, "Executed 3 of 4 moves; now at (1, 0); out of moves.");
    }

    #[test]
    fn the_observation_shows_the_current_position() {
        let sb = sandbox();
        let mut env = small();
        env.step(&vec![Move::Down], &sb);
        assert_eq!(env.observation(), "..G\nS#.\n...\nS = (1, 0) (you), G = (0, 2)");
    }

    #[test]
    fn generation_is_deterministic_and_the_solver_solves_every_instance() {
        let sb = sandbox();
        let config = PlanPathConfig::default();
        for i in 0..500 {
            let seed = stream(&[42, i]);
            let env = PlanPath::generate(&config, seed);
            assert_eq!(env.instance(), PlanPath::generate(&config, seed).instance());
            assert_ne!(env.start, env.goal);
            let mut play = env.clone();
            let step = play.step(&env.solve().unwrap(), &sb);
            assert!(step.success, "seed {seed}");
            assert_eq!(env.solve().unwrap().len(), env.shortest());
        }
        let a = PlanPath::generate(&config, 1).instance();
        assert_ne!(a, PlanPath::generate(&config, 2).instance());
        // Walls are drawn with the configured probability.
        let walls: usize =
            (0..200).map(|i| PlanPath::generate(&config, i).grid.walls.iter().filter(|w| **w).count()).sum();
        let share = walls as f64 / 20_000.0;
        assert!((0.18..0.25).contains(&share), "{share}");
    }

    #[test]
    fn clones_are_independent() {
        let sb = sandbox();
        let env = small();
        let mut a = env.clone();
        let b = env.clone();
        a.step(&vec![Move::Down], &sb);
        assert_eq!(a.position(), (1, 0));
        assert_eq!(b.position(), (0, 0));
        assert!(!b.done());
    }

    #[test]
    fn the_helpers_match_hand_made_cases() {
        // S . #
        // . # G  greedy from (0,0) to (1,2): |dr| = 1 < |dc| = 2 → R to (0,1), then R is a wall: stop.
        // . . .
        let env = PlanPath::from_instance(
            &PlanPathConfig::default(),
            r#"{"grid": ["..#", ".#.", "..."], "start": [0, 0], "goal": [1, 2]}"#,
        )
        .unwrap();
        let g = env.grid();
        assert_eq!(format_moves(&greedy(g, (0, 0), (1, 2))), "R");
        assert_eq!(format_moves(&bfs(g, (0, 0), (1, 2)).unwrap()), "DDRRU");
        assert_eq!(bfs(g, (0, 0), (0, 0)).unwrap(), []);
        let walk = random_walk(g, (0, 0), (1, 2), 5);
        assert!(walk.len() <= 2 * 3 + 2);
    }

    #[test]
    fn the_python_helpers_print_what_the_rust_helpers_compute() {
        let sb = sandbox();
        let config = PlanPathConfig::default();
        let mut code = String::new();
        let mut expected = String::new();
        let envs: Vec<PlanPath> = (0..40).map(|i| PlanPath::generate(&config, stream(&[7, i]))).collect();
        let mut files = Vec::new();
        for (i, env) in envs.iter().enumerate() {
            files.push((format!("task{i}.py"), env.tool_preamble()));
            code.push_str(&format!(
                "import task{i} as t\nprint(t.bfs(t.grid, t.S, t.G), t.greedy(t.grid, t.S, t.G), t.random_walk(t.grid, t.S, t.G), t.random_walk(t.grid, t.S, t.G, seed={i}))\n"
            ));
            let (g, s, goal) = (env.grid(), env.position(), env.goal());
            expected.push_str(&format!(
                "{} {} {} {}\n",
                format_moves(&bfs(g, s, goal).unwrap()),
                format_moves(&greedy(g, s, goal)),
                format_moves(&random_walk(g, s, goal, 0)),
                format_moves(&random_walk(g, s, goal, i as u64)),
            ));
        }
        let mut program = Program::new(code);
        program.files = files;
        let out = sb.run(&program).unwrap();
        assert!(out.ok(), "{}", out.stderr);
        // An empty greedy walk prints as an empty field; compare field by field.
        let got: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split(' ').collect()).collect();
        let want: Vec<Vec<&str>> = expected.lines().map(|l| l.split(' ').collect()).collect();
        assert_eq!(got, want);
    }
}
