//! The checker: S1–S5 over a finished run's history.
//!
//! Over 600 lines: the five rules read one index of the run's grants built
//! here, and each is a page of its own; split into files, each would need
//! that index's internals.
//!
//! Two views are used. S1 is about beliefs (what holders would act on),
//! judged in simulated time. S2–S5 are about the store's answers, taken
//! from each holder's link right above the store: the store's own answer is
//! known even when the reply was then lost. Calls are ordered by the run's
//! sequence numbers: call A precedes call B when A's store call returned
//! before B's started; calls that overlap are concurrent and never ordered.
//! A call whose effect is unknown (a store error from the store itself) is
//! allowed to have happened or not, never counted as either. Every rule is
//! thus sound: a reported violation is a real one; some violations (those
//! hidden behind ambiguous calls) are not detectable.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use crate::store::LeaseEnd;

use super::history::{Belief, Effect, Finished, OpKind, OpRecord, Outcome};

/// The rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// Two believed-valid intervals of one work ID overlap.
    S1,
    /// A fencing token does not exceed an earlier one, or is reused.
    S2,
    /// A stale (taken-over or expired) token was accepted, or a refused call
    /// changed state.
    S3,
    /// A read returned neither the last applied checkpoint nor one whose
    /// outcome was unknown.
    S4,
    /// A wrong hand-off.
    S5,
    /// The harness itself saw something no store should do (an unexpected
    /// error kind, a failed task).
    Harness,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// Which check of the rule found it (stable: `s3-expired`,
    /// `s4-overwritten`, ...), for telling known issues from new ones.
    pub code: &'static str,
    /// The work ID.
    pub work_id: String,
    /// Where in simulated time it shows.
    pub at: Duration,
    /// What happened.
    pub message: String,
    /// The calls involved (history indices).
    pub ops: Vec<usize>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} ({}) on {:?} at {}ms: {}",
            self.rule,
            self.code,
            self.work_id,
            self.at.as_millis(),
            self.message
        )?;
        if !self.ops.is_empty() {
            write!(f, " (calls {:?})", self.ops)?;
        }
        Ok(())
    }
}

/// What the checker needs besides the history.
pub(crate) struct Params {
    pub ttl: Duration,
    /// Slack for a store clock's rounding (SQLite: 1 ms).
    pub tolerance: Duration,
    /// Holder IDs by index.
    pub holder_ids: Vec<String>,
}

/// A granted acquisition as the store answered it.
struct Grant<'a> {
    op: &'a OpRecord,
    token: u64,
    start: u64,
    end: u64,
}

/// Grants sorted by the end of their store call, with the running maximum
/// token, to answer "the largest token granted before sequence number s".
struct Granted<'a> {
    by_end: Vec<&'a Grant<'a>>,
    /// (max token, grant index in `by_end`) over `by_end[..=i]`.
    prefix_max: Vec<(u64, usize)>,
}

impl<'a> Granted<'a> {
    fn new(grants: &'a [Grant<'a>]) -> Self {
        let mut by_end: Vec<&Grant<'_>> = grants.iter().collect();
        by_end.sort_by_key(|g| g.end);
        let mut prefix_max = Vec::with_capacity(by_end.len());
        let mut best: Option<(u64, usize)> = None;
        for (i, g) in by_end.iter().enumerate() {
            if best.is_none_or(|(t, _)| g.token > t) {
                best = Some((g.token, i));
            }
            prefix_max.extend(best);
        }
        Self { by_end, prefix_max }
    }

    /// The grant with the largest token among those whose store call ended
    /// before sequence number `seq`.
    fn max_before(&self, seq: u64) -> Option<&'a Grant<'a>> {
        let n = self.by_end.partition_point(|g| g.end < seq);
        let (_, i) = *self.prefix_max.get(n.checked_sub(1)?)?;
        Some(self.by_end[i])
    }
}

