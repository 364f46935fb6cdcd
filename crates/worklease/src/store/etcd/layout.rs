//! How a batch goes to etcd: one nested transaction per lease, laid out
//! in as few transactions as etcd's limits allow (one, unless the keys
//! are long), sent at once.
//!
//! etcd bounds each branch of a transaction by `--max-txn-ops` (128 by
//! default) and gives a nested transaction (etcd 3.3 and later) what its
//! parent leaves of the limit: a branch of `a` operations leaves its
//! nested transactions `max_txn_ops − a`. So a batch is laid out flat
//! (its nested transactions in the success branch) while that fits, and
//! otherwise in groups: the success branch holds `k` group transactions
//! of up to `g` leases each, with `k + tail + g + inner ≤ max_txn_ops`
//! (`tail`: operations of the batch itself, a renewal's session keys;
//! `inner`: the most operations per branch of one lease's transaction).
//! With the default limit, [`RESERVED_OPS`] kept aside, that is up to
//! 61 × 62 leases; a batch names at most [`MAX_BATCH`]. etcd also refuses
//! requests above `--max-request-bytes` (1.5 MiB by default): a batch
//! whose keys add up to more than [`MAX_REQUEST_BYTES`] goes as several
//! transactions, sent at once (long work IDs only: 1,000 renewals of
//! 40-byte keys are about 60 KiB).

use std::ops::Range;

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use futures_util::future::try_join_all;

use crate::error::Result;

use super::rpc::Budget;
use super::snapshot::bad_value;
use super::Core;

/// The most leases one batch call names ([`crate::LeaseStore::max_batch`]),
/// with etcd's default `--max-txn-ops`; fewer when a smaller limit leaves
/// less room ([`batch_capacity`]).
pub const MAX_BATCH: usize = 1000;

/// The most operations per branch of one lease's nested transaction.
const INNER_OPS: usize = 3;
/// The most operations of a batch transaction itself (a renewal's session
/// keys).
pub(super) const TAIL_OPS: usize = 2;

/// What a batch transaction keeps of `--max-txn-ops` besides its own
/// operations: the operations per branch of one lease's nested
/// transaction (at most three) and a renewal's session keys (two).
pub const RESERVED_OPS: usize = INNER_OPS + TAIL_OPS;

/// The most bytes of keys and values one batch transaction carries
/// (etcd's default `--max-request-bytes` is 1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// What every operation adds to a request besides its keys and values
/// (field tags, lengths, revisions), counted generously.
pub(super) const OP_BYTES: usize = 24;

/// The most leases one transaction holds under `max_txn_ops`: flat, or
/// in groups (see the module docs).
pub fn batch_capacity(max_txn_ops: usize) -> usize {
    let room = max_txn_ops.saturating_sub(RESERVED_OPS);
    let grouped = (room / 2) * room.div_ceil(2);
    room.max(grouped).min(MAX_BATCH)
}

/// How many groups `n` leases go in (0: flat) with `tail` operations of
/// the batch and `inner` per lease, under `max_txn_ops`.
fn groups(n: usize, tail: usize, inner: usize, max_txn_ops: usize) -> Option<usize> {
    let room = max_txn_ops.checked_sub(tail + inner)?;
    if n <= room {
        return Some(0);
    }
    (1..=room).find(|&k| k + n.div_ceil(k) <= room)
}

