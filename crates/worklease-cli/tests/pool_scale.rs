//! `worklease pool` at scale (issue 17): three real pool processes share
//! thousands of work IDs on the default SQLite store, each work ID's
//! child runs until the end (it sleeps past the window), and over the
//! window no lease is lost and no child starts twice.
//!
//! Every child appends `<work ID> <fencing token>` to `$D/starts` when it
//! starts, then `exec`s a long sleep (so one process per work ID stays).
//! The test reads that file and the pools' stderr; it waits for events by
//! polling what the processes leave behind, in bounded loops, and watches
//! the window (a duration the issue sets, not a stand-in for an event)
//! the same way.
//!
//! The bounds are generous on purpose (a debug build on a loaded 2-core
//! CI machine): coverage may take as long as children keep starting
//! ([`STALL_ROUNDS`]); the measured times are printed (`--nocapture`),
//! and the "within 3 rounds" is measured on a release build (see
//! the closing note of issue 17). A pool that loses a lease, restarts a
//! child or stops covering its share fails whatever the machine's speed.

mod common;
use common::{poll_until, World};

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

const POOLS: [&str; 3] = ["scale-a", "scale-b", "scale-c"];

/// Coverage may take as long as children keep starting (a debug build on
/// a loaded machine starts them slowly), but fails once none started for
/// this many rounds: a pool that lost its leases, or waits for nothing,
/// stops starting children long before.
const STALL_ROUNDS: u32 = 3;

/// The bound of the whole coverage, however steady.
const COVERAGE_CAP: Duration = Duration::from_secs(600);

/// How long every child must keep running with its lease held.
const WINDOW: Duration = Duration::from_secs(60);

/// The two tests start thousands of processes each: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The child: records its start, then stays (it outlives the window).
const CHILD: &str =
    "echo \"$WORKLEASE_WORK_ID $WORKLEASE_FENCING_TOKEN\" >> \"$D/starts\"; exec sleep 3600\n";

/// A pool process; SIGKILLed (its children die with it: the pool sets
/// their parent-death signal) if the test ends first.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_pool(world: &World, holder: &str, ttl: &str) -> Running {
    let stderr =
        std::fs::File::create(world.path(&format!("{holder}.stderr"))).expect("a stderr file");
    let ids = world.path("ids.txt");
    let script = world.path("child.sh");
    world
        .cmd(&[
            "pool",
            "--holder",
            holder,
            "--pool-name",
            "scale",
            "--ttl",
            ttl,
            "--work-ids-file",
            ids.to_str().expect("a UTF-8 path"),
            "--",
            "sh",
            script.to_str().expect("a UTF-8 path"),
        ])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(Running)
        .expect("spawn worklease pool")
}

/// Work ID → how many times its child started (from `$D/starts`).
fn starts(world: &World) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(world.path("starts")).unwrap_or_default();
    let mut counts = BTreeMap::new();
    // Only whole lines: a child may be writing the last one right now.
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let id = line.split(' ').next().unwrap_or_default().to_string();
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// The warnings and errors a pool logged: a lost lease, a failed renewal
/// or round, a hand-off forced by a lost membership all log one.
fn complaints(world: &World, holder: &str) -> Vec<String> {
    std::fs::read_to_string(world.path(&format!("{holder}.stderr")))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains("ERROR"))
        .map(str::to_string)
        .collect()
}

/// No child started twice, and no pool complained (`when`: the phase).
fn assert_calm(world: &World, counts: &BTreeMap<String, usize>, when: &str) {
    let twice: Vec<_> = counts.iter().filter(|(_, &c)| c > 1).take(10).collect();
    assert!(
        twice.is_empty(),
        "children started more than once {when}: {twice:?}"
    );
    for h in POOLS {
        let c = complaints(world, h);
        assert!(
            c.is_empty(),
            "pool {h} logged {} complaints {when}, first: {:?}",
            c.len(),
            &c[..c.len().min(5)]
        );
    }
}

