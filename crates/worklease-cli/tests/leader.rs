//! `worklease leader` and `elect --publish` (issue 19): who leads, the value
//! the leader publishes and the transitions, read without campaigning, and
//! every change with `--watch`.

mod common;
use common::{free_port, http_get, spawn, stderr, wait_for_file, Running, World};

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;

fn json_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

#[test]
fn an_election_nobody_leads_exits_3_naming_it() {
    let w = World::new();
    // The store exists (a run made it), the election was never led.
    assert!(w.output(&["run", "other", "--", "true"]).status.success());
    let out = w.output(&["leader", "sched"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"sched\" has no leader"),
        "{}",
        stderr(&out)
    );
    // --json prints the null object as well, so a pipe into jq reads one.
    let out = w.output(&["leader", "--json", "sched"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json_line(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(v["election"], "sched");
    assert!(v["holder_id"].is_null(), "{v}");
}

/// `leader --step-down` on a plain lease (no election record) makes the
/// request but says that nothing honours it there, naming `release --force`;
/// `status` lists the request's lease only with `--all`.
#[test]
fn a_step_down_request_on_a_plain_lease_says_nothing_honours_it_and_status_hides_its_lease() {
    let w = World::new();
    let _held = spawn(
        &w,
        &[
            "run",
            "plain",
            "--",
            "sh",
            "-c",
            "touch \"$D/held\"; sleep 60",
        ],
    );
    wait_for_file(&w, "held");
    let out = w.output(&["leader", "--step-down", "plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("no election record") && err.contains("release --force"),
        "{err}"
    );
    // The request's own lease is worklease's: `status` hides it unless
    // asked with --all.
    let listed = |args: &[&str]| String::from_utf8_lossy(&w.output(args).stdout).into_owned();
    let plain = listed(&["status"]);
    assert!(
        plain.contains("plain") && !plain.contains("plain/step-down"),
        "{plain}"
    );
    assert!(listed(&["status", "--all"]).contains("plain/step-down"));
}

#[test]
fn a_published_value_over_the_limit_is_a_usage_error_before_the_store_is_touched() {
    let w = World::new();
    let big = "a".repeat(4097);
    let out = w.output(&["elect", "--publish", &big, "sched", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the limit is 4096 bytes"),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains(&big),
        "the value is not echoed back: {} bytes of stderr",
        stderr(&out).len()
    );
    assert!(
        !w.path("store/leases.db").exists(),
        "nothing may be created for bad input"
    );
}

#[test]
fn a_reserved_or_too_long_election_name_is_a_usage_error_before_the_store_is_touched() {
    let w = World::new();
    let long = "e".repeat(1015);
    for (name, says) in [
        ("sched/step-down", "reserved for the step-down requests"),
        (long.as_str(), "the limit is 1014 bytes"),
    ] {
        for args in [vec!["elect", name, "--", "true"], vec!["leader", name]] {
            let out = w.output(&args);
            assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
            assert!(
                !w.path("store/leases.db").exists(),
                "nothing may be created for bad input ({args:?})"
            );
        }
    }
}

/// `elect` as `holder`, publishing `value`, standing by for 2 s after a
/// step-down, with a child that appends its fencing token to
/// `$D/<holder>.terms`, touches `$D/<holder>.started` and runs until
/// `$D/<holder>.stop` exists.
fn candidate(w: &World, holder: &str, value: &str) -> Running {
    let child = format!(
        "echo \"$WORKLEASE_FENCING_TOKEN\" >> \"$D/{holder}.terms\"; touch \"$D/{holder}.started\"; \
         while [ ! -e \"$D/{holder}.stop\" ]; do sleep 0.02; done"
    );
    let args = [
        "elect",
        "--ttl",
        "3s",
        "--poll",
        "200ms",
        "--backoff",
        "2s",
        "--holder",
        holder,
        "--publish",
        value,
        "sched",
        "--",
        "sh",
        "-c",
        &child,
    ];
    spawn(w, &args)
}

fn terms(w: &World, holder: &str) -> usize {
    std::fs::read_to_string(w.path(&format!("{holder}.terms"))).map_or(0, |t| t.lines().count())
}

#[test]
fn a_leader_asked_to_step_down_hands_over_and_stands_by() {
    let w = World::new();
    let mut a = candidate(&w, "a", "10.0.0.1:80");
    wait_for_file(&w, "a.started");
    let _b = candidate(&w, "b", "10.0.0.2:80");
    let asked = w.output(&["leader", "--step-down", "sched"]);
    assert!(asked.status.success(), "{}", stderr(&asked));
    assert!(
        String::from_utf8_lossy(&asked.stdout).contains("asked \"a\""),
        "{}",
        String::from_utf8_lossy(&asked.stdout)
    );
    wait_for_file(&w, "b.started");
    let now = w.output(&["leader", "--json", "sched"]);
    let now = json_line(String::from_utf8_lossy(&now.stdout).trim());
    assert_eq!(
        (now["holder_id"].as_str(), now["transitions"].as_u64()),
        (Some("b"), Some(1))
    );
    assert!(
        a.0.try_wait().expect("try_wait").is_none(),
        "a leader that stepped down stays up as a standby"
    );
    // b's child ends: b releases and exits 0; a campaigns again (after its
    // back-off) and leads a second term.
    std::fs::write(w.path("b.stop"), "").expect("stop b");
    assert!(
        common::poll_until(common::LONG, || terms(&w, "a") == 2),
        "a did not lead again after b let go"
    );
    std::fs::write(w.path("a.stop"), "").expect("stop a");
    let code = common::wait_exit(a);
    assert_eq!(code, 0);
}

#[test]
fn leader_shows_the_value_and_watch_follows_the_hand_over() {
    let w = World::new();
    let _a = candidate(&w, "a", "10.0.0.1:80");
    wait_for_file(&w, "a.started");
    let now = w.output(&["leader", "--json", "sched"]);
    assert!(now.status.success(), "{}", stderr(&now));
    let now = json_line(String::from_utf8_lossy(&now.stdout).trim());
    assert_eq!(now["election"], "sched");
    assert_eq!(now["holder_id"], "a");
    assert_eq!(now["value"], "10.0.0.1:80");
    assert_eq!(now["transitions"], 0);
    assert!(
        now["fencing_token"].as_u64().is_some() && now["since"].is_string(),
        "{now}"
    );

    let mut watch = Running(
        w.cmd(&["leader", "--json", "--watch", "--poll", "200ms", "sched"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn worklease leader"),
    );
    let mut lines = BufReader::new(watch.0.stdout.take().expect("piped stdout")).lines();
    let mut next = || json_line(&lines.next().expect("a line").expect("read stdout"));
    assert_eq!(next()["holder_id"], "a", "the first line is who leads now");
    let _b = candidate(&w, "b", "10.0.0.2:80");
    std::fs::write(w.path("a.stop"), "").expect("stop a");
    wait_for_file(&w, "b.started");
    // Nobody, then b before its record (no value), then b with its value:
    // the first two may be missed between reads, never reordered.
    let b = loop {
        let line = next();
        if line["holder_id"] == "b" && line["value"] == "10.0.0.2:80" {
            break line;
        }
        assert!(
            line["holder_id"].is_null() || (line["holder_id"] == "b" && line["value"].is_null()),
            "an unexpected change: {line}"
        );
    };
    assert_eq!(b["transitions"], 1, "{b}");
    assert!(
        b["fencing_token"].as_u64() > now["fencing_token"].as_u64(),
        "{b}"
    );
    std::fs::write(w.path("b.stop"), "").expect("stop b");
    loop {
        let line = next();
        if line["holder_id"].is_null() {
            break;
        }
    }
}

#[test]
fn health_endpoints_tell_the_leader_from_the_standby() {
    let w = World::new();
    let (pa, pb) = (free_port(), free_port());
    let elect = |holder: &str, port: u16| {
        let child = format!("touch \"$D/{holder}.started\"; sleep 60");
        let addr = format!("127.0.0.1:{port}");
        spawn(
            &w,
            &[
                "elect",
                "--ttl",
                "3s",
                "--holder",
                holder,
                "--health-addr",
                &addr,
                "sched",
                "--",
                "sh",
                "-c",
                &child,
            ],
        )
    };
    let _a = elect("a", pa);
    wait_for_file(&w, "a.started");
    let _b = elect("b", pb);
    assert!(
        common::poll_until(common::LONG, || http_get(pb, "/livez").is_some()),
        "the standby's endpoints did not answer"
    );
    assert_eq!(http_get(pa, "/livez").map(|r| r.0), Some(200));
    assert_eq!(
        http_get(pb, "/livez").map(|r| r.0),
        Some(200),
        "a standby is alive"
    );
    assert_eq!(http_get(pa, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(
        http_get(pb, "/readyz").map(|r| r.0),
        Some(503),
        "a standby is not ready"
    );
    let (status, body) = http_get(pb, "/leader").expect("an answer");
    assert_eq!(status, 200);
    assert_eq!(json_line(body.trim())["holder_id"], "a");
    // A second process on a busy address fails at start.
    let busy = w.output(&[
        "elect",
        "--health-addr",
        &format!("127.0.0.1:{pa}"),
        "other",
        "--",
        "true",
    ]);
    assert_eq!(busy.status.code(), Some(69), "{}", stderr(&busy));
    assert!(
        stderr(&busy).contains("cannot serve health endpoints"),
        "{}",
        stderr(&busy)
    );
}
