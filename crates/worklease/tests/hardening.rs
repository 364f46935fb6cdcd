//! Regression tests from a review that tried to break the library: extreme
//! options must not panic, a dropped SQLite call must not leave a lease
//! behind, and the SQLite store refuses files it cannot share safely.

use std::sync::Arc;
use std::time::Duration;

use worklease::store::fault::FaultStore;
use worklease::store::memory::MemoryStore;
use worklease::store::sqlite::{SqliteStore, TokioClock};
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, RenewalOptions, WorkId};

fn memory_leases(holder: &str) -> (Arc<FaultStore>, Leases) {
    let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
    let leases = Leases::new(store.clone(), Config::new(holder, Duration::from_secs(9))).unwrap();
    (store, leases)
}

#[tokio::test(start_paused = true)]
async fn a_huge_backoff_still_ends_in_a_lost_signal() {
    let (store, leases) = memory_leases("h");
    let t = leases.acquire("w", AcquireOptions::new()).await.unwrap();
    let opts = RenewalOptions::new().backoff(Duration::MAX, Duration::MAX, 0.2);
    let renewal = leases.start_renewal(t, opts).unwrap();
    store.set_unreachable(true);
    let cause = tokio::time::timeout(Duration::from_secs(9), renewal.lost())
        .await
        .expect("lost within the TTL");
    assert!(matches!(cause, Error::WindowExhausted { .. }), "{cause:?}");
    assert!(renewal.stop().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn extreme_wait_options_do_not_panic() {
    let (_, a) = memory_leases("a");
    let t = a
        .acquire("w", AcquireOptions::new().wait_timeout(Duration::MAX))
        .await
        .unwrap();
    let b = Leases::new(a.store().clone(), Config::new("b", Duration::from_secs(9))).unwrap();
    let opts = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(Duration::MAX)
        .wait_timeout(Duration::from_secs(1));
    assert!(matches!(
        b.acquire("w", opts).await,
        Err(Error::WaitTimedOut { .. })
    ));
    // A wait whose cancellation already fired does not acquire.
    a.release(t).await.unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let e = b
        .acquire(
            "w",
            AcquireOptions::new().wait_for_lease().cancel_on(cancel),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled { .. }), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn ensure_live_refuses_after_the_deadline_even_before_the_lost_signal() {
    let (_, leases) = memory_leases("h");
    let t = leases.acquire("w", AcquireOptions::new()).await.unwrap();
    let renewal = leases.start_renewal(t, RenewalOptions::new()).unwrap();
    assert!(renewal.ensure_live().is_ok());
    drop(renewal);
    let t = leases.acquire("w2", AcquireOptions::new()).await.unwrap();
    let renewal = leases.start_renewal(t, RenewalOptions::new()).unwrap();
    // Freeze: no task runs while the clock jumps past the deadline, as
    // after a SIGSTOP; the work must not trust the lease.
    tokio::time::advance(Duration::from_secs(20)).await;
    assert!(renewal.ensure_live().is_err());
}

/// A SQLite acquisition dropped while it waits for another process's
/// write lock runs to its end on its own task once the lock is free, and
/// its grant, which nobody took, is released at once (ADR 0019): the
/// store's own notification of that release is the signal, and the work
/// ID is then free.
#[tokio::test]
async fn a_dropped_sqlite_call_leaves_no_lease() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open_with_clock(&path, Arc::new(TokioClock::new())).unwrap());
    let leases = Leases::new(store.clone(), Config::new("b", Duration::from_secs(30))).unwrap();
    // Another process holds the file's write lock.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    let r = tokio::time::timeout(
        Duration::from_millis(200),
        leases.acquire("w", AcquireOptions::new()),
    )
    .await;
    assert!(r.is_err(), "the acquisition waits for the lock");
    let released = store
        .watch(&WorkId::new("w").unwrap())
        .expect("the SQLite store notifies releases");
    raw.execute_batch("COMMIT").unwrap();
    tokio::time::timeout(Duration::from_secs(30), released)
        .await
        .expect("the abandoned acquisition's grant is released, not left for its 30 s TTL");
    let leases_now = store.inspect(&[]).await.unwrap();
    assert!(
        leases_now.iter().all(|l| l.released || l.expired),
        "an abandoned acquisition left a lease: {leases_now:?}"
    );
    leases
        .acquire("w", AcquireOptions::new())
        .await
        .expect("the work ID is free");
}

