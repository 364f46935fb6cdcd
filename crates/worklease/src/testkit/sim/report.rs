//! Figures and failure reports.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::check::Violation;
use super::history::{AppCounts, Delivery, Effect, FaultKind, Finished, OpKind, Outcome};

/// Figures of one run or of many (see [`Stats::merge`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Runs (seeds).
    pub runs: u64,
    /// Holders, over all runs.
    pub holders: u64,
    /// Simulated time, over all runs.
    pub simulated: Duration,
    /// Store calls per operation.
    pub ops: BTreeMap<OpKind, u64>,
    /// The store's answers (calls that reached it).
    pub answers: BTreeMap<Outcome, u64>,
    /// Calls that reached the store and were applied.
    pub applied: u64,
    /// Calls whose effect stayed unknown to the checker.
    pub ambiguous: u64,
    /// Calls whose caller stopped waiting.
    pub abandoned: u64,
    /// Faults injected, per kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// Belief intervals recorded.
    pub beliefs: u64,
    /// What the holders saw.
    pub app: AppCounts,
    /// Violations found.
    pub violations: u64,
}

impl Stats {
    pub(crate) fn of(f: &Finished, holders: usize, simulated: Duration) -> Self {
        let mut s = Stats {
            runs: 1,
            holders: holders as u64,
            simulated,
            faults: f.faults.clone(),
            beliefs: f.beliefs.len() as u64,
            app: f.app.clone(),
            ..Stats::default()
        };
        for op in &f.ops {
            *s.ops.entry(op.kind).or_default() += 1;
            if let Some(o) = op.applied.as_ref().and_then(|a| a.outcome) {
                *s.answers.entry(o).or_default() += 1;
            }
            match op.effect() {
                Effect::Applied => s.applied += 1,
                Effect::Ambiguous => s.ambiguous += 1,
                Effect::None => {}
            }
            if op.delivery == Delivery::Abandoned {
                s.abandoned += 1;
            }
        }
        s
    }

    /// Adds `other`'s figures to these.
    pub fn merge(&mut self, other: &Stats) {
        self.runs += other.runs;
        self.holders += other.holders;
        self.simulated += other.simulated;
        for (k, v) in &other.ops {
            *self.ops.entry(*k).or_default() += v;
        }
        for (k, v) in &other.answers {
            *self.answers.entry(*k).or_default() += v;
        }
        self.applied += other.applied;
        self.ambiguous += other.ambiguous;
        self.abandoned += other.abandoned;
        for (k, v) in &other.faults {
            *self.faults.entry(*k).or_default() += v;
        }
        self.beliefs += other.beliefs;
        let (a, b) = (&mut self.app, &other.app);
        a.sessions += b.sessions;
        a.renewal_sessions += b.renewal_sessions;
        a.batch_sessions += b.batch_sessions;
        a.batch_leases += b.batch_leases;
        a.releases += b.releases;
        a.abandoned += b.abandoned;
        a.lost += b.lost;
        a.held += b.held;
        a.late_grants += b.late_grants;
        a.clean_reads += b.clean_reads;
        self.violations += other.violations;
    }

    /// All store calls.
    pub fn total_ops(&self) -> u64 {
        self.ops.values().sum()
    }

