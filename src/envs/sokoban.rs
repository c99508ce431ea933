//! Sokoban n×n (6×6 walls included, one box by default): push every box onto a goal.
//!
//! * Generation by reverse play: boxes start on their goals and the player walks
//!   `reverse_steps` random steps, pulling a box whenever it walks away from one; any
//!   state reached that way is solvable. Instances whose boxes all end on goals are
//!   redrawn, and the BFS solver confirms every instance.
//! * Symbols: '#' wall, ' ' floor, '.' goal, '$' box, '*' box on goal, '@' player,
//!   '+' player on goal.
//! * Action: a move list U/D/L/R (see [`super::moves`]), executed in order.
//! * Reward per move: −0.01, or −0.05 when invalid (into a wall, a blocked push, an
//!   unknown token; nothing moves); a box pushed onto a goal +1, off a goal −0.5; all
//!   boxes on goals +10 and done. After `max_moves` moves the episode ends unsolved.
//! * [`Sokoban::deadlocked`] tells when a box off its goal is stuck in a corner, which no
//!   later move can undo; the feedback says so.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::moves::{Move, format_moves, parse_moves};
use super::{Env, Error, Step};
use crate::rng::SplitMix64;
use crate::sandbox::Sandbox;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SokobanConfig {
    /// Side of the room, walls included.
    pub size: u32,
    /// Boxes (and goals) in the room.
    pub boxes: u32,
    /// Reverse-play pulls used to scatter the boxes away from the goals.
    pub reverse_steps: u32,
    /// Moves allowed in one episode before it ends unsolved.
    pub max_moves: u32,
}

impl Default for SokobanConfig {
    fn default() -> Self {
        SokobanConfig { size: 6, boxes: 1, reverse_steps: 20, max_moves: 200 }
    }
}

type Cell = (usize, usize);

/// A Sokoban instance as stored in the `tasks` table: the rows of the room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub room: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
struct Layout {
    size: usize,
    walls: Vec<bool>,
    goals: Vec<Cell>,
}

impl Layout {
    fn wall(&self, (r, c): Cell) -> bool {
        self.walls[r * self.size + c]
    }

    fn next(&self, (r, c): Cell, m: &Move) -> Option<Cell> {
        let (dr, dc) = m.delta()?;
        let (nr, nc) = (r as i64 + dr, c as i64 + dc);
        let n = self.size as i64;
        ((0..n).contains(&nr) && (0..n).contains(&nc) && !self.wall((nr as usize, nc as usize)))
            .then_some((nr as usize, nc as usize))
    }
}

/// One Sokoban episode.
#[derive(Debug, Clone)]
pub struct Sokoban {
    layout: Arc<Layout>,
    player: Cell,
    boxes: Vec<Cell>,
    moves_taken: u32,
    max_moves: u32,
    done: bool,
    success: bool,
}

/// What a move does from a state: the new player cell and the box pushed (from, to).
fn try_move(layout: &Layout, player: Cell, boxes: &[Cell], m: &Move) -> Option<(Cell, Option<(usize, Cell)>)> {
    let next = layout.next(player, m)?;
    match boxes.iter().position(|&b| b == next) {
        None => Some((next, None)),
        Some(i) => {
            let beyond = layout.next(next, m)?;
            (!boxes.contains(&beyond)).then_some((next, Some((i, beyond))))
        }
    }
}

/// A search state: the player and the sorted box cells.
type State = (Cell, Vec<Cell>);

/// Shortest move list solving the state (BFS over player and boxes), or None when
/// unsolvable or larger than `limit` states.
fn solve_state(layout: &Layout, player: Cell, boxes: &[Cell], limit: usize) -> Option<Vec<Move>> {
    let key = |p: Cell, b: &[Cell]| -> State {
        let mut b = b.to_vec();
        b.sort();
        (p, b)
    };
    let start = key(player, boxes);
    // Each reached state with the state and move it was reached by.
    let mut previous: HashMap<State, Option<(State, usize)>> = HashMap::new();
    previous.insert(start.clone(), None);
    let mut queue = VecDeque::from([start]);
    while let Some(state) = queue.pop_front() {
        if state.1.iter().all(|b| layout.goals.contains(b)) {
            let mut path = Vec::new();
            let mut cursor = state;
            while let Some(Some((before, i))) = previous.get(&cursor) {
                path.push(Move::ALL[*i].clone());
                cursor = before.clone();
            }
            path.reverse();
            return Some(path);
        }
        if previous.len() > limit {
            return None;
        }
        for (i, m) in Move::ALL.iter().enumerate() {
            if let Some((p, push)) = try_move(layout, state.0, &state.1, m) {
                let mut b = state.1.clone();
                if let Some((k, to)) = push {
                    b[k] = to;
                }
                let next = key(p, &b);
                if !previous.contains_key(&next) {
                    previous.insert(next.clone(), Some((state.clone(), i)));
                    queue.push_back(next);
                }
            }
        }
    }
    None
}

