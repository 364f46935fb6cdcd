//! Helpers shared by the benchmarks (each includes this with `mod common;`).

use std::time::Duration;

/// The measurement time per figure: `--seconds N` on the command line
/// (`cargo bench ... -- --seconds 5`), 2 s by default.
pub fn seconds() -> Duration {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}
