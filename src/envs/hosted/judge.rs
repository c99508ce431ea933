//! [`Judge`]: an outside scorer's scores of one task's answers (a reasoning-gym dataset's
//! own `score_answer`, a Python reward function), through the environment host. Play asks
//! for every answer of a step in one request before the step reads them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::HostSession;

#[derive(Debug)]
pub struct Judge {
    pub session: Arc<HostSession>,
    /// The task row the scorer is given.
    pub row: serde_json::Value,
    scores: Mutex<HashMap<String, f64>>,
}

impl Judge {
    pub fn new(session: Arc<HostSession>, row: serde_json::Value) -> Judge {
        Judge { session, row, scores: Mutex::default() }
    }

    pub fn has(&self, answer: &str) -> bool {
        self.scores.lock().expect("scores").contains_key(answer)
    }

    pub fn set(&self, answer: String, score: f64) {
        self.scores.lock().expect("scores").insert(answer, score);
    }

    /// The score of `answer`; 1 is right.
    pub fn score(&self, answer: &str) -> f64 {
        *self.scores.lock().expect("scores").get(answer).expect("every answer is scored before its step reads it")
    }
}
