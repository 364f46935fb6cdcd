//! Helpers shared by the end-to-end test files that drive the real
//! `worklease` binary.

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
