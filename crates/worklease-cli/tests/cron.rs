//! End-to-end: `worklease run` as cron fleets run it (issue 37): cron's
//! empty environment and the configuration files, quiet losers
//! (`--if-held`, `-q`), run once (`--once`), every stderr line JSON under
//! `--log-format json`, and a closed stderr.

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::{assert_exit, stderr, World, BIN, LONG};

/// `worklease ARGS` in cron's environment: only PATH and HOME (`home`),
/// plus `extra`.
fn cron(home: &Path, args: &[&str], extra: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run worklease")
}

#[test]
fn crons_empty_environment_warns_of_the_per_host_default_and_can_refuse_it() {
    let home = tempfile::tempdir().expect("home");
    let per_host = home.path().join(".local/share/worklease/leases.db");

    // No store anywhere: the job runs, on the per-host file, and says so.
    let out = cron(home.path(), &["run", "nightly", "--", "true"], &[]);
    assert_exit(&out, 0);
    let err = stderr(&out);
    assert!(err.contains("no store is configured"), "{err}");
    assert!(err.contains(&per_host.display().to_string()), "{err}");
    // -q leaves the warning out (errors only).
    let out = cron(home.path(), &["-q", "run", "nightly", "--", "true"], &[]);
    assert_exit(&out, 0);
    assert_eq!(stderr(&out), "");

    // --require-shared-store (or its variable) refuses it: 78, nothing run.
    std::fs::remove_file(&per_host).expect("remove the store");
    let ran = home.path().join("ran");
    let touch = [
        "run",
        "--require-shared-store",
        "nightly",
        "--",
        "touch",
        "ran",
    ];
    let out = Command::new(BIN)
        .args(touch)
        .current_dir(home.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_exit(&out, 78);
    assert!(stderr(&out).contains("per-host"), "{}", stderr(&out));
    assert!(
        !ran.exists() && !per_host.exists(),
        "ran or created the store"
    );
    let out = cron(
        home.path(),
        &["elect", "sched", "--", "true"],
        &[("WORKLEASE_REQUIRE_SHARED_STORE", "true")],
    );
    assert_exit(&out, 78);
    // Also when the per-host store is given explicitly.
    let out = cron(
        home.path(),
        &[
            "pool",
            "--require-shared-store",
            "--work-ids",
            "a",
            "--",
            "true",
        ],
        &[("WORKLEASE_STORE", "memory:")],
    );
    assert_exit(&out, 78);
}

#[test]
fn the_configuration_file_names_the_store_and_its_errors_name_the_file() {
    let home = tempfile::tempdir().expect("home");
    let config = home.path().join(".config/worklease/config.toml");
    std::fs::create_dir_all(config.parent().expect("dir")).expect("mkdir");
    let shared = home.path().join("shared/leases.db");
    std::fs::write(
        &config,
        format!(
            "# the fleet's store\nstore = \"sqlite:{}\"\n",
            shared.display()
        ),
    )
    .expect("write config");

    // The user's file ($HOME/.config) names the store: no warning.
    let out = cron(home.path(), &["run", "nightly", "--", "true"], &[]);
    assert_exit(&out, 0);
    assert_eq!(stderr(&out), "");
    assert!(shared.exists(), "the configured store was not used");
    let out = cron(home.path(), &["status", "--json", "nightly"], &[]);
    assert_exit(&out, 0);

    // WORKLEASE_STORE still overrides it.
    let other = home.path().join("other.db");
    let out = cron(
        home.path(),
        &["run", "nightly", "--", "true"],
        &[("WORKLEASE_STORE", &format!("sqlite:{}", other.display()))],
    );
    assert_exit(&out, 0);
    assert!(other.exists());

    // $XDG_CONFIG_HOME comes before $HOME/.config; WORKLEASE_CONFIG
    // replaces both and must exist.
    let xdg = home.path().join("xdg");
    std::fs::create_dir_all(xdg.join("worklease")).expect("mkdir");
    std::fs::write(
        xdg.join("worklease/config.toml"),
        "require_shared_store = true\n",
    )
    .expect("write");
    let out = cron(
        home.path(),
        &["run", "nightly", "--", "true"],
        &[("XDG_CONFIG_HOME", xdg.to_str().expect("utf-8"))],
    );
    assert_exit(&out, 78);
    assert!(
        stderr(&out).contains("xdg/worklease/config.toml"),
        "{}",
        stderr(&out)
    );
    let missing = home.path().join("missing.toml");
    let out = cron(
        home.path(),
        &["status"],
        &[("WORKLEASE_CONFIG", missing.to_str().expect("utf-8"))],
    );
    assert_exit(&out, 78);
    assert!(stderr(&out).contains("missing.toml"), "{}", stderr(&out));

    // An unknown key is an error naming the file and line, not ignored.
    std::fs::write(&config, "\nstor = \"redis://x\"\n").expect("write");
    let out = cron(home.path(), &["run", "nightly", "--", "true"], &[]);
    assert_exit(&out, 78);
    let err = stderr(&out);
    assert!(
        err.contains("config.toml, line 2") && err.contains("stor"),
        "{err}"
    );
}

#[test]
fn losers_exit_quietly_with_if_held_ok_and_q_silences_the_held_line() {
    let w = World::new();
    let holder = w.hold(&["run", "nightly"], "a");

    let out = w.sh(&["run", "--if-held=ok", "nightly"], "touch \"$D/b\"");
    assert_exit(&out, 0);
    assert_eq!(stderr(&out), "");
    assert!(!w.path("b").exists(), "a loser ran its command");

    let out = w.output(&["-q", "run", "nightly", "--", "true"]);
    assert_exit(&out, 75);
    assert_eq!(stderr(&out), "");

    let out = w.output(&["run", "--if-held", "fail", "nightly", "--", "true"]);
    assert_exit(&out, 75);
    assert!(stderr(&out).contains("is held by"), "{}", stderr(&out));

    // Under --log-format json every line is JSON, worklease's own too.
    let out = w.output(&["--log-format", "json", "run", "nightly", "--", "true"]);
    assert_exit(&out, 75);
    let err = stderr(&out);
    assert!(!err.is_empty());
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
    assert!(err.contains("is held by"), "{err}");
    // So is a usage error.
    let out = w.output(&["--log-format=json", "run", "--ttl", "0s", "x", "--", "true"]);
    assert_exit(&out, 64);
    for line in stderr(&out).lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "{line}"
        );
    }

    // A closed stderr is no panic: the status stays 75.
    let out = w
        .cmd(&["run", "nightly", "--", "true"])
        .stderr(Stdio::null())
        .output()
        .expect("run");
    assert_exit(&out, 75);
    w.touch("a.stop");
    holder.exits(0);
}

