//! Release of one lease or of a batch: one etcd transaction whose success
//! branch holds one nested transaction per lease, `If live is this
//! acquisition's Then delete live, put state (released) Else get live,
//! acq, state`, so each lease's outcome, and on a failure why (the single
//! call's rules), comes back in the one reply. The session lease stays:
//! the holder's other keys share it, and unused it expires.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::error::Result;
use crate::store::record::Phase;
use crate::store::{LeaseEnd, LeaseRef};

use super::layout::{Part, OP_BYTES};
use super::snapshot::{snapshot_ops, to_json, Free, Snapshot, State, StoredPrevious};
use super::{now_ms, Core};

/// Compares that `live` is the acquisition `lease` names.
pub(super) fn is_ours(live: &str, lease: LeaseRef<'_>) -> [Compare; 2] {
    [
        Compare::create_revision(
            live,
            CompareOp::Equal,
            i64::try_from(lease.fencing_token).unwrap_or(-1),
        ),
        Compare::value(live, CompareOp::Equal, lease.holder_id.as_str()),
    ]
}

impl Core {
    /// Releases each of `leases` in one transaction: `live` deleted and
    /// `state` written as released, for each lease still this holder's.
    pub(super) async fn release_batch(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let Some(first) = leases.first() else {
            return Ok(Vec::new());
        };
        let at_ms = now_ms();
        let parts: Vec<Part> = leases
            .iter()
            .map(|lease| {
                let keys = self.keys(lease.work_id);
                let state = to_json(&State {
                    token: lease.fencing_token,
                    phase: Phase::Released.as_str().to_string(),
                    at_ms,
                    granted_s: 0,
                    ttl_ms: 0,
                });
                let bytes =
                    7 * (keys.live.len() + OP_BYTES) + lease.holder_id.as_str().len() + state.len();
                let op = TxnOp::txn(
                    Txn::new()
                        .when(is_ours(&keys.live, *lease))
                        .and_then([
                            TxnOp::delete(keys.live.as_str(), None),
                            TxnOp::put(keys.state.as_str(), state, None),
                        ])
                        .or_else(snapshot_ops(&keys, false)),
                );
                Part { op, bytes }
            })
            .collect();
        let replies = self
            .send_batch(parts, |_| Vec::new(), "release", self.budget_of(*first))
            .await?;
        leases
            .iter()
            .zip(replies)
            .map(|(lease, one)| {
                let rev = one.revision;
                let one = one.txn;
                if !one.succeeded() {
                    return Ok(Err(
                        Snapshot::from_responses(one.op_responses())?.refusal(*lease)
                    ));
                }
                self.forget(lease.work_id, lease.fencing_token);
                self.saw_free(
                    lease.work_id,
                    Free {
                        acq_rev: lease.fencing_token,
                        state_rev: rev,
                        prev: Some(StoredPrevious {
                            holder: lease.holder_id.to_string(),
                            token: lease.fencing_token,
                            end: LeaseEnd::Released.as_str().to_string(),
                        }),
                    },
                );
                Ok(Ok(()))
            })
            .collect()
    }
}