pub(crate) fn check(f: &Finished, p: &Params) -> Vec<Violation> {
    let mut out = Vec::new();
    for note in &f.notes {
        out.push(Violation {
            rule: Rule::Harness,
            code: "harness-note",
            work_id: String::new(),
            at: Duration::ZERO,
            message: note.clone(),
            ops: Vec::new(),
        });
    }
    for op in &f.ops {
        if let Some(Outcome::Other) = op.applied.as_ref().and_then(|a| a.outcome) {
            out.push(Violation {
                rule: Rule::Harness,
                code: "harness-error-kind",
                work_id: op.work_id.clone(),
                at: op.invoked.at,
                message: format!(
                    "the store answered {} with an unexpected error kind",
                    op.kind.name()
                ),
                ops: vec![op.id],
            });
        }
    }
    let mut ops: BTreeMap<&str, Vec<&OpRecord>> = BTreeMap::new();
    for op in &f.ops {
        ops.entry(op.work_id.as_str()).or_default().push(op);
    }
    let mut beliefs: BTreeMap<&str, Vec<&Belief>> = BTreeMap::new();
    for b in &f.beliefs {
        beliefs.entry(b.work_id.as_str()).or_default().push(b);
    }
    for (wid, bs) in &beliefs {
        s1(wid, bs, &mut out);
    }
    for (wid, ops) in &ops {
        let grants: Vec<Grant<'_>> = ops
            .iter()
            .filter(|o| o.kind == OpKind::Acquire && o.effect() == Effect::Applied)
            .filter_map(|o| {
                let (start, end) = o.span()?;
                let (token, _) = o.applied.as_ref()?.grant.as_ref()?;
                Some(Grant {
                    op: o,
                    token: *token,
                    start: start.seq,
                    end: end.seq,
                })
            })
            .collect();
        let granted = Granted::new(&grants);
        s2(wid, &grants, &granted, &mut out);
        s3(wid, ops, &grants, &granted, p, &mut out);
        s4(wid, ops, &mut out);
        s5(wid, ops, &grants, p, &mut out);
    }
    out.sort_by_key(|v| (v.at, v.rule));
    out
}

/// S1: believed intervals of different acquisitions never overlap.
fn s1(wid: &str, bs: &[&Belief], out: &mut Vec<Violation>) {
    let mut segs: Vec<&Belief> = bs.iter().copied().filter(|b| b.from < b.until).collect();
    segs.sort_by_key(|b| (b.from, b.until, b.holder, b.token));
    let mut seen = BTreeSet::new();
    for (i, a) in segs.iter().enumerate() {
        for b in &segs[i + 1..] {
            if b.from >= a.until {
                break;
            }
            if a.token != b.token && seen.insert((a.token.min(b.token), a.token.max(b.token))) {
                out.push(Violation {
                    rule: Rule::S1,
                    code: "s1-overlap",
                    work_id: wid.to_string(),
                    at: b.from,
                    message: format!(
                        "h{} believed it held token {} from {}ms to {}ms while h{} believed it held token {} from {}ms to {}ms",
                        a.holder,
                        a.token,
                        a.from.as_millis(),
                        a.until.as_millis(),
                        b.holder,
                        b.token,
                        b.from.as_millis(),
                        b.until.as_millis()
                    ),
                    ops: Vec::new(),
                });
            }
        }
    }
}

/// S2: every grant's token exceeds every token granted before it, and no
/// token is granted twice.
fn s2(wid: &str, grants: &[Grant<'_>], granted: &Granted<'_>, out: &mut Vec<Violation>) {
    let mut tokens: BTreeMap<u64, usize> = BTreeMap::new();
    for g in grants {
        if let Some(first) = tokens.insert(g.token, g.op.id) {
            out.push(Violation {
                rule: Rule::S2,
                code: "s2-duplicate",
                work_id: wid.to_string(),
                at: g.op.invoked.at,
                message: format!("fencing token {} granted twice", g.token),
                ops: vec![first, g.op.id],
            });
        }
        if let Some(before) = granted.max_before(g.start) {
            if before.token >= g.token {
                out.push(Violation {
                    rule: Rule::S2,
                    code: "s2-order",
                    work_id: wid.to_string(),
                    at: g.op.invoked.at,
                    message: format!(
                        "fencing token {} granted after token {} had been granted",
                        g.token, before.token
                    ),
                    ops: vec![before.op.id, g.op.id],
                });
            }
        }
        let previous = g.op.applied.as_ref().and_then(|a| a.grant.as_ref());
        if let Some((_, h)) = previous {
            if let Some(prev) = &h.previous {
                if prev.fencing_token >= g.token {
                    out.push(Violation {
                        rule: Rule::S2,
                        code: "s2-handoff-order",
                        work_id: wid.to_string(),
                        at: g.op.invoked.at,
                        message: format!(
                            "fencing token {} follows token {} of the previous holder",
                            g.token, prev.fencing_token
                        ),
                        ops: vec![g.op.id],
                    });
                }
            }
        }
    }
}

fn names_lease(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Renew | OpKind::Checkpoint | OpKind::ReadCheckpoint | OpKind::Release
    )
}

