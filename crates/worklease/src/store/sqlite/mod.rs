//! The embedded SQLite store: one file shared by many processes on one host.
//!
//! * **Atomicity.** Every operation that writes is one `BEGIN IMMEDIATE`
//!   transaction: read the row, decide with the shared lease rules, write,
//!   commit (a renewal of the current, live lease is one guarded `UPDATE`
//!   whose condition is those rules; any other renewal reads the row to
//!   name its error). The reads (`read_checkpoint`, `inspect`) are read
//!   transactions (WAL snapshots) with the clock read after the snapshot
//!   was taken: they neither wait for nor hold up other processes'
//!   writers, and `inspect` of named work IDs reads just those rows. A
//!   busy timeout (default 5 s) queues writers of other processes.
//! * **One connection per value, calls in order.** This value's calls run
//!   on its connection one after another in the order they came, drained
//!   by one blocking task at a time: a renewal waits behind the calls
//!   queued before it, never behind a crowd of blocking threads racing for
//!   the connection (a `worklease pool` starting thousands of children
//!   lost leases that way).
//! * **Clock.** Expiry is judged by the host's monotonic clock
//!   (`CLOCK_MONOTONIC`), stored with the boot ID
//!   (`/proc/sys/kernel/random/boot_id`). A wall-clock step changes
//!   nothing; a reboot expires every lease, since a row from another boot is
//!   expired. It is the clock holders judge their own deadlines by (Rust's
//!   and tokio's `Instant`), so the two agree also across a suspend, which
//!   neither counts: a suspended host's leases resume with the time they had
//!   left. (`CLOCK_BOOTTIME`, which counts a suspend, would let a contender
//!   take a lease its resumed holder still believes live.) See
//!   [`StoreClock`].
//! * **Fencing.** Tokens come from one sequence in the file, shared by all
//!   work IDs, committed with the acquisition (`synchronous = FULL`, so a
//!   power loss cannot roll back a token that was handed out). They survive
//!   process restarts and the deletion of a lease row.
//! * **Notifications.** Waiters on the same `SqliteStore` value as the
//!   releaser are woken at once. Waiters on other values (other processes,
//!   or a second value on the same file) are woken through the file: a
//!   release, batch release or revocation sets the database file's
//!   timestamps after its commit, and a value with waiters (or held leases
//!   under background renewal) watches the file ([`notify`]: inotify on
//!   Linux) while it has them, then checks on its connection whether
//!   another connection committed (`PRAGMA data_version`) and, if so,
//!   reads the watched work IDs' rows in one statement; it wakes the
//!   waiters of a lease whose fencing token or phase changed (released,
//!   revoked, taken), not of one that was only renewed. Bursts of events
//!   cost one check at a time, and checks take at most a fifth of the
//!   connection's time (a check of many watched leases rests the longer
//!   after it: 100,000 held leases are checked about every two seconds).
//!   A hand-off between processes takes a few
//!   milliseconds instead of a poll interval, and a revocation by
//!   `worklease release --force` reaches the holder's lost signal as fast.
//!   Waiters still poll as the fallback: for writers that do not signal
//!   (older versions, the `sqlite3` shell), and where the watcher cannot
//!   be set up (inotify limits, a file system without notifications;
//!   logged once at `warn`, never an error).
//!   [`SqliteStore::cross_process_wakeups`] turns the watching off. See
//!   `push.rs` for why the main file is watched and not the `-wal`. Share
//!   one value (in an `Arc`) per process: one connection, one watcher.
//! * **Cancellation.** A call whose future is dropped while it waits for
//!   the file's write lock is rolled back rather than committed, so an
//!   abandoned acquisition or renewal leaves no lease behind.
//! * **Batches.** [`LeaseStore::renew_many`], [`LeaseStore::acquire_many`]
//!   and [`LeaseStore::release_many`] are each ONE `BEGIN IMMEDIATE`
//!   transaction of at most [`MAX_BATCH`] (500) leases, in which every
//!   lease takes the step of its single call, with the statements prepared
//!   once for the batch, one clock reading (taken under the write lock) for
//!   all its leases, and one commit (one WAL `fsync`). Statements per
//!   lease: `renew_many` one guarded `UPDATE`, plus a `SELECT` for a lease
//!   that is not the current live one (to name its error); `acquire_many`,
//!   per work ID tried, a `SELECT` of the row and of the fencing sequence,
//!   and for a grant an `UPDATE` of the sequence and an upsert of the row,
//!   stopping once `max` are granted; `release_many` a `SELECT` and an
//!   upsert, and after the commit it wakes this value's waiters of each
//!   released lease, as `release` does. An empty batch opens no
//!   transaction. Every statement finds its row by the primary key
//!   (`work_id`), so no further index would help: the schema is unchanged. The limit comes from the write lock a batch holds:
//!   every other process's writer waits for the whole batch. Measured in a
//!   release build on a shared, busy 2-core VM, with 10,000 and 100,000
//!   leases in one file: `renew_many` of 500 takes 1.2–2.6 ms (median; up
//!   to 6 ms while other builds load the host), 3–5 µs CPU per lease,
//!   where a single `renew` costs 80–250 µs CPU and a commit;
//!   `acquire_many` and `release_many` of 500 take 4–9 ms, 6–8 µs CPU per
//!   lease. The slowest calls (15–40 ms, about one in fifty at 100,000
//!   leases) are those that also run SQLite's automatic WAL checkpoint
//!   after their commit, a passive one that other writers do not wait
//!   for. 500 keeps a batch within a few milliseconds; twice as many
//!   would halve the commits, a small part of the cost, and double the
//!   wait.
//!   A batch is all or nothing: `Held`, `Fenced`, `Expired` and a stored
//!   row that cannot be decoded are one lease's outcome, while a failure
//!   of SQLite itself (a failed statement, I/O, a full disk, the busy
//!   timeout, a replaced file, a caller that gave up) fails the whole call
//!   and rolls it back: nothing of it is written, and a failed
//!   `acquire_many` grants nothing and uses no fencing token. Not
//!   guaranteed: fairness between processes beyond SQLite's busy handler
//!   (a process sending batches back to back can delay another's writes,
//!   up to its busy timeout); and a batch is judged at its one clock
//!   reading, so a lease of a batch that runs 2 ms counts as unexpired
//!   for those 2 ms. No writer can tell (every writer waits for the
//!   batch), the holder's own deadline is earlier still, and only a
//!   reader (`status`) may see such a lease expired just before the batch
//!   commits its renewal.
//! * **The file stays the file.** Every transaction checks that the path
//!   still names the file opened (device and inode): a store whose file
//!   was deleted or replaced refuses every call, so its holders give up by
//!   their deadlines instead of renewing in a file nobody else sees while
//!   a fresh file restarts fencing tokens at 1. A hard-linked file is
//!   refused at open for the same reason.
//! * **File permissions.** Anyone who can write the file, or replace it or
//!   a directory on its way, can take or forge any lease in it. A new file
//!   is created with mode 0600 (SQLite gives its `-wal` and `-shm` files
//!   the main file's mode), and directories that `sqlite:` URLs create are
//!   0700. Opening fails with
//!   [`Error::UnsafeStoreFile`](crate::Error::UnsafeStoreFile), before
//!   anything is written, when a directory from `/` down to the file's
//!   (after symbolic links are resolved, and down to each symbolic link
//!   followed at the file's name too) is writable by every user and lacks
//!   the sticky bit, or is owned by another user than root or the
//!   effective one; when a symbolic link followed is another user's; when
//!   the file or one of its companions is owned by another user than the
//!   effective one, or a companion is a symbolic link; and when the path
//!   starts with `file:` (SQLite would read it as a URI). Directories are
//!   judged through handles opened one inside the other, and SQLite is
//!   given the canonical path. Root also accepts a file and directories
//!   owned by the owner of the file's directory (a service account's
//!   store, inspected with `sudo`), never one planted by another user in
//!   root's or a shared directory. A group-writable directory is accepted
//!   (its group is trusted). An existing file's mode is left as it is.
//!   Not guaranteed: a check of who may write, not of what they did; a
//!   trusted user (root, the owner) can still swap anything. See
//!   `perms.rs`.
//!
//! Not supported: more than one host (SQLite's locking over network file
//! systems is unreliable: use PostgreSQL, Redis or etcd), platforms
//! without a boot ID (Linux and Android have one), and SQLite URIs
//! (`file:...`, refused) or in-memory databases (`:memory:`, refused; the
//! `memory:` store is the in-memory one): the path is a plain file path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::{Result, StoreError};
use crate::store::notify::Watchers;
#[cfg(doc)]
use crate::store::LeaseStore;

