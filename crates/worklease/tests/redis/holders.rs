//! Holders under a failover (shared by the Sentinel and Cluster failover
//! tests): 4 holders take turns on 2 work IDs, renewing and
//! checkpointing, and record what they saw; the figures count overlapping
//! holders, fencing tokens gone back and acknowledged checkpoints lost.
//! (A module of `tests/redis_topologies.rs`.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use worklease::store::redis::RedisStore;
use worklease::store::LeaseRef;
use worklease::{Error, HolderId, LeaseStore, WorkId};

/// The `w`-th work ID of the holders.
pub(crate) fn work_id(w: usize) -> WorkId {
    WorkId::new(format!("jobs/failover-{w}")).expect("work")
}

pub(crate) const HOLDERS: usize = 4;
/// Renewals and checkpoints per term, one every TTL / 40: a term outlasts
/// its TTL, so a holder cut off by the failover believes in its lease
/// until its last acknowledged extension runs out.
const ROUNDS: u64 = 60;
/// The work IDs the holders take turns on.
pub(crate) const WORK_IDS: usize = 2;

/// One acquisition as its holder saw it: from the grant to the moment
/// it stopped believing in it (its release, or its last acknowledged
/// extension plus the TTL).
#[derive(Debug, Clone)]
struct Term {
    work: usize,
    token: u64,
    from: Instant,
    until: Instant,
}

/// What the holders saw.
#[derive(Default)]
struct Seen {
    terms: Vec<Term>,
    /// Per work ID: the newest acknowledged checkpoint (token, sequence).
    acked: HashMap<usize, (u64, u64)>,
    /// Per work ID: the largest token granted so far.
    max_token: HashMap<usize, u64>,
    tokens_back: u64,
    checkpoints_lost: u64,
    unacknowledged: u64,
    /// How long each acknowledged renewal and checkpoint took before the
    /// kill (the cost of the replica wait, compared across the runs).
    writes: Vec<Duration>,
}

fn parse(data: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(data).ok()?;
    let (token, seq) = text.split_once(':')?;
    Some((token.parse().ok()?, seq.parse().ok()?))
}

/// Signals from the holders to the test.
struct Progress {
    /// Acknowledged checkpoints.
    checkpoints: watch::Sender<u64>,
    /// Whether the primary was killed.
    killed: AtomicBool,
    /// Grants after the kill.
    grants_after_kill: watch::Sender<u64>,
}

/// One holder: take a free work ID, read its checkpoint, then checkpoint
/// and renew it for a while, release it, and again, until `stop`.
async fn holder(
    index: usize,
    store: Arc<RedisStore>,
    ttl: Duration,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
) {
    let me = HolderId::new(format!("holder-{index}")).expect("holder");
    let works: Vec<WorkId> = (0..WORK_IDS).map(work_id).collect();
    let mut turn = index;
    while !stop.load(Ordering::Relaxed) {
        turn += 1;
        let w = turn % WORK_IDS;
        let work = &works[w];
        let before = seen.lock().expect("seen").acked.get(&w).copied();
        let grant = match store.acquire(work, &me, ttl).await {
            Ok(grant) => grant,
            Err(_) => {
                tokio::time::sleep(ttl / 20).await;
                continue;
            }
        };
        let from = Instant::now();
        let mut until = from + ttl;
        if progress.killed.load(Ordering::Relaxed) {
            progress.grants_after_kill.send_modify(|n| *n += 1);
        }
        let lease = LeaseRef {
            work_id: work,
            holder_id: &me,
            fencing_token: grant.fencing_token,
        };
        let read = store.read_checkpoint(lease).await;
        {
            let mut s = seen.lock().expect("seen");
            let max = s.max_token.entry(w).or_default();
            if grant.fencing_token <= *max {
                s.tokens_back += 1;
            } else {
                *max = grant.fencing_token;
            }
            if let (Ok(c), Some(before)) = (&read, before) {
                let got = c.data.as_deref().and_then(parse);
                if got.is_none_or(|got| got < before) {
                    s.checkpoints_lost += 1;
                }
            }
        }
        // Hold for a while: a checkpoint, then a renewal, and so on. After
        // failed calls (the failover), the first read shows whether the
        // store still has this holder's last acknowledged checkpoint.
        let mut mine: Option<(u64, u64)> = None;
        let mut gap = false;
        for seq in 1..=ROUNDS {
            if Instant::now() >= until || stop.load(Ordering::Relaxed) {
                break;
            }
            if gap {
                if let Ok(c) = store.read_checkpoint(lease).await {
                    gap = false;
                    let got = c.data.as_deref().and_then(parse);
                    if mine.is_some_and(|mine| got.is_none_or(|got| got < mine)) {
                        seen.lock().expect("seen").checkpoints_lost += 1;
                    }
                }
            }
            let sent = Instant::now();
            let result = if seq % 2 == 0 {
                store.renew(lease, ttl).await.map(drop)
            } else {
                let data = Bytes::from(format!("{}:{seq}", grant.fencing_token));
                store.checkpoint(lease, ttl, data).await.map(drop)
            };
            match result {
                Ok(()) => {
                    until = sent + ttl;
                    if !progress.killed.load(Ordering::Relaxed) {
                        seen.lock().expect("seen").writes.push(sent.elapsed());
                    }
                    if seq % 2 == 1 {
                        mine = Some((grant.fencing_token, seq));
                        let mut s = seen.lock().expect("seen");
                        let acked = s.acked.entry(w).or_default();
                        *acked = (*acked).max((grant.fencing_token, seq));
                        progress.checkpoints.send_modify(|n| *n += 1);
                    }
                }
                Err(e) if e.is_lease_lost() => {
                    until = until.min(Instant::now());
                    break;
                }
                Err(Error::Store(e)) if e.message.contains("replicas") => {
                    seen.lock().expect("seen").unacknowledged += 1;
                    gap = true;
                }
                Err(_) => gap = true,
            }
            tokio::time::sleep(ttl / 40).await;
        }
        let released = Instant::now();
        let _ = store.release(lease).await;
        let term = Term {
            work: w,
            token: grant.fencing_token,
            from,
            until: until.min(released),
        };
        seen.lock().expect("seen").terms.push(term);
    }
}