fn extends(kind: OpKind) -> bool {
    matches!(kind, OpKind::Renew | OpKind::Checkpoint)
}

/// S3: the store accepts no call with a token that was taken over (a later
/// grant finished before the call started) or has expired (the call
/// started more than a TTL after the last extension of the lease ended,
/// with no extension of unknown outcome that could have kept it alive).
fn s3(
    wid: &str,
    ops: &[&OpRecord],
    grants: &[Grant<'_>],
    granted: &Granted<'_>,
    p: &Params,
    out: &mut Vec<Violation>,
) {
    let by_token: BTreeMap<u64, &Grant<'_>> = grants.iter().map(|g| (g.token, g)).collect();
    for o in ops.iter().filter(|o| names_lease(o.kind)) {
        let (Effect::Applied, Some((start, _)), Some(token)) = (o.effect(), o.span(), o.token)
        else {
            continue;
        };
        if let Some(later) = granted.max_before(start.seq) {
            if later.token > token {
                out.push(Violation {
                    rule: Rule::S3,
                    code: "s3-stale-token",
                    work_id: wid.to_string(),
                    at: start.at,
                    message: format!(
                        "{} with token {token} was accepted after token {} had been granted",
                        o.kind.name(),
                        later.token
                    ),
                    ops: vec![later.op.id, o.id],
                });
                continue;
            }
        }
        let Some(grant) = by_token.get(&token) else {
            continue;
        };
        if grant.start >= start.seq {
            continue;
        }
        let mut last = grant.op.span().map(|(_, e)| e.at);
        let mut last_op = grant.op.id;
        let mut unknown = false;
        for e in ops
            .iter()
            .filter(|e| extends(e.kind) && e.token == Some(token) && e.id != o.id)
        {
            let Some(a) = &e.applied else { continue };
            if a.start.seq >= start.seq {
                continue;
            }
            match (e.effect(), a.end) {
                (Effect::Applied, Some(end)) => {
                    if last.is_none_or(|l| end.at > l) {
                        last = Some(end.at);
                        last_op = e.id;
                    }
                }
                (Effect::None, _) => {}
                _ => unknown = true,
            }
        }
        if unknown {
            continue;
        }
        if let Some(l) = last {
            if start.at > l + p.ttl + p.tolerance {
                out.push(Violation {
                    rule: Rule::S3,
                    code: "s3-expired",
                    work_id: wid.to_string(),
                    at: start.at,
                    message: format!(
                        "{} with token {token} was accepted {}ms after the lease's last extension ended at {}ms (TTL {}ms): the lease had expired",
                        o.kind.name(),
                        (start.at - l).as_millis(),
                        l.as_millis(),
                        p.ttl.as_millis()
                    ),
                    ops: vec![last_op, o.id],
                });
            }
        }
    }
}

/// S4: a read returns the last applied checkpoint, or one whose outcome is
/// unknown or concurrent with it; never one that was refused, and never
/// one that an applied checkpoint replaced before the read started.
fn s4(wid: &str, ops: &[&OpRecord], out: &mut Vec<Violation>) {
    let checkpoints: Vec<&OpRecord> = ops
        .iter()
        .copied()
        .filter(|o| o.kind == OpKind::Checkpoint)
        .collect();
    let by_data: BTreeMap<&[u8], &OpRecord> = checkpoints
        .iter()
        .filter_map(|o| Some((o.data.as_deref()?, *o)))
        .collect();
    // Applied checkpoints by end, with the running latest start.
    let mut applied: Vec<(u64, u64, usize)> = checkpoints
        .iter()
        .filter(|o| o.effect() == Effect::Applied)
        .filter_map(|o| o.span().map(|(s, e)| (e.seq, s.seq, o.id)))
        .collect();
    applied.sort();
    let mut latest_start: Vec<(u64, usize)> = Vec::with_capacity(applied.len());
    let mut best: Option<(u64, usize)> = None;
    for (_, s, id) in &applied {
        if best.is_none_or(|(b, _)| *s > b) {
            best = Some((*s, *id));
        }
        latest_start.extend(best);
    }
    let latest_before = |seq: u64| -> Option<(u64, usize)> {
        let n = applied.partition_point(|(e, _, _)| *e < seq);
        latest_start.get(n.checked_sub(1)?).copied()
    };
    for r in ops.iter().filter(|o| o.kind == OpKind::ReadCheckpoint) {
        let (Effect::Applied, Some((start, end))) = (r.effect(), r.span()) else {
            continue;
        };
        let Some(read) = r.applied.as_ref().and_then(|a| a.read.as_ref()) else {
            continue;
        };
        let v = |code: &'static str, message: String, ops: Vec<usize>| Violation {
            rule: Rule::S4,
            code,
            work_id: wid.to_string(),
            at: start.at,
            message,
            ops,
        };
        match &read.data {
            None => {
                if let Some((_, id)) = latest_before(start.seq) {
                    out.push(v(
"s4-missing",
                        format!("read no checkpoint, although checkpoint #{id} had been applied before the read started"),
                        vec![id, r.id],
                    ));
                }
            }
            Some(d) => {
                let Some(c) = by_data.get(d.as_ref()) else {
                    out.push(v(
                        "s4-unknown-data",
                        format!(
                            "read checkpoint {:?}, which no holder wrote to this work ID",
                            String::from_utf8_lossy(d)
                        ),
                        vec![r.id],
                    ));
                    continue;
                };
                if c.effect() == Effect::None {
                    out.push(Violation {
                        rule: Rule::S3,
                        code: "s3-refused-changed-state",
                        work_id: wid.to_string(),
                        at: start.at,
                        message: format!(
                            "read checkpoint {:?}, whose write was refused or never reached the store ({:?}): a refused call changed state",
                            String::from_utf8_lossy(d),
                            c.applied.as_ref().and_then(|a| a.outcome)
                        ),
                        ops: vec![c.id, r.id],
                    });
                    continue;
                }
                let Some(a) = &c.applied else { continue };
                if a.start.seq > end.seq {
                    out.push(v(
                        "s4-read-before-write",
                        format!(
                            "read checkpoint {:?} before it was written",
                            String::from_utf8_lossy(d)
                        ),
                        vec![c.id, r.id],
                    ));
                    continue;
                }
                let written_by = a.end.map_or(u64::MAX, |e| e.seq);
                if let Some((s, id)) = latest_before(start.seq) {
                    if s > written_by {
                        out.push(v(
"s4-overwritten",
                            format!(
                                "read checkpoint {:?}, which checkpoint #{id} had replaced before the read started",
                                String::from_utf8_lossy(d)
                            ),
                            vec![c.id, id, r.id],
                        ));
                    }
                }
            }
        }
    }
}