const SOLVER_STATES: usize = 200_000;

impl Sokoban {
    /// A new solvable room from `seed` (deterministic).
    pub fn generate(config: &SokobanConfig, seed: u64) -> Sokoban {
        let n = config.size as usize;
        let boxes = config.boxes as usize;
        let mut rng = SplitMix64::new(seed);
        loop {
            let mut walls: Vec<bool> =
                (0..n * n).map(|k| k / n == 0 || k / n == n - 1 || k % n == 0 || k % n == n - 1).collect();
            let interior: Vec<Cell> = (0..n * n).map(|k| (k / n, k % n)).filter(|&c| !walls[c.0 * n + c.1]).collect();
            for _ in 0..rng.below(3) {
                let (r, c) = *rng.choose(&interior);
                walls[r * n + c] = true;
            }
            let mut free: Vec<Cell> = interior.iter().copied().filter(|c| !walls[c.0 * n + c.1]).collect();
            if free.len() < boxes + 2 {
                continue;
            }
            rng.shuffle(&mut free);
            let goals: Vec<Cell> = free[..boxes].to_vec();
            let layout = Layout { size: n, walls, goals: goals.clone() };
            let mut box_cells = goals;
            let mut player = free[boxes];
            for _ in 0..config.reverse_steps {
                let m = Move::ALL[rng.below(4)].clone();
                let Some(next) = layout.next(player, &m) else { continue };
                if box_cells.contains(&next) {
                    continue;
                }
                let (dr, dc) = m.delta().expect("a real move");
                let behind = (player.0 as i64 - dr, player.1 as i64 - dc);
                let pulled = box_cells.iter().position(|&b| (b.0 as i64, b.1 as i64) == behind);
                if let Some(i) = pulled.filter(|_| rng.chance(0.8)) {
                    box_cells[i] = player;
                }
                player = next;
            }
            if box_cells.iter().all(|b| layout.goals.contains(b)) {
                continue;
            }
            if solve_state(&layout, player, &box_cells, SOLVER_STATES).is_some() {
                return Sokoban::new(Arc::new(layout), player, box_cells, config.max_moves);
            }
        }
    }

    fn new(layout: Arc<Layout>, player: Cell, boxes: Vec<Cell>, max_moves: u32) -> Sokoban {
        Sokoban { layout, player, boxes, moves_taken: 0, max_moves, done: false, success: false }
    }

    pub fn from_instance(config: &SokobanConfig, json: &str) -> Result<Sokoban, Error> {
        let bad = |reason: String| Error::Instance { env: "sokoban", reason };
        let instance: Instance = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let n = instance.room.len();
        if n < 3 || instance.room.iter().any(|r| r.chars().count() != n) {
            return Err(bad(format!("the room must be square, got {n} rows")));
        }
        let (mut walls, mut goals, mut boxes, mut players) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (r, row) in instance.room.iter().enumerate() {
            for (c, symbol) in row.chars().enumerate() {
                walls.push(symbol == '#');
                if matches!(symbol, '.' | '*' | '+') {
                    goals.push((r, c));
                }
                if matches!(symbol, '$' | '*') {
                    boxes.push((r, c));
                }
                if matches!(symbol, '@' | '+') {
                    players.push((r, c));
                }
                if !"# .$*@+".contains(symbol) {
                    return Err(bad(format!("unknown symbol {symbol:?}")));
                }
            }
        }
        if players.len() != 1 || boxes.is_empty() || boxes.len() != goals.len() {
            return Err(bad("a room needs one player and as many goals as boxes (at least one)".into()));
        }
        Ok(Sokoban::new(Arc::new(Layout { size: n, walls, goals }), players[0], boxes, config.max_moves))
    }

    pub fn instance(&self) -> Instance {
        Instance { room: self.rows() }
    }

    fn rows(&self) -> Vec<String> {
        let n = self.layout.size;
        (0..n)
            .map(|r| {
                (0..n)
                    .map(|c| {
                        let cell = (r, c);
                        let goal = self.layout.goals.contains(&cell);
                        if self.layout.wall(cell) {
                            '#'
                        } else if self.boxes.contains(&cell) {
                            if goal { '*' } else { '$' }
                        } else if self.player == cell {
                            if goal { '+' } else { '@' }
                        } else if goal {
                            '.'
                        } else {
                            ' '
                        }
                    })
                    .collect()
            })
            .collect()
    }

