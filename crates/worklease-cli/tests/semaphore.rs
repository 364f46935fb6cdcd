//! `worklease run --permits N` and `status --permits N` (issue 18): at
//! most N commands of one semaphore run at once across processes, each
//! child with its own permit's work ID and fencing token.

mod common;
use common::{
    holder_script, poll_until, read, spawn, stderr, wait_exit, wait_for_file, Running, World, LONG,
};

/// `worklease run --ttl 5s --permits 2 EXTRA db` of a [`permit_script`]
/// child `name`, in the background.
fn permit_holder(w: &World, extra: &[&str], name: &str) -> Running {
    let script = permit_script(name);
    let mut args = vec!["run", "--ttl", "5s", "--permits", "2"];
    args.extend_from_slice(extra);
    args.extend(["db", "--", "sh", "-c", &script]);
    spawn(w, &args)
}

/// A holder child that also records its permit's work ID in `$D/<name>.id`.
fn permit_script(name: &str) -> String {
    format!(
        "echo \"$WORKLEASE_WORK_ID\" > \"$D/{name}.id\"; {}",
        holder_script(name)
    )
}

#[test]
fn at_most_n_commands_run_and_a_waiter_takes_the_freed_permit() {
    let w = World::new();
    let (a, b) = (permit_holder(&w, &[], "a"), permit_holder(&w, &[], "b"));
    wait_for_file(&w, "a.started");
    wait_for_file(&w, "b.started");
    let mut ids = [read(&w, "a.id"), read(&w, "b.id")];
    ids.sort();
    assert_eq!(ids, ["db/permit/0", "db/permit/1"], "two distinct permits");

    let third = w.output(&["run", "--permits", "2", "db", "--", "touch", "c.ran"]);
    assert_eq!(third.status.code(), Some(75), "{}", stderr(&third));
    assert!(
        stderr(&third).contains("all 2 permits of semaphore \"db\" are held"),
        "{}",
        stderr(&third)
    );
    assert!(!w.path("c.ran").exists(), "a third command ran");

    let status = w.output(&["status", "--permits", "2", "db"]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout)
            .contains("semaphore \"db\": 2 of 2 permits held, 0 fair waiter(s) in line"),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );

    let waiter = permit_holder(&w, &["--wait", "--poll", "100ms"], "d");
    std::fs::write(w.path("a.stop"), b"").expect("stop a");
    assert_eq!(wait_exit(a), 0);
    wait_for_file(&w, "d.started");
    assert_eq!(
        read(&w, "d.id"),
        read(&w, "a.id"),
        "the waiter took a's permit"
    );
    let (ta, td): (u64, u64) = (
        read(&w, "a.token").parse().expect("a token"),
        read(&w, "d.token").parse().expect("a token"),
    );
    assert!(td > ta, "the permit's token went up: {ta} then {td}");
    std::fs::write(w.path("b.stop"), b"").expect("stop b");
    std::fs::write(w.path("d.stop"), b"").expect("stop d");
    assert_eq!(wait_exit(b), 0);
    assert_eq!(wait_exit(waiter), 0);
}

