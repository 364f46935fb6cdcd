//! BENCHMARKS.md from a run's JSON: the machine, the exact command, the
//! goals and whether they were met, a table per scenario, the plots.

use std::fmt::Write as _;

use crate::results::{HandoffMode, HandoffRow, OpRow, Run, ScaleRow, Variant};

/// The goals of issue 10, in the words of the report.
const GOAL_CYCLE: &str = "cycle throughput ≥ 0.9 × baseline at 16 clients";
const GOAL_P99: &str = "cycle p99 latency ≤ 1.2 × baseline's at 16 clients";
const GOAL_FAILOVER: &str = "failover within TTL + poll interval + 50 ms";
const GOAL_HANDOFF: &str = "hand-off with push within 2 store round trips (median)";
const GOAL_PEER: &str = "cycle at least as fast as the peer lock at every concurrency";
const GOAL_SCALE: &str = "100,000 leases renewed by one process, no renewal missed";

/// A rate with thousands separators.
fn rate(x: f64) -> String {
    if x < 10.0 {
        return format!("{x:.1}");
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A count with thousands separators.
fn count(n: u64) -> String {
    rate(n as f64).trim_end_matches(".0").to_string()
}

/// Microseconds as milliseconds, to 3 significant digits or so.
fn ms(us: u64) -> String {
    ms_f(us as f64 / 1000.0)
}

fn ms_f(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn mark(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**not met**"
    }
}

fn find<'a>(
    rows: &'a [OpRow],
    store: &str,
    clients: usize,
    bytes: Option<usize>,
    variant: Variant,
) -> Option<&'a OpRow> {
    rows.iter().find(|r| {
        r.store == store && r.clients == clients && r.bytes == bytes && r.variant == variant
    })
}

/// The stores of a run, in its order.
fn stores(run: &Run) -> Vec<&str> {
    run.stores.iter().map(|s| s.name.as_str()).collect()
}

/// One goal's verdict for one store.
struct Verdict {
    goal: &'static str,
    store: String,
    measured: String,
    /// `None`: not measured in this run.
    met: Option<bool>,
}