/// Consecutive ranges of `sizes` (the bytes of each lease's nested
/// transaction) that each fit one transaction: at most `max` leases and
/// [`MAX_REQUEST_BYTES`] (a lease larger than that alone goes alone; etcd
/// answers it).
fn chunks(sizes: &[usize], max: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, size) in sizes.iter().enumerate() {
        if i > start && (i - start == max || bytes + size > MAX_REQUEST_BYTES) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// One lease's nested transaction and its estimated size in bytes.
pub(super) struct Part {
    pub(super) op: TxnOp,
    pub(super) bytes: usize,
}

/// The reply to one lease's nested transaction, and the revision of the
/// transaction it was in.
pub(super) struct Reply {
    pub(super) txn: TxnResponse,
    pub(super) revision: i64,
}

/// The replies of the first `n` operations of `resp`, each a nested
/// transaction.
fn nested_replies(resp: &TxnResponse, n: usize) -> Result<Vec<TxnResponse>> {
    let out: Vec<TxnResponse> = resp
        .op_responses()
        .into_iter()
        .take(n)
        .map(|r| match r {
            TxnOpResponse::Txn(t) => Ok(t),
            other => Err(bad_value(&format!(
                "a batch transaction answered {other:?}"
            ))),
        })
        .collect::<Result<_>>()?;
    if out.len() != n {
        return Err(bad_value(&format!(
            "{} replies in a batch transaction of {n}",
            out.len()
        )));
    }
    Ok(out)
}

impl Core {
    /// The most leases one batch call names.
    pub(super) fn max_batch_len(&self) -> usize {
        batch_capacity(self.config.max_txn_ops).max(1)
    }

    /// Sends `parts` (at most [`INNER_OPS`] operations per branch each) in
    /// as few transactions as fit, at once, each ending with the operations
    /// `tail` gives for its range of parts (at most [`TAIL_OPS`]); per
    /// part, its reply. An error of any transaction is the batch's error
    /// (the others may have been applied).
    pub(super) async fn send_batch(
        &self,
        parts: Vec<Part>,
        tail: impl Fn(Range<usize>) -> Vec<TxnOp>,
        what: &str,
        budget: Budget,
    ) -> Result<Vec<Reply>> {
        let sizes: Vec<usize> = parts.iter().map(|p| p.bytes).collect();
        let ops: Vec<TxnOp> = parts.into_iter().map(|p| p.op).collect();
        self.send_built(&sizes, |r| ops[r].to_vec(), tail, what, budget)
            .await
    }

    /// As [`Core::send_batch`], for parts of `sizes` bytes that `build`
    /// makes (for a range of them) afresh for each try, so that the first
    /// try sends them without a copy.
    pub(super) async fn send_built(
        &self,
        sizes: &[usize],
        build: impl Fn(Range<usize>) -> Vec<TxnOp>,
        tail: impl Fn(Range<usize>) -> Vec<TxnOp>,
        what: &str,
        budget: Budget,
    ) -> Result<Vec<Reply>> {
        let sends = chunks(sizes, self.max_batch_len())
            .into_iter()
            .map(|range| self.send_one(range, &build, &tail, what, budget));
        Ok(try_join_all(sends).await?.into_iter().flatten().collect())
    }

    /// One transaction of the parts in `range` and their `tail` (flat or
    /// grouped); per part, its reply.
    async fn send_one(
        &self,
        range: Range<usize>,
        build: &impl Fn(Range<usize>) -> Vec<TxnOp>,
        tail: &impl Fn(Range<usize>) -> Vec<TxnOp>,
        what: &str,
        budget: Budget,
    ) -> Result<Vec<Reply>> {
        let n = range.len();
        let tail_len = tail(range.clone()).len();
        let k = groups(n, tail_len, INNER_OPS, self.config.max_txn_ops)
            .ok_or_else(|| bad_value(&format!("a batch of {n} does not fit max_txn_ops")))?;
        // Flat, or groups of `per` (the last one smaller).
        let per = if k == 0 { n } else { n.div_ceil(k) };
        let layout = || {
            let parts = build(range.clone());
            let mut ops = if k == 0 {
                parts
            } else {
                let mut parts = parts.into_iter();
                (0..n.div_ceil(per))
                    .map(|_| {
                        TxnOp::txn(
                            Txn::new().and_then(parts.by_ref().take(per).collect::<Vec<_>>()),
                        )
                    })
                    .collect()
            };
            ops.extend(tail(range.clone()));
            Txn::new().and_then(ops)
        };
        let resp = self.txn_with(layout, what, budget).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let reply = |txn| Reply { txn, revision };
        if k == 0 {
            return Ok(nested_replies(&resp, n)?.into_iter().map(reply).collect());
        }
        let mut out = Vec::with_capacity(n);
        let groups = n.div_ceil(per);
        for (g, group) in nested_replies(&resp, groups)?.iter().enumerate() {
            let size = per.min(n - g * per);
            out.extend(nested_replies(group, size)?.into_iter().map(reply));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_follows_max_txn_ops() {
        assert_eq!(batch_capacity(128), MAX_BATCH);
        assert_eq!(batch_capacity(64), 29 * 30);
        assert_eq!(batch_capacity(8), 3);
        assert_eq!(batch_capacity(6), 1);
        assert_eq!(batch_capacity(5), 0);
    }

    #[test]
    fn batches_go_flat_while_they_fit_then_in_groups() {
        assert_eq!(groups(100, 2, 3, 128), Some(0));
        assert_eq!(groups(123, 2, 3, 128), Some(0));
        // 124 leases: two groups of 62 (2 + 2 + 62 + 3 = 69).
        assert_eq!(groups(124, 2, 3, 128), Some(2));
        // 1,000 leases: 9 groups of 112 (9 + 2 + 112 + 3 = 126).
        assert_eq!(groups(1000, 2, 3, 128), Some(9));
        assert_eq!(groups(61 * 62, 2, 3, 128), Some(61));
        assert_eq!(groups(61 * 62 + 1, 2, 3, 128), None);
        for n in 1..=batch_capacity(64) {
            assert!(groups(n, 2, 3, 64).is_some(), "{n}");
        }
    }

    #[test]
    fn chunks_keep_to_the_count_and_the_bytes() {
        assert_eq!(chunks(&[10; 5], 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(chunks(&[], 2), Vec::<Range<usize>>::new());
        let big = MAX_REQUEST_BYTES / 2 + 1;
        assert_eq!(chunks(&[big, big, 10], 1000), vec![0..1, 1..3]);
        assert_eq!(chunks(&[MAX_REQUEST_BYTES * 2, 10], 1000), vec![0..1, 1..2]);
    }
}
