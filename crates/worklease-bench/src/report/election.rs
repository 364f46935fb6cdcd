//! The election scenario in the report: its goals (issue 19: a hand-over
//! after a resign or a step-down request within 2 store round trips + one
//! notification, median, 1 and 16 candidates; an observer learns of a new
//! leader within one notification or one poll), what stands in their way,
//! and the table.
//!
//! The bound is the unfair push hand-off to one waiter measured in the
//! same run on the same store value (the row with `how: bound`), as for
//! the fair hand-off ([`super::fair`]): the release's round trip, one
//! notification and the acquisition's round trip. An observer's bound is
//! the same figure: one notification and its two reads (the lease, then
//! the term's record); on a store without notifications, one poll
//! interval and those two reads.

use std::fmt::Write as _;

use super::format::{failed_calls, failures, ms};
use super::verdict::{
    of_bound, over_bound, stores, within_bound, Verdict, GOAL_ELECTION_HANDOVER, GOAL_OBSERVE,
};
use crate::results::{ElectionRow, HandOver, Run};

/// The bound row of `store`.
fn bound<'a>(run: &'a Run, store: &str) -> Option<&'a ElectionRow> {
    run.election
        .iter()
        .find(|r| r.how == HandOver::Bound && r.handoff.store == store)
}

/// The hand-over rows (resign, step-down) of `store`.
fn hand_overs<'a>(run: &'a Run, store: &str) -> Vec<&'a ElectionRow> {
    run.election
        .iter()
        .filter(|r| r.how != HandOver::Bound && r.handoff.store == store)
        .collect()
}

/// An observer's bound on `store`, µs: the hand-off bound where the store
/// notifies; one poll interval and two round trips where it does not.
fn observe_bound_us(run: &Run, b: &ElectionRow) -> u64 {
    if b.handoff.notified {
        b.handoff.latency.p50_us
    } else {
        run.plan.handoff_poll_ms * 1000 + 2 * b.handoff.round_trip_us
    }
}

/// The election goals of every store of the run: the hand-over goal on
/// stores with notifications, the observer goal on all.
pub fn verdicts(run: &Run, v: &mut Vec<Verdict>) {
    for store in stores(run) {
        let rows = hand_overs(run, store);
        if rows.is_empty() {
            continue;
        }
        let verdict = |goal, measured: String, met| Verdict {
            goal,
            store: store.to_string(),
            measured,
            met,
        };
        let Some(b) = bound(run, store) else {
            v.push(verdict(
                GOAL_ELECTION_HANDOVER,
                "the unfair push hand-off to one waiter (the bound) was not measured".into(),
                None,
            ));
            continue;
        };
        let bound_us = b.handoff.latency.p50_us;
        if rows.iter().all(|r| r.handoff.notified) {
            let list: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{} with {} standby(s): {} ms ({:.2} × the bound)",
                        r.how.as_str(),
                        r.handoff.waiters,
                        ms(r.handoff.latency.p50_us),
                        of_bound(&r.handoff, &b.handoff)
                    )
                })
                .collect();
            let met = within_bound(&b.handoff, rows.iter().map(|r| &r.handoff));
            v.push(verdict(
                GOAL_ELECTION_HANDOVER,
                format!(
                    "{}; bound {} ms: the unfair push hand-off to one waiter (2 round trips of {} ms + one notification)",
                    list.join(", "),
                    ms(bound_us),
                    ms(b.handoff.round_trip_us)
                ),
                Some(met),
            ));
        }
        let observe_us = observe_bound_us(run, b);
        let list: Vec<String> = rows
            .iter()
            .filter_map(|r| {
                let o = r.observed.as_ref()?;
                Some(format!(
                    "{} with {} standby(s): p50 {} ms, p99 {} ms",
                    r.how.as_str(),
                    r.handoff.waiters,
                    ms(o.p50_us),
                    ms(o.p99_us)
                ))
            })
            .collect();
        let met = rows.iter().all(|r| {
            r.observed
                .as_ref()
                .is_some_and(|o| o.count > 0 && o.p50_us <= observe_us)
        });
        v.push(verdict(
            GOAL_OBSERVE,
            format!(
                "{} (median judged); bound {} ms: {}",
                list.join(", "),
                ms(observe_us),
                if b.handoff.notified {
                    "one notification and its two reads, as the unfair push hand-off to one waiter"
                } else {
                    "one poll interval and two round trips (no notifications)"
                }
            ),
            Some(met),
        ));
    }
}