fn goals(run: &Run) -> Vec<Verdict> {
    let mut v = Vec::new();
    for store in stores(run) {
        let ours = find(&run.cycle, store, 16, None, Variant::Ours);
        let base = find(&run.cycle, store, 16, None, Variant::Baseline);
        match (ours, base) {
            (Some(o), Some(b)) => {
                let r = o.ops_per_sec / b.ops_per_sec;
                v.push(Verdict {
                    goal: GOAL_CYCLE,
                    store: store.to_string(),
                    measured: format!(
                        "{r:.2} × ({} vs {} cycles/s)",
                        rate(o.ops_per_sec),
                        rate(b.ops_per_sec)
                    ),
                    met: Some(r >= 0.9),
                });
                let p = o.latency.p99_us as f64 / b.latency.p99_us.max(1) as f64;
                v.push(Verdict {
                    goal: GOAL_P99,
                    store: store.to_string(),
                    measured: format!(
                        "{p:.2} × ({} vs {} ms)",
                        ms(o.latency.p99_us),
                        ms(b.latency.p99_us)
                    ),
                    met: Some(p <= 1.2),
                });
            }
            _ => {
                for goal in [GOAL_CYCLE, GOAL_P99] {
                    v.push(Verdict {
                        goal,
                        store: store.to_string(),
                        measured: "not measured at 16 clients in this run".to_string(),
                        met: None,
                    });
                }
            }
        }
    }
    for store in stores(run) {
        let ratios: Vec<(usize, f64)> = run
            .cycle
            .iter()
            .filter(|r| r.store == store && r.variant == Variant::Peer)
            .filter_map(|p| {
                find(&run.cycle, store, p.clients, None, Variant::Ours)
                    .map(|o| (p.clients, o.ops_per_sec / p.ops_per_sec))
            })
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let worst = ratios
            .iter()
            .cloned()
            .fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        let list: Vec<String> = ratios
            .iter()
            .map(|(c, r)| format!("{c}: {r:.2} ×"))
            .collect();
        v.push(Verdict {
            goal: GOAL_PEER,
            store: store.to_string(),
            measured: format!("ours / peer by clients: {}", list.join(", ")),
            met: Some(worst.1 >= 1.0),
        });
    }
    for f in &run.failover {
        let max = f.trials_ms.iter().cloned().fold(0.0, f64::max);
        v.push(Verdict {
            goal: GOAL_FAILOVER,
            store: f.store.clone(),
            measured: if f.trials_ms.is_empty() {
                format!(
                    "no trial succeeded: {}",
                    f.first_error.as_deref().unwrap_or("?")
                )
            } else {
                format!(
                    "worst {} ms of {} trials; bound {} ms (TTL {} + poll {} + 50)",
                    ms_f(max),
                    f.trials_ms.len(),
                    f.bound_ms,
                    f.ttl_ms,
                    f.poll_ms
                )
            },
            met: Some(!f.trials_ms.is_empty() && f.errors == 0 && max <= f.bound_ms as f64),
        });
    }
    for store in stores(run) {
        let rows: Vec<&HandoffRow> = run
            .handoff
            .iter()
            .filter(|h| h.store == store && h.mode == HandoffMode::Push)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let list: Vec<String> = rows
            .iter()
            .map(|h| {
                format!(
                    "{} waiter(s): {:.1} round trips",
                    h.waiters,
                    h.latency.p50_us as f64 / h.round_trip_us.max(1) as f64
                )
            })
            .collect();
        let notified = rows.iter().all(|h| h.notified);
        let met = notified
            && rows
                .iter()
                .all(|h| h.errors == 0 && h.latency.p50_us <= 2 * h.round_trip_us.max(1));
        v.push(Verdict {
            goal: GOAL_HANDOFF,
            store: store.to_string(),
            measured: format!(
                "{}{} (round trip {} ms)",
                if notified {
                    ""
                } else {
                    "no push, the store has no notifications: "
                },
                list.join(", "),
                ms(rows[0].round_trip_us)
            ),
            met: Some(met),
        });
    }
    for store in stores(run) {
        let row = run
            .scale
            .iter()
            .find(|s| s.store == store && s.leases == 100_000);
        v.push(match row {
            Some(s) => Verdict {
                goal: GOAL_SCALE,
                store: store.to_string(),
                measured: format!(
                    "{} of 100,000 acquired; {} renewals missed (leases lost), {} failed attempts",
                    count(s.acquired as u64),
                    count(s.missed),
                    count(s.renewal_failures)
                ),
                met: Some(s.acquired == s.leases && s.missed == 0),
            },
            None => Verdict {
                goal: GOAL_SCALE,
                store: store.to_string(),
                measured: "not measured at 100,000 leases in this run".to_string(),
                met: None,
            },
        });
    }
    v
}

/// What one of ours' operations costs on each store, beside its baseline
/// (facts of the stores' designs, to read the ratios by).
fn store_note(store: &str) -> Option<&'static str> {
    Some(match store {
        "memory" => "ours: each call takes the store's mutex, checks the lease rules, builds the grant (token, hand-off facts) and goes through the lease layer (tracing span, metrics, observer); the baseline is one `HashMap` entry update under a mutex, so the ratio measures that fixed overhead. The store keeps the record of every work ID it has seen (fencing tokens must not go back), so the cycle's millions of fresh work IDs grow its table, and each resize of the table holds the store's lock: the cycle's maximum latencies.",
        "sqlite" => "ours: each call is one `BEGIN IMMEDIATE` transaction (read the row, decide, write, commit; an acquisition also bumps the fencing sequence) on the store's one connection; the baseline is one autocommit `UPDATE`. Both are bound by one fsync per commit, and both run one at a time on one connection, so adding clients adds little throughput.",
        "postgres" => "ours: each call is one prepared statement on the store's pool (an acquisition: a CTE that locks the current row, `INSERT ... ON CONFLICT DO UPDATE` drawing from the fencing sequence; a release: an `UPDATE` with the verdict and, when a waiter marked the row, `pg_notify`); the baseline is one single-row `UPDATE`. Every statement commits: at one client both follow the WAL flush.",
        "redis" => "ours: each call is one `EVALSHA` of a Lua script touching the lease's keys (state hash, `live` key with its PX TTL, fencing counter; a checkpoint also its data key); the baseline is one `EVALSHA` of a 3-command script. All clients share the store's one multiplexed connection, as the baseline does.",
        "etcd" => "ours: an acquisition is a read of the lease's keys, an etcd lease grant and a transaction (three round trips, two of them Raft writes); a renewal or checkpoint a keep-alive of the etcd lease and a transaction; a release one transaction. The baseline is one transaction (one Raft write).",
        "s3" => "ours goes through the register adapter: each operation reads the object, then writes it conditionally (two requests); the baseline is one conditional PUT.",
        _ => return None,
    })
}