mod batch;
mod clock;
mod file;
mod ops;
mod path;
mod perms;
mod push;
mod queue;
mod row;
#[cfg(feature = "fuzzing")]
pub(crate) use row::{fuzz_row, Columns as RowColumns};
mod schema;
mod seen;

pub use batch::MAX_BATCH;
pub use clock::{BootClock, ClockReading, StoreClock, TokioClock};
pub use schema::SCHEMA_VERSION;

use file::FileIdentity;
use schema::migrate;

const KIND: &str = "sqlite";

/// The embedded SQLite store. See the module docs for its guarantees and
/// what it does not support.
pub struct SqliteStore {
    /// The connection and the calls queued for it.
    conn: Arc<queue::ConnQueue>,
    clock: Arc<dyn StoreClock>,
    path: PathBuf,
    file: FileIdentity,
    /// This value's waiters, woken by its own releases and by [`push`].
    watchers: Arc<Watchers>,
    /// Wake-ups by other processes' releases.
    push: push::Push,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

/// How long a call waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

fn db_err(context: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::with_source(KIND, context.to_string(), e)
}

impl SqliteStore {
    /// Opens (creating if needed, with mode 0600) the store file at `path`
    /// with the [`BootClock`]. The parent directory must exist.
    ///
    /// # Errors
    /// [`Error::UnsafeStoreFile`](crate::Error::UnsafeStoreFile), with
    /// nothing written, when another local user could write or replace the
    /// file: a directory from `/` down to it (or to a symbolic link
    /// followed) is writable by every user without the sticky bit, or is
    /// owned by another user than root or the effective one; the file, a
    /// symbolic link followed, or one of its `-wal`, `-shm`, `-journal`
    /// companions is owned by another user; a companion is a symbolic link;
    /// or `path` starts with `file:`, which SQLite would read as a URI (see
    /// "File permissions" in the module docs). A [`StoreError`] when the
    /// file cannot be opened or created, a directory on its way changed
    /// while it was checked, its schema is newer than this code's
    /// [`SCHEMA_VERSION`], or the clock cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with_clock(path, Arc::new(BootClock::new()?))
    }