/// Three pools over `n` work IDs at `ttl`: every work ID's child starts
/// exactly once (see [`STALL_ROUNDS`]), then for [`WINDOW`] no
/// child starts again, no pool complains, every pool runs; SIGTERM ends
/// them with 128 + 15.
fn three_pools(n: usize, ttl: Duration) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let world = World::new();
    let ids: Vec<String> = (0..n).map(|i| format!("job-{i:05}")).collect();
    std::fs::write(world.path("ids.txt"), ids.join("\n") + "\n").expect("write ids.txt");
    std::fs::write(world.path("child.sh"), CHILD).expect("write child.sh");
    let round = ttl / 3;
    let ttl_arg = format!("{}s", ttl.as_secs());

    let stall = STALL_ROUNDS * round;
    let started = Instant::now();
    let mut pools: Vec<(&str, Running)> = POOLS
        .iter()
        .map(|h| (*h, start_pool(&world, h, &ttl_arg)))
        .collect();
    // Until every work ID started: fail at a stall, a restart, a
    // complaint or a pool that exited.
    let (mut seen, mut last_start) = (0, Instant::now());
    let covered = poll_until(COVERAGE_CAP, || {
        let counts = starts(&world);
        if counts.len() > seen {
            (seen, last_start) = (counts.len(), Instant::now());
        }
        counts.len() == n
            || last_start.elapsed() > stall
            || counts.values().any(|&c| c > 1)
            || POOLS.iter().any(|h| !complaints(&world, h).is_empty())
    });
    let coverage = started.elapsed();
    let counts = starts(&world);
    assert_calm(&world, &counts, "while the children started");
    assert!(
        covered && counts.len() == n,
        "{} of {n} work IDs started; none for the last {:?} ({STALL_ROUNDS} rounds of {round:?}), {coverage:?} after the pools started",
        counts.len(),
        last_start.elapsed()
    );
    println!(
        "{n} work IDs, TTL {ttl:?}: all started {:.2} s after the pools ({:.2} rounds)",
        coverage.as_secs_f64(),
        coverage.as_secs_f64() / round.as_secs_f64()
    );

    // The window: nothing starts again, nothing is lost, every pool runs.
    let window_end = Instant::now() + WINDOW;
    let broke = poll_until(WINDOW, || {
        starts(&world).values().any(|&c| c > 1)
            || POOLS.iter().any(|h| !complaints(&world, h).is_empty())
            || pools
                .iter_mut()
                .any(|(_, p)| p.0.try_wait().expect("try_wait").is_some())
    });
    let counts = starts(&world);
    assert_calm(&world, &counts, "during the window");
    assert!(!broke, "a pool exited during the window");
    assert!(
        Instant::now() >= window_end,
        "the window was watched to its end"
    );
    assert_eq!(counts.len(), n, "every work ID's child started");
    assert!(
        counts.keys().all(|id| ids.binary_search(id).is_ok()),
        "only the given work IDs were started"
    );
    println!("{n} work IDs, TTL {ttl:?}: no restart and no complaint over {WINDOW:?}");

    // SIGTERM: each pool forwards it, waits for its children, releases
    // everything and exits 128 + 15.
    for (_, p) in &pools {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(p.0.id()).expect("a pid"));
        nix::sys::signal::kill(pid, Signal::SIGTERM).expect("SIGTERM a pool");
    }
    let mut statuses = BTreeMap::new();
    let all = poll_until(stall + WINDOW, || {
        for (h, p) in pools.iter_mut() {
            if let Some(s) = p.0.try_wait().expect("try_wait") {
                statuses.insert(*h, s.code());
            }
        }
        statuses.len() == POOLS.len()
    });
    assert!(
        all,
        "pools still running {:?} after SIGTERM: ended {statuses:?}",
        stall + WINDOW
    );
    assert!(
        statuses.values().all(|c| *c == Some(128 + 15)),
        "exit statuses after SIGTERM: {statuses:?}"
    );
}

#[test]
fn three_pools_share_10000_work_ids_at_ttl_10s() {
    three_pools(10_000, Duration::from_secs(10));
}

#[test]
fn three_pools_share_2000_work_ids_at_ttl_5s() {
    three_pools(2_000, Duration::from_secs(5));
}