/// S5: a grant's hand-off names the acquisition before it, and says
/// "released" exactly when that acquisition's release was applied (either
/// way when its outcome is unknown); a read reports its grant's hand-off.
fn s5(wid: &str, ops: &[&OpRecord], grants: &[Grant<'_>], p: &Params, out: &mut Vec<Violation>) {
    let by_token: BTreeMap<u64, &Grant<'_>> = grants.iter().map(|g| (g.token, g)).collect();
    let v = |code: &'static str, at: Duration, message: String, ops: Vec<usize>| Violation {
        rule: Rule::S5,
        code,
        work_id: wid.to_string(),
        at,
        message,
        ops,
    };
    for g in grants {
        let Some((_, handoff)) = g.op.applied.as_ref().and_then(|a| a.grant.as_ref()) else {
            continue;
        };
        let at = g.op.invoked.at;
        let Some(prev) = &handoff.previous else {
            if let Some(first) = grants.iter().find(|o| o.end < g.start) {
                out.push(v(
"s5-not-first",
                    at,
                    format!(
                        "token {} reported as the first acquisition, but token {} was granted before",
                        g.token, first.token
                    ),
                    vec![first.op.id, g.op.id],
                ));
            }
            continue;
        };
        if prev.ended == LeaseEnd::Revoked {
            out.push(v(
                "s5-revoked",
                at,
                format!(
                    "token {} follows a revoked lease (token {}), but nothing revoked it",
                    g.token, prev.fencing_token
                ),
                vec![g.op.id],
            ));
            continue;
        }
        match by_token.get(&prev.fencing_token) {
            Some(before) => {
                let holder = p.holder_ids.get(before.op.holder).map(String::as_str);
                if holder != Some(prev.holder_id.as_str()) {
                    out.push(v(
"s5-wrong-holder",
                        at,
                        format!(
                            "token {}'s hand-off names {:?} as holder of token {}, which h{} acquired",
                            g.token, prev.holder_id, prev.fencing_token, before.op.holder
                        ),
                        vec![before.op.id, g.op.id],
                    ));
                }
                if let Some(skipped) = grants
                    .iter()
                    .find(|o| o.token > prev.fencing_token && o.token < g.token)
                {
                    out.push(v(
                        "s5-skipped",
                        at,
                        format!(
                            "token {}'s hand-off names token {} as previous, skipping token {}",
                            g.token, prev.fencing_token, skipped.token
                        ),
                        vec![before.op.id, skipped.op.id, g.op.id],
                    ));
                }
                let releases: Vec<&&OpRecord> = ops
                    .iter()
                    .filter(|o| o.kind == OpKind::Release && o.token == Some(prev.fencing_token))
                    .collect();
                let applied = releases.iter().find(|o| o.effect() == Effect::Applied);
                let unknown = releases.iter().any(|o| o.effect() == Effect::Ambiguous);
                let clean = prev.ended == LeaseEnd::Released;
                match (applied, unknown, clean) {
                    (Some(r), _, false) => out.push(v(
"s5-release-ignored",
                        at,
                        format!(
                            "token {} reports an unclean hand-off ({}), but the release of token {} was applied",
                            g.token,
                            prev.ended.as_str(),
                            prev.fencing_token
                        ),
                        vec![r.id, g.op.id],
                    )),
                    (None, false, true) => out.push(v(
"s5-clean-without-release",
                        at,
                        format!(
                            "token {} reports a clean hand-off, but no release of token {} was applied",
                            g.token, prev.fencing_token
                        ),
                        releases.iter().map(|o| o.id).chain([g.op.id]).collect(),
                    )),
                    _ => {}
                }
            }
            None => {
                // An acquisition whose reply nobody saw: its holder never
                // learned the token, so nobody could release it.
                let candidate = ops.iter().any(|o| {
                    o.kind == OpKind::Acquire
                        && o.effect() == Effect::Ambiguous
                        && p.holder_ids.get(o.holder).map(String::as_str)
                            == Some(prev.holder_id.as_str())
                        && o.applied.as_ref().is_some_and(|a| a.start.seq < g.end)
                });
                if !candidate {
                    out.push(v(
"s5-unknown-previous",
                        at,
                        format!(
                            "token {}'s hand-off names token {} of {:?}, which no acquisition produced",
                            g.token, prev.fencing_token, prev.holder_id
                        ),
                        vec![g.op.id],
                    ));
                } else if prev.ended == LeaseEnd::Released {
                    out.push(v(
"s5-clean-from-unknown",
                        at,
                        format!(
                            "token {} reports a clean hand-off from token {}, whose grant nobody received",
                            g.token, prev.fencing_token
                        ),
                        vec![g.op.id],
                    ));
                }
            }
        }
    }
    for r in ops.iter().filter(|o| o.kind == OpKind::ReadCheckpoint) {
        let (Some(read), Some(token)) = (r.applied.as_ref().and_then(|a| a.read.as_ref()), r.token)
        else {
            continue;
        };
        let Some(g) = by_token.get(&token) else {
            continue;
        };
        let Some((_, handoff)) = g.op.applied.as_ref().and_then(|a| a.grant.as_ref()) else {
            continue;
        };
        if read.handoff != *handoff {
            out.push(v(
                "s5-read-differs",
                r.invoked.at,
                format!(
                    "the read of token {token} reports hand-off {:?}, the grant reported {:?}",
                    read.handoff.previous, handoff.previous
                ),
                vec![g.op.id, r.id],
            ));
        }
    }
}
