//! Deterministic simulation of the lease contract under faults (issue 9):
//! many holders, one store, seeded faults, a paused clock, and a checker of
//! S1–S5 (see `worklease::sim`).
//!
//! * `cargo test -p worklease --test simulation -- --nocapture` runs the
//!   default seeds per store and prints figures;
//! * `WORKLEASE_SIM_SEEDS=N` runs N seeds per store (long runs), from
//!   `WORKLEASE_SIM_SEED_BASE` (default 0), on every core, with a line of
//!   progress every 10 s (a release build runs many times faster:
//!   `cargo test --release -p worklease --features testkit --test simulation`);
//!   `WORKLEASE_SIM_WORKERS=N` runs them on N threads instead;
//! * `WORKLEASE_SIM_SEED=S WORKLEASE_SIM_STORE=memory` replays one seed on
//!   one store (the command a failure prints);
//! * `WORKLEASE_SIM_MUTANT=<name>` puts one of this file's broken store
//!   variants under the store runs (to replay a mutant's failure).

use std::path::PathBuf;
use std::sync::Arc;

use worklease::sim::{self, Backend, Campaign, SimConfig};

fn only_store(store: &str) -> bool {
    match std::env::var(sim::STORE_VAR) {
        Ok(s) if s != store => {
            println!("{store}: skipped ({}={s})", sim::STORE_VAR);
            false
        }
        _ => true,
    }
}

/// Known library issues, by store and violation code: listed in the
/// figures with their replay commands, tolerated so that every other rule
/// keeps guarding CI. Remove an entry once its fix lands. (The first one
/// this simulation found, a stale register read restarting the adapter's
/// observation of a newer version, is fixed: observations are ordered by
/// call.)
const KNOWN_ISSUES: &[(&str, &str)] = &[];

fn campaign(backend: Backend, default_seeds: u64) {
    let store = backend.name();
    if !only_store(store) {
        return;
    }
    let mut c = Campaign::new(backend, sim::seeds_from_env(default_seeds));
    if std::env::var_os("WORKLEASE_SIM_SEEDS").is_some() {
        // A long campaign: every core (or `WORKLEASE_SIM_WORKERS` threads:
        // SQLite's seeds wait on its blocking threads, and more workers
        // than cores keep the cores busy), and a line of progress now and
        // then.
        if let Some(n) = std::env::var("WORKLEASE_SIM_WORKERS")
            .ok()
            .and_then(|n| n.parse().ok())
        {
            c.workers = n;
        }
        c.progress = Some(std::time::Duration::from_secs(10));
    } else {
        // The test harness already runs the campaigns side by side.
        c.workers = 1;
    }
    if let Ok(name) = std::env::var("WORKLEASE_SIM_MUTANT") {
        c.config.wrap = Some(mutants::by_name(&name));
        c.replay_env = format!("WORKLEASE_SIM_MUTANT={name}");
    }
    c.known_issues = KNOWN_ISSUES
        .iter()
        .filter(|(s, _)| *s == store)
        .map(|(_, code)| *code)
        .collect();
    if let [seed] = c.seeds[..] {
        // A replay: show everything, the trace included.
        let r = sim::run_with_env(&c.backend, &c.config, seed, &c.replay_env);
        println!("{r}\n{}", r.stats);
        let new: Vec<_> = r
            .violations
            .iter()
            .filter(|v| !c.known_issues.contains(&v.code))
            .collect();
        assert!(new.is_empty(), "{r}");
        return;
    }
    let report = c.run();
    println!("{report}");
    assert!(
        report.failures.is_empty(),
        "{}",
        report
            .failures
            .first()
            .map(|r| r.to_string())
            .unwrap_or_default()
    );
    if c.seeds.len() >= 100 {
        exercised(&c.backend, &report.totals);
    }
}

