//! End-to-end test of `worklease demo`: the real binary, on a small
//! directory of text files the test creates.
//!
//! The demo synchronises on its children's output itself (the SIGKILL
//! follows a checkpoint line); the test only bounds how long it may take.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_worklease");

/// Far more than the demo needs (about TTL + 1s): only a hung demo hits it.
const LIMIT: Duration = Duration::from_secs(60);

/// 30 text files (some in subdirectories), plus files the demo must skip:
/// binary, not UTF-8, and under target/ and .git/.
fn make_input(dir: &Path) {
    for i in 0..30 {
        let sub = match i % 3 {
            0 => dir.to_path_buf(),
            1 => dir.join("notes"),
            _ => dir.join("notes/deep"),
        };
        std::fs::create_dir_all(&sub).expect("mkdir");
        let text: String = (0..=i)
            .map(|line| format!("file {i} line {line}: the quick brown fox\n"))
            .collect();
        std::fs::write(sub.join(format!("file-{i:02}.txt")), text).expect("write");
    }
    std::fs::write(dir.join("image.bin"), [0u8, 1, 2, 255]).expect("write");
    std::fs::write(dir.join("latin1.txt"), b"caf\xe9\n").expect("write");
    for skipped in ["target", ".git"] {
        std::fs::create_dir_all(dir.join(skipped)).expect("mkdir");
        std::fs::write(dir.join(skipped).join("skip.txt"), "not counted\n").expect("write");
    }
}

/// `worklease ARGS` with `WORKLEASE_HOME` pointing at `home`, no
/// WORKLEASE_STORE, and its output piped.
fn demo_command(args: &[&str], home: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("WORKLEASE_STORE")
        .env_remove("WORKLEASE_TOKEN")
        .env_remove("RUST_LOG")
        .env("WORKLEASE_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `worklease ARGS` ([`demo_command`]) to its end (bounded by
/// [`LIMIT`]).
fn run_demo(args: &[&str], home: &Path) -> Output {
    let child = demo_command(args, home)
        .spawn()
        .expect("spawn worklease demo");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(out) => out.expect("wait for worklease demo"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("worklease demo did not end within {LIMIT:?}");
        }
    }
}

/// One test's directory: the demo's input ([`make_input`]) and its
/// `WORKLEASE_HOME`.
struct Demo {
    tmp: tempfile::TempDir,
    input: PathBuf,
}

impl Demo {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let input = tmp.path().join("input");
        make_input(&input);
        Demo { tmp, input }
    }

    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    /// `worklease demo ARGS INPUT` to its end ([`run_demo`]).
    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["demo"];
        all.extend_from_slice(args);
        all.push(self.input.to_str().expect("UTF-8 path"));
        run_demo(&all, &self.home())
    }
}

/// The demo's stdout, once its exit code was `expected`.
fn stdout_of(out: &Output, expected: i32) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(expected), "{stdout}");
    stdout
}
/// The numbers after each `fencing token ` in `line`, in order.
fn fencing_tokens(line: &str) -> Vec<u64> {
    line.split("fencing token ")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("a fencing token")
        })
        .collect()
}

/// `(K, N)` of `from the checkpoint at file K of N` in `line`.
fn resumed_at(line: &str) -> (u64, u64) {
    let rest = line
        .split_once("from the checkpoint at file ")
        .expect("a checkpoint position")
        .1;
    let (k, rest) = rest.split_once(" of ").expect("K of N");
    let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (k.parse().expect("K"), n.parse().expect("N"))
}

#[test]
fn the_demo_kills_a_worker_and_every_shard_is_processed_exactly_once() {
    let demo = Demo::new();
    let started = Instant::now();
    let out = demo.run(&["--workers", "3", "--shards", "4", "--ttl", "1s"]);
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}\n(took {took:?})");
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        stdout
            .lines()
            .any(|l| l == "OK: every shard processed exactly once to completion"),
        "{all}"
    );
    assert!(
        stdout.contains("30 text files") && stdout.contains("; 2 files skipped"),
        "{all}"
    );
    for shard in 0..4 {
        assert!(stdout.contains(&format!("demo/shard-{shard} ")), "{all}");
    }
    assert!(stdout.contains("SIGKILL to worker-"), "{all}");

    // A shard resumed from the middle after an unclean hand-off, with a
    // larger fencing token than the killed holder's.
    let resumed = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("resumed: "))
        .unwrap_or_else(|| panic!("no resumed shard reported\n{all}"));
    assert!(
        resumed.contains("clean hand-off: no") && resumed.contains("expired after its SIGKILL"),
        "{resumed}\n{all}"
    );
    let tokens = fencing_tokens(resumed);
    assert_eq!(tokens.len(), 2, "{resumed}");
    assert!(tokens[0] > tokens[1], "{resumed}");
    let (k, n) = resumed_at(resumed);
    assert!(0 < k && k < n, "not resumed mid-shard: {resumed}");

    // The demo used its own store, not the default one.
    assert!(!demo.home().join("leases.db").exists(), "{all}");
}

