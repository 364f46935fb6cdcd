//! The work pool on the in-memory and SQLite stores, on a paused clock:
//! balance (3 pools, a 4th joins, one is killed), pools started together
//! starting only their share, finished work IDs (never acquired again, out
//! of the shares, no needless hand-offs), mutual exclusion and clean
//! hand-offs throughout, slot events and back-off timing, bad options.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worklease::pool::{Pool, PoolError, PoolObserver, PoolOptions, SlotError};
use worklease::runner::RunContext;
use worklease::store::fault::FaultStore;
use worklease::store::memory::MemoryStore;
use worklease::store::sqlite::{SqliteStore, TokioClock};
use worklease::{
    AcquireOptions, Config, Error, InvalidInput, LeaseEnd, LeaseStore, Leases, WorkId,
};

const TTL: Duration = Duration::from_secs(9);
/// The round interval: the default renewal interval, TTL/3.
const ROUND: Duration = Duration::from_secs(3);

fn stores() -> Vec<(&'static str, Arc<dyn LeaseStore>)> {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let sqlite = SqliteStore::open_with_clock(dir.join("leases.db"), Arc::new(TokioClock::new()))
        .expect("open");
    vec![
        ("memory", Arc::new(MemoryStore::new())),
        ("sqlite", Arc::new(sqlite)),
    ]
}

fn work_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("shard-{i:02}")).collect()
}

/// What the work functions saw, shared by every pool of a test.
#[derive(Default)]
struct World {
    /// Work ID → the pool whose work function runs on it now.
    holders: Mutex<HashMap<String, String>>,
    /// Work ID → the final state its last work function returned.
    last_final: Mutex<HashMap<String, String>>,
    /// Pools killed (their hand-offs are not clean).
    killed: Mutex<HashSet<String>>,
    violations: Mutex<Vec<String>>,
    /// Pool → how many work functions it started.
    starts: Mutex<HashMap<String, u64>>,
}

impl World {
    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }
}

/// Clears the world's holder entry when the work function ends (also when
/// it is dropped with a killed pool).
struct Holding(Arc<World>, String, String);

impl Drop for Holding {
    fn drop(&mut self) {
        let mut h = self.0.holders.lock().unwrap();
        if h.get(&self.1) == Some(&self.2) {
            h.remove(&self.1);
        }
    }
}

/// The work: claim the work ID in the world (no other pool may hold it),
/// check the hand-off, wait for the stop signal, return a final state.
async fn work(world: Arc<World>, me: String, ctx: RunContext) -> Result<Option<Bytes>, SlotError> {
    let w = ctx.token().work_id().to_string();
    *world.starts.lock().unwrap().entry(me.clone()).or_default() += 1;
    if let Some(other) = world.holders.lock().unwrap().insert(w.clone(), me.clone()) {
        world.violation(format!("{w}: {me} started while {other} held it"));
    }
    let _holding = Holding(world.clone(), w.clone(), me.clone());
    let prior = ctx.prior();
    if let Some(prev) = &prior.handoff.previous {
        let killed = world.killed.lock().unwrap().contains(&prev.holder_id);
        if !killed {
            if !prior.clean_handoff() {
                world.violation(format!(
                    "{w}: {me} got an unclean hand-off from live {} ({:?})",
                    prev.holder_id, prev.ended
                ));
            }
            let want = world.last_final.lock().unwrap().get(&w).cloned();
            let got = prior
                .data
                .as_ref()
                .map(|d| String::from_utf8_lossy(d).into_owned());
            if got != want {
                world.violation(format!(
                    "{w}: {me} read checkpoint {got:?}, the last final state was {want:?}"
                ));
            }
        }
    }
    ctx.cancelled().cancelled().await;
    let state = format!("{me}:{}", ctx.fencing_token());
    world
        .last_final
        .lock()
        .unwrap()
        .insert(w.clone(), state.clone());
    Ok(Some(state.into()))
}

struct Member {
    name: String,
    pool: Pool,
    fault: Arc<FaultStore>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), PoolError>>,
}

fn start(store: &Arc<dyn LeaseStore>, world: &Arc<World>, name: &str, ids: &[String]) -> Member {
    let fault = Arc::new(FaultStore::new(store.clone()));
    let leases = Leases::new(fault.clone(), Config::new(name, TTL)).unwrap();
    let pool = Pool::new(leases, PoolOptions::new("fleet", ids.to_vec())).unwrap();
    let shutdown = CancellationToken::new();
    let (w, me) = (world.clone(), name.to_string());
    let p = pool.clone();
    let s = shutdown.clone();
    let task =
        tokio::spawn(async move { p.run(s, move |ctx| work(w.clone(), me.clone(), ctx)).await });
    Member {
        name: name.to_string(),
        pool,
        fault,
        shutdown,
        task,
    }
}

