//! The end of the demo: each shard's final checkpoint, read back and
//! checked against a direct single pass over the same files.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use worklease::{AcquireOptions, Config, LeaseStore, Leases};

use super::input::TextFile;
use super::protocol::{holder, work_id, Counts, ShardState};
use super::timeline::Record;
use super::worker::{Kill, Plan};
use super::{say, VERIFIER};
use crate::exit::Failure;

/// Each shard's final checkpoint, read under a lease of its own (holder
/// [`VERIFIER`]): the result of the shard, or why there is none.
pub(super) async fn read_final_checkpoints(
    store: Arc<dyn LeaseStore>,
    plan: &Plan,
) -> Result<Vec<Result<ShardState, String>>, Failure> {
    let leases = Leases::new(store, Config::new(VERIFIER, plan.ttl))?;
    // A shard whose last holder died is free once its lease runs out.
    let options = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(plan.ttl * 2 + Duration::from_secs(2));
    let mut finals = Vec::new();
    for shard in 0..plan.shard_files.len() {
        let token = match leases.acquire(&work_id(shard), options.clone()).await {
            Ok(token) => token,
            Err(e) => {
                finals.push(Err(format!("cannot take the lease to read it: {e}")));
                continue;
            }
        };
        let read = leases.read_checkpoint(&token).await;
        if let Err(e) = leases.release(token).await {
            tracing::warn!(error = %e, "cannot release the verifier's lease");
        }
        finals.push(match read {
            Err(e) => Err(format!("cannot read the checkpoint: {e}")),
            Ok(c) => match c.data {
                None => Err("no checkpoint".to_string()),
                Some(data) => serde_json::from_slice::<ShardState>(&data)
                    .map_err(|e| format!("the checkpoint is not a shard's state: {e}")),
            },
        });
    }
    Ok(finals)
}

