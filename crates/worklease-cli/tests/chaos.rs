//! Chaos against real processes: several `worklease run` holders wait for
//! one work ID on a real store (SQLite always; PostgreSQL and Redis from
//! `WORKLEASE_TEST_POSTGRES_URL` and `WORKLEASE_TEST_REDIS_URL`, defaults
//! as in the library's `tests/postgres.rs` and `tests/redis.rs`, with a
//! table or key prefix per run), while the test SIGKILLs holders and
//! pauses others (SIGSTOP of the holder and its child's process group for
//! twice the TTL, then SIGCONT of the holder alone).
//!
//! The child of each holder is this test binary again (the `chaos_child`
//! entry, selected by `WORKLEASE_CHAOS_SINK`). It reads the checkpoint it
//! inherits with `worklease checkpoint get --json`, then loops: append a
//! `(fencing token, sequence)` record to a sink through a fenced write,
//! then save `token:sequence` with `worklease checkpoint set`. The fenced
//! writes:
//!
//! * SQLite: a SQLite file of the test, appended in an `IMMEDIATE`
//!   transaction only if the token is at least the highest one recorded;
//! * PostgreSQL: [`PostgresStore::fenced_transaction`] (the lease row is
//!   locked and checked) around an `INSERT ... SELECT ... WHERE token >=
//!   max(token)` into a table of the test;
//! * Redis: one Lua script that appends to a list only if the token is at
//!   least the highest one recorded.
//!
//! Every child writes what it did to a journal (one line per event, with
//! `CLOCK_MONOTONIC` times, shared by all processes of the host). After the
//! run the test checks: no record was accepted from a stale token (tokens
//! never go back in the sink's order); no two holders wrote in overlapping
//! time; every acknowledged checkpoint was seen by the next holder (or a
//! later one replaced it); every hand-off said how the previous lease
//! ended (expired after a fault, released at the end); each paused holder
//! exited 76 with its child killed before it wrote again; each killed
//! holder's child died with it. After each fault, the test replays a write
//! with the superseded token: the sink must reject it.
//!
//! The fault schedule comes from a seed (printed; `WORKLEASE_CHAOS_SEED`
//! replays it); the processes' own timing is the machine's. The stores run
//! one after the other, each in about 15 s. PostgreSQL and Redis must
//! answer (`.ci/services/` makes sure they do).

mod common;
use common::{group_stopped, poll_until, process_gone, stopped, BIN, LONG};

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use worklease::store::postgres::{FencedTransactionError, PostgresStore};
use worklease::Token;

/// Selects the child role, and names the sink kind (`sqlite`, `postgres`,
/// `redis`).
const SINK_KIND: &str = "WORKLEASE_CHAOS_SINK";
/// The sink's place: the SQLite file, the lease store's PostgreSQL URL, or
/// the Redis URL.
const SINK_AT: &str = "WORKLEASE_CHAOS_SINK_AT";
/// The sink's name: the PostgreSQL table or the Redis key prefix.
const SINK_NAME: &str = "WORKLEASE_CHAOS_SINK_NAME";
/// Replays a fault schedule.
const SEED: &str = "WORKLEASE_CHAOS_SEED";

/// The lease TTL of every holder.
const TTL: Duration = Duration::from_secs(1);
/// How often a waiting holder tries again.
const POLL: &str = "50ms";
/// How many holders run at once.
const HOLDERS: usize = 3;
/// How many holders are SIGKILLed per store.
const KILLS: usize = 5;
/// How many holders are paused per store.
const PAUSES: usize = 3;
/// The pause between a child's iterations.
const PACE: Duration = Duration::from_millis(10);

/// One store at a time: the machine's cores are few, and the faults are
/// timed against the TTL.
static SERIAL: Mutex<()> = Mutex::new(());

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process of the
/// host.
fn mono_ns() -> i64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

// ---------------------------------------------------------------------
// The fenced sinks.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
    Redis,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::Redis => "redis",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "sqlite" => Kind::Sqlite,
            "postgres" => Kind::Postgres,
            "redis" => Kind::Redis,
            other => panic!("unknown sink {other:?}"),
        }
    }
}

