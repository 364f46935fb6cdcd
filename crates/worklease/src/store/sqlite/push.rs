//! Wake-ups across processes: a waiter on this value learns of a release
//! or revocation made by another process (or another value on the same
//! file) within milliseconds, instead of at its next poll.
//!
//! * **Signal.** A value that commits a release, a batch release or a
//!   revocation then sets the database file's timestamps (`utimensat`:
//!   no write to its contents and no file descriptor, since closing one
//!   would drop this process's SQLite locks on the file). That raises a
//!   file-change event (inotify's `IN_ATTRIB`) after the commit is
//!   visible to every connection.
//! * **Watch.** While this value has at least one [`Registration`] (a
//!   waiter's [`LeaseStore::watch`] future, or a held lease's under
//!   background renewal), a [`notify`] watcher (inotify on Linux) watches
//!   the database file, and a task checks after its change events; with
//!   no registration left, both stop. Events that come while a check is
//!   in flight make one more check after it ([`Notify`] keeps one
//!   permit), so a burst of commits costs one check at a time.
//! * **Check.** See `seen.rs`: `PRAGMA data_version` on this value's
//!   connection (through its call queue), and only when another
//!   connection committed, one `SELECT` of the watched work IDs; waiters
//!   are woken when a lease's fencing token or phase changed, not when it
//!   was only renewed. A check reads every watched row, so after each the
//!   next waits four times as long as it took ([`CHECK_REST`]): a value
//!   watching 100,000 held leases spends at most a fifth of its
//!   connection's time on checks, and sees a revocation within about two
//!   seconds instead of milliseconds.
//! * **Why the main file, not the `-wal`.** A commit writes its frames to
//!   the `-wal`, syncs it, and only then publishes them in the shared
//!   index (SQLite's `walFrames`): a check woken by the `-wal` write runs
//!   during the sync and reads the state before the commit. The signal
//!   comes after the commit returned. Only the signal's event (new
//!   timestamps) makes a check: the main file's writes (WAL checkpoints,
//!   which copy commits long after they were made) and opens do not, so a
//!   fleet that commits thousands of renewals a second costs no check
//!   (renewals do not signal).
//! * **Fallback.** Waiters still poll at their interval: a commit by a
//!   writer that does not signal (an older worklease, the `sqlite3`
//!   shell), an expiry (no commit at all), or a watcher that cannot be set
//!   up (the inotify limits `fs.inotify.max_user_instances` /
//!   `max_user_watches`, a file system without notifications, no tokio
//!   runtime) leave them to their poll; the last is logged once per value
//!   (`warn`), never an error of the store.
//!
//! [`LeaseStore::watch`]: crate::LeaseStore::watch

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::limits::WorkId;
use crate::store::notify::Watchers;

use super::queue::{lock, ConnQueue};
use super::seen::{self, Seen};

/// After a check, the next one waits at least this many times as long as
/// it took: checks take at most a fifth of the connection's time, however
/// many work IDs are watched and however often other processes release.
/// A check costs about 1-4 µs per watched work ID (measured in a release
/// build: 10,000 in 9-24 ms, 100,000 in 0.19-0.41 s), so the rest is below
/// a millisecond for a few hundred work IDs, and about 1.6 s after a check
/// of 100,000 held leases.
const CHECK_REST: u32 = 4;

/// The wake-ups across processes of one store value.
pub(super) struct Push {
    /// `None` when turned off ([`super::SqliteStore::cross_process_wakeups`]).
    shared: Option<Arc<Shared>>,
}

/// What the registrations, the watcher's task and the value share.
struct Shared {
    path: PathBuf,
    conn: Arc<ConnQueue>,
    /// The value's waiters (weak: once the value is gone, its watch
    /// futures end and so do the registrations).
    watchers: Weak<Watchers>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Live registrations per work ID.
    watched: HashMap<WorkId, usize>,
    /// The watcher and its task, while anything is registered (and the
    /// watcher could be set up).
    running: Option<Running>,
    /// A failure to set up the watcher was logged at `warn` already.
    warned: bool,
}

/// A file watcher and the task that checks after its events; dropping it
/// stops both.
struct Running {
    _watcher: notify::RecommendedWatcher,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A watch future's interest in its work ID: while one lives, the file is
/// watched and its work ID read at each check.
pub(super) struct Registration {
    shared: Arc<Shared>,
    work_id: WorkId,
}

impl Push {
    /// Wake-ups for the store file at `path`, checked on `conn`, waking
    /// `watchers`; none when `enabled` is false.
    pub(super) fn new(
        enabled: bool,
        path: &Path,
        conn: &Arc<ConnQueue>,
        watchers: &Arc<Watchers>,
    ) -> Self {
        Self {
            shared: enabled.then(|| {
                Arc::new(Shared {
                    path: path.to_path_buf(),
                    conn: conn.clone(),
                    watchers: Arc::downgrade(watchers),
                    state: Mutex::new(State::default()),
                })
            }),
        }
    }

