//! End-to-end tests of `worklease checkpoint`: data handed from one
//! holder to the next, whether the hand-off was clean, and a stale
//! token's refusal.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{assert_exit, holder_script, stderr, World};

use nix::sys::signal::Signal;

/// All 256 byte values, twice.
fn binary_data() -> Vec<u8> {
    (0..512u32).map(|i| (i % 256) as u8).collect()
}

fn checkpoint_json(w: &World, file: &str) -> serde_json::Value {
    serde_json::from_str(&w.read(file)).unwrap_or_else(|e| panic!("{file}: {e}: {}", w.read(file)))
}

#[test]
fn checkpoints_round_trip_binary_data_with_a_clean_hand_off() {
    let w = World::new();
    let data = binary_data();
    std::fs::write(w.path("data.bin"), &data).expect("write data");

    let set = "\"$WL\" checkpoint set < \"$D/data.bin\"";
    let out = w.sh(&["run", "--holder", "alpha", "job"], set);
    assert_exit(&out, 0);

    let get = "\"$WL\" checkpoint get > \"$D/out.bin\" 2> \"$D/get.err\" && \"$WL\" checkpoint get --json > \"$D/get.json\"";
    let out = w.sh(&["run", "--holder", "beta", "job"], get);
    assert_exit(&out, 0);
    assert_eq!(std::fs::read(w.path("out.bin")).expect("out.bin"), data);
    let note = w.read("get.err");
    assert!(
        note.contains("clean hand-off: yes") && note.contains("\"alpha\""),
        "{note}"
    );
    let json = checkpoint_json(&w, "get.json");
    assert_eq!(json["clean_handoff"], true);
    assert_eq!(json["checkpoint_bytes"], data.len());
    assert_eq!(
        json["checkpoint_text"],
        serde_json::Value::Null,
        "not UTF-8"
    );
    assert_eq!(json["previous_holder"]["holder_id"], "alpha");
    assert_eq!(json["previous_holder"]["ended"], "released");
    assert!(json["checkpoint_base64"]
        .as_str()
        .is_some_and(|s| s.len() == 684));

    // A text checkpoint given as an argument.
    let out = w.sh(&["run", "job"], "\"$WL\" checkpoint set 'page 7'");
    assert_exit(&out, 0);
    let out = w.sh(
        &["run", "job"],
        "\"$WL\" checkpoint get --json > \"$D/text.json\"",
    );
    assert_exit(&out, 0);
    assert_eq!(
        checkpoint_json(&w, "text.json")["checkpoint_text"],
        "page 7"
    );
}

#[test]
fn after_a_sigkilled_holder_the_hand_off_is_not_clean() {
    let w = World::new();
    let script = format!("\"$WL\" checkpoint set 'page 7' && {}", holder_script("a"));
    let first = w.start_sh(
        &["run", "--ttl", "1s", "--holder", "alpha", "job"],
        &script,
        "a",
    );
    first.signal(Signal::SIGKILL);
    drop(first);

    let get = "\"$WL\" checkpoint get > \"$D/out.txt\" 2> \"$D/get.err\" && \"$WL\" checkpoint get --json > \"$D/get.json\"";
    let out = w.sh(&["run", "--wait", "--poll", "100ms", "job"], get);
    assert_exit(&out, 0);
    assert_eq!(w.read("out.txt"), "page 7");
    assert!(
        w.read("get.err").contains("clean hand-off: no"),
        "{}",
        w.read("get.err")
    );
    let json = checkpoint_json(&w, "get.json");
    assert_eq!(json["clean_handoff"], false);
    assert_eq!(json["previous_holder"]["ended"], "expired");
    assert_eq!(json["previous_holder"]["holder_id"], "alpha");
}

#[test]
fn a_checkpoint_from_a_stale_token_exits_76_and_writes_nothing() {
    let w = World::new();
    let first = "\"$WL\" checkpoint set first && printf %s \"$WORKLEASE_TOKEN\" > \"$D/token1\"";
    let out = w.sh(&["run", "job"], first);
    assert_exit(&out, 0);
    let out = w.sh(&["run", "job"], "\"$WL\" checkpoint set second");
    assert_exit(&out, 0);

    let stale = w.read("token1");
    let out = w.output(&["checkpoint", "set", "--token", &stale, "stale"]);
    assert_exit(&out, 76);
    assert!(
        stderr(&out).contains("nothing was written"),
        "{}",
        stderr(&out)
    );
    let out = w.output(&["checkpoint", "get", "--token", &stale]);
    assert_exit(&out, 76);

    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["checkpoint_bytes"], "second".len());
}

/// `checkpoint get --work-id`: an operator's read of any work ID, without
/// a token: unknown (exit 4), released, and live (left as it was).
#[test]
fn an_operator_reads_any_work_ids_checkpoint_with_get_work_id() {
    let w = World::new();
    let out = w.sh(
        &["run", "--holder", "importer", "import"],
        "echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/importer.token\" && \"$WL\" checkpoint set 'page 7'",
    );
    assert_exit(&out, 0);
    let unknown = w.output(&["checkpoint", "get", "--work-id", "never-run"]);
    assert_exit(&unknown, 4);
    assert!(
        stderr(&unknown).contains("does not know the work ID"),
        "{}",
        stderr(&unknown)
    );

    let token = w.read_token("importer.token");
    let out = w.output(&["checkpoint", "get", "--work-id", "import"]);
    assert_exit(&out, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "page 7");
    assert!(stderr(&out).contains("released"), "{}", stderr(&out));
    let out = w.output(&["checkpoint", "get", "--work-id", "import", "--json"]);
    assert_exit(&out, 0);
    let json: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).expect("JSON");
    assert_eq!(json["work_id"], "import");
    assert_eq!(json["holder_id"], "importer");
    assert_eq!(json["fencing_token"], token);
    assert_eq!(json["state"], "released");
    assert_eq!(json["checkpoint_text"], "page 7");

    // A live lease reads too, and is left as it was.
    let live = w.hold(&["run", "--ttl", "5s", "--holder", "h2", "import"], "h2");
    let out = w.output(&["checkpoint", "get", "--work-id", "import", "--json"]);
    assert_exit(&out, 0);
    let json: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).expect("JSON");
    assert_eq!(json["state"], "live");
    assert_eq!(json["holder_id"], "h2");
    assert_eq!(
        json["checkpoint_text"], "page 7",
        "S4: kept across the hand-off"
    );
    w.touch("h2.stop");
    live.exits(0);
}
