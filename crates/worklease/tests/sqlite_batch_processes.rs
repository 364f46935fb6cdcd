//! Two OS processes on one SQLite file: one holds a set of work IDs and
//! renews them in batches (`renew_many`, stale tokens included), abandons
//! some and releases others in batches; the other takes single work IDs
//! as they come free. No work ID ever has two holders (S1), and its
//! fencing tokens increase with its acquisitions (S2).
//!
//! The parent test starts two copies of this test binary running
//! `child_batch_or_single` (a no-op unless `WORKLEASE_TEST_BATCH_CHILD`
//! is set). Each child appends one line per event, each with one `write`
//! on an `O_APPEND` file (atomic on a local file system), stamped with
//! `CLOCK_MONOTONIC`, which every process of the host shares:
//! `<event> <work ID> <token> <holder> <now ms> <deadline ms>`, the
//! deadline being the token's own (the holder stops counting the lease as
//! its own then). A token's holding runs from its `acquired` line to the
//! earlier of its `releasing` line and its last deadline; the holdings of
//! one work ID's tokens must not overlap.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use worklease::store::sqlite::SqliteStore;
use worklease::{AcquireOptions, Config, Error, Leases, Token};

const WORK_IDS: usize = 6;
const TTL: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(4);

fn mono_ms() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000
}

struct Log(std::fs::File);

impl Log {
    fn event(&mut self, event: &str, t: &Token) {
        let now = mono_ms();
        let until = now + t.remaining().unwrap_or_default().as_millis() as u64;
        let line = format!(
            "{event} {} {} {} {now} {until}\n",
            t.work_id(),
            t.fencing_token(),
            t.holder_id()
        );
        self.0.write_all(line.as_bytes()).expect("log");
    }
}

/// Holds what it can get of the work IDs, renewing in batches every
/// 20–150 ms; abandons one lease now and then, and sends its token in the
/// batches again from a random moment half a TTL to two TTLs later (by
/// then it may have expired, or been taken by the other process); releases
/// a few in batches.
async fn batch_holder(leases: Leases, ids: Vec<String>, log: &mut Log) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let end = Instant::now() + RUN;
    let mut live: Vec<Token> = Vec::new();
    // Abandoned tokens, each with the moment it is sent again.
    let mut stale: Vec<(Token, Instant)> = Vec::new();
    while Instant::now() < end {
        let free: Vec<&String> = ids
            .iter()
            .filter(|id| !live.iter().any(|t| t.work_id().as_str() == id.as_str()))
            .filter(|id| {
                !stale
                    .iter()
                    .any(|(t, _)| t.work_id().as_str() == id.as_str())
            })
            .collect();
        for t in leases
            .acquire_many(free, WORK_IDS)
            .await
            .expect("acquire_many")
        {
            log.event("acquired", &t);
            live.push(t);
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..150))).await;
        let now = Instant::now();
        let (resent, waiting): (Vec<_>, Vec<_>) = stale.drain(..).partition(|(_, at)| *at <= now);
        stale = waiting;
        let batch: Vec<Token> = live
            .drain(..)
            .chain(resent.into_iter().map(|(t, _)| t))
            .collect();
        let outcomes = leases.renew_many(&batch).await.expect("renew_many");
        for (old, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Ok(t) => {
                    log.event("renewed", &t);
                    live.push(t);
                }
                Err(Error::Fenced { .. }) => log.event("fenced", &old),
                Err(Error::Expired { .. }) => {}
                Err(e) => panic!("renew_many: {e}"),
            }
        }
        if !live.is_empty() && rng.gen_bool(0.3) {
            let t = live.swap_remove(rng.gen_range(0..live.len()));
            stale.push((t, Instant::now() + TTL.mul_f64(rng.gen_range(0.5..2.0))));
        }
        if live.len() > 2 && rng.gen_bool(0.2) {
            let gone: Vec<Token> = live.drain(..2).collect();
            for t in &gone {
                log.event("releasing", t);
            }
            leases.release_many(gone).await.expect("release_many");
        }
    }
    for t in &live {
        log.event("releasing", t);
    }
    leases.release_many(live).await.expect("release_many");
}