    /// Registers interest in `work_id` until the registration is dropped,
    /// starting the watcher when it is the first; `None` when wake-ups are
    /// off. Changes committed after this call returns are seen, since the
    /// watcher is set up before it returns.
    pub(super) fn register(&self, work_id: &WorkId) -> Option<Registration> {
        let shared = self.shared.as_ref()?;
        let mut state = lock(&shared.state);
        let first = state.watched.is_empty();
        *state.watched.entry(work_id.clone()).or_default() += 1;
        // Set up again only when the first registration comes (not at
        // every one while setting up fails).
        if first && state.running.is_none() {
            state.running = shared.start(&mut state.warned);
        }
        drop(state);
        Some(Registration {
            shared: shared.clone(),
            work_id: work_id.clone(),
        })
    }

    /// Whether the watcher runs now (for tests).
    #[cfg(test)]
    pub(super) fn is_running(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| lock(&s.state).running.is_some())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        if let Some(n) = state.watched.get_mut(&self.work_id) {
            *n -= 1;
            if *n == 0 {
                state.watched.remove(&self.work_id);
            }
        }
        if state.watched.is_empty() {
            let running = state.running.take();
            drop(state);
            drop(running);
        }
    }
}

impl Shared {
    /// Sets up the file watcher and starts its task; `None` (logged once
    /// at `warn`, then at `debug`) when it cannot be set up.
    fn start(self: &Arc<Self>, warned: &mut bool) -> Option<Running> {
        let runtime = match tokio::runtime::Handle::try_current() {
            Ok(r) => r,
            Err(_) => {
                tracing::debug!(path = %self.path.display(), "no tokio runtime: waiters poll for other processes' releases");
                return None;
            }
        };
        let dirty = Arc::new(Notify::new());
        let on_event = {
            let dirty = dirty.clone();
            move |event: notify::Result<notify::Event>| match event {
                // The signal (new timestamps: inotify's IN_ATTRIB), events
                // lost to a full queue (`Other`, rescan), or an error of
                // the watcher: check.
                Ok(notify::Event {
                    kind: EventKind::Modify(ModifyKind::Metadata(_)) | EventKind::Other,
                    ..
                })
                | Err(_) => dirty.notify_one(),
                // Opens, reads and writes (WAL checkpoints write the file
                // long after the commits they copy) tell nothing.
                Ok(_) => {}
            }
        };
        let watcher = notify::recommended_watcher(on_event).and_then(|mut w| {
            w.watch(&self.path, RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        match watcher {
            Ok(w) => {
                let stop = CancellationToken::new();
                runtime.spawn(checks(self.clone(), dirty, stop.clone()));
                Some(Running { _watcher: w, stop })
            }
            Err(e) => {
                if std::mem::replace(warned, true) {
                    tracing::debug!(path = %self.path.display(), error = %e, "cannot watch the database file: waiters poll for other processes' releases");
                } else {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot watch the database file (inotify limits: fs.inotify.max_user_instances, max_user_watches; or a file system without notifications): waiters learn of other processes' releases at their poll interval");
                }
                None
            }
        }
    }

    /// The work IDs registered now.
    fn watched(&self) -> Vec<WorkId> {
        lock(&self.state).watched.keys().cloned().collect()
    }
}

/// The watcher's task: one check after each burst of events, until
/// `stop`.
async fn checks(shared: Arc<Shared>, dirty: Arc<Notify>, stop: CancellationToken) {
    let mut seen = Seen::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = dirty.notified() => {}
        }
        let watched = shared.watched();
        if watched.is_empty() {
            continue;
        }
        let since = seen.version;
        let (tx, rx) = tokio::sync::oneshot::channel();
        shared.conn.push(Box::new(move |conn| {
            let started = std::time::Instant::now();
            let r = seen::read(conn, since, &watched);
            // The task may have stopped: then the answer is dropped.
            let _ = tx.send((watched, r, started.elapsed()));
        }));
        let Ok((watched, reading, took)) = rx.await else {
            return; // the runtime is shutting down
        };
        if stop.is_cancelled() {
            return;
        }
        let rest = took * CHECK_REST;
        if !wake(&shared, &mut seen, &watched, reading) {
            return; // the store value is gone
        }
        // Events meanwhile are kept by `dirty` (one permit).
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(rest) => {}
        }
    }
}

/// Wakes the waiters of the work IDs whose leases changed in `reading`
/// (see [`Seen::apply`]); false when the store value is gone.
fn wake(
    shared: &Shared,
    seen: &mut Seen,
    watched: &[WorkId],
    reading: rusqlite::Result<Option<(i64, seen::Reading)>>,
) -> bool {
    let (version, rows) = match reading {
        Ok(Some(r)) => r,
        Ok(None) => return true, // no other connection committed
        Err(e) => {
            tracing::debug!(path = %shared.path.display(), error = %e, "the wake-up check failed: waiters poll until the next change");
            return true;
        }
    };
    let woken = seen.apply(version, watched, &rows);
    let Some(watchers) = shared.watchers.upgrade() else {
        return false;
    };
    for id in &woken {
        tracing::debug!(work_id = %id, "another process changed the lease: waking its waiters");
        watchers.notify(id);
    }
    true
}

