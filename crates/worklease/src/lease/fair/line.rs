//! The line of a fair target: its work IDs, the record its queue lease
//! keeps (who is in line, in order), and what one fair acquisition holds.

use bytes::Bytes;

use crate::error::{InvalidInput, Result};
use crate::lease::renewal::Renewal;
use crate::lease::Leases;
use crate::limits::{WorkId, MAX_WORK_ID_BYTES};
use crate::token::Token;

pub use crate::internal::{QUEUE_SUFFIX, WAITER_INFIX};

/// The most waiters one line holds at once (a slot number has at most 5
/// digits; the record of a full line is about 1 MiB, the checkpoint limit).
pub const MAX_WAITERS: usize = 50_000;

/// The work IDs of the line of one target.
pub(crate) struct Line {
    pub(crate) queue: WorkId,
    pub(crate) target: String,
}

impl Line {
    /// The longest work ID of `target`'s line, in bytes (a waiter's
    /// with the largest slot).
    pub(crate) fn longest(target: &str) -> usize {
        target.len()
            + WAITER_INFIX.len().max(QUEUE_SUFFIX.len())
            + (MAX_WAITERS - 1).to_string().len()
    }

    pub(crate) fn new(target: &str) -> Result<Self> {
        let longest = Self::longest(target);
        if longest > MAX_WORK_ID_BYTES {
            return Err(InvalidInput::Config(format!(
                "{target:?} is too long for fair waiting: its line's work IDs \
                 ({target}{WAITER_INFIX}SLOT) are up to {longest} bytes, the limit is {MAX_WORK_ID_BYTES}"
            ))
            .into());
        }
        Ok(Self {
            queue: WorkId::new(format!("{target}{QUEUE_SUFFIX}"))?,
            target: target.to_string(),
        })
    }

    /// The waiter lease of `slot`.
    pub(crate) fn waiter(&self, slot: usize) -> Result<WorkId> {
        Ok(WorkId::new(format!("{}{WAITER_INFIX}{slot}", self.target))?)
    }
}

/// One waiter in line: the slot of its waiter lease and that lease's
/// fencing token (a later waiter in the same slot has another token, so
/// a slot used again is never taken for the waiter that left it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) slot: usize,
    pub(crate) token: u64,
}

/// The record of a line: `slot token` per line, in arrival order.
pub(crate) fn decode(data: Option<&Bytes>) -> Vec<Entry> {
    let Some(data) = data else {
        return Vec::new();
    };
    let parse = |l: &str| {
        let (slot, token) = l.split_once(' ')?;
        Some(Entry {
            slot: slot.parse().ok().filter(|s| *s < MAX_WAITERS)?,
            token: token.parse().ok()?,
        })
    };
    let entries: Option<Vec<Entry>> = std::str::from_utf8(data)
        .ok()
        .and_then(|text| text.lines().map(parse).collect());
    entries.unwrap_or_else(|| {
        // Not ours (written by hand, or by another program): the line
        // starts again; only the order of the waiters in it is lost.
        tracing::warn!("a fair line's record could not be read: starting the line again");
        Vec::new()
    })
}

pub(crate) fn encode(entries: &[Entry]) -> Bytes {
    let mut out = String::with_capacity(entries.len() * 12);
    for e in entries {
        out.push_str(&format!("{} {}\n", e.slot, e.token));
    }
    Bytes::from(out)
}

/// The lowest slot no entry of `live` uses.
pub(crate) fn free_slot(live: &[Entry], skip: &[usize]) -> usize {
    (0..)
        .find(|s| !live.iter().any(|e| e.slot == *s) && !skip.contains(s))
        .unwrap_or(0)
}

/// What a fair acquisition holds along the way. Its owner lets go of both
/// on every way out ([`Hold::let_go`]); dropped before that (the caller
/// dropped the future), it lets go in the background, so that nobody
/// waits for them until their TTL.
pub(crate) struct Hold {
    pub(crate) leases: Leases,
    /// The queue lease, renewed while held (on a slow store the steps in
    /// it may take longer than a TTL).
    pub(crate) queue: Option<Renewal>,
    pub(crate) waiter: Option<Renewal>,
}