/// A campaign that passed must also have exercised what it claims to:
/// every fault kind, and every path of the holders (otherwise a broken
/// injector would pass vacuously).
fn exercised(backend: &Backend, t: &sim::Stats) {
    use sim::FaultKind::*;
    let mut kinds = vec![
        DelayBefore,
        DelayAfter,
        ErrorBefore,
        LostReply,
        Unreachable,
        Outage,
        Freeze,
        FreezePastTtl,
        Drift,
        WallStep,
    ];
    if let Backend::Register { .. } = backend {
        kinds.extend([
            RegisterReadDelay,
            RegisterWriteDelay,
            RegisterWriteError,
            RegisterLostReply,
        ]);
    }
    for k in kinds {
        assert!(
            t.faults.get(&k).copied().unwrap_or(0) > 0,
            "{}: no {k:?} fault was injected",
            backend.name()
        );
    }
    let a = &t.app;
    let paths = [
        ("sessions", a.sessions),
        ("background renewals", a.renewal_sessions),
        ("batch sessions", a.batch_sessions),
        ("releases", a.releases),
        ("crashes", a.abandoned),
        ("losses noticed", a.lost),
        ("Held answers", a.held),
        ("late grants handed back", a.late_grants),
        ("clean hand-offs read", a.clean_reads),
        ("calls whose caller gave up", t.abandoned),
        (
            "Fenced answers",
            t.answers.get(&sim::Outcome::Fenced).copied().unwrap_or(0),
        ),
        (
            "Expired answers",
            t.answers.get(&sim::Outcome::Expired).copied().unwrap_or(0),
        ),
    ];
    for (what, n) in paths {
        assert!(n > 0, "{}: no {what} in {} seeds", backend.name(), t.runs);
    }
    assert!(
        a.sessions >= 10 * t.runs,
        "{}: only {} sessions in {} seeds",
        backend.name(),
        a.sessions,
        t.runs
    );
}