/// One accepted record, in the sink's order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    token: u64,
    seq: u64,
    at_ns: i64,
    holder: String,
}

/// Appends to the Redis list `KEYS[2]` only if the token `ARGV[1]` is at
/// least the highest one recorded (`KEYS[1]`).
const REDIS_APPEND: &str = r"
local high = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < high then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1";

/// A connection to a fenced sink.
enum Sink {
    Sqlite(rusqlite::Connection),
    Postgres {
        store: Box<PostgresStore>,
        table: String,
    },
    Redis {
        conn: redis::aio::MultiplexedConnection,
        high: String,
        records: String,
    },
}

impl Sink {
    /// Opens the sink `kind` at `at` named `name`.
    async fn open(kind: Kind, at: &str, name: &str) -> Self {
        match kind {
            Kind::Sqlite => {
                let conn = rusqlite::Connection::open(at).expect("open the sink file");
                conn.busy_timeout(Duration::from_secs(10))
                    .expect("busy timeout");
                Sink::Sqlite(conn)
            }
            Kind::Postgres => Sink::Postgres {
                store: Box::new(PostgresStore::from_url(at).expect("lease store URL")),
                table: name.to_string(),
            },
            Kind::Redis => Sink::Redis {
                conn: redis::Client::open(at)
                    .expect("Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("the test Redis server answers (see WORKLEASE_TEST_REDIS_URL)"),
                high: format!("{name}chaos:high"),
                records: format!("{name}chaos:records"),
            },
        }
    }

    /// Creates the sink's table (SQLite, PostgreSQL).
    async fn create(&mut self) {
        match self {
            Sink::Sqlite(conn) => conn
                .execute_batch(
                    "CREATE TABLE records (id INTEGER PRIMARY KEY, token INTEGER NOT NULL, \
                     seq INTEGER NOT NULL, at_ns INTEGER NOT NULL, holder TEXT NOT NULL)",
                )
                .expect("create the sink table"),
            Sink::Postgres { store, table } => {
                store
                    .initialize()
                    .await
                    .expect("the test PostgreSQL server answers (see WORKLEASE_TEST_POSTGRES_URL)");
                let client = store.pool().get().await.expect("connection");
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {table} (id bigserial PRIMARY KEY, token bigint NOT NULL, \
                         seq bigint NOT NULL, at_ns bigint NOT NULL, holder text NOT NULL)"
                    ))
                    .await
                    .expect("create the sink table");
            }
            Sink::Redis { .. } => {}
        }
    }

    /// Appends `(token, seq)` for `holder` if the fence lets it: `Ok(true)`
    /// when accepted, `Ok(false)` when rejected as stale, `Err` when the
    /// sink failed (nothing was written).
    async fn write(&mut self, token: &Token, seq: u64) -> Result<bool, String> {
        let (t, holder) = (token.fencing_token(), token.holder_id().to_string());
        let t_sql = i64::try_from(t).map_err(|e| e.to_string())?;
        let seq_sql = i64::try_from(seq).map_err(|e| e.to_string())?;
        match self {
            Sink::Sqlite(conn) => {
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| e.to_string())?;
                let high: i64 = tx
                    .query_row("SELECT COALESCE(MAX(token), 0) FROM records", [], |r| {
                        r.get(0)
                    })
                    .map_err(|e| e.to_string())?;
                if t_sql < high {
                    return Ok(false);
                }
                tx.execute(
                    "INSERT INTO records (token, seq, at_ns, holder) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![t_sql, seq_sql, mono_ns(), holder],
                )
                .map_err(|e| e.to_string())?;
                tx.commit().map_err(|e| e.to_string())?;
                Ok(true)
            }
            Sink::Postgres { store, table } => {
                let sql = format!(
                    "INSERT INTO {table} (token, seq, at_ns, holder) \
                     SELECT $1, $2, $3, $4 \
                     WHERE $1 >= (SELECT COALESCE(MAX(token), 0) FROM {table})"
                );
                let written = store
                    .fenced_transaction(token, move |tx| {
                        Box::pin(async move {
                            tx.execute(&sql, &[&t_sql, &seq_sql, &mono_ns(), &holder])
                                .await
                        })
                    })
                    .await;
                match written {
                    Ok(n) => Ok(n == 1),
                    Err(FencedTransactionError::Lease(e)) if e.is_lease_lost() => Ok(false),
                    Err(e) => Err(format!("{e}: {:?}", std::error::Error::source(&e))),
                }
            }
            Sink::Redis {
                conn,
                high,
                records,
            } => {
                let accepted: i64 = redis::Script::new(REDIS_APPEND)
                    .key(high.as_str())
                    .key(records.as_str())
                    .arg(t)
                    .arg(format!("{t} {seq} {} {holder}", mono_ns()))
                    .invoke_async(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(accepted == 1)
            }
        }
    }

    /// Every accepted record, in the sink's order.
    async fn records(&mut self) -> Vec<Record> {
        match self {
            Sink::Sqlite(conn) => {
                let mut stmt = conn
                    .prepare("SELECT token, seq, at_ns, holder FROM records ORDER BY id")
                    .expect("prepare");
                let rows = stmt
                    .query_map([], |r| {
                        Ok(Record {
                            token: r.get::<_, i64>(0)? as u64,
                            seq: r.get::<_, i64>(1)? as u64,
                            at_ns: r.get(2)?,
                            holder: r.get(3)?,
                        })
                    })
                    .expect("query");
                rows.collect::<Result<_, _>>().expect("rows")
            }
            Sink::Postgres { store, table } => {
                let client = store.pool().get().await.expect("connection");
                client
                    .query(
                        &format!("SELECT token, seq, at_ns, holder FROM {table} ORDER BY id"),
                        &[],
                    )
                    .await
                    .expect("read the sink")
                    .iter()
                    .map(|r| Record {
                        token: r.get::<_, i64>(0) as u64,
                        seq: r.get::<_, i64>(1) as u64,
                        at_ns: r.get(2),
                        holder: r.get(3),
                    })
                    .collect()
            }
            Sink::Redis { conn, records, .. } => {
                let lines: Vec<String> = redis::cmd("LRANGE")
                    .arg(records.as_str())
                    .arg(0)
                    .arg(-1)
                    .query_async(conn)
                    .await
                    .expect("read the sink");
                lines
                    .iter()
                    .map(|l| {
                        let f: Vec<&str> = l.split(' ').collect();
                        Record {
                            token: f[0].parse().expect("token"),
                            seq: f[1].parse().expect("seq"),
                            at_ns: f[2].parse().expect("at"),
                            holder: f[3].to_string(),
                        }
                    })
                    .collect()
            }
        }
    }

    /// Removes what the run wrote on a server (PostgreSQL tables and the
    /// fencing sequence, Redis keys); a SQLite sink goes with its
    /// directory.
    async fn remove(&mut self) {
        match self {
            Sink::Sqlite(_) => {}
            Sink::Postgres { store, table } => {
                let client = store.pool().get().await.expect("connection");
                client
                    .batch_execute(&format!(
                        "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {}; \
                         DROP SEQUENCE IF EXISTS {}",
                        store.table().quoted(),
                        store.table().sequence_quoted()
                    ))
                    .await
                    .expect("drop the test tables");
            }
            Sink::Redis { conn, high, .. } => {
                let prefix = high.trim_end_matches("chaos:high");
                let mut keys: Vec<String> = Vec::new();
                {
                    let mut scan = redis::AsyncCommands::scan_match(conn, format!("{prefix}*"))
                        .await
                        .expect("list the test keys");
                    while let Some(key) = scan.next_item().await {
                        keys.push(key.expect("list the test keys"));
                    }
                }
                if !keys.is_empty() {
                    redis::cmd("UNLINK")
                        .arg(keys)
                        .exec_async(conn)
                        .await
                        .expect("delete the test keys");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------
// The child.

/// Appends one line to the journal in one write (lines of concurrent
/// writers do not interleave).
fn journal(line: &str) {
    let path = Path::new(&std::env::var("D").expect("$D")).join("journal.log");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the journal");
    f.write_all(format!("{line}\n").as_bytes())
        .expect("write the journal");
}

/// `T:S` as `(T, S)`.
fn parse_pair(s: &str) -> Option<(u64, u64)> {
    let (t, q) = s.split_once(':')?;
    Some((t.parse().ok()?, q.parse().ok()?))
}

/// The child's role: not a test of its own (it returns at once unless
/// `WORKLEASE_CHAOS_SINK` is set, as only `worklease run` children of the
/// tests below have it).
#[test]
fn chaos_child() {
    let Ok(kind) = std::env::var(SINK_KIND) else {
        return;
    };
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(child(Kind::parse(&kind)));
    std::process::exit(code);
}

async fn child(kind: Kind) -> i32 {
    let text = std::env::var("WORKLEASE_TOKEN").expect("WORKLEASE_TOKEN");
    let token: Token = text.parse().expect("token");
    let t = token.fencing_token();
    let dir = PathBuf::from(std::env::var("D").expect("$D"));

    // What the previous holders left.
    let got = Command::new(BIN)
        .args(["checkpoint", "get", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run worklease checkpoint get");
    if !got.status.success() {
        eprintln!(
            "chaos child {t}: checkpoint get failed: {}",
            String::from_utf8_lossy(&got.stderr)
        );
        return 70;
    }
    let json: serde_json::Value = serde_json::from_slice(&got.stdout).expect("JSON");
    let prior = json["checkpoint_text"].as_str().unwrap_or("-").to_string();
    let (prev_token, prev_end) = match json["previous_holder"].as_object() {
        Some(p) => (
            p["fencing_token"].as_u64().expect("token").to_string(),
            p["ended"].as_str().expect("ended").to_string(),
        ),
        None => ("-".to_string(), "-".to_string()),
    };
    journal(&format!(
        "start {} {t} {} {prior} {prev_token} {prev_end} {} {text}",
        token.holder_id(),
        std::process::id(),
        mono_ns()
    ));

    let at = std::env::var(SINK_AT).expect("sink place");
    let name = std::env::var(SINK_NAME).unwrap_or_default();
    let mut sink = Sink::open(kind, &at, &name).await;
    let mut seq = 0;
    loop {
        if dir.join("stop").exists() {
            journal(&format!("stop {t}"));
            return 0;
        }
        seq += 1;
        match sink.write(&token, seq).await {
            Ok(true) => {}
            Ok(false) => {
                journal(&format!("rejected {t} {seq}"));
                return 3;
            }
            Err(e) => {
                eprintln!("chaos child {t}: the sink failed: {e}");
                seq -= 1;
                tokio::time::sleep(PACE).await;
                continue;
            }
        }
        let set = Command::new(BIN)
            .args(["checkpoint", "set", &format!("{t}:{seq}")])
            .stdin(Stdio::null())
            .output()
            .expect("run worklease checkpoint set");
        match set.status.code() {
            Some(0) => journal(&format!("ack {t} {seq}")),
            Some(76) => {
                journal(&format!("lost {t} {seq}"));
                return 76;
            }
            other => eprintln!(
                "chaos child {t}: checkpoint set exited {other:?}: {}",
                String::from_utf8_lossy(&set.stderr)
            ),
        }
        tokio::time::sleep(PACE).await;
    }
}

// ---------------------------------------------------------------------
// The journal, read back.

/// A child's start.
#[derive(Debug, Clone)]
struct Start {
    holder: String,
    token: u64,
    pid: i32,
    /// The checkpoint it read.
    prior: Option<(u64, u64)>,
    /// The previous acquisition's token and how it ended.
    previous: Option<(u64, String)>,
    text: String,
}

#[derive(Debug, Default)]
struct Journal {
    starts: Vec<Start>,
    /// Acknowledged checkpoints `(token, seq)`.
    acks: Vec<(u64, u64)>,
    /// Writes the sink rejected, by token.
    rejected: Vec<(u64, u64)>,
    /// Tokens whose child stopped at the end of the run (its holder then
    /// released).
    stopped: std::collections::BTreeSet<u64>,
    /// Lines per token.
    lines: BTreeMap<u64, usize>,
}

fn read_journal(dir: &Path) -> Journal {
    let text = std::fs::read_to_string(dir.join("journal.log")).unwrap_or_default();
    let mut j = Journal::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let token: u64 = f[if f[0] == "start" { 2 } else { 1 }]
            .parse()
            .expect("token");
        *j.lines.entry(token).or_default() += 1;
        match f[0] {
            "start" => j.starts.push(Start {
                holder: f[1].to_string(),
                token,
                pid: f[3].parse().expect("pid"),
                prior: parse_pair(f[4]),
                previous: f[5].parse().ok().map(|p| (p, f[6].to_string())),
                text: f[8].to_string(),
            }),
            "ack" => j.acks.push((token, f[2].parse().expect("seq"))),
            "rejected" => j.rejected.push((token, f[2].parse().expect("seq"))),
            "stop" => {
                j.stopped.insert(token);
            }
            _ => {}
        }
    }
    j
}

// ---------------------------------------------------------------------
// The run.

/// A `worklease run` holder; killed and reaped if the test ends early.
struct Holder {
    id: String,
    proc: Child,
}

impl Holder {
    fn pid(&self) -> i32 {
        i32::try_from(self.proc.id()).expect("pid")
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// How a holder's lease ended, as far as the test made it end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Killed,
    Paused,
}

struct Run {
    kind: Kind,
    dir: tempfile::TempDir,
    store_url: String,
    sink_at: String,
    sink_name: String,
    rt: tokio::runtime::Runtime,
    sink: Sink,
    holders: Vec<Holder>,
    started: usize,
    /// Tokens whose lease a fault ended.
    fates: BTreeMap<u64, Fate>,
    /// Holders that exited on their own during the run (ID, status).
    exits: Vec<(String, Option<i32>)>,
    probes_rejected: usize,
    /// Pauses during which a successor's child started.
    taken_over_while_paused: usize,
}

impl Run {
    fn new(kind: Kind) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // Connection tasks must run between the test's calls: a PostgreSQL
        // transaction dropped by a rejected probe is rolled back by the
        // connection's task, and until then it holds the lease row.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let tag = format!("{:08x}", rand::random::<u32>());
        let (store_url, sink_at, sink_name) = match kind {
            Kind::Sqlite => (
                format!("sqlite:{}", dir.path().join("leases.db").display()),
                dir.path().join("sink.db").display().to_string(),
                String::new(),
            ),
            Kind::Postgres => {
                let base = env_url(
                    "WORKLEASE_TEST_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                let url = with_param(&base, &format!("table=wl_test_chaos_{tag}"));
                (url.clone(), url, format!("wl_test_chaos_sink_{tag}"))
            }
            Kind::Redis => {
                let base = env_url("WORKLEASE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0");
                let prefix = format!("worklease-test:chaos-{tag}:");
                (with_param(&base, &format!("prefix={prefix}")), base, prefix)
            }
        };
        let mut sink = rt.block_on(Sink::open(kind, &sink_at, &sink_name));
        rt.block_on(sink.create());
        Self {
            kind,
            dir,
            store_url,
            sink_at,
            sink_name,
            rt,
            sink,
            holders: Vec::new(),
            started: 0,
            fates: BTreeMap::new(),
            exits: Vec::new(),
            probes_rejected: 0,
            taken_over_while_paused: 0,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts one more `worklease run --wait` holder.
    fn spawn_holder(&mut self, work_id: &str) {
        self.started += 1;
        let id = format!("h{}", self.started);
        let log = std::fs::File::create(self.path(&format!("{id}.log"))).expect("log");
        let exe = std::env::current_exe().expect("this test binary");
        let proc = Command::new(BIN)
            .args(["run", "--ttl", &format!("{}ms", TTL.as_millis())])
            .args(["--wait", "--poll", POLL, "--holder", &id, work_id, "--"])
            .arg(exe)
            .args(["chaos_child", "--exact", "--nocapture", "--quiet"])
            .env_remove("WORKLEASE_TOKEN")
            .env_remove("RUST_LOG")
            .env("WORKLEASE_STORE", &self.store_url)
            .env("D", self.dir.path())
            .env(SINK_KIND, self.kind.name())
            .env(SINK_AT, &self.sink_at)
            .env(SINK_NAME, &self.sink_name)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start worklease run");
        self.holders.push(Holder { id, proc });
    }

    fn holder_index(&self, id: &str) -> usize {
        self.holders
            .iter()
            .position(|h| h.id == id)
            .unwrap_or_else(|| panic!("no running holder {id}"))
    }

    /// Notes and replaces the holders that exited on their own.
    fn reap_unexpected(&mut self, work_id: &str) {
        let mut i = 0;
        while i < self.holders.len() {
            if let Some(status) = self.holders[i].proc.try_wait().expect("try_wait") {
                let h = self.holders.remove(i);
                eprintln!(
                    "chaos {}: holder {} exited on its own with {status:?}; its log:\n{}",
                    self.kind.name(),
                    h.id,
                    std::fs::read_to_string(self.path(&format!("{}.log", h.id)))
                        .unwrap_or_default()
                );
                self.exits.push((h.id.clone(), status.code()));
                self.spawn_holder(work_id);
            } else {
                i += 1;
            }
        }
    }

    /// Waits for the child of the next lease: a start with a token above
    /// `after`.
    fn next_start(&mut self, after: u64, work_id: &str) -> Start {
        let mut found = None;
        let dir = self.dir.path().to_path_buf();
        let end = Instant::now() + LONG;
        while found.is_none() {
            self.reap_unexpected(work_id);
            found = read_journal(&dir)
                .starts
                .into_iter()
                .filter(|s| s.token > after)
                .max_by_key(|s| s.token);
            assert!(
                found.is_some() || Instant::now() < end,
                "no holder took the lease over within {LONG:?}"
            );
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        found.expect("found")
    }

    /// Waits until the sink has a record of `token`.
    fn wait_for_record(&mut self, token: u64) {
        let (rt, sink) = (&self.rt, &mut self.sink);
        assert!(
            poll_until(LONG, || rt
                .block_on(sink.records())
                .iter()
                .any(|r| r.token == token)),
            "the holder with token {token} wrote nothing within {LONG:?}"
        );
    }

    /// Replays a write with a superseded token: the sink must reject it.
    fn probe(&mut self, stale: &Start) {
        let token: Token = stale.text.parse().expect("token");
        let accepted = self
            .rt
            .block_on(self.sink.write(&token, u64::MAX >> 1))
            .expect("the sink answers");
        assert!(
            !accepted,
            "the sink accepted a write with the superseded token {}",
            stale.token
        );
        self.probes_rejected += 1;
    }

    fn kill_holder(&mut self, start: &Start) {
        let mut h = self.holders.remove(self.holder_index(&start.holder));
        kill(Pid::from_raw(h.pid()), Signal::SIGKILL).expect("SIGKILL");
        h.proc.wait().expect("reap");
        assert!(
            poll_until(LONG, || process_gone(start.pid)),
            "the child of the killed holder {} still runs",
            start.holder
        );
        self.fates.insert(start.token, Fate::Killed);
    }

    fn pause_holder(&mut self, start: &Start) {
        let i = self.holder_index(&start.holder);
        let pid = self.holders[i].pid();
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP holder");
        killpg(Pid::from_raw(start.pid), Signal::SIGSTOP).expect("SIGSTOP child group");
        assert!(
            poll_until(LONG, || stopped(pid) && group_stopped(start.pid)),
            "holder {pid} or child {} did not stop",
            start.pid
        );
        let stopped_at = mono_ns();
        let lines = read_journal(self.dir.path()).lines[&start.token];
        std::thread::sleep(TTL * 2);
        // Usually a successor's child runs by now; not when a stopped
        // process holds a lock the others need (the SQLite store's write
        // lock, a fenced PostgreSQL transaction's lock on the lease row)
        // until the holder, continued, kills its child's group.
        if read_journal(self.dir.path())
            .starts
            .iter()
            .any(|s| s.token > start.token)
        {
            self.taken_over_while_paused += 1;
        }
        kill(Pid::from_raw(pid), Signal::SIGCONT).expect("SIGCONT holder");
        let mut h = self.holders.remove(i);
        let end = Instant::now() + LONG;
        let status = loop {
            if let Some(status) = h.proc.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < end, "the continued holder did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        let log = std::fs::read_to_string(self.path(&format!("{}.log", h.id))).unwrap_or_default();
        assert_eq!(status.code(), Some(76), "holder {}: {log}", h.id);
        assert!(log.contains("SIGKILL"), "holder {}: {log}", h.id);
        assert!(
            poll_until(LONG, || process_gone(start.pid)),
            "the paused child {} still runs",
            start.pid
        );
        // It wrote nothing after it was stopped: not in the sink, not in
        // the journal.
        let late: Vec<Record> = self
            .rt
            .block_on(self.sink.records())
            .into_iter()
            .filter(|r| r.token == start.token && r.at_ns > stopped_at)
            .collect();
        assert!(late.is_empty(), "the paused child wrote {late:?}");
        assert_eq!(
            read_journal(self.dir.path()).lines[&start.token],
            lines,
            "the paused child did something after it was continued"
        );
        self.fates.insert(start.token, Fate::Paused);
    }
}

fn env_url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// Runs the chaos over one store and checks the outcome.
fn chaos(kind: Kind) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let began = Instant::now();
    let seed = std::env::var(SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!(
        "chaos {}: seed {seed} (set {SEED}={seed} to replay the fault schedule)",
        kind.name()
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan: Vec<Fate> = std::iter::repeat_n(Fate::Killed, KILLS)
        .chain(std::iter::repeat_n(Fate::Paused, PAUSES))
        .collect();
    plan.shuffle(&mut rng);

    let mut run = Run::new(kind);
    let work_id = "chaos";
    for _ in 0..HOLDERS {
        run.spawn_holder(work_id);
    }
    let mut current = run.next_start(0, work_id);
    for fault in plan {
        run.wait_for_record(current.token);
        // The fault strikes at a random instant of the holder's work.
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..=800)));
        match fault {
            Fate::Killed => run.kill_holder(&current),
            Fate::Paused => run.pause_holder(&current),
        }
        run.spawn_holder(work_id);
        let next = run.next_start(current.token, work_id);
        run.wait_for_record(next.token);
        run.probe(&current);
        current = next;
    }

    // The end: every child stops at its next step, and every holder exits
    // 0 in turn, each releasing to the next.
    std::fs::write(run.path("stop"), b"").expect("touch stop");
    let end = Instant::now() + LONG;
    for mut h in std::mem::take(&mut run.holders) {
        let status = loop {
            if let Some(status) = h.proc.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < end,
                "holder {} did not finish; its log:\n{}\njournal:\n{}",
                h.id,
                std::fs::read_to_string(run.path(&format!("{}.log", h.id))).unwrap_or_default(),
                std::fs::read_to_string(run.path("journal.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let log = std::fs::read_to_string(run.path(&format!("{}.log", h.id))).unwrap_or_default();
        assert_eq!(status.code(), Some(0), "holder {}: {log}", h.id);
    }

    let records = run.rt.block_on(run.sink.records());
    let journal = read_journal(run.dir.path());
    check(&run, &records, &journal);

    let tokens: std::collections::BTreeSet<u64> = records.iter().map(|r| r.token).collect();
    let killed = run.fates.values().filter(|f| **f == Fate::Killed).count();
    let paused = run.fates.values().filter(|f| **f == Fate::Paused).count();
    eprintln!(
        "chaos {}: {} holders killed, {} paused (each exited 76, its child killed before it \
         wrote again; a successor had started during {} of the pauses), {} exited on their \
         own; {} records written by {} holders, 0 accepted from a stale token; stale records \
         rejected: {} (writes replayed with superseded tokens) + {} (from children); {} \
         checkpoints acknowledged, {} hand-offs checked; {:.1}s",
        kind.name(),
        killed,
        paused,
        run.taken_over_while_paused,
        run.exits.len(),
        records.len(),
        tokens.len(),
        run.probes_rejected,
        journal.rejected.len(),
        journal.acks.len(),
        journal.starts.len(),
        began.elapsed().as_secs_f64()
    );
    assert_eq!(killed, KILLS);
    assert_eq!(paused, PAUSES);
    run.rt.block_on(run.sink.remove());
}

/// The checks after a run.
fn check(run: &Run, records: &[Record], journal: &Journal) {
    assert!(!records.is_empty(), "nothing was written");

    // No record accepted from a stale token: in the sink's order, tokens
    // never go back.
    let mut high = 0;
    for r in records {
        assert!(
            r.token >= high,
            "record {r:?} was accepted after token {high}"
        );
        high = r.token;
    }
    // No writer was stale: a child that tried to write after its lease
    // passed to another would have been rejected.
    assert!(
        journal.rejected.is_empty(),
        "children wrote with stale tokens: {:?}",
        journal.rejected
    );

    // No two holders wrote in overlapping time: each token's writes lie
    // between the previous token's last and the next token's first.
    let mut spans: BTreeMap<u64, (i64, i64, &str)> = BTreeMap::new();
    for r in records {
        let span = spans
            .entry(r.token)
            .or_insert((r.at_ns, r.at_ns, r.holder.as_str()));
        assert_eq!(span.2, r.holder, "one token, two holders: {r:?}");
        span.0 = span.0.min(r.at_ns);
        span.1 = span.1.max(r.at_ns);
    }
    let spans: Vec<(u64, (i64, i64, &str))> = spans.into_iter().collect();
    for pair in spans.windows(2) {
        let ((t1, (_, last1, h1)), (t2, (first2, _, h2))) = (pair[0], pair[1]);
        assert!(
            last1 < first2,
            "{h1} (token {t1}) wrote until {last1} ns, after {h2} (token {t2}) began writing at \
             {first2} ns"
        );
    }

    // Every acknowledged checkpoint was seen by its successor: a child read
    // at least the newest checkpoint acknowledged under an older token,
    // and what it read was written under an older token, by a record the
    // sink accepted.
    let accepted: std::collections::BTreeSet<(u64, u64)> =
        records.iter().map(|r| (r.token, r.seq)).collect();
    for s in &journal.starts {
        let newest_acked = journal
            .acks
            .iter()
            .filter(|(t, _)| *t < s.token)
            .max()
            .copied();
        if let Some(acked) = newest_acked {
            let prior = s.prior.unwrap_or_else(|| {
                panic!(
                    "{} (token {}) read no checkpoint after {acked:?} was acknowledged",
                    s.holder, s.token
                )
            });
            assert!(
                prior >= acked,
                "{} (token {}) read {prior:?}, older than the acknowledged {acked:?}",
                s.holder,
                s.token
            );
        }
        if let Some(prior) = s.prior {
            assert!(
                prior.0 < s.token,
                "{s:?} read a checkpoint of its own token"
            );
            assert!(
                accepted.contains(&prior),
                "{s:?} read a checkpoint whose record the sink never accepted"
            );
        }
        // The hand-off tells how the previous lease ended.
        if let Some((prev, ended)) = &s.previous {
            assert!(*prev < s.token, "{s:?}");
            if run.fates.contains_key(prev) {
                assert_eq!(
                    ended, "expired",
                    "{s:?}: the previous holder was killed or paused"
                );
            }
            if journal.stopped.contains(prev) {
                assert_eq!(
                    ended, "released",
                    "{s:?}: the previous child stopped at the end"
                );
            }
        }
    }
}

#[test]
fn chaos_over_sqlite() {
    chaos(Kind::Sqlite);
}

#[test]
fn chaos_over_postgres() {
    chaos(Kind::Postgres);
}

#[test]
fn chaos_over_redis() {
    chaos(Kind::Redis);
}
