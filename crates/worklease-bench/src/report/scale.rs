//! The scale scenario in the report: its goals (leases renewed, store
//! calls per tick, CPU and memory per lease, a register store's ceiling),
//! what stands in their way, and its tables.

use std::fmt::Write as _;

use super::format::{count, ms_f, rate};
use super::verdict::{Verdict, GOAL_CALLS, GOAL_CPU, GOAL_RSS, GOAL_SCALE, GOAL_SCALE_REGISTER};
use crate::results::{Run, ScaleRow, Variant};

/// The size of the goals of a store with its own clock, and of a register
/// store's.
const GOAL_LEASES: usize = 100_000;
const GOAL_REGISTER_LEASES: usize = 1_000;
/// The goals' bounds: CPU µs per renewal, resident bytes per lease.
const GOAL_CPU_US: f64 = 5.0;
const GOAL_RSS_BYTES: f64 = 2048.0;

/// A store's scale row at `leases` leases.
fn row<'a>(run: &'a Run, store: &str, leases: usize) -> Option<&'a ScaleRow> {
    run.scale
        .iter()
        .find(|s| s.store == store && s.leases == leases)
}

/// Seconds between two renewals of a lease.
fn interval_secs(s: &ScaleRow) -> f64 {
    s.renew_interval_ms.max(1) as f64 / 1000.0
}

/// Renewals per second `leases` leases need.
fn needed(s: &ScaleRow, leases: usize) -> f64 {
    leases as f64 / interval_secs(s)
}

/// Why a row's CPU and memory per lease are no figures at its size:
/// fewer leases acquired than asked, or some lost.
fn short_of(s: &ScaleRow) -> Option<String> {
    let mut short = Vec::new();
    if s.acquired < s.leases {
        short.push(format!(
            "only {} of the {} leases acquired",
            count(s.acquired as u64),
            count(s.leases as u64)
        ));
    }
    if s.missed > 0 {
        short.push(format!("{} lost", count(s.missed)));
    }
    (!short.is_empty()).then(|| {
        format!(
            "; {}: no figure at {}",
            short.join(", "),
            count(s.leases as u64)
        )
    })
}

/// Held, missed and failed, for a goal's measured column.
fn held(s: &ScaleRow) -> String {
    format!(
        "{} of {} acquired; {} renewals missed (leases lost), {} failed attempts",
        count(s.acquired as u64),
        count(s.leases as u64),
        count(s.missed),
        count(s.renewal_failures)
    )
}