/// Waits (polling every 100 ms) until every member holds `quota` slots
/// and together they cover all `total`; returns how long it took, or
/// panics after `limit`.
async fn converge(members: &[&Member], quota: usize, total: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let sets: Vec<Vec<String>> = members.iter().map(|m| m.pool.active_slots()).collect();
        let union: HashSet<&String> = sets.iter().flatten().collect();
        if sets.iter().all(|s| s.len() == quota) && union.len() == total {
            return start.elapsed();
        }
        assert!(
            start.elapsed() <= limit,
            "no convergence to {quota} each within {limit:?}: {:?}",
            members
                .iter()
                .map(|m| (m.name.clone(), m.pool.active_slots()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn pools_balance_on_join_and_cover_a_dead_pool() {
    for (name, store) in stores() {
        let world = Arc::new(World::default());
        let ids = work_ids(12);
        let a = start(&store, &world, "pool-a", &ids);
        let b = start(&store, &world, "pool-b", &ids);
        let c = start(&store, &world, "pool-c", &ids);
        let took = converge(&[&a, &b, &c], 4, 12, 4 * ROUND).await;
        eprintln!("{name}: 3 pools hold 4 each after {took:?}");
        // Stable: still 4 each a few rounds later.
        tokio::time::sleep(3 * ROUND).await;
        converge(&[&a, &b, &c], 4, 12, Duration::ZERO).await;

        // A fourth joins: all converge to 3 within 2 rounds (+ slack for
        // the hand-offs; the bound stated in the pool docs is 2 rounds
        // plus the time the work takes to stop).
        let d = start(&store, &world, "pool-d", &ids);
        let took = converge(&[&a, &b, &c, &d], 3, 12, 2 * ROUND + Duration::from_secs(1)).await;
        eprintln!("{name}: 4 pools hold 3 each {took:?} after the fourth joined");
        tokio::time::sleep(3 * ROUND).await;
        converge(&[&a, &b, &c, &d], 3, 12, Duration::ZERO).await;

        // Kill b: it can no longer reach the store, and its task is
        // aborted (no release). The others cover all 12 within TTL + 2
        // rounds.
        world.killed.lock().unwrap().insert(b.name.clone());
        b.fault.set_unreachable(true);
        b.task.abort();
        let took = converge(
            &[&a, &c, &d],
            4,
            12,
            TTL + 2 * ROUND + Duration::from_secs(1),
        )
        .await;
        eprintln!("{name}: 3 pools cover 12 {took:?} after one was killed");
        tokio::time::sleep(3 * ROUND).await;
        converge(&[&a, &c, &d], 4, 12, Duration::ZERO).await;

        // Clean shutdown: every slot's final state checkpointed, released.
        for m in [&a, &c, &d] {
            m.shutdown.cancel();
        }
        for m in [a, c, d] {
            m.task.await.unwrap().unwrap();
            assert!(m.pool.active_slots().is_empty(), "{name}");
        }
        let infos = store.inspect(&[]).await.unwrap();
        for id in &ids {
            let info = infos.iter().find(|i| i.work_id.as_str() == id).unwrap();
            assert_eq!(info.ended, Some(LeaseEnd::Released), "{name}: {id}");
        }
        let v = world.violations.lock().unwrap().clone();
        assert!(v.is_empty(), "{name}: {v:#?}");
        assert!(world.holders.lock().unwrap().is_empty(), "{name}");
        let runs: u64 = world.starts.lock().unwrap().values().sum();
        eprintln!("{name}: {runs} work runs");
    }
}

#[tokio::test(start_paused = true)]
async fn pools_started_together_start_only_their_share() {
    let names = ["pool-a", "pool-b", "pool-c"];
    for (name, store) in stores() {
        let world = Arc::new(World::default());
        let ids = work_ids(12);
        let members: Vec<Member> = names
            .iter()
            .map(|p| start(&store, &world, p, &ids))
            .collect();
        let all: Vec<&Member> = members.iter().collect();
        let took = converge(&all, 4, 12, 3 * ROUND).await;
        eprintln!("{name}: 3 pools started together hold 4 each after {took:?}");
        // The first round only writes the memberships.
        assert!(took >= ROUND, "{name}: work started after {took:?}");
        tokio::time::sleep(3 * ROUND).await;
        converge(&all, 4, 12, Duration::ZERO).await;
        // Each pool started exactly its 4: none took more and gave some
        // back.
        let starts = world.starts.lock().unwrap().clone();
        let want: HashMap<String, u64> = names.iter().map(|p| (p.to_string(), 4)).collect();
        assert_eq!(starts, want, "{name}");
        for m in &members {
            m.shutdown.cancel();
        }
        for m in members {
            m.task.await.unwrap().unwrap();
        }
        let v = world.violations.lock().unwrap().clone();
        assert!(v.is_empty(), "{name}: {v:#?}");
    }
}

/// What the work functions of the finishing test share.
#[derive(Default)]
struct Finishing {
    /// Work ID → fires to make its work finish.
    signals: Mutex<HashMap<String, CancellationToken>>,
    /// Work ID → the pool and fencing token that wrote its done record.
    finished_by: Mutex<HashMap<String, (String, u64)>>,
}

impl Finishing {
    fn signal(&self, work_id: &str) -> CancellationToken {
        self.signals
            .lock()
            .unwrap()
            .entry(work_id.to_string())
            .or_default()
            .clone()
    }
}

const DONE: &str = "fleet/done/";

/// Runs until stopped, or until told to finish: then writes the done
/// record `fleet/done/<work ID>` (acquire, release) and returns `Ok`.
async fn finishing_work(
    world: Arc<Finishing>,
    me: String,
    ctx: RunContext,
) -> Result<Option<Bytes>, SlotError> {
    let w = ctx.token().work_id().to_string();
    let (stop, finish) = (ctx.cancelled(), world.signal(&w));
    tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        _ = finish.cancelled() => {}
    }
    let leases = ctx.leases();
    let transient = |e: Error| SlotError::Transient(e.into());
    let record = leases
        .acquire(&format!("{DONE}{w}"), AcquireOptions::new())
        .await
        .map_err(transient)?;
    leases.release(record).await.map_err(transient)?;
    world
        .finished_by
        .lock()
        .unwrap()
        .insert(w, (me, ctx.fencing_token()));
    Ok(None)
}

fn start_finishing(
    store: &Arc<dyn LeaseStore>,
    world: &Arc<Finishing>,
    name: &str,
    ids: &[String],
) -> (Member, Arc<Events>) {
    let fault = Arc::new(FaultStore::new(store.clone()));
    let leases = Leases::new(fault.clone(), Config::new(name, TTL)).unwrap();
    let events = Arc::new(Events::default());
    let options = PoolOptions::new("fleet", ids.to_vec())
        .done_prefix(DONE)
        .observer(events.clone());
    let pool = Pool::new(leases, options).unwrap();
    let shutdown = CancellationToken::new();
    let (w, me) = (world.clone(), name.to_string());
    let p = pool.clone();
    let s = shutdown.clone();
    let task = tokio::spawn(async move {
        p.run(s, move |ctx| finishing_work(w.clone(), me.clone(), ctx))
            .await
    });
    let member = Member {
        name: name.to_string(),
        pool,
        fault,
        shutdown,
        task,
    };
    (member, events)
}

/// Waits (polling every 100 ms, at most 3 rounds) until the members'
/// slots cover exactly `open` and each holds `floor` or `ceil` of them,
/// then checks that this lasts 2 more rounds; returns the holdings.
async fn settle(name: &str, members: &[&Member], open: &BTreeSet<String>) -> Vec<usize> {
    let state = || {
        let sets: Vec<Vec<String>> = members.iter().map(|m| m.pool.active_slots()).collect();
        let union: BTreeSet<String> = sets.iter().flatten().cloned().collect();
        let counts: Vec<usize> = sets.iter().map(Vec::len).collect();
        let (lo, hi) = (
            counts.iter().min().copied().unwrap_or(0),
            counts.iter().max().copied().unwrap_or(0),
        );
        (union == *open && hi - lo <= 1, sets)
    };
    let start = Instant::now();
    loop {
        let (ok, sets) = state();
        if ok {
            break;
        }
        assert!(
            start.elapsed() <= 3 * ROUND,
            "{name}: not balanced over {open:?}: {sets:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, before) = state();
    tokio::time::sleep(2 * ROUND).await;
    let (_, after) = state();
    assert_eq!(before, after, "{name}: the slots moved while balanced");
    after.iter().map(Vec::len).collect()
}

#[tokio::test(start_paused = true)]
async fn finished_work_ids_leave_the_shares_and_are_never_acquired_again() {
    for (name, store) in stores() {
        let world = Arc::new(Finishing::default());
        let ids = work_ids(12);
        let (a, ea) = start_finishing(&store, &world, "pool-a", &ids);
        let (b, eb) = start_finishing(&store, &world, "pool-b", &ids);
        let (c, ec) = start_finishing(&store, &world, "pool-c", &ids);
        let all = [&a, &b, &c];
        let handoffs = || ea.count("released") + eb.count("released") + ec.count("released");
        let mut open: BTreeSet<String> = ids.iter().cloned().collect();
        assert_eq!(settle(name, &all, &open).await, [4, 4, 4], "{name}");
        assert_eq!(handoffs(), 0, "{name}");

        // All of pool-a's work IDs finish: the 8 others are shared again.
        // pool-b and pool-c hold 4, more than ceil(8/3) = 3: each hands
        // one to pool-a.
        for w in a.pool.active_slots() {
            world.signal(&w).cancel();
            open.remove(&w);
        }
        assert_eq!(settle(name, &all, &open).await, [2, 3, 3], "{name}");
        assert_eq!(handoffs(), 2, "{name}");

        // Then one at a time, in turn: the split stays even without a
        // single hand-off more (the remainder of W/n moving to another
        // rank is no reason to stop running work).
        let order = [&c, &b, &a];
        for k in 0..7 {
            let m = order[k % 3];
            let w = m.pool.active_slots().first().cloned().unwrap_or_else(|| {
                panic!("{name}: {} holds nothing at step {k}", m.name);
            });
            world.signal(&w).cancel();
            open.remove(&w);
            let counts = settle(name, &all, &open).await;
            assert_eq!(
                handoffs(),
                2,
                "{name}: a hand-off after {w} finished: {counts:?}"
            );
        }
        // The last one finishes: every pool ends on its own with Ok.
        let last: Vec<String> = open.iter().cloned().collect();
        assert_eq!(last.len(), 1, "{name}");
        world.signal(&last[0]).cancel();
        for m in [a, b, c] {
            let r = tokio::time::timeout(3 * ROUND, m.task).await;
            assert!(
                matches!(r, Ok(Ok(Ok(())))),
                "{name}: {} ended {r:?}",
                m.name
            );
            assert!(m.pool.active_slots().is_empty(), "{name}");
        }
        // Never acquired after its done record: each work ID's lease still
        // has the holder and fencing token that finished it.
        let finished_by = world.finished_by.lock().unwrap().clone();
        let infos = store.inspect(&[]).await.unwrap();
        for id in &ids {
            let info = infos.iter().find(|i| i.work_id.as_str() == id).unwrap();
            let (holder, token) = &finished_by[id];
            assert_eq!(
                (&info.holder_id, info.fencing_token),
                (holder, *token),
                "{name}: {id}"
            );
            assert_eq!(info.ended, Some(LeaseEnd::Released), "{name}: {id}");
        }
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<String>>);

impl PoolObserver for Events {
    fn on_slot_acquired(&self, work_id: &str, fencing_token: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("acquired {work_id} {fencing_token}"));
    }
    fn on_slot_lost(&self, work_id: &str, error: &Error) {
        assert!(error.is_lease_lost());
        self.0.lock().unwrap().push(format!("lost {work_id}"));
    }
    fn on_slot_backoff(&self, work_id: &str, _error: &str, _retry_in: Duration) {
        self.0.lock().unwrap().push(format!("backoff {work_id}"));
    }
    fn on_slot_dead(&self, work_id: &str, _error: &str) {
        self.0.lock().unwrap().push(format!("dead {work_id}"));
    }
    fn on_slot_released(&self, work_id: &str) {
        self.0.lock().unwrap().push(format!("released {work_id}"));
    }
}

impl Events {
    fn count(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }
}

fn pool_with(store: &Arc<dyn LeaseStore>, ids: &[&str], events: &Arc<Events>) -> Pool {
    let leases = Leases::new(store.clone(), Config::new("solo", TTL)).unwrap();
    Pool::new(
        leases,
        PoolOptions::new("p", ids.iter().copied())
            .backoff(Duration::from_secs(2))
            .observer(events.clone()),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_fenced_slot_is_reacquired_at_once() {
    for (name, store) in stores() {
        let events = Arc::new(Events::default());
        let pool = pool_with(&store, &["x"], &events);
        let shutdown = CancellationToken::new();
        let (p, s) = (pool.clone(), shutdown.clone());
        let task = tokio::spawn(async move {
            p.run(s, |ctx| async move {
                ctx.cancelled().cancelled().await;
                Ok(None)
            })
            .await
        });
        // Acquired at the second round (the first writes the membership).
        tokio::time::sleep(ROUND + Duration::from_secs(1)).await;
        assert_eq!(pool.active_slots(), vec!["x".to_string()], "{name}");
        store.revoke(&WorkId::new("x").unwrap()).await.unwrap();
        // Lost at the next renewal (within TTL/3), reacquired at once.
        tokio::time::sleep(ROUND + Duration::from_millis(100)).await;
        assert_eq!(events.count("lost x"), 1, "{name}");
        assert_eq!(events.count("acquired x"), 2, "{name}");
        assert_eq!(pool.active_slots(), vec!["x".to_string()], "{name}");
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn transient_errors_back_off_and_permanent_ones_kill_slots() {
    for (name, store) in stores() {
        let events = Arc::new(Events::default());
        let pool = pool_with(&store, &["t", "p"], &events);
        // Work ID → the instants of its tries.
        let tries = Arc::new(Mutex::new(HashMap::<String, Vec<Instant>>::new()));
        let t = tries.clone();
        let r = pool
            .run(CancellationToken::new(), move |ctx| {
                let t = t.clone();
                async move {
                    let w = ctx.token().work_id().to_string();
                    let n = {
                        let mut t = t.lock().unwrap();
                        let at = t.entry(w.clone()).or_default();
                        at.push(Instant::now());
                        at.len()
                    };
                    // "t" fails transiently twice, then permanently; "p"
                    // fails permanently at once.
                    if w == "t" && n <= 2 {
                        Err(SlotError::Transient("flaky".into()))
                    } else {
                        Err(SlotError::Permanent("broken".into()))
                    }
                }
            })
            .await;
        assert!(
            matches!(r, Err(PoolError::AllSlotsDead { count: 2, .. })),
            "{name}: {r:?}"
        );
        assert_eq!(events.count("backoff t"), 2, "{name}");
        assert_eq!(events.count("dead t"), 1, "{name}");
        assert_eq!(events.count("dead p"), 1, "{name}");
        let tries = tries.lock().unwrap().clone();
        assert_eq!(tries["p"].len(), 1, "{name}");
        // "t" is tried again when its back-off (2 s) ends, not at the next
        // round (every 3 s).
        let gaps: Vec<Duration> = tries["t"].windows(2).map(|p| p[1] - p[0]).collect();
        assert_eq!(gaps.len(), 2, "{name}");
        for gap in gaps {
            assert!(
                gap >= Duration::from_secs(2) && gap < Duration::from_millis(2100),
                "{name}: tried again {gap:?} after a failure with a 2s back-off"
            );
        }
        // Every slot was released after its error.
        let infos = store.inspect(&[]).await.unwrap();
        for id in ["t", "p"] {
            let info = infos.iter().find(|i| i.work_id.as_str() == id).unwrap();
            assert_eq!(info.ended, Some(LeaseEnd::Released), "{name}: {id}");
        }
    }
}

#[tokio::test]
async fn bad_options_are_refused() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let leases = Leases::new(store, Config::new("h", TTL)).unwrap();
    let e = Pool::new(
        leases.clone(),
        PoolOptions::new("p", ["a"]).acquire_options(AcquireOptions::new().wait_for_lease()),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("wait_for_lease"), "{e}");
    for bad in [
        PoolOptions::new("p", Vec::<String>::new()),
        PoolOptions::new("p", ["a", "a"]),
        PoolOptions::new("p", ["p/members/x"]),
        PoolOptions::new("p", [""]),
        PoolOptions::new("p", ["a"]).backoff(Duration::ZERO),
        PoolOptions::new("p", ["p/done/a"]).done_prefix("p/done/"),
        PoolOptions::new("p", ["a"]).done_prefix("p/members/done/"),
        PoolOptions::new("p", ["a"]).done_prefix("p/"),
        PoolOptions::new("p", ["a", &"x".repeat(1020)]).done_prefix("p/done/"),
    ] {
        let e = Pool::new(leases.clone(), bad).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    }
    // The name prefixes the membership leases: it must be a valid work ID.
    for name in ["", "a\nb"] {
        let e = Pool::new(leases.clone(), PoolOptions::new(name, ["a"])).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("pool name"), "{e}");
    }
    // Work IDs and memberships that worklease keeps for itself: a holder ID
    // `x/fair-queue` makes the membership `p/members/x/fair-queue`.
    let e = Pool::new(leases.clone(), PoolOptions::new("p", ["a/step-down"])).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::ReservedWorkId { .. })),
        "{e:?}"
    );
    let reserved = Leases::new(
        Arc::new(MemoryStore::new()),
        Config::new("x/fair-queue", TTL),
    )
    .unwrap();
    let e = Pool::new(reserved, PoolOptions::new("p", ["a"])).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::ReservedWorkId { .. })),
        "{e:?}"
    );
}