/// stderr closed (`2>&-`), not redirected: every write to it fails.
#[test]
fn a_closed_stderr_does_not_panic() {
    let w = World::new();
    let _holder = w.hold(&["run", "nightly"], "a");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"{BIN}\" -v run nightly -- true 2>&-"))
        .env("WORKLEASE_STORE", &w.store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    w.touch("a.stop");
}

#[test]
fn once_skips_a_finished_job_and_runs_after_a_failure() {
    let w = World::new();
    // A failed run records nothing: the next --once runs.
    assert_exit(&w.output(&["run", "--once", "nightly", "--", "false"]), 1);
    assert_exit(
        &w.sh(&["run", "--once", "nightly"], "touch \"$D/first\""),
        0,
    );
    assert!(w.path("first").exists());

    // Finished: skipped, with a line (none under -q), exit 0.
    let out = w.sh(&["run", "--once", "nightly"], "touch \"$D/again\"");
    assert_exit(&out, 0);
    assert!(!w.path("again").exists(), "a finished job ran again");
    assert!(
        stderr(&out).contains("finished already"),
        "{}",
        stderr(&out)
    );
    let out = w.sh(&["-q", "run", "--once", "nightly"], "touch \"$D/again\"");
    assert_exit(&out, 0);
    assert_eq!(stderr(&out), "");
    assert!(!w.path("again").exists());

    // A run without --once breaks the chain: the next --once runs.
    assert_exit(&w.output(&["run", "nightly", "--", "true"]), 0);
    assert_exit(
        &w.sh(&["run", "--once", "nightly"], "touch \"$D/third\""),
        0,
    );
    assert!(w.path("third").exists());

    // The record is worklease's own: refused as a user's work ID, hidden
    // by status.
    let out = w.output(&["run", "nightly/finished", "--", "true"]);
    assert_exit(&out, 64);
    let out = w.output(&["status", "--json"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("nightly/finished"));
}

/// Two hosts' crons (two processes, two holders) fire together with
/// --once and --if-held=ok: the job runs exactly once; a third, late,
/// skips it.
#[test]
fn once_across_two_hosts_runs_the_job_once() {
    let w = World::new();
    let script =
        "echo \"$WORKLEASE_HOLDER_ID\" >> \"$D/ran\"; while [ ! -e \"$D/go\" ]; do sleep 0.02; done";
    let a = w.spawn_sh(
        &[
            "run",
            "--holder",
            "host-a",
            "--once",
            "--if-held=ok",
            "nightly",
        ],
        script,
    );
    let b = w.spawn_sh(
        &[
            "run",
            "--holder",
            "host-b",
            "--once",
            "--if-held=ok",
            "nightly",
        ],
        script,
    );
    assert!(
        common::poll_until(LONG, || w.path("ran").exists()),
        "neither host ran the job"
    );
    w.touch("go");
    a.exits(0);
    b.exits(0);
    let late = w.output(&[
        "run", "--holder", "host-c", "--once", "nightly", "--", "sh", "-c", script,
    ]);
    assert_exit(&late, 0);
    assert_eq!(
        w.read("ran").lines().count(),
        1,
        "the job ran more than once"
    );
}

/// `status` finds date-stamped work IDs by glob or prefix, sorts them
/// naturally, and only exact names are "unknown" (exit 4).
#[test]
fn status_selects_by_glob_and_prefix_and_sorts_naturally() {
    let w = World::new();
    for id in [
        "shard-10",
        "shard-2",
        "reidx/2026-12-01",
        "reidx/2026-12-02",
    ] {
        assert_exit(&w.output(&["run", id, "--", "true"]), 0);
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let out = w.output(args);
        assert_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
                v["work_id"].as_str().expect("work_id").to_string()
            })
            .collect()
    };
    assert_eq!(
        ids(&["status", "--json"]),
        [
            "reidx/2026-12-01",
            "reidx/2026-12-02",
            "shard-2",
            "shard-10"
        ]
    );
    assert_eq!(
        ids(&["status", "--json", "reidx*"]),
        ["reidx/2026-12-01", "reidx/2026-12-02"]
    );
    assert_eq!(
        ids(&["status", "--json", "--prefix", "shard-"]),
        ["shard-2", "shard-10"]
    );
    assert_eq!(ids(&["status", "--json", "nothing*"]), Vec::<String>::new());
    let sorted = ids(&["status", "--json", "--sort", "token"]);
    assert_eq!(
        sorted[0], "reidx/2026-12-02",
        "highest token first: {sorted:?}"
    );
    assert_exit(&w.output(&["status", "shard-3"]), 4);
}

