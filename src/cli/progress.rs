//! Progress on stderr: a bar on a terminal, a plain line every few seconds otherwise
//! (logs of batch jobs stay readable).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use petting::progress::Progress;

/// How often a line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(15);

/// Set by `--quiet`.
static HIDDEN: AtomicBool = AtomicBool::new(false);

/// No progress for the rest of the process (`--quiet`).
pub fn hide() {
    HIDDEN.store(true, Ordering::Relaxed);
}

/// The reporter for this process's stderr.
pub fn for_stderr() -> Box<dyn Progress> {
    if HIDDEN.load(Ordering::Relaxed) {
        Box::new(petting::progress::Quiet)
    } else if std::io::stderr().is_terminal() {
        Box::new(Bar::default())
    } else {
        Box::new(Lines::default())
    }
}

/// The bar's resolution: positions per unit, so that parts of a unit move it.
const PARTS_PER_UNIT: f64 = 1000.0;

/// How often the bar is redrawn at most (tokens may come by the thousand a second).
const DRAW_EVERY: Duration = Duration::from_millis(100);

/// The part of a phase done before its ETA is shown: the first moments' rate (a prefill
/// before any token) says little about the rest.
const ETA_AFTER: f64 = 0.02;

/// Counts of the phase under way.
struct Phase {
    label: String,
    unit: &'static str,
    total: u64,
    done: f64,
    tokens: u64,
    started: Instant,
}

impl Phase {
    fn new(label: &str, total: u64, unit: &'static str) -> Phase {
        Phase { label: label.to_string(), unit, total, done: 0.0, tokens: 0, started: Instant::now() }
    }

    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    /// Seconds left at the rate so far; None before [`ETA_AFTER`] of the work is done.
    fn eta_seconds(&self) -> Option<f64> {
        (self.done > 0.0 && self.done >= ETA_AFTER * self.total as f64).then(|| {
            let per_unit = self.started.elapsed().as_secs_f64() / self.done;
            per_unit * (self.total as f64 - self.done).max(0.0)
        })
    }

    /// "12/200 episodes, 350 tok/s, eta 80 s": whole units done, as a count reads, and the
    /// time left at the phase's average rate (steadier than a recent window's).
    fn summary(&self) -> String {
        let done = (self.done + 1e-6).floor().min(self.total as f64);
        let eta = self.eta_seconds().map_or(String::new(), |s| format!(", eta {s:.0} s"));
        format!("{done}/{} {}, {:.0} tok/s{eta}", self.total, self.unit, self.tokens_per_second())
    }
}

#[derive(Default)]
struct Bar {
    /// The bar, its phase, and when it was last drawn.
    state: Mutex<Option<(ProgressBar, Phase, Instant)>>,
}

impl Progress for Bar {
    fn start(&self, label: &str, total: u64, unit: &'static str) {
        let style = ProgressStyle::with_template("{prefix:>14} [{bar:30}] {msg}")
            .expect("a valid template")
            .progress_chars("=> ");
        let phase = Phase::new(label, total, unit);
        let bar = ProgressBar::new((total as f64 * PARTS_PER_UNIT) as u64)
            .with_style(style)
            .with_prefix(label.to_string())
            .with_message(phase.summary());
        *self.state.lock().expect("progress") = Some((bar, phase, Instant::now()));
    }

    fn advance(&self, units: f64, tokens: u64) {
        if let Some((bar, phase, drawn)) = self.state.lock().expect("progress").as_mut() {
            phase.done += units;
            phase.tokens += tokens;
            if drawn.elapsed() >= DRAW_EVERY {
                *drawn = Instant::now();
                bar.set_message(phase.summary());
                bar.set_position((phase.done * PARTS_PER_UNIT).round() as u64);
            }
        }
    }

    fn finish(&self) {
        if let Some((bar, _, _)) = self.state.lock().expect("progress").take() {
            bar.finish_and_clear();
        }
    }
}

#[derive(Default)]
struct Lines {
    state: Mutex<Option<(Phase, Instant)>>,
}

impl Progress for Lines {
    fn start(&self, label: &str, total: u64, unit: &'static str) {
        *self.state.lock().expect("progress") = Some((Phase::new(label, total, unit), Instant::now()));
    }

    fn advance(&self, units: f64, tokens: u64) {
        let mut state = self.state.lock().expect("progress");
        let Some((phase, last_line)) = state.as_mut() else { return };
        phase.done += units;
        phase.tokens += tokens;
        if last_line.elapsed() >= LINE_EVERY {
            *last_line = Instant::now();
            eprintln!("  {}: {}", phase.label, phase.summary());
        }
    }

    fn finish(&self) {
        self.state.lock().expect("progress").take();
    }
}