    pub fn boxes_on_goals(&self) -> usize {
        self.boxes.iter().filter(|b| self.layout.goals.contains(b)).count()
    }

    /// A box off its goal with walls on two orthogonal sides can never move again.
    pub fn deadlocked(&self) -> bool {
        let wall = |r: usize, c: usize| self.layout.wall((r, c));
        self.boxes.iter().filter(|b| !self.layout.goals.contains(b)).any(|&(r, c)| {
            let vertical = wall(r - 1, c) || wall(r + 1, c);
            let horizontal = wall(r, c - 1) || wall(r, c + 1);
            vertical && horizontal
        })
    }

    /// Python that defines the instance and helpers for the tool agent's program.
    pub fn tool_preamble(&self) -> String {
        let rows: Vec<String> = self.rows().iter().map(|r| format!("    {r:?},")).collect();
        format!("room = [\n{}\n]\n{}", rows.join("\n"), PYTHON_HELPERS)
    }
}

/// The helper every Sokoban tool program can call (documented in the tool prompt).
const PYTHON_HELPERS: &str = r#"MOVES = {'U': (-1, 0), 'D': (1, 0), 'L': (0, -1), 'R': (0, 1)}

def parse_room(room):
    """(walls, goals, boxes, player) of a room; cells are (row, column) tuples."""
    walls, goals, boxes, player = set(), set(), set(), None
    for r, row in enumerate(room):
        for c, ch in enumerate(row):
            if ch == '#': walls.add((r, c))
            if ch in '.*+': goals.add((r, c))
            if ch in '$*': boxes.add((r, c))
            if ch in '@+': player = (r, c)
    return walls, goals, boxes, player

def solve(room):
    """Shortest move string solving the room (BFS over player and boxes), or None."""
    from collections import deque
    walls, goals, boxes, player = parse_room(room)
    start = (player, frozenset(boxes))
    prev = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, bs = state
        if bs <= goals:
            path = []
            while prev[state] is not None:
                state, m = prev[state]
                path.append(m)
            return ''.join(reversed(path))
        for m, (dr, dc) in MOVES.items():
            nxt = (p[0] + dr, p[1] + dc)
            if nxt in walls:
                continue
            nb = bs
            if nxt in bs:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bs:
                    continue
                nb = (bs - {nxt}) | {beyond}
            new = (nxt, frozenset(nb))
            if new not in prev:
                prev[new] = (state, m)
                queue.append(new)
    return None
"#;

impl Env for Sokoban {
    type Action = Vec<Move>;

    fn rules(&self) -> String {
        "Sokoban: push every box ($) onto a goal (.). '#' is a wall, '@' is you, '*' a box on a goal, '+' you on a goal. \
         Moves: U (up), D (down), L (left), R (right). Walking into a box pushes it one cell if the cell behind it is free; \
         boxes cannot be pulled, and a box pushed into a corner is stuck for good. Answer with the moves, e.g. #### RRUL."
            .to_string()
    }

    fn observation(&self) -> String {
        format!("{}\nBoxes on goals: {}/{}", self.rows().join("\n"), self.boxes_on_goals(), self.boxes.len())
    }

    fn parse(&self, text: &str) -> Result<Vec<Move>, String> {
        parse_moves(text)
    }