/// What stands in the way of an unmet election goal; `None` for the
/// other goals.
pub fn why(run: &Run, v: &Verdict) -> Option<String> {
    if v.goal != GOAL_ELECTION_HANDOVER && v.goal != GOAL_OBSERVE {
        return None;
    }
    let b = bound(run, &v.store)?;
    if v.goal == GOAL_OBSERVE {
        return Some(format!(
            "an observer reads the lease and the term's record after the notification of the release (the release, not the acquisition, is what the store notifies), then again after twice the last read's round trip, doubling up to the poll interval ({} ms), until it finds the next leader; a next leader slower to start than those reads is seen one doubling later.",
            run.plan.handoff_poll_ms
        ));
    }
    let over = over_bound(
        &b.handoff,
        hand_overs(run, &v.store).into_iter().map(|r| {
            (
                format!(
                    "on {} with {} standby(s)",
                    r.how.as_str(),
                    r.handoff.waiters
                ),
                &r.handoff,
            )
        }),
    );
    Some(format!(
        "measured: {}. The figure ends when the next leader's function starts, and a term starts with its record: after the acquisition (the bound's end) the new leader reads the record handed over (for the transitions count) and writes its own (term, since, priority, published value), two more store calls, so that no leader works without its record; `resign` itself first stops the renewal. With 16 standbys every one of them is woken by the release and tries the lease: on a store that serializes writes (one etcd Raft log, one SQLite write lock) the winner's record calls queue behind the losers' attempts.",
        if over.is_empty() {
            "no hand-over over the bound".to_string()
        } else {
            over.join(", ")
        }
    ))
}

/// The election table.
pub fn table(w: &mut String, run: &Run) {
    if run.election.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## Election hand-over: resign or step-down → the next leader\n"
    );
    let _ = writeln!(
        w,
        "A leader holds for {} ms plus a random part of a poll interval, then gives up; N standby candidates (`Elector::lead`, poll every {} ms as the fallback) wait; the figure is from the leader giving up to the next leader's function starting (lease held, term's record written). **resign**: the leader's function calls `Leadership::resign`, timed from that call. **step-down**: another task calls `election::request_step_down`; timed from the leader's lost signal (it saw the request; its function returns and `lead` releases); **seen** is the request's start to that signal. A leader sits out until another one leads. **observer**: an `election::observe` stream beside them; from each term's start to its first report of that term (0 when it reported it first), and the terms it never reported (over before it read). **bound**: the unfair push hand-off to one waiter on the same store value (2 round trips + one notification). All in this process, on one store value.\n",
        run.plan.handoff_hold_ms, run.plan.handoff_poll_ms
    );
    let _ = writeln!(w, "| store | standbys | gave up by | p50 ms | p99 ms | hand-overs | round trip ms | p50 / bound | seen p50 ms | observer p50 ms | observer p99 ms | terms not reported |\n|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    for r in &run.election {
        let h = &r.handoff;
        let b = bound(run, &h.store);
        let opt = |l: Option<u64>| l.map_or("-".to_string(), ms);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            h.store,
            h.waiters,
            match (r.how, h.notified) {
                (HandOver::Bound, true) => "bound: unfair hand-off, push",
                (HandOver::Bound, false) => "bound: unfair hand-off, polling",
                (how, _) => how.as_str(),
            },
            ms(h.latency.p50_us),
            ms(h.latency.p99_us),
            h.latency.count,
            ms(h.round_trip_us),
            b.map_or("-".into(), |b| format!("{:.2}", of_bound(h, &b.handoff))),
            opt(r.seen.as_ref().map(|l| l.p50_us)),
            opt(r.observed.as_ref().map(|l| l.p50_us)),
            opt(r.observed.as_ref().map(|l| l.p99_us)),
            if r.how == HandOver::Bound {
                "-".to_string()
            } else {
                r.observed_missed.to_string()
            },
        );
        notes.extend(failed_calls(
            format!("{} {} with {} standbys", h.store, r.how.as_str(), h.waiters),
            h.errors,
            h.first_error.as_deref(),
        ));
    }
    failures(w, "Failures", &notes);
}