/// What the break test found: nothing is written over a device or through
/// a link by --metrics-file; a relative SQLite path in a configuration
/// file is refused (each command would resolve it in its own directory);
/// --once refuses at once what it could not record; a configuration file
/// that is not a regular file, or too large, is refused.
#[test]
fn metrics_file_config_and_once_refuse_what_they_cannot_do_safely() {
    let w = World::new();
    let target = w.path("victim");
    std::fs::write(&target, "keep").expect("write");
    let link = w.path("link.prom");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for bad in [
        link.to_str().expect("utf-8"),
        "/dev/null",
        w.path("no/such/dir.prom").to_str().expect("utf-8"),
    ] {
        let out = w.sh(&["run", "--metrics-file", bad, "job"], "touch \"$D/ran\"");
        assert_exit(&out, 64);
        assert!(stderr(&out).contains("--metrics-file"), "{}", stderr(&out));
    }
    assert!(
        !w.path("ran").exists(),
        "the job ran with a refused --metrics-file"
    );
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
    let null = std::fs::symlink_metadata("/dev/null").expect("/dev/null");
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &null.file_type()
    ));

    let home = tempfile::tempdir().expect("home");
    let config = home.path().join("c.toml");
    std::fs::write(&config, "store = \"sqlite:rel/leases.db\"\n").expect("write");
    let out = cron(
        home.path(),
        &["run", "j", "--", "true"],
        &[("WORKLEASE_CONFIG", config.to_str().expect("utf-8"))],
    );
    assert_exit(&out, 78);
    assert!(stderr(&out).contains("relative"), "{}", stderr(&out));
    std::fs::write(&config, format!("store = {:?}\n", "x".repeat(70_000))).expect("write");
    let out = cron(
        home.path(),
        &["status"],
        &[("WORKLEASE_CONFIG", config.to_str().expect("utf-8"))],
    );
    assert_exit(&out, 78);
    let out = cron(
        home.path(),
        &["status"],
        &[("WORKLEASE_CONFIG", "/dev/zero")],
    );
    assert_exit(&out, 78);

    let long_holder = "h".repeat(250);
    let out = w.sh(
        &["run", "--once", "--holder", &long_holder, "job"],
        "touch \"$D/ran\"",
    );
    assert_exit(&out, 64);
    let long_id = "x".repeat(1020);
    let out = w.sh(&["run", "--once", &long_id], "touch \"$D/ran\"");
    assert_exit(&out, 64);
    assert!(
        !w.path("ran").exists(),
        "--once ran a job it could not record"
    );
}