    /// Opens the store file at `path`, judging expiry by `clock`.
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub fn open_with_clock(path: impl AsRef<Path>, clock: Arc<dyn StoreClock>) -> Result<Self> {
        let given = path.as_ref();
        let text = given.to_string_lossy();
        // A plain file: none of SQLite's special names.
        if text.is_empty() || text == ":memory:" {
            return Err(StoreError::new(
                KIND,
                format!("{text:?} is not a file path: the SQLite store needs a file that processes share"),
            )
            .into());
        }
        if crate::store::url_parts::starts_with_file_scheme(&text) {
            return Err(crate::Error::UnsafeStoreFile {
                path: given.to_path_buf(),
                reason: crate::store::url_parts::URI_REFUSED.to_string(),
            });
        }
        let checked = perms::prepare(given)?;
        // The canonical path: absolute, so SQLite never reads it as a URI
        // (which could turn locking off or open an in-memory database).
        let path = checked.path().to_path_buf();
        let shown = path.display().to_string();
        let at = |what: &str| format!("{what} {shown:?}");
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(&path, flags)
            .map_err(db_err(&at("cannot open the database file")))?;
        checked.recheck()?;
        let file = checked.identity;
        // Another name for the same file (a hard link) would have its own
        // WAL and lock files: two stores on one table, no exclusion.
        {
            use std::os::unix::fs::MetadataExt;
            let links = std::fs::metadata(&path)
                .map_err(|e| StoreError::with_source(KIND, at("cannot read the metadata of"), e))?
                .nlink();
            if links > 1 {
                return Err(StoreError::new(
                    KIND,
                    format!("{} has {links} hard links: processes using different names would not exclude each other; use one name", at("the database")),
                )
                .into());
            }
        }
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(db_err(&at("cannot set the busy timeout on")))?;
        // Switching to WAL takes an exclusive lock that the busy timeout
        // does not wait for: retry while other processes open the same new
        // file. WAL is persistent in the file, so this is a one-time race.
        let started = std::time::Instant::now();
        let mode = loop {
            match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
                Err(e) if is_busy(&e) && started.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => break other.map_err(db_err(&at("cannot switch to WAL mode:")))?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::new(
                KIND,
                format!(
                    "{} stays in journal mode {mode:?}, not WAL",
                    at("the database")
                ),
            )
            .into());
        }
        // WAL mode made SQLite create (or open) the `-wal` and `-shm` files.
        checked.recheck()?;
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(db_err(&at("cannot set pragmas on")))?;
        migrate(&mut conn, &shown)?;
        // `rarray()`, for the wake-up check's one statement.
        rusqlite::vtab::array::load_module(&conn)
            .map_err(db_err(&at("cannot load the array module on")))?;
        clock.now()?;
        let conn = queue::ConnQueue::new(conn);
        let watchers = Arc::new(Watchers::default());
        Ok(Self {
            push: push::Push::new(true, &path, &conn, &watchers),
            conn,
            clock,
            path,
            file,
            watchers,
        })
    }

    /// Turns this value's wake-ups by other processes' releases on (the
    /// default) or off. Off, its waiters learn of a release or revocation
    /// made through another value (another process) only at their next
    /// poll, and a held lease's revocation at its next renewal, as with a
    /// store that has no notifications; its own releases still wake its
    /// own waiters at once, and still signal other processes. For
    /// comparisons (the benchmark's polling rows) and tests; see
    /// "Notifications" in the module docs.
    #[must_use]
    pub fn cross_process_wakeups(mut self, on: bool) -> Self {
        self.push = push::Push::new(on, &self.path, &self.conn, &self.watchers);
        self
    }

    /// The file this store uses: its canonical path (absolute, symbolic
    /// links resolved), which may differ from the path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireOptions, Config, Leases};
    use std::sync::Mutex;

    /// A clock whose epoch can be changed, as a reboot changes the boot ID.
    struct RebootableClock {
        inner: TokioClock,
        epoch: Mutex<String>,
    }

    impl StoreClock for RebootableClock {
        fn now(&self) -> Result<ClockReading, StoreError> {
            let mut r = self.inner.now()?;
            r.epoch = self
                .epoch
                .lock()
                .map_err(|_| StoreError::new(KIND, "poisoned"))?
                .clone();
            Ok(r)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fencing_survives_restart_and_reboot_expires_leases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leases.db");
        let clock = Arc::new(RebootableClock {
            inner: TokioClock::new(),
            epoch: Mutex::new("boot-1".into()),
        });
        let ttl = Duration::from_secs(3600);
        let first = {
            let store = Arc::new(SqliteStore::open_with_clock(&path, clock.clone()).expect("open"));
            let leases = Leases::new(store, Config::new("a", ttl)).expect("config");
            let t = leases
                .acquire("job", AcquireOptions::new())
                .await
                .expect("acquire");
            leases
                .checkpoint(&t, &b"progress"[..])
                .await
                .expect("checkpoint");
            t.fencing_token()
        }; // the process ends without releasing
        let store = Arc::new(SqliteStore::open_with_clock(&path, clock.clone()).expect("reopen"));
        let b = Leases::new(store.clone(), Config::new("b", ttl)).expect("config");
        assert!(
            matches!(
                b.acquire("job", AcquireOptions::new()).await,
                Err(crate::Error::Held { .. })
            ),
            "a restart of a process does not end its lease"
        );
        *clock.epoch.lock().expect("lock") = "boot-2".into(); // the host reboots
        let t = b
            .acquire("job", AcquireOptions::new())
            .await
            .expect("a reboot expires every lease");
        assert!(t.fencing_token() > first, "S2 across a restart");
        let c = b.read_checkpoint(&t).await.expect("read");
        assert_eq!(c.data.as_deref(), Some(&b"progress"[..]));
        assert!(!c.clean_handoff());
        // Deleting the row by hand does not reset the fencing sequence.
        let (tx, rx) = tokio::sync::oneshot::channel();
        store.conn.push(Box::new(move |c| {
            let _ = tx.send(c.execute("DELETE FROM worklease_leases", []));
        }));
        rx.await.expect("the connection").expect("delete");
        let t2 = b
            .acquire("job", AcquireOptions::new())
            .await
            .expect("acquire");
        assert!(
            t2.fencing_token() > t.fencing_token(),
            "S2 after a deleted row"
        );
    }
}