impl Hold {
    /// The queue lease's latest token, if it is still ours.
    pub(crate) fn queue_token(&self) -> Result<Token> {
        match &self.queue {
            Some(r) => r.ensure_live(),
            None => {
                Err(crate::error::StoreError::new("fair", "the queue lease is not held").into())
            }
        }
    }

    /// Releases the queue lease, best effort (a failure leaves it to
    /// expire; nothing of the caller's outcome depends on it).
    pub(crate) async fn release_queue(&mut self) {
        if let Some(q) = self.queue.take() {
            self.release_detached(q, "queue").await;
        }
    }

    /// Lets go of everything held.
    pub(crate) async fn let_go(&mut self) {
        self.release_queue().await;
        if let Some(w) = self.waiter.take() {
            self.release_detached(w, "waiter").await;
        }
    }

    /// Releases `renewal`'s lease on a task of its own (counted by
    /// [`Leases::settle`]) and waits for it: a caller dropped meanwhile (an
    /// interrupted `worklease run` drops its acquisition) no longer cuts
    /// the release short, which left the lease, out of `self` already,
    /// taken until its TTL (found by `signal_orphans`: a queue lease left
    /// once in 40 interrupted fair waits).
    async fn release_detached(&self, renewal: Renewal, what: &'static str) {
        let leases = self.leases.clone();
        let task = self
            .leases
            .spawn_background(async move { release(&leases, renewal, what).await });
        // A task that panicked or was dropped at the runtime's end: the
        // lease expires.
        let _ = task.await;
    }
}

async fn release(leases: &Leases, renewal: Renewal, what: &'static str) {
    match renewal.stop().await {
        Ok(t) => {
            if let Err(e) = leases.release(t).await {
                tracing::debug!(error = %e, "could not release a fair {what} lease: it expires");
            }
        }
        Err(e) => tracing::debug!(error = %e, "a fair {what} lease was lost while held"),
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let (queue, waiter) = (self.queue.take(), self.waiter.take());
        if queue.is_none() && waiter.is_none() {
            return;
        }
        let leases = self.leases.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            // Counted as the handle's place being let go of until done.
            let place = leases.inner.letting_go.ticket();
            leases.clone().spawn_background(async move {
                let mut hold = Hold {
                    leases,
                    queue,
                    waiter,
                };
                hold.let_go().await;
                drop(place);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_starts_the_line_again() {
        let e = vec![
            Entry { slot: 3, token: 17 },
            Entry {
                slot: 0,
                token: u64::MAX,
            },
        ];
        assert_eq!(decode(Some(&encode(&e))), e);
        assert_eq!(decode(None), Vec::<Entry>::new());
        assert_eq!(
            decode(Some(&Bytes::from_static(b"3 1\nx\n"))),
            Vec::<Entry>::new()
        );
        assert_eq!(
            decode(Some(&Bytes::from_static(b"99999999 1\n"))),
            Vec::<Entry>::new()
        );
        assert_eq!(
            decode(Some(&Bytes::from_static(b"\xff"))),
            Vec::<Entry>::new()
        );
    }

    #[test]
    fn the_lowest_free_slot_is_taken() {
        let live = [Entry { slot: 0, token: 1 }, Entry { slot: 2, token: 5 }];
        assert_eq!(free_slot(&live, &[]), 1);
        assert_eq!(free_slot(&live, &[1]), 3);
        assert_eq!(free_slot(&[], &[]), 0);
    }

    #[test]
    fn a_target_too_long_for_its_line_names_the_limit() {
        let e = Line::new(&"x".repeat(MAX_WORK_ID_BYTES - 10))
            .err()
            .expect("too long")
            .to_string();
        assert!(
            e.contains(&format!("the limit is {MAX_WORK_ID_BYTES}")),
            "{e}"
        );
    }
}