/// Takes single work IDs as they come free, holds each briefly (one
/// renewal) and releases it.
async fn single_taker(leases: Leases, ids: Vec<String>, log: &mut Log) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let end = Instant::now() + RUN;
    while Instant::now() < end {
        let id = &ids[rng.gen_range(0..ids.len())];
        match leases.acquire(id, AcquireOptions::new()).await {
            Ok(t) => {
                log.event("acquired", &t);
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..30))).await;
                let t = leases.renew(&t).await.expect("renew a lease just taken");
                log.event("renewed", &t);
                log.event("releasing", &t);
                leases.release(t).await.expect("release");
            }
            Err(Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("acquire: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_batch_or_single() {
    let Ok(dir) = std::env::var("WORKLEASE_TEST_BATCH_CHILD") else {
        return; // run as an ordinary test: nothing to do
    };
    let dir = PathBuf::from(dir);
    let role = std::env::var("WORKLEASE_TEST_BATCH_ROLE").expect("role");
    let store = Arc::new(SqliteStore::open(dir.join("leases.db")).expect("open"));
    let leases = Leases::new(store, Config::new(role.clone(), TTL)).expect("config");
    let mut log = Log(std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("log"))
        .expect("log"));
    let ids: Vec<String> = (0..WORK_IDS).map(|i| format!("batch-job-{i}")).collect();
    match role.as_str() {
        "batch" => batch_holder(leases, ids, &mut log).await,
        _ => single_taker(leases, ids, &mut log).await,
    }
}

/// One token's holding: from its acquisition to its release or its last
/// deadline.
struct Holding {
    holder: String,
    start: u64,
    until: u64,
    released: Option<u64>,
}

#[test]
fn batch_renewals_and_single_acquisitions_never_give_two_holders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = ["batch", "single"]
        .iter()
        .map(|role| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_batch_or_single",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("WORKLEASE_TEST_BATCH_CHILD", dir.path())
                .env("WORKLEASE_TEST_BATCH_ROLE", role)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success(), "a child process failed");
    }
    let log = std::fs::read_to_string(dir.path().join("log")).expect("log");
    // work ID -> token -> holding
    let mut ids: BTreeMap<String, BTreeMap<u64, Holding>> = BTreeMap::new();
    let mut fenced = 0;
    for line in log.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        let [event, id, token, holder, now, until] = p[..] else {
            panic!("a torn log line {line:?}:\n{log}");
        };
        let (token, now, until): (u64, u64, u64) = (
            token.parse().expect("token"),
            now.parse().expect("now"),
            until.parse().expect("until"),
        );
        let tokens = ids.entry(id.to_string()).or_default();
        match event {
            "acquired" => {
                let prev = tokens.insert(
                    token,
                    Holding {
                        holder: holder.to_string(),
                        start: now,
                        until,
                        released: None,
                    },
                );
                assert!(
                    prev.is_none(),
                    "S2: token {token} of {id} granted twice:\n{log}"
                );
            }
            "renewed" | "releasing" => {
                let h = tokens
                    .get_mut(&token)
                    .unwrap_or_else(|| panic!("{line:?} before its acquisition:\n{log}"));
                assert_eq!(h.holder, holder, "{line:?}: another holder's token:\n{log}");
                if event == "renewed" {
                    h.until = h.until.max(until);
                } else {
                    h.released = Some(now);
                }
            }
            "fenced" => fenced += 1,
            other => panic!("unknown event {other:?}:\n{log}"),
        }
    }
    let mut holders = std::collections::HashSet::new();
    for (id, tokens) in &ids {
        let mut prev: Option<(u64, &Holding)> = None;
        for (&token, h) in tokens {
            holders.insert(h.holder.as_str());
            if let Some((pt, p)) = prev {
                let end = p.released.map_or(p.until, |r| r.min(p.until));
                assert!(
                    end <= h.start,
                    "S1: {id}: token {pt} ({}) held until {end}, token {token} ({}) from {}:\n{log}",
                    p.holder,
                    h.holder,
                    h.start
                );
                assert!(
                    p.start <= h.start,
                    "S2: {id}: token {token} was acquired before token {pt}:\n{log}"
                );
            }
            prev = Some((token, h));
        }
    }
    assert_eq!(holders.len(), 2, "both processes held leases:\n{log}");
    assert!(
        fenced > 0,
        "no stale token was refused in a batch (the check did not exercise a takeover):\n{log}"
    );
}