    fn step(&mut self, action: &Vec<Move>, _sandbox: &Sandbox) -> Step {
        let (mut reward, mut executed, mut invalid) = (0.0, 0, 0);
        for m in action {
            if self.done {
                break;
            }
            executed += 1;
            self.moves_taken += 1;
            match try_move(&self.layout, self.player, &self.boxes, m) {
                None => {
                    reward -= 0.05;
                    invalid += 1;
                }
                Some((player, push)) => {
                    reward -= 0.01;
                    self.player = player;
                    if let Some((i, to)) = push {
                        let (was, now) = (self.layout.goals.contains(&self.boxes[i]), self.layout.goals.contains(&to));
                        self.boxes[i] = to;
                        if now && !was {
                            reward += 1.0;
                        } else if was && !now {
                            reward -= 0.5;
                        }
                    }
                }
            }
            if self.boxes_on_goals() == self.boxes.len() {
                reward += 10.0;
                self.done = true;
                self.success = true;
            } else if self.moves_taken >= self.max_moves {
                self.done = true;
            }
        }
        let mut feedback = format!(
            "Executed {executed} of {} moves ({invalid} invalid); boxes on goals {}/{}",
            action.len(),
            self.boxes_on_goals(),
            self.boxes.len()
        );
        if self.success {
            feedback.push_str("; solved");
        } else if self.deadlocked() {
            feedback.push_str("; a box is stuck in a corner");
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
        solve_state(&self.layout, self.player, &self.boxes, SOLVER_STATES)
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

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    //  ######
    //  #@$ .#     box at (1,2), goal at (1,4)
    //  #    #
    //  #    #
    //  #    #
    //  ######
    fn room(rows: &[&str]) -> Sokoban {
        let json = serde_json::json!({ "room": rows }).to_string();
        Sokoban::from_instance(&SokobanConfig::default(), &json).unwrap()
    }

    fn small() -> Sokoban {
        room(&["######", "#@$ .#", "#    #", "#    #", "#    #", "######"])
    }

    #[test]
    fn pushes_earn_the_hand_computed_rewards() {
        let sb = sandbox();
        let mut env = small();
        // U into the wall −0.05; R pushes the box to (1,3) −0.01; R pushes it onto the goal −0.01 + 1 + 10.
        let step = env.step(&vec![Move::Up, Move::Right, Move::Right, Move::Left], &sb);
        assert!(close(step.reward, -0.05 - 0.01 + 10.99), "{}", step.reward);
        assert!(step.done && step.success);
        assert_eq!(step.feedback, "Executed 3 of 4 moves (1 invalid); boxes on goals 1/1; solved.");
    }

    #[test]
    fn pushing_off_a_goal_costs_and_corners_are_deadlocks() {
        let sb = sandbox();
        // The box starts on its goal: one push takes it off.
        let mut env = room(&["######", "#@*  #", "#    #", "#    #", "#    #", "######"]);
        let step = env.step(&vec![Move::Right], &sb);
        assert!(close(step.reward, -0.51), "{}", step.reward);
        assert!(!env.deadlocked());
        // Pushing it to (1,4), against the corner of the room.
        let step = env.step(&vec![Move::Right], &sb);
        assert!(env.deadlocked());
        assert!(step.feedback.ends_with("a box is stuck in a corner."), "{}", step.feedback);
        assert_eq!(env.solve(), None);
        // A box pushed into another box or a wall does not move.
        let mut blocked = small();
        blocked.step(&vec![Move::Right, Move::Right], &sb);
        assert!(blocked.success());
    }

    #[test]
    fn the_observation_draws_the_room() {
        assert_eq!(small().observation(), "######\n#@$ .#\n#    #\n#    #\n#    #\n######\nBoxes on goals: 0/1");
    }

    #[test]
    fn generation_is_deterministic_and_the_solver_solves_every_instance() {
        let sb = sandbox();
        let config = SokobanConfig::default();
        for i in 0..500 {
            let seed = stream(&[11, i]);
            let env = Sokoban::generate(&config, seed);
            assert_eq!(env.instance(), Sokoban::generate(&config, seed).instance());
            assert_eq!(env.boxes_on_goals(), 0);
            let mut play = env.clone();
            assert!(play.step(&env.solve().unwrap(), &sb).success, "seed {seed}");
        }
        let two = Sokoban::generate(&SokobanConfig { boxes: 2, ..config }, 1);
        assert_eq!(two.boxes.len(), 2);
    }

    #[test]
    fn clones_are_independent() {
        let sb = sandbox();
        let env = small();
        let mut a = env.clone();
        a.step(&vec![Move::Right], &sb);
        assert_eq!((a.player, env.player), ((1, 2), (1, 1)));
        assert_eq!(env.boxes, [(1, 2)]);
    }

    #[test]
    fn the_python_solver_finds_paths_of_the_same_length() {
        let sb = sandbox();
        let envs: Vec<Sokoban> =
            (0..20).map(|i| Sokoban::generate(&SokobanConfig::default(), stream(&[13, i]))).collect();
        let mut program = Program::new(String::new());
        let mut expected = String::new();
        for (i, env) in envs.iter().enumerate() {
            program.files.push((format!("task{i}.py"), env.tool_preamble()));
            program.code.push_str(&format!("import task{i} as t\nprint(len(t.solve(t.room)))\n"));
            expected.push_str(&format!("{}\n", env.solve().unwrap().len()));
        }
        let out = sb.run(&program).unwrap();
        assert!(out.ok(), "{}", out.stderr);
        assert_eq!(out.stdout, expected);
    }
}
