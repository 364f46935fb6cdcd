//! The embedded SQLite store: one file shared by many processes on one host.
//!
//! * **Atomicity.** Every operation is one `BEGIN IMMEDIATE` transaction:
//!   read the row, decide with the shared lease rules, write, commit. WAL
//!   mode lets readers (`status`) run beside a writer; a busy timeout
//!   (default 5 s) queues writers of other processes.
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
//!   releaser are woken at once; waiters on other values (other processes,
//!   or a second value on the same file) poll, since SQLite has no
//!   cross-process notification. Share one value (in an `Arc`) per process.
//! * **Cancellation.** A call whose future is dropped while it waits for
//!   the file's write lock is rolled back rather than committed, so an
//!   abandoned acquisition or renewal leaves no lease behind.
//! * **The file stays the file.** Every transaction checks that the path
//!   still names the file opened (device and inode): a store whose file
//!   was deleted or replaced refuses every call, so its holders give up by
//!   their deadlines instead of renewing in a file nobody else sees while
//!   a fresh file restarts fencing tokens at 1. A hard-linked file is
//!   refused at open for the same reason.
//!
//! Not supported: more than one host (SQLite's locking over network file
//! systems is unreliable: use PostgreSQL, Redis or etcd), platforms
//! without a boot ID (Linux and Android have one), and SQLite URIs or
//! in-memory databases: the path is a plain file path.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::notify::Watchers;
use crate::store::record::{self, Phase, Record};
use crate::store::{Checkpoint, Grant, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder};

const KIND: &str = "sqlite";

/// The schema version this code writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// A reading of a store clock: milliseconds since an epoch, and the epoch's
/// identity. Readings of different epochs cannot be compared: a lease
/// stamped in another epoch counts as expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockReading {
    /// Identifies the epoch (for [`BootClock`], the boot ID).
    pub epoch: String,
    /// Milliseconds since the epoch began.
    pub millis: u64,
}