#[test]
fn without_the_kill_every_hand_off_is_clean() {
    let demo = Demo::new();
    let out = demo.run(&["--no-kill", "--workers", "2", "--shards", "3"]);
    let stdout = stdout_of(&out, 0);
    assert!(
        stdout.contains("OK: every shard processed exactly once to completion"),
        "{stdout}"
    );
    assert!(!stdout.contains("SIGKILL to"), "{stdout}");
    assert!(
        stdout.contains("No shard was resumed after an unclean hand-off."),
        "{stdout}"
    );
}

/// A tree that changes while the demo runs fails its check (the workers
/// read other contents than the pass made before they started): the
/// report says so, so that the failure is not taken for the leases'.
#[test]
fn a_tree_changing_during_the_run_is_named_as_the_cause() {
    let demo = Demo::new();
    let growing = demo.input.join("file-00.txt");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&growing)
                .expect("open");
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                f.write_all(b"one more line\n").expect("append");
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let out = demo.run(&["--no-kill", "--workers", "1", "--shards", "1"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().expect("writer");
    let stdout = stdout_of(&out, 1);
    assert!(stdout.contains("FAILED"), "{stdout}");
    assert!(
        stdout.contains("1 file(s) under") && stdout.contains("changed while the demo ran"),
        "{stdout}"
    );
}

#[test]
fn demo_usage_errors_exit_64() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let home = tmp.path().join("home");
    let cases: &[&[&str]] = &[
        &["demo", "--store", "memory:", "."],
        &["demo", "--workers", "0", "."],
        &["demo", "--ttl", "0", "."],
        &["demo", "--ttl", "2ms", "."],
        &["demo", empty.to_str().expect("UTF-8 path")],
        &["demo", "/no/such/dir"],
    ];
    for args in cases {
        let out = run_demo(args, &home);
        assert_eq!(
            out.status.code(),
            Some(64),
            "worklease {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn one_worker_and_one_shard_read_in_the_singular() {
    let demo = Demo::new();
    let out = demo.run(&["--workers", "1", "--shards", "1", "--no-kill"]);
    let stdout = stdout_of(&out, 0);
    assert!(stdout.contains("  1 worker, worker-1; it runs"), "{stdout}");
    assert!(
        stdout.contains("  1 shard of 30 files: work ID demo/shard-0\n"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("1 workers") && !stdout.contains(".. worker-1"),
        "{stdout}"
    );
}

#[test]
fn an_interrupted_demo_stops_its_workers_and_removes_its_scratch_directory() {
    use std::io::{BufRead, BufReader};
    let demo = Demo::new();
    let scratch_parent = demo.tmp.path().join("tmp");
    std::fs::create_dir(&scratch_parent).expect("mkdir");
    let input = demo.input.to_str().expect("UTF-8 path");
    let args = [
        "demo",
        "--no-kill",
        "--workers",
        "2",
        "--shards",
        "2",
        "--pace",
        "500ms",
        input,
    ];
    let mut child = demo_command(&args, &demo.home())
        .env("TMPDIR", &scratch_parent)
        .spawn()
        .expect("spawn worklease demo");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // A worker's child has started a shard: the timeline has begun.
    let end = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no timeline line; saw {seen:#?}"));
        let started = line.starts_with('[');
        seen.push(line);
        if started {
            break;
        }
    }
    assert_eq!(
        std::fs::read_dir(&scratch_parent).expect("ls").count(),
        1,
        "the scratch directory is where TMPDIR says"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match done.recv_timeout(LIMIT) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("the interrupted demo did not end within {LIMIT:?}");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}\n{seen:#?}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&scratch_parent)
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
