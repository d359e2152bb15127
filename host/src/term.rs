//! What the binary writes to the terminal: data and result lines on stdout (a closed pipe ends the
//! output quietly, never a panic), logs on stderr at WARN by default, and one progress line on
//! long phases when stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter::LevelFilter, EnvFilter};

/// Set once stdout is closed (e.g. `| head -1`): further output is dropped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Write one line to stdout. A closed pipe is the end of the output, not an error: the command
/// goes on (its files are written already) and exits with its usual code.
pub fn line(s: &str) {
    write_stdout(format_args!("{s}\n"));
}

/// Write text to stdout as it is (no newline added).
pub fn text(s: &str) {
    write_stdout(format_args!("{s}"));
}

fn write_stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    clear_progress();
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Write one line to stderr (a closed stderr is ignored too).
pub fn err_line(s: &str) {
    clear_progress();
    let _ = writeln!(std::io::stderr().lock(), "{s}");
}

/// The progress line currently shown (its length), if any.
static PROGRESS: Mutex<usize> = Mutex::new(0);

fn clear_progress() {
    let mut shown = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    if *shown > 0 {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        *shown = 0;
    }
}

/// Clear the progress line before the process ends.
pub fn finish() {
    clear_progress();
}

/// A layer that shows the latest INFO event as one overwritten line on a terminal.
struct Progress;

struct MessageOf(String);

impl Visit for MessageOf {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Progress {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut m = MessageOf(String::new());
        event.record(&mut m);
        if m.0.is_empty() {
            return;
        }
        let mut shown = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
        let msg: String = m.0.chars().take(100).collect();
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K… {msg}");
        *shown = msg.len() + 2;
    }
}

/// stderr for a log line, with the progress line cleared first.
fn stderr_after_progress() -> std::io::Stderr {
    clear_progress();
    std::io::stderr()
}

/// Install logging: `RUST_LOG` if set, else WARN (`-v` INFO, `-vv` DEBUG, `-vvv` TRACE). With
/// the default level and a terminal on stderr, INFO events drive the progress line instead.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let filter = if from_env {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"))
    } else {
        EnvFilter::new(level.to_string())
    };
    let tty = std::io::stderr().is_terminal();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(stderr_after_progress)
        .with_target(false)
        .with_ansi(tty)
        .with_filter(filter);
    let progress = (tty && !from_env && verbose == 0).then_some(Progress.with_filter(LevelFilter::INFO));
    tracing_subscriber::registry().with(fmt).with(progress).init();
}
