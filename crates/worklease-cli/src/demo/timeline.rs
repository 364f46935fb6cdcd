//! What the demo prints while it runs: the plan, then a line for each
//! event of the workers; and what it records of them for the report.

use std::path::Path;

use worklease::store::url;

use super::input::TextFile;
use super::protocol::{holder, work_id, ChildEvent, Previous};
use super::worker::{Event, Kill, Plan};
use super::{say, POLL};

/// A hand-off the demo saw a child resume from: the previous holder did not
/// release.
pub(super) struct Resume {
    pub(super) worker: usize,
    pub(super) shard: usize,
    pub(super) token: u64,
    pub(super) next: usize,
    pub(super) files: usize,
    pub(super) previous: Previous,
}

/// What the demo remembers of the run for its report.
#[derive(Default)]
pub(super) struct Record {
    pub(super) resumes: Vec<Resume>,
    /// `(worker, shard, checkpointed files when the SIGKILL was sent)` of
    /// the kill that landed mid-shard.
    pub(super) kill: Option<(usize, usize, usize)>,
    /// The last kill sent, until it is known to have landed.
    kill_sent: Option<(usize, usize, usize)>,
    pub(super) failures: usize,
}

pub(super) fn print_plan(
    plan: &Plan,
    root: &Path,
    files: &[TextFile],
    skipped: usize,
    scratch_store: bool,
    kill: Kill,
) {
    let bytes: u64 = files.iter().map(|f| f.counts.bytes).sum();
    let n = plan.shard_files.len();
    let min = plan.shard_files.iter().min().copied().unwrap_or(0);
    let max = plan.shard_files.iter().max().copied().unwrap_or(0);
    let sizes = if min == max {
        format!("{min}")
    } else {
        format!("{min}-{max}")
    };
    say(format!(
        "worklease demo: {} ({bytes} bytes) under {}; {} skipped \
         (binary, not UTF-8 or unreadable; target/ and .git/ not searched)",
        count(files.len(), "text file"),
        root.display(),
        count(skipped, "file"),
    ));
    let ids = if n == 1 {
        format!("work ID {}", work_id(0))
    } else {
        format!("work IDs {} .. {}", work_id(0), work_id(n - 1))
    };
    let of = if max == 1 { "file" } else { "files" };
    say(format!("  {} of {sizes} {of}: {ids}", count(n, "shard")));
    say(format!(
        "  store: {}{}",
        url::redact(&plan.store_url),
        if scratch_store {
            " (fresh, removed at the end)"
        } else {
            ""
        }
    ));
    if plan.workers == 1 {
        say(format!(
            "  1 worker, {}; it runs, shard after shard:",
            holder(0)
        ));
    } else {
        say(format!(
            "  {} workers, {} .. {}; each runs, shard after shard:",
            plan.workers,
            holder(0),
            holder(plan.workers - 1)
        ));
    }
    say(format!(
        "    worklease run --wait --ttl {} --poll {POLL} --holder worker-N demo/shard-K -- worklease demo-shard ...",
        crate::run::fmt_secs(plan.ttl)
    ));
    say(format!(
        "  the child checkpoints after every file ({} per file){}",
        crate::run::fmt_secs(plan.pace),
        if kill == Kill::Armed {
            "; the first worker whose child has checkpointed a third of a shard gets SIGKILL"
        } else {
            "; no worker is killed"
        }
    ));
    say("");
}

/// The timeline line of an event (`None`: not shown), and what the report
/// needs of it.
pub(super) fn describe(plan: &Plan, record: &mut Record, event: Event) -> Option<String> {
    match event {
        Event::Child {
            worker,
            shard,
            event,
        } => match event {
            ChildEvent::Start {
                complete: true,
                token,
                ..
            } => Some(format!(
                "{} found {} complete (fencing token {token}): nothing to do",
                holder(worker),
                work_id(shard)
            )),
            ChildEvent::Start {
                token,
                next,
                files,
                clean_handoff,
                previous,
                discarded,
                ..
            } => {
                let mut line = format!(
                    "{} took {} (fencing token {token}): ",
                    holder(worker),
                    work_id(shard)
                );
                if next == 0 {
                    line.push_str(&format!("{files} files, from the start"));
                } else {
                    line.push_str(&format!(
                        "resuming from the checkpoint at file {next} of {files}"
                    ));
                }
                if let Some(p) = &previous {
                    line.push_str(&format!(
                        "; clean hand-off: {} (previous holder {}, fencing token {}, {})",
                        if clean_handoff { "yes" } else { "no" },
                        p.holder,
                        p.token,
                        p.ended
                    ));
                }
                if let Some(why) = discarded {
                    line.push_str(&format!("; a checkpoint {why} was not resumed"));
                }
                if let (false, Some(previous)) = (clean_handoff, previous) {
                    record.resumes.push(Resume {
                        worker,
                        shard,
                        token,
                        next,
                        files,
                        previous,
                    });
                }
                Some(line)
            }
            ChildEvent::Checkpoint { .. } => None,
            ChildEvent::Complete { token, files } => Some(format!(
                "{} completed {} (fencing token {token}): {files} files checkpointed",
                holder(worker),
                work_id(shard)
            )),
        },
        Event::KillSent {
            worker,
            shard,
            pid,
            next,
            files,
        } => {
            record.kill_sent = Some((worker, shard, next));
            Some(format!(
                "SIGKILL to {}'s `worklease run` (pid {pid}) on {}: its child has just checkpointed \
                 {next} of {files} files",
                holder(worker),
                work_id(shard)
            ))
        }
        Event::Killed {
            worker,
            shard,
            mid_shard,
        } => {
            if mid_shard {
                record.kill = record.kill_sent.take();
            }
            Some(format!(
                "{} is dead: its `worklease run` ended by SIGKILL and its child's output ended with it; \
                 nobody released {}, whose lease runs out within the TTL ({}){}",
                holder(worker),
                work_id(shard),
                crate::run::fmt_secs(plan.ttl),
                if mid_shard {
                    ""
                } else {
                    " (the shard had just been completed: the demo kills again)"
                }
            ))
        }
        Event::KillMissed { worker, shard } => Some(format!(
            "the SIGKILL came too late: {}'s run on {} had ended; the demo kills again",
            holder(worker),
            work_id(shard)
        )),
        Event::RunFailed {
            worker,
            shard,
            status,
            stderr,
        } => {
            record.failures += 1;
            let stderr = stderr.trim();
            Some(format!(
                "{}'s `worklease run` on {} failed ({status}){}{}: it tries again later",
                holder(worker),
                work_id(shard),
                if stderr.is_empty() { "" } else { ": " },
                stderr.replace('\n', " | ")
            ))
        }
        Event::Finished {
            worker,
            unconfirmed,
        } => Some(if unconfirmed == 0 {
            format!("{} has seen every shard complete: done", holder(worker))
        } else {
            format!(
                "{} gives up with {unconfirmed} shards it could not see complete",
                holder(worker)
            )
        }),
    }
}

/// `1 file`, `2 files`: `n` and `noun`, in the plural unless `n` is 1.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
