//! End-to-end tests of `worklease gc`: what it deletes (ended leases old
//! enough, under the prefix), what it never deletes (a live lease), the
//! dry run, JSON, and that fencing tokens keep rising after a deletion.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by files the children create, polled in
//! bounded loops; no sleep stands in for an event.

mod common;
use common::{assert_exit, stderr, World};

/// A `run` whose child records its fencing token in `$D/<name>.token`
/// and, when `data` is not empty, saves it as the checkpoint.
fn run_once(w: &World, work_id: &str, name: &str, data: &str) {
    let mut script = format!("echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/{name}.token\"");
    if !data.is_empty() {
        script.push_str(&format!(" && \"$WL\" checkpoint set '{data}'"));
    }
    let out = w.sh(&["run", "--holder", name, work_id], &script);
    assert_exit(&out, 0);
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn gc_deletes_ended_leases_never_a_live_one_and_tokens_keep_rising() {
    let w = World::new();
    run_once(&w, "nightly-1", "first", "");
    let first = w.read_token("first.token");
    let live = w.hold(&["run", "--ttl", "5s", "live-job"], "live");

    let dry = w.output(&["gc", "--older-than", "0s", "--dry-run"]);
    assert_exit(&dry, 0);
    let text = stdout(&dry);
    assert!(text.contains("would delete \"nightly-1\""), "{text}");
    assert!(
        !text.contains("live-job"),
        "a live lease is never listed: {text}"
    );
    assert!(text.contains("would delete 1 ended lease(s)"), "{text}");
    assert_exit(&w.output(&["status", "nightly-1"]), 0);

    let young = w.output(&["gc", "--older-than", "30d"]);
    assert_exit(&young, 0);
    assert!(
        stdout(&young).contains("deleted 0 ended lease(s)"),
        "{}",
        stdout(&young)
    );

    let out = w.output(&["gc", "--older-than", "0s"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("deleted \"nightly-1\" (released"), "{text}");
    assert!(text.contains("deleted 1 ended lease(s)"), "{text}");
    let gone = w.output(&["status", "nightly-1"]);
    assert!(
        stderr(&gone).contains("no lease on \"nightly-1\""),
        "{}",
        stderr(&gone)
    );

    // The live holder was not touched: it still holds, and ends normally.
    let held = w.status_json("live-job");
    assert_eq!(held["expired"], false, "{held}");
    w.touch("live.stop");
    live.exits(0);

    // S2 after the deletion.
    run_once(&w, "nightly-1", "second", "");
    let second = w.read_token("second.token");
    assert!(second > first, "token {second} after gc, {first} before");
}

#[test]
fn gc_prefix_and_json() {
    let w = World::new();
    run_once(&w, "reports/a", "a", "");
    run_once(&w, "shards/b", "b", "");
    let out = w.output(&["gc", "--older-than", "0s", "--prefix", "reports/", "--json"]);
    assert_exit(&out, 0);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(json["count"], 1, "{json}");
    assert_eq!(json["dry_run"], false);
    assert_eq!(json["leases"][0]["work_id"], "reports/a");
    assert_eq!(json["leases"][0]["holder_id"], "a");
    assert_eq!(json["leases"][0]["ended"], "released");
    assert!(json["leases"][0]["fencing_token"].as_u64().is_some());
    assert_exit(&w.output(&["status", "shards/b"]), 0);
}

#[test]
fn gc_usage_and_store_failures() {
    let w = World::new();
    assert_exit(&w.output(&["gc"]), 64);
    assert_exit(&w.output(&["gc", "--older-than", "soon"]), 64);
    // gc never creates a store.
    let out = w
        .cmd(&["gc", "--older-than", "1d"])
        .env(
            "WORKLEASE_STORE",
            format!("sqlite:{}", w.path("none/leases.db").display()),
        )
        .output()
        .expect("run");
    assert_exit(&out, 69);
}