/// The clock a [`SqliteStore`] judges expiry by. It must be monotonic within
/// an epoch and shared by every process using the file.
pub trait StoreClock: Send + Sync + 'static {
    /// The current reading.
    ///
    /// # Errors
    /// A [`StoreError`] when the clock cannot be read.
    fn now(&self) -> Result<ClockReading, StoreError>;
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`) with the boot ID as
/// epoch: the default. Immune to wall-clock steps, shared by every process
/// of the host, and the clock of the holders' own deadlines (see the module
/// docs on suspend).
#[derive(Debug, Clone)]
pub struct BootClock {
    boot_id: String,
}

impl BootClock {
    /// Reads the boot ID.
    ///
    /// # Errors
    /// A [`StoreError`] when `/proc/sys/kernel/random/boot_id` cannot be
    /// read (not Linux, or `/proc` not mounted).
    pub fn new() -> Result<Self, StoreError> {
        let path = "/proc/sys/kernel/random/boot_id";
        let boot_id = std::fs::read_to_string(path).map_err(|e| {
            StoreError::with_source(KIND, format!("cannot read the boot ID from {path}"), e)
        })?;
        Ok(Self {
            boot_id: boot_id.trim().to_string(),
        })
    }
}

impl StoreClock for BootClock {
    fn now(&self) -> Result<ClockReading, StoreError> {
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map_err(|e| StoreError::with_source(KIND, "cannot read CLOCK_MONOTONIC", e))?;
        Ok(ClockReading {
            epoch: self.boot_id.clone(),
            millis: ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000,
        })
    }
}

/// A clock on tokio's [`tokio::time::Instant`], for tests with a paused
/// clock in ONE process (its epoch is random per instance, so another
/// process sees every lease it stamps as expired).
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: tokio::time::Instant,
    epoch: String,
}

impl TokioClock {
    /// A clock starting at zero now.
    pub fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
            epoch: format!("tokio-{:016x}", rand::random::<u64>()),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreClock for TokioClock {
    fn now(&self) -> Result<ClockReading, StoreError> {
        Ok(ClockReading {
            epoch: self.epoch.clone(),
            millis: self.base.elapsed().as_millis() as u64,
        })
    }
}

/// The embedded SQLite store. See the module docs for its guarantees and
/// what it does not support.
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    clock: Arc<dyn StoreClock>,
    path: PathBuf,
    file: FileIdentity,
    watchers: Watchers,
}

/// The device and inode of the database file as opened.
///
/// Every transaction checks that the path still names this file. If the
/// file was deleted (or replaced) under a running store, this process
/// would go on renewing leases in a file nobody else can open, while a new
/// process creates a fresh file at the path whose fencing tokens start
/// again at 1: two holders with one fencing token. Refusing every
/// operation instead makes the holders' renewals fail, so they give up by
/// their deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Fails unless `path` still names this file.
    fn check(&self, path: &Path) -> Result<()> {
        match Self::of(path) {
            Ok(now) if now == *self => Ok(()),
            Ok(_) => Err(StoreError::new(
                KIND,
                format!(
                    "the database file {:?} was replaced while this store had it open: refusing to go on \
                     (its leases and fencing tokens are not the ones this store holds); restart with the new file",
                    path.display()
                ),
            )
            .into()),
            Err(e) => Err(StoreError::with_source(
                KIND,
                format!(
                    "the database file {:?} is gone (deleted while this store had it open?): refusing to go on, \
                     since a new file there would start fencing tokens again at 1",
                    path.display()
                ),
                e,
            )
            .into()),
        }
    }
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

/// Marks a blocking transaction abandoned when the future awaiting it is
/// dropped (or has finished: the flag is then read by nobody).
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn db_err(context: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::with_source(KIND, context.to_string(), e)
}

impl SqliteStore {
    /// Opens (creating if needed) the store file at `path` with the
    /// [`BootClock`]. The parent directory must exist.
    ///
    /// # Errors
    /// A [`StoreError`] when the file cannot be opened or created, its schema
    /// is newer than this code's [`SCHEMA_VERSION`], or the clock cannot be
    /// read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with_clock(path, Arc::new(BootClock::new()?))
    }

    /// Opens the store file at `path`, judging expiry by `clock`.
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub fn open_with_clock(path: impl AsRef<Path>, clock: Arc<dyn StoreClock>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let at = |what: &str| format!("{what} {shown:?}");
        // A plain file: no URI parsing (which could turn locking off or
        // open an in-memory database), and none of SQLite's special names.
        if shown.is_empty() || shown == ":memory:" {
            return Err(StoreError::new(
                KIND,
                format!("{shown:?} is not a file path: the SQLite store needs a file that processes share"),
            )
            .into());
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(&path, flags)
            .map_err(db_err(&at("cannot open the database file")))?;
        // Another name for the same file (a hard link) would have its own
        // WAL and lock files: two stores on one table, no exclusion.
        let file = FileIdentity::of(&path)
            .map_err(|e| StoreError::with_source(KIND, at("cannot read the metadata of"), e))?;
        #[cfg(unix)]
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
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(db_err(&at("cannot set pragmas on")))?;
        migrate(&mut conn, &shown)?;
        clock.now()?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            clock,
            path,
            file,
            watchers: Watchers::default(),
        })
    }

    /// The file this store uses.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one IMMEDIATE transaction on a blocking thread, with the
    /// clock read after the write lock was taken.
    ///
    /// If the caller's future is dropped before the transaction commits
    /// (an abandoned acquisition, a renewal past its deadline), the
    /// transaction is rolled back: the blocking thread cannot be stopped,
    /// but it checks before committing.
    async fn tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        let clock = self.clock.clone();
        let (path, file) = (self.path.clone(), self.file);
        let abandoned = Arc::new(AtomicBool::new(false));
        let _guard = AbandonOnDrop(abandoned.clone());
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().map_err(|_| {
                StoreError::new(KIND, "connection lock poisoned by an earlier panic")
            })?;
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db_err("cannot begin a transaction"))?;
            // Under the write lock: the file every other process writes.
            file.check(&path)?;
            let now = clock.now()?;
            let out = f(&tx, &now)?;
            if abandoned.load(Ordering::SeqCst) {
                // Dropping `tx` rolls back.
                return Err(StoreError::new(KIND, "the caller gave up: rolled back").into());
            }
            tx.commit().map_err(db_err("cannot commit"))?;
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::with_source(KIND, "store task failed", e))?
    }

    /// Runs `f` on the current, live row of `lease` and writes the row back
    /// when `write` is set.
    async fn update_current<T: Send + 'static>(
        &self,
        lease: LeaseRef<'_>,
        write: bool,
        f: impl FnOnce(&mut Row, &ClockReading) -> T + Send + 'static,
    ) -> Result<T> {
        let work_id = lease.work_id.clone();
        let holder_id = lease.holder_id.clone();
        let fencing_token = lease.fencing_token;
        self.tx(move |tx, now| {
            let lease = LeaseRef {
                work_id: &work_id,
                holder_id: &holder_id,
                fencing_token,
            };
            let Some(mut row) = load(tx, &work_id)? else {
                return Err(record::fenced(lease));
            };
            record::check_current(Some(&row.record), lease, row.unexpired(now))?;
            let out = f(&mut row, now);
            if write {
                save(tx, &work_id, &row)?;
            }
            Ok(out)
        })
        .await
    }
}

fn migrate(conn: &mut Connection, shown: &str) -> Result<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err("cannot begin the schema transaction"))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(db_err("cannot read the schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::new(
            KIND,
            format!(
                "{shown:?} has schema version {version}: newer than this worklease's {SCHEMA_VERSION} \
                 (upgrade worklease), or not a worklease database"
            ),
        )
        .into());
    }
    if version < 1 {
        // Refuse to add our tables to another application's database.
        let foreign: Option<String> = tx
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name NOT IN ('worklease_sequence', 'worklease_leases') LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err("cannot read the schema"))?;
        if let Some(table) = foreign {
            return Err(StoreError::new(
                KIND,
                format!("{shown:?} is not a worklease database (it has a table {table:?}): use a file of its own"),
            )
            .into());
        }
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS worklease_sequence (
                 name  TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );
             INSERT OR IGNORE INTO worklease_sequence (name, value) VALUES ('fencing_token', 0);
             CREATE TABLE IF NOT EXISTS worklease_leases (
                 work_id            TEXT PRIMARY KEY,
                 holder_id          TEXT NOT NULL,
                 fencing_token      INTEGER NOT NULL,
                 ttl_ms             INTEGER NOT NULL,
                 phase              TEXT NOT NULL,
                 clock_epoch        TEXT NOT NULL,
                 expires_clock_ms   INTEGER NOT NULL,
                 expires_at_unix_ms INTEGER NOT NULL,
                 checkpoint         BLOB,
                 prev_holder_id     TEXT,
                 prev_fencing_token INTEGER,
                 prev_end           TEXT
             );
             PRAGMA user_version = 1;",
        )
        .map_err(db_err("cannot create the schema"))?;
    }
    tx.commit().map_err(db_err("cannot commit the schema"))?;
    Ok(())
}

/// A lease row: the shared record plus its expiry on the store clock.
struct Row {
    record: Record,
    clock_epoch: String,
    expires_clock_ms: u64,
    expires_at_unix_ms: u64,
}

impl Row {
    fn unexpired(&self, now: &ClockReading) -> bool {
        self.clock_epoch == now.epoch && self.expires_clock_ms > now.millis
    }

    fn remaining(&self, now: &ClockReading) -> Option<Duration> {
        self.unexpired(now)
            .then(|| Duration::from_millis(self.expires_clock_ms - now.millis))
    }

    fn extend(&mut self, now: &ClockReading, ttl: Duration) -> SystemTime {
        self.record.ttl_ms = crate::limits::ceil_millis(ttl);
        self.clock_epoch = now.epoch.clone();
        // The reading is truncated to the millisecond: the true now may be
        // up to 1 ms later. Rounding up keeps the store's expiry at or after
        // the holder's deadline (send time + TTL - margin).
        self.expires_clock_ms = now.millis + 1 + self.record.ttl_ms;
        let wall = SystemTime::now() + ttl;
        self.expires_at_unix_ms = crate::token::unix_millis(wall);
        wall
    }

    fn end_now(&mut self, now: &ClockReading, phase: Phase) {
        self.record.phase = phase;
        self.expires_clock_ms = now.millis;
        self.expires_at_unix_ms = crate::token::unix_millis(SystemTime::now());
    }

    fn info(&self, work_id: WorkId, now: &ClockReading) -> LeaseInfo {
        let live = self.record.is_live(self.unexpired(now));
        LeaseInfo {
            work_id,
            holder_id: self.record.holder_id.clone(),
            fencing_token: self.record.fencing_token,
            expires_at: match self.remaining(now) {
                Some(left) => SystemTime::now() + left,
                None => SystemTime::UNIX_EPOCH + Duration::from_millis(self.expires_at_unix_ms),
            },
            expires_in: if live { self.remaining(now) } else { None },
            expired: !live,
            released: self.record.phase == Phase::Released,
            ended: (!live).then(|| self.record.end()),
            checkpoint_bytes: self.record.checkpoint.as_ref().map_or(0, Bytes::len),
            handoff: self.record.handoff(),
        }
    }
}

macro_rules! columns {
    () => {
        "holder_id, fencing_token, ttl_ms, phase, clock_epoch, expires_clock_ms, \
         expires_at_unix_ms, checkpoint, prev_holder_id, prev_fencing_token, prev_end"
    };
}
const SELECT_ONE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM worklease_leases WHERE work_id = ?1"
);
const SELECT_ALL: &str = concat!(
    "SELECT work_id, ",
    columns!(),
    " FROM worklease_leases ORDER BY work_id"
);
const UPSERT: &str = concat!(
    "INSERT OR REPLACE INTO worklease_leases (work_id, ",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
);
const READ_SEQUENCE: &str = "SELECT value FROM worklease_sequence WHERE name = 'fencing_token'";
const WRITE_SEQUENCE: &str =
    "UPDATE worklease_sequence SET value = ?1 WHERE name = 'fencing_token'";

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, what.to_string(), rusqlite::types::Type::Text)
}

fn row_from(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Row> {
    let phase: String = r.get(at + 3)?;
    let prev_holder: Option<String> = r.get(at + 8)?;
    let prev_token: Option<i64> = r.get(at + 9)?;
    let prev_end: Option<String> = r.get(at + 10)?;
    let previous = match (prev_holder, prev_token, prev_end) {
        (Some(holder_id), Some(t), Some(end)) => Some(PreviousHolder {
            holder_id,
            fencing_token: t as u64,
            ended: LeaseEnd::from_str(&end).ok_or_else(|| corrupt("prev_end"))?,
        }),
        _ => None,
    };
    let checkpoint: Option<Vec<u8>> = r.get(at + 7)?;
    Ok(Row {
        record: Record {
            holder_id: r.get(at)?,
            fencing_token: r.get::<_, i64>(at + 1)? as u64,
            ttl_ms: r.get::<_, i64>(at + 2)? as u64,
            phase: Phase::parse(&phase).ok_or_else(|| corrupt("phase"))?,
            checkpoint: checkpoint.map(Bytes::from),
            previous,
        },
        clock_epoch: r.get(at + 4)?,
        expires_clock_ms: r.get::<_, i64>(at + 5)? as u64,
        expires_at_unix_ms: r.get::<_, i64>(at + 6)? as u64,
    })
}

fn load(tx: &rusqlite::Transaction<'_>, work_id: &WorkId) -> Result<Option<Row>> {
    let mut stmt = tx
        .prepare_cached(SELECT_ONE)
        .map_err(db_err("cannot read the lease"))?;
    Ok(stmt
        .query_row(params![work_id.as_str()], |r| row_from(r, 0))
        .optional()
        .map_err(db_err("cannot read the lease"))?)
}

fn save(tx: &rusqlite::Transaction<'_>, work_id: &WorkId, row: &Row) -> Result<()> {
    let r = &row.record;
    let prev = r.previous.as_ref();
    let mut stmt = tx
        .prepare_cached(UPSERT)
        .map_err(db_err("cannot write the lease"))?;
    stmt.execute(params![
        work_id.as_str(),
        r.holder_id,
        r.fencing_token as i64,
        r.ttl_ms as i64,
        r.phase.as_str(),
        row.clock_epoch,
        row.expires_clock_ms as i64,
        row.expires_at_unix_ms as i64,
        r.checkpoint.as_deref(),
        prev.map(|p| p.holder_id.as_str()),
        prev.map(|p| p.fencing_token as i64),
        prev.map(|p| p.ended.as_str()),
    ])
    .map_err(db_err("cannot write the lease"))?;
    Ok(())
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let (work_id, holder_id) = (work_id.clone(), holder_id.clone());
        self.tx(move |tx, now| {
            let current = load(tx, &work_id)?;
            let last: i64 = tx
                .prepare_cached(READ_SEQUENCE)
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(db_err("cannot read the fencing sequence"))?;
            // max() guards against a sequence row edited by hand.
            let next =
                (last as u64).max(current.as_ref().map_or(0, |r| r.record.fencing_token)) + 1;
            let record = record::acquire(
                current.as_ref().map(|r| &r.record),
                current.as_ref().is_some_and(|r| r.unexpired(now)),
                &work_id,
                &holder_id,
                crate::limits::ceil_millis(ttl),
                next,
                current.as_ref().and_then(|r| r.remaining(now)),
            )?;
            tx.prepare_cached(WRITE_SEQUENCE)
                .and_then(|mut s| s.execute(params![next as i64]))
                .map_err(db_err("cannot advance the fencing sequence"))?;
            let mut row = Row {
                record,
                clock_epoch: String::new(),
                expires_clock_ms: 0,
                expires_at_unix_ms: 0,
            };
            let expires_at = row.extend(now, ttl);
            save(tx, &work_id, &row)?;
            Ok(Grant {
                fencing_token: next,
                expires_at,
                handoff: row.record.handoff(),
            })
        })
        .await
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.update_current(lease, true, move |row, now| row.extend(now, ttl))
            .await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.update_current(lease, true, move |row, now| {
            row.record.checkpoint = Some(data);
            row.extend(now, ttl)
        })
        .await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.update_current(lease, false, |row, _| record::read(&row.record))
            .await
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.update_current(lease, true, |row, now| row.end_now(now, Phase::Released))
            .await?;
        self.watchers.notify(lease.work_id);
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let work_ids = work_ids.to_vec();
        self.tx(move |tx, now| {
            let mut stmt = tx
                .prepare_cached(SELECT_ALL)
                .map_err(db_err("cannot list leases"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, row_from(r, 1)?)))
                .map_err(db_err("cannot list leases"))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, row) = row.map_err(db_err("cannot read a lease row"))?;
                let id = WorkId::new(id)
                    .map_err(|e| StoreError::with_source(KIND, "a stored work ID is invalid", e))?;
                if work_ids.is_empty() || work_ids.contains(&id) {
                    out.push(row.info(id, now));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let id = work_id.clone();
        let before = self
            .tx(move |tx, now| {
                let Some(mut row) = load(tx, &id)? else {
                    return Ok(None);
                };
                let before = row.info(id.clone(), now);
                if row.record.is_live(row.unexpired(now)) {
                    row.end_now(now, Phase::Revoked);
                    save(tx, &id, &row)?;
                }
                Ok(Some(before))
            })
            .await?;
        self.watchers.notify(work_id);
        Ok(before)
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.watchers.watch(work_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireOptions, Config, Leases};

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
        store
            .conn
            .lock()
            .expect("lock")
            .execute("DELETE FROM worklease_leases", [])
            .expect("delete");
        let t2 = b
            .acquire("job", AcquireOptions::new())
            .await
            .expect("acquire");
        assert!(
            t2.fencing_token() > t.fencing_token(),
            "S2 after a deleted row"
        );
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leases.db");
        Connection::open(&path)
            .expect("open")
            .execute_batch("PRAGMA user_version = 99")
            .expect("set version");
        let e = SqliteStore::open_with_clock(&path, Arc::new(TokioClock::new())).unwrap_err();
        assert!(e.to_string().contains("schema version 99"), "{e}");
    }

    #[test]
    fn boot_clock_reads_boot_time() {
        let clock = BootClock::new().expect("Linux has a boot ID");
        let a = clock.now().expect("read");
        let b = clock.now().expect("read");
        assert_eq!(a.epoch, b.epoch);
        assert!(b.millis >= a.millis && a.millis > 0);
    }
}