    /// All faults injected (outage intervals and drifting holders counted
    /// once each).
    pub fn total_faults(&self) -> u64 {
        self.faults.values().sum()
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  runs {}, holders {}, simulated time {:.0}s",
            self.runs,
            self.holders,
            self.simulated.as_secs_f64()
        )?;
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|(k, v)| format!("{} {v}", k.name()))
            .collect();
        writeln!(f, "  store calls {}: {}", self.total_ops(), ops.join(", "))?;
        let answers: Vec<String> = self
            .answers
            .iter()
            .map(|(k, v)| format!("{k:?} {v}"))
            .collect();
        writeln!(
            f,
            "  store answers: {}; applied {}, unknown outcome {}, caller gave up {}",
            answers.join(", "),
            self.applied,
            self.ambiguous,
            self.abandoned
        )?;
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k:?} {v}"))
            .collect();
        writeln!(f, "  faults {}: {}", self.total_faults(), faults.join(", "))?;
        let a = &self.app;
        writeln!(
            f,
            "  sessions {} ({} with background renewal; {} batch sessions of {} leases renewed together): released {}, crashed {}, lost noticed {}; Held {}, late grants handed back {}, clean hand-offs read {}",
            a.sessions, a.renewal_sessions, a.batch_sessions, a.batch_leases, a.releases, a.abandoned, a.lost, a.held, a.late_grants, a.clean_reads
        )?;
        write!(
            f,
            "  belief intervals {}, violations {}",
            self.beliefs, self.violations
        )
    }
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The store (backend name).
    pub store: String,
    /// The seed.
    pub seed: u64,
    /// Figures.
    pub stats: Stats,
    /// Every violation, in order of simulated time.
    pub violations: Vec<Violation>,
    /// A hash of the whole history (every call, answer, delivery, time and
    /// belief; no wall-clock value): equal for two runs of one seed.
    pub fingerprint: u64,
    /// The calls and beliefs around the first violations.
    pub trace: String,
    /// The command that replays this run.
    pub replay: String,
    /// Real time the run took.
    pub elapsed: Duration,
    /// The whole history.
    pub history: std::sync::Arc<Finished>,
}

impl Report {
    /// True when no rule was broken.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.passed() {
            return write!(
                f,
                "simulation passed: store {}, seed {} ({} calls)",
                self.store,
                self.seed,
                self.stats.total_ops()
            );
        }
        writeln!(
            f,
            "simulation FAILED: store {}, seed {}: {} violation(s)",
            self.store,
            self.seed,
            self.violations.len()
        )?;
        for v in self.violations.iter().take(10) {
            writeln!(f, "  {v}")?;
        }
        if self.violations.len() > 10 {
            writeln!(f, "  ... and {} more", self.violations.len() - 10)?;
        }
        writeln!(f, "replay: {}", self.replay)?;
        write!(f, "{}", self.trace)
    }
}

/// The calls and beliefs of the first violations' work IDs (two at most),
/// from two TTLs before to half a TTL after each. A token's overlapping
/// belief intervals (one per renewal) are shown merged.
pub(crate) fn trace(f: &Finished, violations: &[Violation], ttl: Duration) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut shown: Vec<&str> = Vec::new();
    for v in violations.iter().filter(|v| !v.work_id.is_empty()) {
        if shown.contains(&v.work_id.as_str()) {
            continue;
        }
        if shown.len() == 2 {
            break;
        }
        shown.push(&v.work_id);
        let from = v.at.saturating_sub(ttl * 2);
        let to = v.at + ttl / 2;
        let _ = writeln!(
            out,
            "trace of {:?} from {}ms to {}ms ({:?}):",
            v.work_id,
            from.as_millis(),
            to.as_millis(),
            v.rule
        );
        for op in f.ops.iter().filter(|o| {
            o.work_id == v.work_id
                && (v.ops.contains(&o.id)
                    || (o.invoked.at <= to && o.completed.is_none_or(|c| c.at >= from)))
        }) {
            let _ = writeln!(out, "  {op}");
        }
        let mut merged: Vec<(usize, u64, Duration, Duration)> = Vec::new();
        for b in f
            .beliefs
            .iter()
            .filter(|b| b.work_id == v.work_id && b.from <= to && b.until >= from)
        {
            match merged
                .iter_mut()
                .find(|m| m.0 == b.holder && m.1 == b.token && b.from <= m.3 && m.2 <= b.until)
            {
                Some(m) => {
                    m.2 = m.2.min(b.from);
                    m.3 = m.3.max(b.until);
                }
                None => merged.push((b.holder, b.token, b.from, b.until)),
            }
        }
        for (holder, token, from, until) in merged {
            let _ = writeln!(
                out,
                "  belief: h{holder} token {token} from {}ms to {}ms",
                from.as_millis(),
                until.as_millis()
            );
        }
    }
    out
}

pub(crate) fn fingerprint(f: &Finished) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for op in &f.ops {
        format!("{op:?}").hash(&mut h);
    }
    for b in &f.beliefs {
        format!("{b:?}").hash(&mut h);
    }
    f.notes.hash(&mut h);
    h.finish()
}
