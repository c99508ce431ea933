//! Lists of grid moves (U/D/L/R), as Plan-Path and Sokoban read them from replies and
//! from tool programs' output.
//!
//! Recognised, in this order:
//! 1. the text after the last `####` (the prompts' final-answer marker);
//! 2. otherwise the last bracketed list in the text, e.g. `['R', 'R', 'D']` or `["U"]`;
//! 3. otherwise the last non-empty line, if it consists of moves only (`RRDL`,
//!    `R R D L`, `R, R, D`, `right down`).
//!
//! Inside the answer a token may be `U`/`D`/`L`/`R`, a run of them (`RRD`), or
//! `up`/`down`/`left`/`right` in any case; anything else is kept as an invalid move,
//! which the environment penalises (and does not execute). No answer at all is a parse
//! error.

use serde::{Serialize, Serializer};

/// One move of an action list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    Up,
    Down,
    Left,
    Right,
    /// A token that is not a move, kept so it can be penalised.
    Invalid(String),
}

impl Move {
    /// (row, column) change; None for an invalid token.
    pub fn delta(&self) -> Option<(i64, i64)> {
        match self {
            Move::Up => Some((-1, 0)),
            Move::Down => Some((1, 0)),
            Move::Left => Some((0, -1)),
            Move::Right => Some((0, 1)),
            Move::Invalid(_) => None,
        }
    }

    pub fn letter(&self) -> &str {
        match self {
            Move::Up => "U",
            Move::Down => "D",
            Move::Left => "L",
            Move::Right => "R",
            Move::Invalid(token) => token,
        }
    }

    /// All four moves in the order every search uses (U, D, L, R).
    pub const ALL: [Move; 4] = [Move::Up, Move::Down, Move::Left, Move::Right];

    fn from_letter(c: char) -> Option<Move> {
        match c {
            'U' => Some(Move::Up),
            'D' => Some(Move::Down),
            'L' => Some(Move::Left),
            'R' => Some(Move::Right),
            _ => None,
        }
    }
}

impl Serialize for Move {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.letter())
    }
}

/// Moves as agents write them: `RRDL`.
pub fn format_moves(moves: &[Move]) -> String {
    moves.iter().map(Move::letter).collect()
}

/// Parses a move list (see the module doc).
pub fn parse_moves(text: &str) -> Result<Vec<Move>, String> {
    if let Some(answer) = super::after_marker(text) {
        let answer = answer.lines().next().unwrap_or("");
        return Ok(match bracketed(answer) {
            Some(list) => tokens(list),
            None => tokens(answer),
        });
    }
    if let Some(list) = last_bracketed(text) {
        return Ok(tokens(list));
    }
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    let moves = tokens(last);
    if last.trim().is_empty() {
        Err("the reply is empty; expected a move list such as #### RRDL".to_string())
    } else if moves.iter().any(|m| matches!(m, Move::Invalid(_))) {
        Err("no move list found; end the reply with a line such as #### RRDL".to_string())
    } else {
        Ok(moves)
    }
}

fn bracketed(text: &str) -> Option<&str> {
    let open = text.find('[')?;
    let close = text.rfind(']')?;
    (close > open).then(|| &text[open + 1..close])
}

fn last_bracketed(text: &str) -> Option<&str> {
    let close = text.rfind(']')?;
    let open = text[..close].rfind('[')?;
    Some(&text[open + 1..close])
}

fn tokens(text: &str) -> Vec<Move> {
    let mut moves = Vec::new();
    let pieces = text.split(|c: char| c.is_whitespace() || c == ',').filter(|p| !p.is_empty());
    for piece in pieces {
        let token = piece.trim_matches(|c: char| c == '\'' || c == '"' || c == '`' || c == '.' || c == '*');
        if token.is_empty() {
            continue;
        }
        let word = match token.to_ascii_lowercase().as_str() {
            "up" => Some(Move::Up),
            "down" => Some(Move::Down),
            "left" => Some(Move::Left),
            "right" => Some(Move::Right),
            _ => None,
        };
        if let Some(m) = word {
            moves.push(m);
        } else if token.chars().all(|c| Move::from_letter(c).is_some()) {
            moves.extend(token.chars().filter_map(Move::from_letter));
        } else {
            moves.push(Move::Invalid(token.to_string()));
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use Move::*;

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(parse_moves("#### RRDL").unwrap(), [Right, Right, Down, Left]);
        assert_eq!(parse_moves("I go\n#### R R, D\nbye").unwrap(), [Right, Right, Down]);
        assert_eq!(parse_moves("#### ['U', \"L\"]").unwrap(), [Up, Left]);
        assert_eq!(parse_moves("['R', 'D']\n").unwrap(), [Right, Down]);
        assert_eq!(parse_moves("path:\nRRDD\n").unwrap(), [Right, Right, Down, Down]);
        assert_eq!(parse_moves("**Actions List**: [\"up\", \"Right\"]").unwrap(), [Up, Right]);
        assert_eq!(parse_moves("#### []").unwrap(), []);
        assert_eq!(parse_moves("####").unwrap(), []);
    }

    #[test]
    fn unknown_tokens_inside_an_answer_are_kept_as_invalid_moves() {
        assert_eq!(parse_moves("#### R X D").unwrap(), [Right, Invalid("X".into()), Down]);
        assert_eq!(parse_moves("['R', 'north']").unwrap(), [Right, Invalid("north".into())]);
    }

    #[test]
    fn text_without_an_answer_is_a_parse_error() {
        assert!(parse_moves("").unwrap_err().contains("empty"));
        assert!(parse_moves("I think we should go right").unwrap_err().contains("no move list"));
        assert!(parse_moves("Traceback ...\nNameError: name 'x' is not defined").is_err());
    }

    #[test]
    fn moves_serialise_as_letters() {
        let json = serde_json::to_string(&[Right, Invalid("x".into())]).unwrap();
        assert_eq!(json, r#"["R","x"]"#);
        assert_eq!(format_moves(&[Up, Down, Left, Right]), "UDLR");
    }
}