/// The scale goals of every store of the run.
pub fn verdicts(run: &Run, v: &mut Vec<Verdict>) {
    for info in &run.stores {
        let store = info.name.as_str();
        let verdict = |goal, measured: String, met| Verdict {
            goal,
            store: store.to_string(),
            measured,
            met,
        };
        if info.register {
            v.push(match row(run, store, GOAL_REGISTER_LEASES) {
                Some(s) => verdict(
                    GOAL_SCALE_REGISTER,
                    format!(
                        "{}; {}",
                        held(s),
                        s.register_ceiling().map_or_else(
                            || "ceiling not measured".to_string(),
                            |c| format!(
                                "ceiling {} leases ({} requests/s × {:.2} s / 2 requests per renewal)",
                                count(c as u64),
                                rate(s.register_requests_per_sec.unwrap_or_default()),
                                interval_secs(s)
                            )
                        )
                    ),
                    Some(s.acquired == s.leases && s.missed == 0),
                ),
                None => verdict(
                    GOAL_SCALE_REGISTER,
                    "not measured at 1,000 leases in this run".to_string(),
                    None,
                ),
            });
        } else {
            match row(run, store, GOAL_LEASES) {
                Some(s) => {
                    v.push(verdict(
                        GOAL_SCALE,
                        held(s),
                        Some(s.acquired == s.leases && s.missed == 0),
                    ));
                    // Judged only where every lease was held to the end.
                    let short = short_of(s);
                    let judged = |met: bool| short.is_none().then_some(met);
                    let caveat = short.clone().unwrap_or_default();
                    v.push(match s.cpu_us_per_renewal() {
                        Some(c) => verdict(
                            GOAL_CPU,
                            format!(
                                "{c:.1} µs per renewal ({} renewals in {:.0} s, {:.3} CPU s/s){caveat}",
                                count(s.renewals_ok),
                                s.window_secs,
                                s.cpu_per_sec,
                            ),
                            judged(c <= GOAL_CPU_US),
                        ),
                        None => verdict(
                            GOAL_CPU,
                            format!("no renewal succeeded in the window{caveat}"),
                            judged(false),
                        ),
                    });
                    v.push(verdict(
                        GOAL_RSS,
                        format!(
                            "{:.0} B ({:.2} KiB) per lease{caveat}",
                            s.rss_per_lease_bytes,
                            s.rss_per_lease_bytes / 1024.0,
                        ),
                        judged(s.rss_per_lease_bytes <= GOAL_RSS_BYTES),
                    ));
                }
                None => {
                    for goal in [GOAL_SCALE, GOAL_CPU, GOAL_RSS] {
                        v.push(verdict(
                            goal,
                            "not measured at 100,000 leases in this run".to_string(),
                            None,
                        ));
                    }
                }
            }
        }
        let judged: Vec<(&ScaleRow, f64, u64)> = run
            .scale
            .iter()
            .filter(|s| s.store == store)
            .filter_map(|s| Some((s, s.calls_per_tick()?, s.calls_bound()?)))
            .collect();
        v.push(if judged.is_empty() {
            let measured = if run.scale.iter().any(|s| s.store == store) {
                "store calls not counted in this run"
            } else {
                "not measured in this run"
            };
            verdict(GOAL_CALLS, measured.to_string(), None)
        } else {
            let list: Vec<String> = judged
                .iter()
                .map(|(s, c, b)| {
                    format!(
                        "{}: {c:.1} per tick for {} due (bound {b})",
                        count(s.leases as u64),
                        rate(s.due_per_tick().unwrap_or_default())
                    )
                })
                .collect();
            verdict(
                GOAL_CALLS,
                format!("by leases: {}", list.join(", ")),
                Some(judged.iter().all(|(_, c, b)| *c <= *b as f64)),
            )
        });
    }
}

/// The best single-client and 16-client baseline rate of a store (one
/// compare-and-set per operation: renew's baseline).
fn baseline_peak(run: &Run, store: &str) -> Option<f64> {
    run.renew
        .iter()
        .filter(|r| r.store == store && r.variant == Variant::Baseline)
        .map(|r| r.ops_per_sec)
        .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
}