#[test]
fn sqlite_refuses_what_it_cannot_share() {
    let dir = tempfile::tempdir().unwrap();
    let clock = || Arc::new(TokioClock::new());
    for bad in ["", ":memory:"] {
        let e = SqliteStore::open_with_clock(bad, clock())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a file path"), "{bad:?}: {e}");
    }
    // A URI is a file name (here in the working directory's "file:" form),
    // never a way to turn locking off: the store opens a plain file of
    // that name, in WAL mode.
    let uri = dir.path().join("file:x.db?vfs=unix-none");
    let store = SqliteStore::open_with_clock(&uri, clock()).expect("a plain file name");
    assert!(uri.exists(), "the URI was taken as a plain file name");
    drop(store);
    let missing = dir.path().join("no/such/dir/leases.db");
    let e = SqliteStore::open_with_clock(&missing, clock())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/dir"), "the path is named: {e}");
    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE invoices (id INTEGER)")
        .unwrap();
    let e = SqliteStore::open_with_clock(&other, clock())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a worklease database") && e.contains("invoices"),
        "{e}"
    );
}

#[test]
fn many_processes_may_open_a_new_file_at_once() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path).map(|_| ())
                })
            })
            .collect();
        for t in threads {
            t.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_after_the_deadline_is_handed_back() {
    let (store, a) = memory_leases("a");
    store.set_reply_delay(Duration::from_secs(10)); // more than the 9 s TTL
    let e = a.acquire("w", AcquireOptions::new()).await.unwrap_err();
    assert!(matches!(e, Error::Expired { .. }), "{e:?}");
    store.set_reply_delay(Duration::ZERO);
    let b = Leases::new(a.store().clone(), Config::new("b", Duration::from_secs(9))).unwrap();
    b.acquire("w", AcquireOptions::new())
        .await
        .expect("the late grant was handed back");
}

#[test]
fn sqlite_refuses_a_hard_linked_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    drop(SqliteStore::open_with_clock(&a, Arc::new(TokioClock::new())).unwrap());
    std::fs::hard_link(&a, dir.path().join("b.db")).unwrap();
    let e = SqliteStore::open_with_clock(&a, Arc::new(TokioClock::new()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("hard links"), "{e}");
}

#[test]
fn store_errors_show_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteStore::open_with_clock(dir.path(), Arc::new(TokioClock::new()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&dir.path().display().to_string()) && e.matches(':').count() >= 2,
        "{e}"
    );
}

/// A store file deleted (or replaced) under a running store: the holder's
/// renewals fail instead of going on in a file nobody else can open, while
/// a new process starts fencing tokens again at 1 in a fresh file at the
/// same path (two holders with one fencing token).
#[tokio::test]
async fn sqlite_refuses_to_go_on_when_its_file_was_deleted_or_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let config = |h: &str| Config::new(h, Duration::from_secs(30));
    let a = Leases::new(Arc::new(SqliteStore::open(&path).unwrap()), config("a")).unwrap();
    let id = "deleted";
    let t = a.acquire(id, AcquireOptions::new()).await.unwrap();

    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
    }
    let e = a.renew(&t).await.unwrap_err().to_string();
    assert!(e.contains("is gone") && e.contains("fencing tokens"), "{e}");

    // A new process makes a new file at the path: the old store still
    // refuses (it would otherwise write into a file nobody else sees).
    let b = Leases::new(Arc::new(SqliteStore::open(&path).unwrap()), config("b")).unwrap();
    let tb = b.acquire(id, AcquireOptions::new()).await.unwrap();
    let e = a.renew(&t).await.unwrap_err().to_string();
    assert!(e.contains("was replaced"), "{e}");
    b.release(tb).await.unwrap();
}
