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

/// Counts of the phase under way.
struct Phase {
    label: String,
    unit: &'static str,
    total: u64,
    done: u64,
    tokens: u64,
    started: Instant,
}

impl Phase {
    fn new(label: &str, total: u64, unit: &'static str) -> Phase {
        Phase { label: label.to_string(), unit, total, done: 0, tokens: 0, started: Instant::now() }
    }

    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    /// Seconds left at the rate so far; None before the first unit is done.
    fn eta_seconds(&self) -> Option<f64> {
        (self.done > 0).then(|| {
            let per_unit = self.started.elapsed().as_secs_f64() / self.done as f64;
            per_unit * self.total.saturating_sub(self.done) as f64
        })
    }
}

#[derive(Default)]
struct Bar {
    state: Mutex<Option<(ProgressBar, Phase)>>,
}

impl Progress for Bar {
    fn start(&self, label: &str, total: u64, unit: &'static str) {
        let style = ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("a valid template")
            .progress_chars("=> ");
        let bar = ProgressBar::new(total).with_style(style).with_prefix(label.to_string()).with_message(unit);
        *self.state.lock().expect("progress") = Some((bar, Phase::new(label, total, unit)));
    }

    fn advance(&self, units: u64, tokens: u64) {
        if let Some((bar, phase)) = self.state.lock().expect("progress").as_mut() {
            phase.done += units;
            phase.tokens += tokens;
            bar.set_message(format!("{}, {:.0} tok/s", phase.unit, phase.tokens_per_second()));
            bar.inc(units);
        }
    }

    fn finish(&self) {
        if let Some((bar, _)) = self.state.lock().expect("progress").take() {
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

    fn advance(&self, units: u64, tokens: u64) {
        let mut state = self.state.lock().expect("progress");
        let Some((phase, last_line)) = state.as_mut() else { return };
        phase.done += units;
        phase.tokens += tokens;
        if last_line.elapsed() >= LINE_EVERY {
            *last_line = Instant::now();
            let eta = phase.eta_seconds().map_or(String::new(), |s| format!(", eta {s:.0} s"));
            eprintln!(
                "  {}: {}/{} {}, {:.0} tok/s{eta}",
                phase.label,
                phase.done,
                phase.total,
                phase.unit,
                phase.tokens_per_second()
            );
        }
    }

    fn finish(&self) {
        self.state.lock().expect("progress").take();
    }
}
