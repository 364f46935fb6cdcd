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

/// The longest quoted value (a work ID, a holder ID) a line shows whole;
/// a longer one is shown by its first [`SHOWN_BYTES`] bytes and its length.
const LONGEST_QUOTED: usize = 96;

/// How much of a longer quoted value is shown.
const SHOWN_BYTES: usize = 48;

/// `message` with each double-quoted value (as `{:?}` writes work IDs and
/// holder IDs) longer than [`LONGEST_QUOTED`] bytes shortened to its first
/// bytes, an ellipsis and its length: a 2,000-byte work ID is not echoed
/// back whole (issue 37).
pub fn shorten_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(1024));
    let mut rest = message;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        // The closing quote: the first one not escaped by a backslash.
        let mut escaped = false;
        let close = after.char_indices().find_map(|(i, c)| match c {
            '\\' if !escaped => {
                escaped = true;
                None
            }
            '"' if !escaped => Some(i),
            _ => {
                escaped = false;
                None
            }
        });
        let Some(close) = close else {
            rest = after;
            continue;
        };
        let inner = &after[..close];
        if inner.len() > LONGEST_QUOTED {
            let mut end = SHOWN_BYTES;
            while !inner.is_char_boundary(end) {
                end -= 1;
            }
            out.push_str(&inner[..end]);
            out.push_str(&format!("…\" ({} bytes)", inner.len()));
        } else {
            out.push_str(inner);
            out.push('"');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

fn write(level: &str, message: &str) {
    let message = shorten_quoted(message);
    let message = message.as_str();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quoted_values_are_shortened_with_their_length() {
        let long = "x".repeat(2000);
        let line = shorten_quoted(&format!("lease on {long:?} is held by \"h\""));
        assert_eq!(
            line,
            format!(
                "lease on \"{}…\" ({} bytes) is held by \"h\"",
                "x".repeat(48),
                2000
            )
        );
        let short = "lease on \"a \\\"b\\\"\" is held";
        assert_eq!(shorten_quoted(short), short);
        assert_eq!(shorten_quoted("an \"unclosed"), "an \"unclosed");
        // Multi-byte characters are cut on a boundary.
        let wide = "é".repeat(100);
        assert!(shorten_quoted(&format!("{wide:?}")).starts_with(&format!("\"{}…", "é".repeat(24))));
    }
}
