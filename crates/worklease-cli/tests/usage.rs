//! End-to-end tests of what `worklease` refuses and tells: usage errors
//! (64) before the store is touched, a missing store (69), `--help`, and
//! `status`.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{assert_exit, stderr, World};

use std::collections::BTreeSet;

#[test]
fn usage_errors_exit_64() {
    let w = World::new();
    let cases: &[&[&str]] = &[
        &["run", "--ttl", "0", "job", "--", "true"],
        &["run", "--ttl", "soon", "job", "--", "true"],
        &["run", "", "--", "true"],
        &["run", "--store", "bogus://x", "job", "--", "true"],
        &["run", "--store", "/tmp/leases.db", "job", "--", "true"],
        &["run", "job"],
        &["run", "job", "--", ""],
        &["elect", "job", "--", ""],
        &["run", "--poll", "0s", "job", "--", "true"],
        &["run", "--no-such-flag", "job", "--", "true"],
        &["status", "--store", "bogus://x"],
        &["release", "job"],
        &["checkpoint", "set", "data"],
        &["checkpoint", "get", "--token", "not-a-token"],
        &[],
    ];
    for args in cases {
        let out = w.output(args);
        assert_eq!(
            out.status.code(),
            Some(64),
            "worklease {args:?}: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).trim().is_empty(),
            "worklease {args:?} said nothing"
        );
    }
    // An empty program name is refused before the store is touched.
    assert!(!w.store_path().exists(), "a usage error created the store");
    let out = w.output(&["run", "job", "--", ""]);
    assert!(
        stderr(&out).contains("no command: the program name after `--` is empty"),
        "{}",
        stderr(&out)
    );
    let out = w.output(&["run", "--store", "bogus://x", "job", "--", "true"]);
    assert!(
        stderr(&out).contains("unknown store scheme"),
        "{}",
        stderr(&out)
    );

    // Credentials never show, whatever this build says of the store (not
    // built in, or a malformed URL: BAD-NAME is no valid table name).
    for url in [
        "postgres://app:hunter2@db/leases?table=BAD-NAME",
        "postgres://app:hunter2?table=BAD-NAME",
        "host=db password=hunter2 user=app",
        "redis://:hunter2@cache:6379/0?prefix_typo=x",
    ] {
        let out = w.output(&["status", "--store", url]);
        assert_eq!(out.status.code(), Some(64), "{url}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("hunter2") && stderr(&out).contains("***"),
            "{url}: {}",
            stderr(&out)
        );
    }

    for args in [&["--help"][..], &["run", "--help"], &["--version"]] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(0), "worklease {args:?}");
    }
    let help = String::from_utf8_lossy(&w.output(&["--help"]).stdout).into_owned();
    assert!(
        help.contains("75") && help.contains("76") && help.contains("64"),
        "{help}"
    );
}

#[test]
fn grace_longer_than_half_the_ttl_is_a_usage_error() {
    let w = World::new();
    for args in [
        &["run", "--ttl", "10s", "--grace", "6s", "job", "--", "true"][..],
        &["run", "--grace", "1000000000000s", "job", "--", "true"],
        &[
            "elect", "--ttl", "1s", "--grace", "600ms", "e", "--", "true",
        ],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("TTL/2"), "{args:?}: {}", stderr(&out));
    }
    assert!(!w.path("store").exists(), "a refused run created the store");
}

