//! Helpers shared by the end-to-end test files that drive the real
//! `worklease` binary.
// Each test binary uses a part of them.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_worklease");

/// The bound of every wait for an event that should come much sooner.
pub const LONG: Duration = Duration::from_secs(20);

/// A child script that marks itself started (`$D/<name>.started`, its PID
/// in `$D/<name>.pid`, its fencing token in `$D/<name>.token`) and runs
/// until `$D/<name>.stop` exists.
pub fn holder_script(name: &str) -> String {
    format!(
        "echo $$ > \"$D/{name}.pid\"; echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/{name}.token\"; \
         touch \"$D/{name}.started\"; while [ ! -e \"$D/{name}.stop\" ]; do sleep 0.02; done"
    )
}

/// Polls `done` every 10 ms until it holds (true) or `timeout` passed
/// (false): for events no process signals.
pub fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`R`, `S`, `T`, `Z`...),
/// `None` once it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// True while `pid` is stopped (by a signal or a tracer).
pub fn stopped(pid: i32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

/// True when process group `group` has members, and none of them runs: each
/// is stopped, or waits uninterruptibly (a shell whose vfork child was
/// stopped before its exec), or is a zombie.
pub fn group_stopped(group: i32) -> bool {
    let mut states = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(group) {
            states.push(fields[0].to_string());
        }
    }
    states.iter().any(|s| s == "T")
        && states
            .iter()
            .all(|s| matches!(s.as_str(), "T" | "t" | "D" | "Z" | "X"))
}

/// True once `pid` no longer runs (gone, or a zombie nobody reaped yet).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}