#[test]
fn a_bad_number_of_permits_is_a_usage_error_before_the_store_is_touched() {
    let w = World::new();
    for n in ["0", "10001", "two"] {
        let out = w.output(&["run", "--permits", n, "db", "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(64),
            "--permits {n}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("1 to 10000 permits"),
            "--permits {n}: {}",
            stderr(&out)
        );
    }
    assert!(!w.path("store").exists(), "the store was created");
    let out = w.output(&["status", "--permits", "2", "a", "b"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

/// The size of the fair queue record of `target` (`status --json` of its
/// queue lease): it grows by one ticket per waiter that joins.
fn queue_bytes(w: &World, target: &str) -> u64 {
    let out = w.output(&["status", "--json", &format!("{target}/fair-queue")]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v["checkpoint_bytes"].as_u64())
        .unwrap_or(0)
}

/// `run --ttl TTL WORK_ID` of a holder child named `name`, once started.
fn start_holder(w: &World, ttl: &str, work_id: &str, name: &str) -> Running {
    let r = spawn(
        w,
        &[
            "run",
            "--ttl",
            ttl,
            work_id,
            "--",
            "sh",
            "-c",
            &holder_script(name),
        ],
    );
    wait_for_file(w, &format!("{name}.started"));
    r
}

/// `worklease ARGS` of a fair waiter of `target`, once it joined the line.
fn join(w: &World, target: &str, args: &[&str]) -> Running {
    let before = queue_bytes(w, target);
    let r = spawn(w, args);
    assert!(
        poll_until(LONG, || queue_bytes(w, target) > before),
        "{args:?} did not join the line"
    );
    r
}

#[test]
fn fair_runs_are_served_in_arrival_order() {
    let w = World::new();
    let holder = start_holder(&w, "5s", "job", "h");
    let mut waiters = Vec::new();
    for i in 0..4 {
        let script = format!("echo {i} >> \"$D/order\"");
        waiters.push(join(
            &w,
            "job",
            &[
                "run", "--ttl", "5s", "--fair", "--wait", "--poll", "100ms", "job", "--", "sh",
                "-c", &script,
            ],
        ));
    }
    let impatient = w.output(&["run", "--fair", "job", "--", "true"]);
    assert_eq!(impatient.status.code(), Some(75), "{}", stderr(&impatient));
    assert!(
        stderr(&impatient).contains("4 fair waiter(s) are in line"),
        "{}",
        stderr(&impatient)
    );
    std::fs::write(w.path("h.stop"), b"").expect("stop the holder");
    assert_eq!(wait_exit(holder), 0);
    for waiter in waiters {
        assert_eq!(wait_exit(waiter), 0);
    }
    assert_eq!(read(&w, "order"), "0\n1\n2\n3", "served in arrival order");
}

#[test]
fn an_interrupted_fair_waiter_leaves_the_line_at_once() {
    let w = World::new();
    let holder = start_holder(&w, "20s", "job", "h");
    let fair_waiter = |script: &'static str| {
        [
            "run", "--ttl", "20s", "--fair", "--wait", "--poll", "10s", "job", "--", "sh", "-c",
            script,
        ]
    };
    let a = join(&w, "job", &fair_waiter("touch \"$D/a.ran\""));
    let b = join(&w, "job", &fair_waiter("touch \"$D/b.ran\""));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(a.0.id()).expect("pid")),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    assert_eq!(wait_exit(a), 130, "an interrupted wait exits 128 + SIGINT");
    std::fs::write(w.path("h.stop"), b"").expect("stop the holder");
    assert_eq!(wait_exit(holder), 0);
    // With the interrupted waiter still in line, b would wait for its
    // waiter lease to expire (20 s) or its own poll (10 s).
    let started = std::time::Instant::now();
    assert!(
        poll_until(std::time::Duration::from_secs(8), || w
            .path("b.ran")
            .exists()),
        "the waiter behind an interrupted one was not served within 8 s"
    );
    eprintln!("served {:?} after the holder ended", started.elapsed());
    assert_eq!(wait_exit(b), 0);
    assert!(!w.path("a.ran").exists(), "the interrupted waiter ran");
}

#[test]
fn a_fail_fast_fair_run_does_not_wait_for_someone_arriving() {
    let w = World::new();
    // Someone holds the line's queue lease (an arrival in progress, here
    // for 20 s). Straight through the store: `run` refuses the line's own
    // work IDs.
    hold_in_store(
        &w,
        "job/fair-queue",
        "arriving",
        std::time::Duration::from_secs(20),
    );
    let started = std::time::Instant::now();
    let out = w.output(&["run", "--fair", "job", "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "a fail-fast fair run waited {:?} for the queue lease",
        started.elapsed()
    );
    assert!(!w.path("ran").exists());
}

/// Holds `work_id` as `holder` for `ttl` on the world's SQLite store with
/// one store call, as another process's acquisition would.
fn hold_in_store(w: &World, work_id: &str, holder: &str, ttl: std::time::Duration) {
    use worklease::LeaseStore;
    std::fs::create_dir_all(w.path("store")).expect("store directory");
    let store =
        worklease::store::sqlite::SqliteStore::open(w.path("store/leases.db")).expect("open");
    let work_id = worklease::WorkId::new(work_id).expect("work ID");
    let holder = worklease::HolderId::new(holder).expect("holder ID");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(store.acquire(&work_id, &holder, ttl))
        .expect("acquire");
}
