//! BENCHMARKS.md is what `worklease-bench report` writes from the committed
//! run (docs/benchmarks/run.json): its header says "do not edit by hand",
//! and this holds the report to it.
//!
//! (This test also makes `cargo test --workspace --all-features` build the
//! `worklease-bench` program with the tests' features, so that CI's smoke
//! run starts that binary instead of building every dependency again.)

use std::path::Path;
use std::process::Command;

#[test]
fn committed_report_is_what_report_writes_from_the_committed_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().expect("a temporary directory");
    // The repository's layout, so that the report's links come out alike.
    let out = dir.path().join("docs/benchmarks");
    std::fs::create_dir_all(&out).expect("docs/benchmarks");
    std::fs::copy(root.join("docs/benchmarks/run.json"), out.join("run.json"))
        .expect("docs/benchmarks/run.json");
    let markdown = dir.path().join("BENCHMARKS.md");
    let status = Command::new(env!("CARGO_BIN_EXE_worklease-bench"))
        .arg("report")
        .arg(out.join("run.json"))
        .arg("--markdown")
        .arg(&markdown)
        .status()
        .expect("worklease-bench runs");
    assert!(status.success(), "worklease-bench report: {status}");
    let written = std::fs::read_to_string(&markdown).expect("the written report");
    let committed = std::fs::read_to_string(root.join("BENCHMARKS.md")).expect("BENCHMARKS.md");
    if let Some((n, (w, c))) = written
        .lines()
        .zip(committed.lines())
        .enumerate()
        .find(|(_, (w, c))| w != c)
    {
        panic!(
            "BENCHMARKS.md line {} differs from what `worklease-bench report docs/benchmarks/run.json` writes:\n  committed: {c}\n  written:   {w}",
            n + 1
        );
    }
    assert_eq!(
        written.lines().count(),
        committed.lines().count(),
        "BENCHMARKS.md and the written report differ in length"
    );
}