/// The holders at work, each on a store of its own.
pub(crate) struct Load {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
    tasks: Vec<JoinHandle<()>>,
}

/// What the holders saw, counted.
pub(crate) struct Figures {
    pub(crate) grants: usize,
    pub(crate) grants_after_kill: u64,
    pub(crate) overlaps: usize,
    pub(crate) tokens_back: u64,
    pub(crate) checkpoints_lost: u64,
    pub(crate) unacknowledged: u64,
    /// Median acknowledged renewal or checkpoint before the kill.
    pub(crate) median_write: Duration,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} grants ({} after the kill); overlapping holders {}, fencing tokens gone back {}, \
             acknowledged checkpoints lost {}, writes refused as unreplicated {}; \
             median renewal or checkpoint before the kill {:?}",
            self.grants,
            self.grants_after_kill,
            self.overlaps,
            self.tokens_back,
            self.checkpoints_lost,
            self.unacknowledged,
            self.median_write
        )
    }
}

impl Load {
    /// Starts the holders, each with a store for `url`, leases of `ttl`.
    pub(crate) async fn start(url: &str, ttl: Duration) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress {
            checkpoints: watch::channel(0).0,
            killed: AtomicBool::new(false),
            grants_after_kill: watch::channel(0).0,
        });
        let mut tasks = Vec::new();
        for i in 0..HOLDERS {
            let store = Arc::new(RedisStore::connect(url).await.expect("connect"));
            tasks.push(tokio::spawn(holder(
                i,
                store,
                ttl,
                seen.clone(),
                stop.clone(),
                progress.clone(),
            )));
        }
        Self {
            seen,
            stop,
            progress,
            tasks,
        }
    }

    /// Returns once `n` more checkpoints were acknowledged (counting from
    /// the start).
    pub(crate) async fn checkpoints(&self, n: u64) {
        let _ = self
            .progress
            .checkpoints
            .subscribe()
            .wait_for(|c| *c >= n)
            .await;
    }

    /// Acknowledged checkpoints so far.
    pub(crate) fn checkpoints_so_far(&self) -> u64 {
        *self.progress.checkpoints.borrow()
    }

    /// Marks the moment of the kill (grants after it are counted).
    pub(crate) fn killed(&self) {
        self.progress.killed.store(true, Ordering::Relaxed);
    }

    /// Waits (at most `limit`) until every holder was granted a lease after
    /// the kill, stops the holders and counts what they saw.
    pub(crate) async fn finish(self, limit: Duration) -> Figures {
        let mut after = self.progress.grants_after_kill.subscribe();
        let _ = tokio::time::timeout(limit, after.wait_for(|n| *n >= HOLDERS as u64)).await;
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("holder task");
        }
        let mut seen = std::mem::take(&mut *self.seen.lock().expect("seen"));
        seen.writes.sort();
        let median_write = seen
            .writes
            .get(seen.writes.len() / 2)
            .copied()
            .unwrap_or_default();
        let mut overlaps = 0;
        for (i, a) in seen.terms.iter().enumerate() {
            for b in &seen.terms[i + 1..] {
                if a.work == b.work && a.token != b.token && a.from < b.until && b.from < a.until {
                    eprintln!("overlap: {a:?} and {b:?}");
                    overlaps += 1;
                }
            }
        }
        Figures {
            grants: seen.terms.len(),
            grants_after_kill: self.progress.grants_after_kill.send_replace(0),
            overlaps,
            tokens_back: seen.tokens_back,
            checkpoints_lost: seen.checkpoints_lost,
            unacknowledged: seen.unacknowledged,
            median_write,
        }
    }
}

impl Figures {
    /// Asserts S1, S2 and the survival of acknowledged checkpoints across
    /// `what`, and that every holder was granted a lease after the kill;
    /// `run` (the whole run's figures) is shown on failure.
    pub(crate) fn assert_nothing_lost(&self, what: &str, run: &dyn std::fmt::Display) {
        assert!(self.grants_after_kill >= HOLDERS as u64, "{run}");
        assert_eq!(
            (self.overlaps, self.tokens_back, self.checkpoints_lost),
            (0, 0, 0),
            "S1, S2 and acknowledged checkpoints across {what}: {run}"
        );
    }
}