/// Tells other processes' watchers of the file at `path` that a commit
/// may have ended leases (see the module docs). Best effort: a failure
/// leaves their waiters to poll.
pub(super) fn signal(path: &Path) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let now = TimeSpec::UTIME_NOW;
    if let Err(e) = utimensat(None, path, &now, &now, UtimensatFlags::FollowSymlink) {
        tracing::debug!(path = %path.display(), error = %e, "cannot signal the release to other processes: their waiters poll");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::super::{SqliteStore, TokioClock};
    use crate::limits::HolderId;
    use crate::store::{LeaseRef, LeaseStore};

    const TTL: Duration = Duration::from_secs(60);

    fn id(s: &str) -> crate::limits::WorkId {
        crate::limits::WorkId::new(s).expect("work ID")
    }

    /// Two values on one file, as two processes would have: their own
    /// connections, their own watchers, one clock.
    fn two_values(dir: &tempfile::TempDir) -> (SqliteStore, SqliteStore) {
        let path = dir.path().join("leases.db");
        let clock = std::sync::Arc::new(TokioClock::new());
        let open = || SqliteStore::open_with_clock(&path, clock.clone()).expect("open");
        (open(), open())
    }

    /// A bound on one wake-up: far below any poll interval, and scaled by
    /// this machine's measured acquire + release round trips.
    async fn bound(store: &SqliteStore) -> Duration {
        let holder = HolderId::new("probe").expect("holder");
        let mut worst = Duration::ZERO;
        for _ in 0..5 {
            let started = std::time::Instant::now();
            let g = store
                .acquire(&id("probe"), &holder, TTL)
                .await
                .expect("acquire");
            let lease = LeaseRef {
                work_id: &id("probe"),
                holder_id: &holder,
                fencing_token: g.fencing_token,
            };
            store.release(lease).await.expect("release");
            worst = worst.max(started.elapsed());
        }
        Duration::from_millis(200) + worst * 20
    }

    /// Releases `lease` through `other` and checks that `woken` completes
    /// within `bound`.
    async fn release_wakes(
        other: &SqliteStore,
        lease: LeaseRef<'_>,
        woken: futures_util::future::BoxFuture<'static, ()>,
        bound: Duration,
    ) {
        let started = std::time::Instant::now();
        other.release(lease).await.expect("release");
        tokio::time::timeout(bound, woken)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the release of {} did not wake its waiter on another value within {bound:?}",
                    lease.work_id
                )
            });
        eprintln!(
            "{} woken {:?} after its release",
            lease.work_id,
            started.elapsed()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_value_wakes_on_release_not_on_renewal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (waiter, other) = two_values(&dir);
        let bound = bound(&other).await;
        let holder = HolderId::new("other").expect("holder");
        let (x, sentinel) = (id("x"), id("sentinel"));
        let gx = other.acquire(&x, &holder, TTL).await.expect("acquire x");
        let gs = other
            .acquire(&sentinel, &holder, TTL)
            .await
            .expect("acquire sentinel");
        let lease = |work_id, fencing_token| LeaseRef {
            work_id,
            holder_id: &holder,
            fencing_token,
        };
        assert!(!waiter.push.is_running(), "no watcher while nobody waits");
        let mut woken_x = waiter.watch(&x).expect("watch x");
        let woken_sentinel = waiter.watch(&sentinel).expect("watch sentinel");
        assert!(waiter.push.is_running(), "a watcher while someone waits");
        // Renewals and checkpoints of x by the other value; then it
        // releases the sentinel, whose wake-up comes from a check that
        // also read x after all of them.
        for _ in 0..5 {
            other
                .renew(lease(&x, gx.fencing_token), TTL)
                .await
                .expect("renew");
        }
        other
            .checkpoint(lease(&x, gx.fencing_token), TTL, "state".into())
            .await
            .expect("checkpoint");
        release_wakes(
            &other,
            lease(&sentinel, gs.fencing_token),
            woken_sentinel,
            bound,
        )
        .await;
        assert!(
            (&mut woken_x).now_or_never().is_none(),
            "renewals and a checkpoint of x woke its waiter"
        );
        release_wakes(&other, lease(&x, gx.fencing_token), woken_x, bound).await;
        assert!(
            !waiter.push.is_running(),
            "the watcher stops with its last waiter"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revocation_wakes_the_holders_watch_and_off_means_no_watcher() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (holder_value, operator) = two_values(&dir);
        let bound = bound(&operator).await;
        let holder = HolderId::new("holder").expect("holder");
        let x = id("x");
        holder_value
            .acquire(&x, &holder, TTL)
            .await
            .expect("acquire");
        let woken = holder_value.watch(&x).expect("watch");
        operator.revoke(&x).await.expect("revoke");
        tokio::time::timeout(bound, woken)
            .await
            .expect("a revocation by another value wakes the holder's watch");

        let off = operator.cross_process_wakeups(false);
        let _woken = off.watch(&x).expect("in-process wake-ups stay");
        assert!(!off.push.is_running(), "wake-ups turned off: no watcher");
    }
}