#[test]
fn work_ids_worklease_keeps_for_itself_are_a_usage_error_before_the_store_is_touched() {
    let w = World::new();
    for args in [
        &["run", "jobs/fair-queue", "--", "true"][..],
        &[
            "run",
            "--fair",
            "--wait",
            "jobs/fair-waiter/3",
            "--",
            "true",
        ],
        &["run", "--permits", "2", "sched/step-down", "--", "true"],
        &["pool", "--work-ids", "a,jobs/fair-queue", "--", "true"],
        &["elect", "a/permit/line", "--", "true"],
        &["elect", "a/step-down", "--", "true"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("is reserved for"),
            "{args:?}: {}",
            stderr(&out)
        );
        // Said once: not clap's "invalid value ...: invalid input: ...".
        assert_eq!(
            stderr(&out).matches("invalid").count(),
            1,
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(
        !w.path("store").exists(),
        "a refused command created the store"
    );
}

// ---------------------------------------------------------------------------
// Nothing is written for arguments that cannot work; read-only commands
// create no store.

#[test]
fn a_ttl_too_short_to_renew_exits_64_and_writes_nothing() {
    let w = World::new();
    for args in [
        &["run", "--wait", "--ttl", "1ms", "job", "--", "true"][..],
        &["run", "--wait", "--ttl", "2ms", "job", "--", "true"],
        &["run", "--ttl", "2ms", "job", "--", "true"],
        &["elect", "--ttl", "2ms", "e", "--", "true"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("at least 3ms"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!w.path("store").exists(), "a refused run created the store");
}

#[test]
fn read_only_commands_on_a_missing_store_exit_69_and_create_nothing() {
    let w = World::new();
    let token = "wl1;work=job;holder=h;fencing_token=1;expires_at_ms=0;ttl_ms=1000";
    for args in [
        &["status"][..],
        &["status", "--json", "job"],
        &["release", "--force", "job"],
        &["checkpoint", "get", "--token", token],
        &["checkpoint", "set", "--token", token, "data"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("no store at") && err.contains(&w.store_path().display().to_string()),
            "{args:?}: {err}"
        );
    }
    assert!(
        !w.path("store").exists(),
        "a read-only command created the store"
    );

    // A `~` no shell expanded.
    let out = w.output(&["status", "--store", "sqlite:~/leases.db"]);
    assert_exit(&out, 64);
    assert!(stderr(&out).contains("$HOME"), "{}", stderr(&out));
}

#[test]
fn help_is_honest_about_polling_and_exit_statuses() {
    let w = World::new();
    let help = |args: &[&str]| String::from_utf8_lossy(&w.output(args).stdout).into_owned();
    let main = help(&["--help"]);
    assert!(!main.contains("exactly one machine"), "{main}");
    assert!(
        main.contains("across") && main.contains("networked store"),
        "{main}"
    );
    for sub in ["run", "elect"] {
        let text = help(&[sub, "--help"]);
        assert!(!text.contains("at once when it releases"), "{text}");
        assert!(!text.contains("leads at once"), "{text}");
        // Woken at once where the store notifies (SQLite across processes
        // too, since issue 18), at the next poll on S3.
        assert!(
            text.contains("woken at once") && text.contains("S3"),
            "{text}"
        );
        assert!(text.contains("TTL/2") && text.contains("SIGSTOP"), "{text}");
        assert!(text.contains("`worklease:`"), "{text}");
    }
    let run = help(&["run", "--help"]);
    assert!(run.contains("/dev/null") && run.contains("Ctrl-Z"), "{run}");
    // A clap usage error says `worklease:` too.
    let out = w.output(&["run", "--no-such-flag", "job", "--", "true"]);
    assert!(stderr(&out).starts_with("worklease: "), "{}", stderr(&out));
}

#[test]
fn status_shows_live_and_released_leases() {
    let w = World::new();
    let out = w.sh(&["run", "done"], "\"$WL\" checkpoint set abc");
    assert_exit(&out, 0);
    let out = w.output(&["run", "done", "--", "true"]);
    assert_exit(&out, 0);
    let live = w.hold(&["run", "--ttl", "10s", "--holder", "alpha", "live"], "a");

    let out = w.output(&["status", "--json"]);
    assert_exit(&out, 0);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    let fields: BTreeSet<&str> = [
        "work_id",
        "holder_id",
        "fencing_token",
        "expires_at",
        "expired",
        "released",
        "checkpoint_bytes",
        "clean_handoff",
        "ended",
        "previous_holder",
        "expiry",
    ]
    .into();
    for v in &lines {
        let keys: BTreeSet<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, fields);
        humantime::parse_rfc3339(v["expires_at"].as_str().expect("string")).expect("RFC 3339");
        // SQLite judges expiry by its own clock (an s3:// store by observation).
        assert_eq!(v["expiry"], "by-store-clock");
    }
    let done = &lines[0];
    assert_eq!(done["work_id"], "done");
    assert_eq!(done["released"], true);
    assert_eq!(done["expired"], true);
    assert_eq!(done["checkpoint_bytes"], 3);
    assert_eq!(done["clean_handoff"], true);
    assert_eq!(done["ended"], "released");
    assert_eq!(done["previous_holder"]["ended"], "released");
    let held = &lines[1];
    assert_eq!(held["work_id"], "live");
    assert_eq!(held["holder_id"], "alpha");
    assert_eq!(held["fencing_token"], w.read_token("a.token"));
    assert_eq!(held["released"], false);
    assert_eq!(held["expired"], false);
    assert_eq!(held["clean_handoff"], false);
    assert_eq!(held["ended"], serde_json::Value::Null);
    assert_eq!(held["previous_holder"], serde_json::Value::Null);

    let out = w.output(&["status"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table.contains("WORK ID") && table.contains("CLEAN HAND-OFF"),
        "{table}"
    );
    assert!(
        table.contains("alpha") && table.contains("released"),
        "{table}"
    );

    let out = w.output(&["status", "--json", "live", "nope"]);
    assert_exit(&out, 4);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);

    w.touch("a.stop");
    live.exits(0);
}