/// The Markdown report. `json` and `plots` are links relative to the
/// report.
pub fn markdown(run: &Run, json: &str, plots: &[(String, String)]) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# Benchmarks\n");
    let _ = writeln!(
        w,
        "<!-- Generated by worklease-bench from {json}: do not edit by hand; run the command below again. -->\n"
    );
    let _ = writeln!(
        w,
        "How close worklease comes, on each store, to the store's physical limit, one round trip, measured as the store's minimal compare-and-set on the same client library and pool (the **baseline**), and how it compares with the lock users already have on the same server (the **peer**): all side by side in one run, measured alternately in slices so that a change of the machine's load hits every variant alike.\n"
    );
    if run.quick {
        let _ = writeln!(
            w,
            "> **A `--quick` smoke run**: tiny sizes and durations, to check that every scenario runs. Its figures mean little.\n"
        );
    }
    let m = &run.machine;
    let load = |l: Option<[f64; 3]>| {
        l.map_or("?".to_string(), |l| {
            format!("{:.2} / {:.2} / {:.2}", l[0], l[1], l[2])
        })
    };
    let _ = writeln!(w, "## This run\n");
    let _ = writeln!(w, "| | |\n|---|---|");
    let _ = writeln!(
        w,
        "| command | `{}` (from the repository root) |",
        run.command
    );
    let _ = writeln!(
        w,
        "| machine | {} cores ({}), {:.1} GiB, Linux {}{} |",
        m.cores,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        m.rustc
            .as_deref()
            .map(|r| format!(", {r}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        w,
        "| load average (1 / 5 / 15 min) | {} at the start, {} at the end: the servers and this program share the {} cores{} |",
        load(m.load_average_start),
        load(m.load_average_end),
        m.cores,
        match m.load_average_start {
            Some(l) if l[0] > 0.5 => ", and other work was running when it started",
            _ => "",
        }
    );
    let _ = writeln!(w, "| took | {:.1} min |", run.elapsed_secs / 60.0);
    let _ = writeln!(
        w,
        "| per figure | {:.1} s in {} alternating slices (cycle, renew, checkpoint); lease TTL {} s |",
        run.plan.seconds_per_figure,
        run.plan.slices,
        run.plan.ttl_ms as f64 / 1000.0
    );
    let _ = writeln!(w, "| data | [{json}]({json}) |\n");

    let _ = writeln!(
        w,
        "| store | where | server | baseline (one round trip) | peer |\n|---|---|---|---|---|"
    );
    for s in &run.stores {
        let _ = writeln!(
            w,
            "| {} | `{}` | {} | {} | {} |",
            s.name,
            s.url,
            s.server.as_deref().unwrap_or("in process"),
            s.baseline,
            s.peer.as_deref().unwrap_or("none runs here")
        );
    }
    if !run.skipped.is_empty() {
        let _ = writeln!(w, "\nLeft out:\n");
        for s in &run.skipped {
            let _ = writeln!(
                w,
                "- {}{}: {}",
                s.store,
                s.scenario
                    .as_deref()
                    .map(|x| format!(" ({x})"))
                    .unwrap_or_default(),
                s.reason
            );
        }
    }

    let verdicts = goals(run);
    let _ = writeln!(w, "\n## Goals\n");
    let _ = writeln!(w, "| goal | store | measured | |\n|---|---|---|---|");
    for v in &verdicts {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} |",
            v.goal,
            v.store,
            v.measured,
            v.met.map_or("not measured", mark)
        );
    }
    stands_in_the_way(w, run, &verdicts);

    for (title, path) in plots {
        let _ = writeln!(w, "\n![{title}]({path})");
    }

    let _ = writeln!(w, "\n## Cycle: acquire → release of distinct work IDs\n");
    let _ = writeln!(
        w,
        "Each client acquires a fresh work ID and releases it, again and again; a figure counts cycles. Baseline: two compare-and-sets (one for the acquire, one for the release). Peer: lock → unlock of a fresh key. Latencies are of one whole cycle, in ms.\n"
    );
    op_table(w, run, &run.cycle, true);
    let _ = writeln!(w, "\n## Renew\n");
    let _ = writeln!(
        w,
        "Each client renews a lease of its own. Baseline: one compare-and-set. Peer: its extension, where it has one (a PostgreSQL session lock needs none).\n"
    );
    op_table(w, run, &run.renew, true);
    let _ = writeln!(w, "\n## Checkpoint\n");
    let _ = writeln!(
        w,
        "Each client writes a checkpoint to a lease of its own (which also renews it). Baseline: one compare-and-set writing as many bytes. No peer keeps data with its lock.\n"
    );
    op_table(w, run, &run.checkpoint, false);
    handoff_table(w, run);
    failover_table(w, run);
    scale_table(w, run);
    for s in stores(run) {
        if let Some(note) = store_note(s) {
            if s == stores(run)[0] {
                let _ = writeln!(w, "\n## What each operation costs\n");
            }
            let _ = writeln!(w, "- **{s}**: {note}");
        }
    }
    md
}