/// `worker-1 (fencing token 1): files 0-2; worker-3 (fencing token 4):
/// files 3-7`: who processed which files, in file order.
fn processed_by(state: &ShardState) -> String {
    let mut runs: Vec<(u64, usize, usize)> = Vec::new();
    for &(index, token) in &state.processed {
        match runs.last_mut() {
            Some((t, _, last)) if *t == token && *last + 1 == index => *last = index,
            _ => runs.push((token, index, index)),
        }
    }
    runs.iter()
        .map(|&(token, first, last)| {
            let who = state.holders.get(&token).map_or("?", String::as_str);
            let which = if first == last {
                format!("file {first}")
            } else {
                format!("files {first}-{last}")
            };
            format!("{who} (fencing token {token}): {which}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The problems of one shard's final checkpoint against the direct pass.
fn check_shard(
    run: &str,
    shard: usize,
    range: &Range<usize>,
    files: &[TextFile],
    state: &ShardState,
) -> Vec<String> {
    let mut problems = Vec::new();
    let n = range.len();
    if state.demo != run || state.shard != shard || state.files != n {
        problems.push(format!(
            "the checkpoint is of another run or shard (run {}, shard {}, {} files)",
            state.demo, state.shard, state.files
        ));
        return problems;
    }
    if !state.complete || state.next != n {
        problems.push(format!("not complete: {} of {n} files done", state.next));
    }
    let mut times = vec![0usize; n];
    for &(index, token) in &state.processed {
        match times.get_mut(index) {
            Some(t) => *t += 1,
            None => problems.push(format!(
                "file index {index} (fencing token {token}) is not in the shard"
            )),
        }
    }
    for (index, &t) in times.iter().enumerate() {
        if t != 1 {
            problems.push(format!(
                "file index {index} ({}) processed {t} times",
                files[range.start + index].path
            ));
        }
    }
    let mut direct = Counts::default();
    for file in &files[range.clone()] {
        direct.add(file.counts);
    }
    if state.totals != direct {
        problems.push(format!(
            "totals ({}) differ from the direct pass ({})",
            state.totals, direct
        ));
    }
    problems
}

/// Prints the per-shard results, the resumed shards and the check; true
/// when every shard was processed exactly once to completion.
pub(super) fn report(
    plan: &Plan,
    run: &str,
    files: &[TextFile],
    ranges: &[Range<usize>],
    finals: &[Result<ShardState, String>],
    record: &Record,
) -> bool {
    say("Shards (each one's result is its final checkpoint):");
    say(format!(
        "  {:<14} {:>6} {:>8} {:>9} {:>10}  PROCESSED BY",
        "WORK ID", "FILES", "LINES", "WORDS", "BYTES"
    ));
    let mut problems = Vec::new();
    let mut total = Counts::default();
    for (shard, (range, state)) in ranges.iter().zip(finals).enumerate() {
        match state {
            Ok(state) => {
                say(format!(
                    "  {:<14} {:>6} {:>8} {:>9} {:>10}  {}",
                    work_id(shard),
                    state.processed.len(),
                    state.totals.lines,
                    state.totals.words,
                    state.totals.bytes,
                    processed_by(state)
                ));
                total.add(state.totals);
                for p in check_shard(run, shard, range, files, state) {
                    problems.push(format!("{}: {p}", work_id(shard)));
                }
            }
            Err(why) => {
                say(format!("  {:<14} {why}", work_id(shard)));
                problems.push(format!("{}: {why}", work_id(shard)));
            }
        }
    }
    say(format!(
        "  {:<14} {:>6} {:>8} {:>9} {:>10}",
        "total",
        finals
            .iter()
            .flatten()
            .map(|s| s.processed.len())
            .sum::<usize>(),
        total.lines,
        total.words,
        total.bytes
    ));

    say("");
    if record.resumes.is_empty() {
        say("No shard was resumed after an unclean hand-off.");
    } else {
        say("Resumed after an unclean hand-off:");
    }
    for r in &record.resumes {
        let killed = record
            .kill
            .is_some_and(|(w, s, _)| s == r.shard && holder(w) == r.previous.holder);
        say(format!(
            "  resumed: {} by {} with fencing token {} (> {}), from the checkpoint at file {} of {}; \
             clean hand-off: no (previous holder {}, fencing token {}, {}{})",
            work_id(r.shard),
            holder(r.worker),
            r.token,
            r.previous.token,
            r.next,
            r.files,
            r.previous.holder,
            r.previous.token,
            r.previous.ended,
            if killed { " after its SIGKILL" } else { "" }
        ));
        if r.token <= r.previous.token {
            problems.push(format!(
                "{}: the fencing token did not go up ({} after {})",
                work_id(r.shard),
                r.token,
                r.previous.token
            ));
        }
    }
    if let Some((w, s, next)) = record.kill {
        say(format!(
            "  {} had reported {next} files checkpointed on {} before its SIGKILL; a file its child \
             counted after that checkpoint, if any, was counted again by the next holder, and \
             appears once in the result",
            holder(w),
            work_id(s)
        ));
    } else if plan.kill.lock().map_or(Kill::Off, |k| *k) != Kill::Off {
        say("  note: no SIGKILL landed in the middle of a shard (each run finished first; try a larger --pace)");
    }
    if record.failures > 0 {
        say(format!(
            "  note: {} runs failed and were tried again (see above)",
            record.failures
        ));
    }

    say("");
    let direct = files.iter().fold(Counts::default(), |mut c, f| {
        c.add(f.counts);
        c
    });
    say(format!(
        "Check against a direct single pass over the same {} files: {} lines, {} words, {} bytes",
        files.len(),
        direct.lines,
        direct.words,
        direct.bytes
    ));
    if total != direct {
        problems.push(format!(
            "the shards' totals ({total}) differ from the direct pass ({direct})"
        ));
    }
    if problems.is_empty() {
        say(format!(
            "  every shard's final checkpoint is complete, lists each of its files exactly once, \
             and its totals equal the direct pass ({} shards, {} files)",
            ranges.len(),
            files.len()
        ));
        say("OK: every shard processed exactly once to completion");
        true
    } else {
        for p in &problems {
            say(format!("  {p}"));
        }
        say(format!(
            "FAILED: {} problems: not every shard was processed exactly once to completion",
            problems.len()
        ));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processed_by_groups_runs_of_one_token() {
        let mut state = ShardState::fresh("r", 0, 5);
        state.processed = vec![(0, 1), (1, 1), (2, 4), (3, 4), (4, 4)];
        state.holders = [(1, "worker-1".to_string()), (4, "worker-3".to_string())].into();
        assert_eq!(
            processed_by(&state),
            "worker-1 (fencing token 1): files 0-1; worker-3 (fencing token 4): files 2-4"
        );
    }

    #[test]
    fn the_check_finds_a_file_processed_twice() {
        let files: Vec<TextFile> = ["a", "b"]
            .iter()
            .map(|t| TextFile {
                path: (*t).to_string(),
                counts: Counts::of(t),
            })
            .collect();
        let mut state = ShardState::fresh("r", 0, 2);
        state.next = 2;
        state.complete = true;
        state.processed = vec![(0, 1), (0, 2), (1, 2)];
        state.totals = Counts {
            lines: 0,
            words: 3,
            bytes: 3,
        };
        let problems = check_shard("r", 0, &(0..2), &files, &state);
        assert!(problems.iter().any(|p| p.contains("processed 2 times")));
        assert!(problems.iter().any(|p| p.contains("differ")));
    }
}