/// What stands in the way of an unmet scale goal; `None` for the other
/// goals.
pub fn why(run: &Run, v: &Verdict) -> Option<String> {
    let at = |leases| row(run, &v.store, leases);
    Some(match v.goal {
        GOAL_SCALE => {
            let s = at(GOAL_LEASES)?;
            let achieved = s.renewals_ok as f64 / s.window_secs.max(0.001);
            let calls = match (s.renew_calls, s.renew_call_secs, s.max_batch) {
                (Some(c), Some(secs), Some(b)) if c > 0 => format!(
                    ", in {} `renew_many` store calls of up to {} leases ({} ms each on average)",
                    count(c),
                    count(b as u64),
                    ms_f(secs * 1000.0 / c as f64)
                ),
                _ => String::new(),
            };
            let acquired = if s.acquired < s.leases {
                format!(
                    "; only {} of the {} leases were acquired within the {:.0} s limit",
                    count(s.acquired as u64),
                    count(s.leases as u64),
                    run.plan.scale_acquire_limit_secs
                )
            } else {
                String::new()
            };
            format!(
                "{} leases renewed every {:.2} s need {} renewals/s; this process did {}/s in the window{calls}{}{acquired}. A store whose `renew_many` is the trait's default renews one lease per request, 16 at once, so each lease is still one store write of its own (a commit, a Raft write or a request); what lifts the ceiling is the store's own batch: one statement, script or transaction for many leases (one commit or one round trip per batch).",
                count(s.leases as u64),
                interval_secs(s),
                rate(needed(s, s.leases)),
                rate(achieved),
                baseline_peak(run, &v.store)
                    .map(|p| format!(", and the store's own minimal compare-and-set reached {}/s at best in this run (the renew baseline)", rate(p)))
                    .unwrap_or_default()
            )
        }
        GOAL_SCALE_REGISTER => {
            let s = at(GOAL_REGISTER_LEASES)?;
            let ceiling = match (s.register_requests_per_sec, s.register_ceiling()) {
                (Some(r), Some(c)) => format!(
                    " The server answered {} conditional writes/s at {} clients just before this run, so one process can keep at most {} × {:.2} s / 2 = {} leases renewed every {:.2} s (TTL/3);",
                    rate(r),
                    s.max_batch.unwrap_or_default(),
                    rate(r),
                    interval_secs(s),
                    count(c as u64),
                    interval_secs(s)
                ),
                _ => String::new(),
            };
            format!(
                "a register store has no batch and no clock of its own: each renewal is a read and a conditional write (two requests), whatever the batch size.{ceiling} {} leases need {} requests/s.",
                count(s.leases as u64),
                rate(needed(s, s.leases) * ScaleRow::REGISTER_REQUESTS_PER_RENEWAL)
            )
        }
        GOAL_CALLS => "the session sends a batch when its first lease falls due and takes along the leases due within an eighth of their interval, up to the store's batch size: leases that fall due further apart than that (acquired by calls far apart in time, or retried after a failed attempt) go in partial batches of their own.".to_string(),
        GOAL_CPU => {
            let s = at(GOAL_LEASES)?;
            format!(
                "{} µs of CPU per renewal: this process's CPU time in the window over the renewals done in it, which includes per lease the session's bookkeeping (due time, deadline, observer and metrics calls) and its share of the store client's work on each call; a store whose `renew_many` is the trait's default makes one request per lease, each with a single call's whole client cost.",
                s.cpu_us_per_renewal().map_or("-".to_string(), |c| format!("{c:.1}"))
            )
        }
        GOAL_RSS => {
            let s = at(GOAL_LEASES)?;
            format!(
                "{:.0} B per held lease: this process's resident growth over the leases it holds: per lease the token (work ID and holder ID), the renewal handle (watch channel, lost signal) and the session's entry (due-time and deadline keys, map slot){}, and what the allocator keeps.",
                s.rss_per_lease_bytes,
                match v.store.as_str() {
                    "memory" => ", the memory store's own table (the store is in this process)",
                    "sqlite" => ", SQLite's page cache (the database is opened in this process)",
                    _ => "",
                }
            )
        }
        _ => return None,
    })
}

