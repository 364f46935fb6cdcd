//! worklease's own lines on stderr (`worklease: ...`): the reason for an
//! exit status of its own, and what a supervisor must know (a lost lease,
//! a signal that ended a wait).
//!
//! One rule for all of them: in text they start with `worklease:` (the
//! exit-status table tells a child's status from worklease's own by it);
//! with `--log-format json` they are JSON objects like the logs' own
//! (`timestamp`, `level`, `fields.message`, `target` `"worklease"`), so
//! that every line of the stream is JSON (issue 37). A stderr that is
//! closed or full is ignored: nothing here panics or changes the exit
//! status.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Lines as JSON (`--log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

/// `-q` was given.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Says the lines of this process as JSON from now on.
pub fn json() {
    JSON.store(true, Ordering::Relaxed);
}

/// Notes that `-q` was given: the lines that only inform (a lease held
/// by another host, a job that finished already) are left out; the
/// reasons for worklease's own failures are still said.
pub fn quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Whether `-q` was given.
pub fn is_quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Writes `message` (one line, without its newline) as a warning.
pub fn line(message: &str) {
    write("WARN", message);
}

/// Writes `message` as the reason the command failed.
pub fn failure(message: &str) {
    write("ERROR", message);
}

fn write(level: &str, message: &str) {
    let text = if JSON.load(Ordering::Relaxed) {
        let object = serde_json::json!({
            "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            "level": level,
            "fields": { "message": format!("worklease: {message}") },
            "target": "worklease",
        });
        format!("{object}\n")
    } else {
        format!("worklease: {message}\n")
    };
    // One write per line, so lines of several processes do not mix; a
    // closed stderr (`2>&-`, a reader gone) is ignored.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `worklease: ...` on stderr: [`line`] with `format!`'s arguments.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(&format!($($arg)*))
    };
}
pub(crate) use say;