/// A directory for the SQLite files: memory-backed where the host has one
/// (every commit is an fsync), else the system's temporary directory.
fn sqlite_dir() -> tempfile::TempDir {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(&shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("a temporary directory")
}

#[test]
fn memory() {
    campaign(Backend::Memory, 2000);
}

#[test]
fn register() {
    campaign(Backend::Register { adapters: 3 }, 1500);
}

/// Seeds a long campaign failed on (replayed on every run): the register
/// adapter judged a holder's lease live from a read answered from before
/// a newer token's write landed, when that write's call had a lower number
/// than the read's (S3: a read accepted 1.06 s and 1.11 s into a lease of
/// 1 s; 2 of 300,000 seeds). Its observations now never go back to an
/// older fencing token.
#[test]
fn register_seeds_that_failed_once() {
    let backend = Backend::Register { adapters: 3 };
    for seed in [185_455, 267_789] {
        let r = sim::run(&backend, &SimConfig::default(), seed);
        assert!(r.violations.is_empty(), "{r}");
    }
}

#[test]
fn sqlite() {
    let dir = sqlite_dir();
    campaign(
        Backend::Sqlite {
            dir: dir.path().to_path_buf(),
            processes: 2,
        },
        400,
    );
}

/// A seed replays the same run: same calls, answers, times and beliefs.
#[test]
fn replay_is_deterministic() {
    let dir = sqlite_dir();
    let backends = [
        Backend::Memory,
        Backend::Register { adapters: 3 },
        Backend::Sqlite {
            dir: dir.path().to_path_buf(),
            processes: 2,
        },
    ];
    let config = SimConfig::default();
    for backend in &backends {
        for seed in 0..8 {
            let a = sim::run(backend, &config, seed);
            let b = sim::run(backend, &config, seed);
            assert_eq!(
                (a.fingerprint, &a.stats),
                (b.fingerprint, &b.stats),
                "{} seed {seed} did not replay",
                backend.name()
            );
            assert!(
                a.stats.total_ops() > 100,
                "{} seed {seed} did too little",
                backend.name()
            );
        }
    }
}

/// Stepping the wall clock behind the stores' replies (forward and back,
/// up to an hour, on half of the replies) changes nothing: the histories
/// are identical to those of the same seeds without steps.
#[test]
fn wall_clock_steps_change_nothing() {
    let calm = SimConfig {
        faults: sim::FaultConfig {
            wall_step: 0.0,
            ..SimConfig::default().faults
        },
        ..SimConfig::default()
    };
    let stepping = SimConfig {
        faults: sim::FaultConfig {
            wall_step: 0.5,
            ..SimConfig::default().faults
        },
        ..SimConfig::default()
    };
    let mut steps = 0;
    let dir = sqlite_dir();
    let backends = [
        (Backend::Memory, 20),
        (Backend::Register { adapters: 3 }, 20),
        (
            Backend::Sqlite {
                dir: dir.path().to_path_buf(),
                processes: 2,
            },
            5,
        ),
    ];
    for (backend, seeds) in backends {
        for seed in 0..seeds {
            let a = sim::run(&backend, &calm, seed);
            let b = sim::run(&backend, &stepping, seed);
            let known = |r: &sim::Report| {
                r.violations
                    .iter()
                    .all(|v| KNOWN_ISSUES.contains(&(backend.name(), v.code)))
            };
            assert!(known(&a) && known(&b), "{a}\n{b}");
            assert_eq!(
                a.stats.faults.get(&sim::FaultKind::WallStep),
                None,
                "no steps without the fault"
            );
            steps += b
                .stats
                .faults
                .get(&sim::FaultKind::WallStep)
                .copied()
                .unwrap_or(0);
            assert_eq!(
                a.fingerprint,
                b.fingerprint,
                "{} seed {seed}: wall-clock steps changed the run",
                backend.name()
            );
        }
    }
    assert!(steps > 1000, "only {steps} wall-clock steps were injected");
    println!("wall-clock steps injected: {steps}; histories unchanged");
}

/// Clock drift within the stated bound (safety margin / TTL) keeps S1;
/// beyond it the checker finds overlapping beliefs: the drift model and
/// the checker have teeth, and the margin is what keeps drift safe.
#[test]
fn drift_beyond_the_margin_is_caught() {
    let base = SimConfig::default();
    let bound = base.safety_margin.as_secs_f64() / base.ttl.as_secs_f64();
    let at_bound = SimConfig {
        faults: sim::FaultConfig {
            max_drift: bound,
            ..base.faults.clone()
        },
        ..base.clone()
    };
    let report = Campaign {
        config: at_bound,
        ..Campaign::new(Backend::Memory, (0..100).collect())
    }
    .run();
    println!("drift at the bound ({bound}): {report}");
    assert!(report.failures.is_empty(), "{}", report.failures[0]);

    let beyond = SimConfig {
        faults: sim::FaultConfig {
            max_drift: 3.0 * bound,
            ..base.faults.clone()
        },
        ..base
    };
    let found = (0..200)
        .map(|seed| sim::run(&Backend::Memory, &beyond, seed))
        .find(|r| !r.passed())
        .expect("drift beyond the margin must break S1 in 200 seeds");
    println!("drift beyond the bound ({}): {found}", 3.0 * bound);
    assert!(
        found.violations.iter().all(|v| v.rule == sim::Rule::S1),
        "{found}"
    );
}

/// The checker finds real bugs: each broken store variant below is caught
/// with a replayable seed.
mod mutants {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime};

    use async_trait::async_trait;
    use bytes::Bytes;
    use worklease::store::{Checkpoint, Grant, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore};
    use worklease::{Error, HolderId, Result, WorkId};

    use super::*;

    /// Every mutant, and the check ([`sim::Violation::code`]) that must
    /// catch it.
    pub const ALL: &[(&str, &str)] = &[
        ("renew-ignores-token", "s3-stale-token"),
        ("renew-revives-expired", "s3-expired"),
        ("acquire-steals-early", "s1-overlap"),
        ("checkpoint-writes-when-fenced", "s3-refused-changed-state"),
        ("stale-checkpoint-read", "s4-overwritten"),
        ("token-reused", "s2-duplicate"),
        ("handoff-flag-lost", "s5-release-ignored"),
    ];

    pub fn by_name(name: &str) -> sim::StoreWrapper {
        let name = name.to_string();
        assert!(
            ALL.iter().any(|(n, _)| *n == name),
            "unknown mutant {name:?}; known: {ALL:?}"
        );
        Arc::new(move |inner| Arc::new(Mutant::new(&name, inner)) as Arc<dyn LeaseStore>)
    }

    /// A store that breaks one rule on purpose (see [`ALL`]).
    struct Mutant {
        name: String,
        inner: Arc<dyn LeaseStore>,
        /// stale-checkpoint-read: the first checkpoint read per work ID.
        cached: Mutex<HashMap<WorkId, Checkpoint>>,
    }

    impl Mutant {
        fn new(name: &str, inner: Arc<dyn LeaseStore>) -> Self {
            Self {
                name: name.to_string(),
                inner,
                cached: Mutex::new(HashMap::new()),
            }
        }

        fn is(&self, name: &str) -> bool {
            self.name == name
        }

        /// The live lease of `work_id`, if any.
        async fn live(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
            let info = self.inner.inspect(std::slice::from_ref(work_id)).await?;
            Ok(info.into_iter().find(|i| !i.expired))
        }
    }

    #[async_trait]
    impl LeaseStore for Mutant {
        fn kind(&self) -> &'static str {
            self.inner.kind()
        }

        async fn acquire(
            &self,
            work_id: &WorkId,
            holder_id: &HolderId,
            ttl: Duration,
        ) -> Result<Grant> {
            let r = self.inner.acquire(work_id, holder_id, ttl).await;
            match r {
                // Takes a lease over up to a quarter TTL before it expires.
                Err(Error::Held {
                    expires_in: Some(left),
                    ..
                }) if self.is("acquire-steals-early") && left <= ttl / 4 => {
                    self.inner.revoke(work_id).await?;
                    let mut g = self.inner.acquire(work_id, holder_id, ttl).await?;
                    if let Some(p) = g.handoff.previous.as_mut() {
                        p.ended = LeaseEnd::Expired;
                    }
                    Ok(g)
                }
                // Hands out the previous holder's token again.
                Ok(mut g) if self.is("token-reused") => {
                    if let Some(p) = &g.handoff.previous {
                        g.fencing_token = p.fencing_token;
                    }
                    Ok(g)
                }
                // Reports every clean hand-off as unclean.
                Ok(mut g) if self.is("handoff-flag-lost") => {
                    if let Some(p) = g.handoff.previous.as_mut() {
                        if p.ended == LeaseEnd::Released {
                            p.ended = LeaseEnd::Expired;
                        }
                    }
                    Ok(g)
                }
                r => r,
            }
        }

        async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
            let r = self.inner.renew(lease, ttl).await;
            match r {
                // Renews whoever holds the lease, whatever the token.
                Err(Error::Fenced { .. }) if self.is("renew-ignores-token") => {
                    match self.live(lease.work_id).await? {
                        Some(i) => {
                            let holder = HolderId::new(i.holder_id).expect("a stored holder ID");
                            let current = LeaseRef {
                                work_id: lease.work_id,
                                holder_id: &holder,
                                fencing_token: i.fencing_token,
                            };
                            self.inner.renew(current, ttl).await
                        }
                        None => r,
                    }
                }
                // Brings an expired, untaken lease back by acquiring it
                // again (a new token the caller never learns).
                Err(Error::Expired { .. }) if self.is("renew-revives-expired") => {
                    match self
                        .inner
                        .acquire(lease.work_id, lease.holder_id, ttl)
                        .await
                    {
                        Ok(g) => Ok(g.expires_at),
                        Err(_) => r,
                    }
                }
                r => r,
            }
        }

        async fn checkpoint(
            &self,
            lease: LeaseRef<'_>,
            ttl: Duration,
            data: Bytes,
        ) -> Result<SystemTime> {
            let r = self.inner.checkpoint(lease, ttl, data.clone()).await;
            match r {
                // Refuses a stale writer, but writes its data anyway.
                Err(Error::Fenced { .. } | Error::Expired { .. })
                    if self.is("checkpoint-writes-when-fenced") =>
                {
                    if let Some(i) = self.live(lease.work_id).await? {
                        let holder = HolderId::new(i.holder_id).expect("a stored holder ID");
                        let current = LeaseRef {
                            work_id: lease.work_id,
                            holder_id: &holder,
                            fencing_token: i.fencing_token,
                        };
                        let _ = self.inner.checkpoint(current, ttl, data).await;
                    }
                    r
                }
                r => r,
            }
        }

        async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
            let mut c = self.inner.read_checkpoint(lease).await?;
            if self.is("stale-checkpoint-read") {
                // A cache that is never invalidated.
                let mut cached = self.cached.lock().expect("cache");
                match cached.get(lease.work_id) {
                    Some(old) if old.data.is_some() => c.data = old.data.clone(),
                    _ => {
                        cached.insert(lease.work_id.clone(), c.clone());
                    }
                }
            }
            if self.is("handoff-flag-lost") {
                if let Some(p) = c.handoff.previous.as_mut() {
                    if p.ended == LeaseEnd::Released {
                        p.ended = LeaseEnd::Expired;
                    }
                }
            }
            Ok(c)
        }

        async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
            self.inner.release(lease).await
        }

        async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
            self.inner.inspect(work_ids).await
        }

        async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
            self.inner.revoke(work_id).await
        }

        async fn inspect_checkpoint(
            &self,
            work_id: &WorkId,
        ) -> Result<Option<worklease::StoredCheckpoint>> {
            self.inner.inspect_checkpoint(work_id).await
        }

        async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
            self.inner.delete_ended(work_id, fencing_token).await
        }
    }

    /// Runs seeds until the mutant is caught by the check `code`; checks
    /// the report names the seed and a replay command, and that the seed
    /// replays the same failure.
    fn caught(backend: &Backend, name: &str, code: &str) -> u64 {
        let config = SimConfig {
            wrap: Some(by_name(name)),
            ..SimConfig::default()
        };
        let env = format!("WORKLEASE_SIM_MUTANT={name}");
        let found = (0..100)
            .map(|seed| sim::run_with_env(backend, &config, seed, &env))
            .find(|r| r.violations.iter().any(|v| v.code == code))
            .unwrap_or_else(|| {
                panic!(
                    "mutant {name} on {} was not caught by {code} in 100 seeds",
                    backend.name()
                )
            });
        let text = found.to_string();
        let command = format!(
            "WORKLEASE_SIM_SEED={} WORKLEASE_SIM_STORE={} {env} cargo test -p worklease --test simulation",
            found.seed,
            backend.name()
        );
        assert!(text.contains(&command), "no replay command in:\n{text}");
        let again = sim::run_with_env(backend, &config, found.seed, &env);
        assert_eq!(
            (again.fingerprint, &again.violations),
            (found.fingerprint, &found.violations),
            "the failing seed did not replay"
        );
        let first = found
            .violations
            .iter()
            .find(|v| v.code == code)
            .expect("the check");
        println!(
            "mutant {name} on {}: caught at seed {} by {first}\n  replay: {}",
            backend.name(),
            found.seed,
            found.replay
        );
        found.seed
    }

    #[test]
    fn every_mutant_is_caught_on_the_memory_store() {
        for (name, code) in ALL {
            caught(&Backend::Memory, name, code);
        }
    }

    #[test]
    fn mutants_are_caught_on_the_register_and_sqlite_stores() {
        caught(
            &Backend::Register { adapters: 3 },
            "renew-ignores-token",
            "s3-stale-token",
        );
        caught(
            &Backend::Register { adapters: 3 },
            "acquire-steals-early",
            "s1-overlap",
        );
        let dir = sqlite_dir();
        let sqlite = Backend::Sqlite {
            dir: dir.path().to_path_buf(),
            processes: 2,
        };
        caught(&sqlite, "renew-ignores-token", "s3-stale-token");
        caught(
            &sqlite,
            "checkpoint-writes-when-fenced",
            "s3-refused-changed-state",
        );
    }

    /// The first failure of a broken store prints the seed, the rule and a
    /// trace (run with --nocapture to see one).
    #[test]
    fn a_failure_report_shows_seed_rule_and_trace() {
        let config = SimConfig {
            wrap: Some(by_name("renew-ignores-token")),
            ..SimConfig::default()
        };
        let r = (0..100)
            .map(|seed| sim::run(&Backend::Memory, &config, seed))
            .find(|r| !r.passed())
            .expect("a failure");
        let text = r.to_string();
        println!("What a failure looks like (a deliberately broken store):\n{text}");
        assert!(text.contains(&format!("seed {}", r.seed)), "{text}");
        assert!(text.contains("trace of"), "{text}");
        assert!(text.contains("belief: h"), "{text}");
    }
}
