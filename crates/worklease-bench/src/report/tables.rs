//! The tables of cycle, renew, checkpoint, hand-off and failover.

use std::fmt::Write as _;

use super::format::{mark, ms, rate};
use super::verdict::find;
use crate::results::{HandoffMode, OpRow, Run, Variant};

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

pub fn op_table(w: &mut String, run: &Run, rows: &[OpRow], with_peer: bool) {
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

pub fn handoff_table(w: &mut String, run: &Run) {
    let _ = writeln!(w, "\n## Hand-off: release → the next holder\n");
    let _ = writeln!(
        w,
        "One holder keeps the lease {} ms, then releases; N waiters compete; the figure is the time from the start of the release to the next holder's acquire returning (so at least the release's round trip plus the acquisition's). The releaser waits for the next holder before it waits again, so there are always N waiters. **push**: ours, woken by the store's notification; **poll**: ours with the notifications hidden, polling every {} ms (+ up to 10% jitter); **peer**: the peer lock's own wait. **waiters in** this process: all participants share one store value; other processes: every participant is a process of its own with its own store value (run where that takes another path, SQLite: through the database file), the figure from `CLOCK_MONOTONIC` stamps that all processes share. Up to {} hand-offs per row. Round trip: the median of one client's baseline compare-and-set.\n",
        run.plan.handoff_hold_ms, run.plan.handoff_poll_ms, run.plan.handoffs
    );
    let _ = writeln!(w, "| store | waiters | waiters in | mode | p50 ms | p99 ms | max ms | hand-offs | round trip ms | p50 in round trips |\n|---|---|---|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    for h in &run.handoff {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            h.store,
            h.waiters,
            if h.across_processes {
                "other processes"
            } else {
                "this process"
            },
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
                "{} {} with {} waiters{}: {} failed calls (first: {})",
                h.store,
                h.mode.as_str(),
                h.waiters,
                if h.across_processes {
                    " in other processes"
                } else {
                    ""
                },
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

pub fn failover_table(w: &mut String, run: &Run) {
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