fn lat(r: Option<&OpRow>) -> String {
    r.map_or("-".to_string(), |r| {
        format!(
            "{} / {} / {}",
            ms(r.latency.p50_us),
            ms(r.latency.p99_us),
            ms(r.latency.max_us)
        )
    })
}

fn op_table(w: &mut String, run: &Run, rows: &[OpRow], with_peer: bool) {
    let sized = rows.iter().any(|r| r.bytes.is_some());
    let _ = write!(
        w,
        "| store |{} clients | ours /s | baseline /s |",
        if sized { " bytes |" } else { "" }
    );
    if with_peer {
        let _ = write!(w, " peer /s |");
    }
    let _ = write!(w, " ours / baseline |");
    if with_peer {
        let _ = write!(w, " ours / peer |");
    }
    let _ = write!(w, " ours p50 / p99 / max | baseline p50 / p99 / max |");
    if with_peer {
        let _ = write!(w, " peer p50 / p99 / max |");
    }
    let _ = writeln!(w, " p99 ours / baseline | CPU µs/op ours / baseline |");
    let cols = 9 + usize::from(sized) + if with_peer { 3 } else { 0 };
    let _ = writeln!(w, "|{}", "---|".repeat(cols));
    let mut errors = Vec::new();
    for r in rows.iter().filter(|r| r.variant == Variant::Ours) {
        let _ = &run;
        let base = find(rows, &r.store, r.clients, r.bytes, Variant::Baseline);
        let peer = find(rows, &r.store, r.clients, r.bytes, Variant::Peer);
        let _ = write!(w, "| {} |", r.store);
        if sized {
            let _ = write!(
                w,
                " {} |",
                r.bytes.map_or("-".into(), |b| if b >= 1024 {
                    format!("{} KiB", b / 1024)
                } else {
                    b.to_string()
                })
            );
        }
        let _ = write!(
            w,
            " {} | {} | {} |",
            r.clients,
            rate(r.ops_per_sec),
            base.map_or("-".into(), |b| rate(b.ops_per_sec))
        );
        if with_peer {
            let _ = write!(w, " {} |", peer.map_or("-".into(), |p| rate(p.ops_per_sec)));
        }
        let _ = write!(
            w,
            " {} |",
            base.map_or("-".into(), |b| format!(
                "{:.2}",
                r.ops_per_sec / b.ops_per_sec
            ))
        );
        if with_peer {
            let _ = write!(
                w,
                " {} |",
                peer.map_or("-".into(), |p| format!(
                    "{:.2}",
                    r.ops_per_sec / p.ops_per_sec
                ))
            );
        }
        let _ = write!(w, " {} | {} |", lat(Some(r)), lat(base));
        if with_peer {
            let _ = write!(w, " {} |", lat(peer));
        }
        let cpu = |r: Option<&OpRow>| {
            r.and_then(|r| r.cpu_us_per_op)
                .map_or("-".to_string(), |c| format!("{c:.1}"))
        };
        let _ = writeln!(
            w,
            " {} | {} / {} |",
            base.map_or("-".into(), |b| format!(
                "{:.2}",
                r.latency.p99_us as f64 / b.latency.p99_us.max(1) as f64
            )),
            cpu(Some(r)),
            cpu(base)
        );
        for x in [Some(r), base, peer].into_iter().flatten() {
            if x.errors > 0 {
                errors.push(format!(
                    "{} {} at {} clients: {} failed operations (first: {})",
                    x.store,
                    x.variant.as_str(),
                    x.clients,
                    x.errors,
                    x.first_error.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    if !errors.is_empty() {
        let _ = writeln!(w, "\nFailures (not timed):\n");
        for e in errors {
            let _ = writeln!(w, "- {e}");
        }
    }
}

fn handoff_table(w: &mut String, run: &Run) {
    let _ = writeln!(w, "\n## Hand-off: release → the next holder\n");
    let _ = writeln!(
        w,
        "One holder keeps the lease {} ms, then releases; N waiters compete; the figure is the time from the start of the release to the next holder's acquire returning (so at least the release's round trip plus the acquisition's). The releaser waits for the next holder before it waits again, so there are always N waiters. **push**: ours, woken by the store's notification; **poll**: ours with the notifications hidden, polling every {} ms (+ up to 10% jitter); **peer**: the peer lock's own wait. All participants share one store value (one process). Up to {} hand-offs per row. Round trip: the median of one client's baseline compare-and-set.\n",
        run.plan.handoff_hold_ms, run.plan.handoff_poll_ms, run.plan.handoffs
    );
    let _ = writeln!(w, "| store | waiters | mode | p50 ms | p99 ms | max ms | hand-offs | round trip ms | p50 in round trips |\n|---|---|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    for h in &run.handoff {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            h.store,
            h.waiters,
            h.mode.as_str(),
            ms(h.latency.p50_us),
            ms(h.latency.p99_us),
            ms(h.latency.max_us),
            h.latency.count,
            ms(h.round_trip_us),
            h.latency.p50_us as f64 / h.round_trip_us.max(1) as f64
        );
        if h.errors > 0 {
            notes.push(format!(
                "{} {} with {} waiters: {} failed calls (first: {})",
                h.store,
                h.mode.as_str(),
                h.waiters,
                h.errors,
                h.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    let peers: Vec<String> = run
        .handoff
        .iter()
        .filter(|h| h.mode == HandoffMode::Peer && h.waiters == 1)
        .map(|h| format!("- {}: {}", h.store, h.what))
        .collect();
    if !peers.is_empty() {
        let _ = writeln!(w, "\nPeers' waits:\n\n{}", peers.join("\n"));
    }
    if !notes.is_empty() {
        let _ = writeln!(w, "\nFailures:\n");
        for n in notes {
            let _ = writeln!(w, "- {n}");
        }
    }
}

fn failover_table(w: &mut String, run: &Run) {
    let _ = writeln!(w, "\n## Failover: the holder is killed\n");
    let _ = writeln!(
        w,
        "A holder renews its lease in the background (every TTL/3); a waiter waits for the same lease with the poll interval shown; the holder is killed at a random point of its renewal cycle; the figure is the time from the kill to the waiter's acquire returning. The waiter sleeps until the holder's lease expires by the store's clock (a `Held` answer says how long it has left), so the figure is what was left of the lease plus a round trip.\n"
    );
    let _ = writeln!(w, "| store | holder | TTL ms | poll ms | bound ms | trials ms | worst ms | |\n|---|---|---|---|---|---|---|---|");
    for f in &run.failover {
        let max = f.trials_ms.iter().cloned().fold(0.0, f64::max);
        let trials: Vec<String> = f.trials_ms.iter().map(|t| format!("{t:.0}")).collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            f.store,
            f.how,
            f.ttl_ms,
            f.poll_ms,
            f.bound_ms,
            trials.join(", "),
            format_args!("{max:.0}"),
            if f.errors > 0 {
                format!(
                    "**{} failed**: {}",
                    f.errors,
                    f.first_error.as_deref().unwrap_or("?")
                )
            } else {
                mark(max <= f.bound_ms as f64).to_string()
            }
        );
    }
}

fn scale_table(w: &mut String, run: &Run) {
    let Some(first) = run.scale.first() else {
        return;
    };
    let _ = writeln!(w, "\n## Scale: one process holds and renews N leases\n");
    let _ = writeln!(
        w,
        "One process acquires N leases (TTL {} s), 64 acquisitions in flight, and renews each in the background (`start_renewal`, every {:.2} s) from its acquisition on; then a window of {:.0} s (whole intervals) is measured, starting half an interval after the last acquisition. CPU: user + system seconds of this process per second of the window (`getrusage`; a server's own CPU is not in it). Memory: growth of this process's resident set (`/proc/self/statm`) from before acquiring to the end of the window, per lease (for the memory and SQLite stores it includes the store itself). Renewals needed: per second, for the leases acquired (acquired / interval). Done / due: renewals sent in the window that succeeded, against those the window asks for (each lease sends one every interval after its previous send, and the window is whole intervals, so a lease on schedule sends exactly window / interval; fewer means renewals fell behind). Missed: leases whose renewal did not succeed before the holder's deadline, so the lease was lost (from the first acquisition to the end of the window). Closest call: the least lease time left when a renewal came back.\n",
        first.ttl_ms as f64 / 1000.0,
        first.renew_interval_ms as f64 / 1000.0,
        first.window_secs
    );
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
            rate(needed(s)),
            count(s.renewals_ok),
            count(s.renewals_due),
            count(s.renewal_failures),
            count(s.missed),
            s.min_left_ms.map_or("-".into(), ms_f)
        );
    }
}

/// Renewals per second the acquired leases need.
fn needed(s: &ScaleRow) -> f64 {
    s.acquired as f64 / (s.renew_interval_ms.max(1) as f64 / 1000.0)
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

/// Why a store's hand-off takes what it takes (facts of its design).
fn handoff_note(store: &str) -> &'static str {
    match store {
        "memory" => "a round trip here is one `HashMap` update under a mutex (about a microsecond); a hand-off wakes the waiting task through a watch channel and the runtime has to schedule it, which alone costs tens of microseconds: task wake-ups, not store work.",
        "sqlite" => "the waiters share the releaser's store value, so the release wakes them in-process at once; the hand-off is then the release's commit, the woken waiters' acquisition attempts (one of which commits) and their hops to and from SQLite's blocking thread. Waiters in other processes have no notification at all: they poll.",
        "postgres" => "the release's `pg_notify` reaches the store's listening connection when the release commits; the listener then wakes the waiters after a random jitter of up to 5 ms (`PostgresOptions::wake_jitter`, there so that many waiters do not stampede the row), and the winner's acquisition commits. The jitter alone averages 2.5 ms; with it at zero the hand-off would be the release's commit, the notification and one acquisition.",
        "redis" => "a round trip on loopback is tens of microseconds; the release's `PUBLISH` goes out on the store's subscriber connection, whose task wakes the waiting task, which then runs its acquisition script: each of those hops costs about as much as a round trip, so two round trips cannot be met by any pub/sub path.",
        "etcd" => "the waiters learn of the release from the store's watch on `live` keys (an event after the release's transaction is committed through Raft); the winner's acquisition is then a read, an etcd lease grant and a transaction: three round trips, two of them Raft writes.",
        "s3" => "S3 has no notifications: waiters poll, and the register adapter's acquisition is a read and a conditional write.",
        _ => "",
    }
}

/// Why ours is slower than the peer lock (facts of the two designs).
fn peer_note(store: &str) -> &'static str {
    match store {
        "postgres" => "advisory locks live in the server's shared memory: taking and freeing one writes nothing, so lock → unlock is two round trips and no commit. Ours writes the lease row and commits at each step (the fencing token, the checkpoint and the hand-off facts must survive a crash), so each step waits for the WAL flush. The peer cannot fence, keep a checkpoint, or outlive its session's connection.",
        "redis" => "Redlock's lock is one `SET NX PX` and its unlock one compare-and-delete of the same key; ours' scripts also keep the fencing counter, the state hash (holder, previous holder and how its lease ended) and the checkpoint key, so each does more work inside Redis.",
        "etcd" => "etcd's `Lock` is one RPC (one Raft write for the lock key) and `Unlock` one delete; ours' acquisition is a read, an etcd lease grant and a transaction.",
        "s3" => "the hand-rolled lock is one `PUT If-None-Match: *` and one `DELETE`; ours reads the object before each conditional write (four requests per cycle against two). The hand-rolled lock has no TTL: a crashed holder keeps it forever.",
        _ => "",
    }
}

/// Explains, from the figures and the stores' designs, what stands in the
/// way of each goal not met.
fn stands_in_the_way(w: &mut String, run: &Run, verdicts: &[Verdict]) {
    let unmet: Vec<&Verdict> = verdicts.iter().filter(|v| v.met == Some(false)).collect();
    if unmet.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n### What stands in the way\n");
    // (store, why, goals): goals with the same reason on one line.
    let mut grouped: Vec<(String, String, Vec<String>)> = Vec::new();
    for v in unmet {
        let why = match v.goal {
            GOAL_SCALE => run
                .scale
                .iter()
                .find(|s| s.store == v.store && s.leases == 100_000)
                .map(|s| {
                    let peak = baseline_peak(run, &v.store);
                    let achieved = s.renewals_ok as f64 / s.window_secs.max(0.001);
                    format!(
                        "100,000 leases renewed every {:.2} s need {} renewals/s, each one store write of its own (a commit, a Raft write or a request); this process did {}/s in the window{}. What would lift the ceiling is batching: many due renewals extended by one statement, script or transaction (one commit or one round trip for many leases). The store interface renews one lease per call today, so this needs a batch renewal in `LeaseStore` and a renewal scheduler that groups the renewals falling due together.",
                        s.renew_interval_ms as f64 / 1000.0,
                        rate(s.leases as f64 * 1000.0 / s.renew_interval_ms.max(1) as f64),
                        rate(achieved),
                        peak.map(|p| format!(", and the store's own minimal compare-and-set reached {}/s at best in this run (the renew baseline)", rate(p))).unwrap_or_default()
                    )
                })
                .unwrap_or_default(),
            GOAL_FAILOVER => match v.store.as_str() {
                "etcd" => "etcd counts lease TTLs in whole seconds, raises them to its minimum lease TTL (2 s with the default election timeout) and ends expired leases in a sweep every 500 ms, so a lease can outlive its TTL by up to half a second (the etcd store's docs); the waiter is woken by the watch when etcd deletes the key.".to_string(),
                _ => "the waiter cannot take the lease before it has expired by the store's clock; a failover past the bound means the waiter slept past the expiry (see the trials).".to_string(),
            },
            GOAL_HANDOFF => handoff_note(&v.store).to_string(),
            GOAL_PEER => peer_note(&v.store).to_string(),
            GOAL_CYCLE | GOAL_P99 => {
                let note = store_note(&v.store).unwrap_or_default().to_string();
                let cpu = |variant| {
                    find(&run.cycle, &v.store, 16, None, variant).and_then(|r| r.cpu_us_per_op)
                };
                match (cpu(Variant::Ours), cpu(Variant::Baseline)) {
                    (Some(o), Some(b)) => format!(
                        "{note} On {} shared cores the client's own work counts too: this process spent {o:.1} µs of CPU per cycle against {b:.1} µs for the baseline's.",
                        run.machine.cores
                    ),
                    _ => note,
                }
            }
            _ => String::new(),
        };
        let goal = format!("{} ({})", v.goal, v.measured);
        match grouped
            .iter_mut()
            .find(|(store, w, _)| *store == v.store && *w == why)
        {
            Some((_, _, goals)) => goals.push(goal),
            None => grouped.push((v.store.clone(), why, vec![goal])),
        }
    }
    for (store, why, goals) in grouped {
        let mut chars = why.chars();
        let why = match chars.next() {
            Some(c) => c.to_uppercase().chain(chars).collect::<String>(),
            None => why,
        };
        let _ = writeln!(w, "- **{store}**: {}. {why}", goals.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{FailoverRow, Latency, Machine, PlanInfo, StoreInfo};

    fn op(store: &str, clients: usize, variant: Variant, rate: f64, p99_us: u64) -> OpRow {
        OpRow {
            store: store.into(),
            clients,
            bytes: None,
            variant,
            what: String::new(),
            ops_per_sec: rate,
            cpu_us_per_op: None,
            ops: 1000,
            errors: 0,
            first_error: None,
            latency: Latency {
                p99_us,
                ..Latency::default()
            },
        }
    }

    fn run() -> Run {
        Run {
            format: 1,
            started_unix: 0,
            elapsed_secs: 60.0,
            command: "cargo run --release -p worklease-bench".into(),
            quick: false,
            machine: Machine {
                cores: 2,
                cpu_model: "test".into(),
                memory_gib: 1.0,
                kernel: "6".into(),
                rustc: None,
                load_average_start: Some([0.1, 0.1, 0.1]),
                load_average_end: None,
            },
            plan: PlanInfo {
                seconds_per_figure: 3.0,
                slices: 3,
                ttl_ms: 10_000,
                handoffs: 100,
                handoff_hold_ms: 20,
                handoff_poll_ms: 100,
                failover_trials: 1,
                scale_window_secs: 20.0,
                scale_acquire_limit_secs: 60.0,
            },
            stores: vec![StoreInfo {
                name: "redis".into(),
                url: "redis://127.0.0.1:6379/0".into(),
                server: None,
                baseline: "cas".into(),
                peer: Some("redlock".into()),
            }],
            skipped: Vec::new(),
            cycle: vec![
                op("redis", 16, Variant::Ours, 950.0, 1100),
                op("redis", 16, Variant::Baseline, 1000.0, 1000),
                op("redis", 16, Variant::Peer, 900.0, 900),
                op("redis", 1, Variant::Ours, 100.0, 100),
                op("redis", 1, Variant::Peer, 200.0, 100),
            ],
            renew: Vec::new(),
            checkpoint: Vec::new(),
            handoff: Vec::new(),
            failover: vec![FailoverRow {
                store: "redis".into(),
                how: "SIGKILL".into(),
                ttl_ms: 2000,
                poll_ms: 250,
                bound_ms: 2300,
                trials_ms: vec![1900.0, 2400.0],
                errors: 0,
                first_error: None,
            }],
            scale: Vec::new(),
        }
    }

    fn verdict<'a>(v: &'a [Verdict], goal: &str) -> &'a Verdict {
        v.iter()
            .find(|v| v.goal == goal)
            .expect("a verdict for the goal")
    }

    #[test]
    fn goals_are_judged_from_the_figures() {
        let v = goals(&run());
        // 950 / 1000 = 0.95 ≥ 0.9; p99 1100 / 1000 = 1.1 ≤ 1.2.
        assert_eq!(verdict(&v, GOAL_CYCLE).met, Some(true));
        assert_eq!(verdict(&v, GOAL_P99).met, Some(true));
        // Faster than the peer at 16 clients, slower at 1: not met.
        assert_eq!(verdict(&v, GOAL_PEER).met, Some(false));
        // One trial of 2400 ms against a bound of 2300 ms.
        assert_eq!(verdict(&v, GOAL_FAILOVER).met, Some(false));
        // No 100,000-lease row: not measured, neither met nor unmet.
        assert_eq!(verdict(&v, GOAL_SCALE).met, None);
    }

    #[test]
    fn the_report_explains_every_unmet_goal() {
        let md = markdown(&run(), "run.json", &[]);
        assert!(md.contains("### What stands in the way"));
        assert!(md.contains(&format!("- **redis**: {GOAL_PEER}")));
        assert!(md.contains(GOAL_FAILOVER));
        assert!(md.contains("`cargo run --release -p worklease-bench`"));
    }

    #[test]
    fn figures_are_formatted_for_reading() {
        assert_eq!(rate(1_234_567.4), "1,234,567");
        assert_eq!(rate(999.0), "999");
        assert_eq!(rate(2.25), "2.2");
        assert_eq!(count(0), "0");
        assert_eq!(count(100_000), "100,000");
        assert_eq!(ms(150), "0.150");
        assert_eq!(ms(5_250), "5.25");
        assert_eq!(ms(63_135), "63.1");
        assert_eq!(ms(6_705_000), "6705");
    }
}
