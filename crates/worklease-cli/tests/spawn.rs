//! How `run` and `pool` start their children (`supervise/exec.rs`): the
//! cases a breaker review found, each against the real binary over a
//! SQLite file in a temporary directory.

mod common;
use common::World;

use std::os::unix::fs::PermissionsExt;

fn script(world: &World, name: &str, text: &str) -> String {
    let path = world.path(name);
    std::fs::write(&path, text).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.to_str().expect("a UTF-8 path").to_string()
}

/// A script whose `#!` interpreter does not exist passes the PATH check
/// but cannot be executed: `pool` ends with 127 (it does not retry it
/// forever), as it does for a missing command; `run` exits 127 too.
#[test]
fn an_exec_that_fails_after_the_path_check_ends_the_pool() {
    let world = World::new();
    let bad = script(&world, "bad.sh", "#!/nonexistent/interpreter\necho never\n");
    let out = world
        .cmd(&[
            "pool",
            "--ttl",
            "3s",
            "--backoff",
            "100ms",
            "--pool-name",
            "p",
            "--work-ids",
            "a,b",
            "--",
            &bad,
        ])
        .output()
        .expect("run worklease pool");
    assert_eq!(out.status.code(), Some(127), "pool: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot run"), "the reason is said: {err}");
    assert!(
        !err.contains("tries it again"),
        "no retry of a command that cannot run: {err}"
    );

    let out = world
        .cmd(&["run", "j", "--", &bad])
        .output()
        .expect("run worklease run");
    assert_eq!(out.status.code(), Some(127), "run: {out:?}");
}

/// The command starts with no signal blocked (the supervisor blocks the
/// job-control signals around a spawn; the child must not inherit that).
#[test]
fn the_command_starts_with_no_signal_blocked() {
    let world = World::new();
    let out = world
        .cmd(&["run", "mask", "--", "grep", "^SigBlk:", "/proc/self/status"])
        .output()
        .expect("run worklease run");
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout);
    let mask = line.trim().trim_start_matches("SigBlk:").trim();
    assert!(
        mask.chars().all(|c| c == '0'),
        "the child's blocked signals: {line}"
    );
}

/// With `PATH` unset a bare command name is looked up in `/bin:/usr/bin`,
/// as `execvp` does; a non-executable file of that name in `PATH` is 126
/// (permission denied), not 127.
#[test]
fn path_lookup_is_execvps() {
    let world = World::new();
    let out = world
        .cmd(&["run", "nopath", "--", "sh", "-c", "echo ran"])
        .env_remove("PATH")
        .output()
        .expect("run worklease run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran");

    let dir = world.path("bin");
    std::fs::create_dir(&dir).expect("mkdir bin");
    std::fs::write(dir.join("notexec"), "echo hi\n").expect("write");
    let path = format!("{}:/usr/bin:/bin", dir.display());
    let out = world
        .cmd(&["run", "denied", "--", "notexec"])
        .env("PATH", path)
        .output()
        .expect("run worklease run");
    assert_eq!(out.status.code(), Some(126), "{out:?}");
}