/// The scale tables.
pub fn tables(w: &mut String, run: &Run) {
    let Some(first) = run.scale.first() else {
        return;
    };
    let p = &run.plan;
    let _ = writeln!(w, "\n## Scale: one process holds and renews N leases\n");
    let _ = writeln!(
        w,
        "One process acquires N leases (TTL {} s) with `acquire_many`, in calls of up to {} work IDs with {} in flight, and renews each in the background (`start_renewal`, every {:.2} s) from its acquisition on: the handle's session renews them in batches (`renew_many`, at most the store's batch size per call). Then a window of {:.0} s (whole intervals) is measured, starting half an interval after the last acquisition. CPU: user + system seconds of this process per second of the window (`getrusage`; a server's own CPU is not in it). Memory: growth of this process's resident set (`/proc/self/statm`) from before acquiring to the end of the window, per lease (for the memory and SQLite stores it includes the store itself). Renewals needed: per second, for the leases acquired (acquired / interval). Done / due: renewals sent in the window that succeeded, against those the window asks for (each lease sends one every interval after its previous send, and the window is whole intervals, so a lease on schedule sends exactly window / interval; fewer means renewals fell behind). Missed: leases whose renewal did not succeed before the holder's deadline, so the lease was lost (from the first acquisition to the end of the window). Closest call: the least lease time left when a renewal came back.\n",
        first.ttl_ms as f64 / 1000.0,
        count(p.scale_acquire_batch as u64),
        p.scale_acquire_in_flight,
        interval_secs(first),
        first.window_secs
    );
    let registers: Vec<&str> = run
        .stores
        .iter()
        .filter(|s| s.register)
        .map(|s| s.name.as_str())
        .collect();
    if !registers.is_empty() {
        let _ = writeln!(
            w,
            "Sizes: a register store ({}) runs at fewer leases than the others: each of its renewals is a read and a conditional write with no batch, so its ceiling is the server's request rate × interval / 2 (stated in the goals); 100,000 leases would need {} requests/s.\n",
            registers.join(", "),
            rate(needed(first, 100_000) * ScaleRow::REGISTER_REQUESTS_PER_RENEWAL)
        );
    }
    let _ = writeln!(w, "| store | leases | acquired | in s | CPU s/s | RSS / lease | renewals needed /s | renewals done / due in window | failed attempts | missed | closest call ms |\n|---|---|---|---|---|---|---|---|---|---|---|");
    for s in &run.scale {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.1} | {:.3} | {:.0} B | {} | {} / {} | {} | {} | {} |",
            s.store,
            count(s.leases as u64),
            count(s.acquired as u64),
            s.acquire_secs,
            s.cpu_per_sec,
            s.rss_per_lease_bytes,
            rate(needed(s, s.acquired)),
            count(s.renewals_ok),
            count(s.renewals_due),
            count(s.renewal_failures),
            count(s.missed),
            s.min_left_ms.map_or("-".into(), ms_f)
        );
    }
    let _ = writeln!(w, "\n### Store calls and cost per renewal\n");
    let _ = writeln!(
        w,
        "Store calls: the batch renewals (`renew_many`) that ended in the window, counted by a `metrics` recorder in the scale process from the library's `worklease_operation_seconds` (one record per store call). A tick is one renewal interval: the window holds window / interval of them, and each lease is due once per tick. Due / tick: the renewal attempts sent in the window per tick (the acquired leases while renewals keep their schedule, fewer once they fall behind). Bound: ceil(due / batch size), the fewest calls a tick can take. A store whose `renew_many` is the trait's default answers one call with that many single renewals, 16 at once: for it a call is not one round trip (its mean call time says so). CPU per renewal: CPU seconds in the window / renewals done in it.\n"
    );
    let _ = writeln!(w, "| store | leases | batch size | ticks | due / tick | calls / tick | bound | mean call ms | CPU µs / renewal | RSS / lease |\n|---|---|---|---|---|---|---|---|---|---|");
    let or_dash = |x: Option<String>| x.unwrap_or_else(|| "-".to_string());
    for s in &run.scale {
        let mean_call = s
            .renew_calls
            .filter(|c| *c > 0)
            .zip(s.renew_call_secs)
            .map(|(c, secs)| ms_f(secs * 1000.0 / c as f64));
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} B |",
            s.store,
            count(s.leases as u64),
            or_dash(s.max_batch.map(|b| count(b as u64))),
            or_dash(s.ticks.map(count)),
            or_dash(s.due_per_tick().map(rate)),
            or_dash(s.calls_per_tick().map(|c| format!("{c:.1}"))),
            or_dash(s.calls_bound().map(count)),
            or_dash(mean_call),
            or_dash(s.cpu_us_per_renewal().map(|c| format!("{c:.1}"))),
            s.rss_per_lease_bytes
        );
    }
    let rates: Vec<String> = run
        .scale
        .iter()
        .filter_map(|s| {
            Some(format!(
                "- {} at {} leases: {} conditional writes/s at {} clients before the run: ceiling {} leases",
                s.store,
                count(s.leases as u64),
                rate(s.register_requests_per_sec?),
                s.max_batch?,
                count(s.register_ceiling()? as u64)
            ))
        })
        .collect();
    if !rates.is_empty() {
        let _ = writeln!(
            w,
            "\nRegister stores' request rate (the baseline's conditional writes) and the ceiling it sets (requests/s × interval / 2 requests per renewal):\n\n{}",
            rates.join("\n")
        );
    }
}
