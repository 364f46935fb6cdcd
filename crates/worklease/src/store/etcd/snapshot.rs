//! The values of the keys and [`Snapshot`], what one read of a work ID's
//! keys says about its lease.

use std::time::Duration;

use bytes::Bytes;
use etcd_client::{KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
use crate::store::decode::{self, Corrupt};
use crate::store::record::Phase;
use crate::store::{LeaseEnd, LeaseRef, PreviousHolder};

use super::layout::{Part, OP_BYTES};
use super::leases::{secs, ttl_secs};
use super::rpc::Budget;
use super::{Core, EtcdKeys, KIND};

/// How an acquisition's predecessor ended, as `acq` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredPrevious {
    pub(super) holder: String,
    pub(super) token: u64,
    pub(super) end: String,
}

/// The value of `acq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Acquisition {
    pub(super) holder: String,
    pub(super) ttl_ms: u64,
    /// The TTL etcd granted the lease, in seconds.
    pub(super) granted_s: i64,
    /// The expiry estimate by the acquirer's wall clock, in Unix ms.
    pub(super) exp_ms: u64,
    pub(super) prev: Option<StoredPrevious>,
    /// A number drawn by the acquiring call: a copy of its transaction
    /// that was applied although its reply was lost is recognised by it.
    #[serde(default)]
    pub(super) nonce: u64,
}

/// The value of `state`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct State {
    /// The acquisition it is about.
    pub(super) token: u64,
    /// `held`, `released` or `revoked`.
    pub(super) phase: String,
    /// Held: the expiry estimate after the last renewal; else the moment
    /// of the end. Writer's wall clock, Unix ms.
    pub(super) at_ms: u64,
    /// Held: the TTL etcd granted the lease now attached to `live`.
    #[serde(default)]
    pub(super) granted_s: i64,
    /// Held: the TTL of the renewal that wrote it, in ms (0 in values
    /// written before it was kept: the acquisition's TTL counts).
    #[serde(default)]
    pub(super) ttl_ms: u64,
}

pub(super) fn bad_value(what: &str) -> Error {
    StoreError::new(KIND, format!("unexpected value in etcd: {what}")).into()
}

pub(super) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_vec(v).unwrap_or_default()
}

pub(super) fn token_of(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// The value of `acq` and its mod revision, the fencing token; an error
/// naming the field when it is no acquisition record (not JSON of its
/// shape, an invalid holder ID, a token of 0, a predecessor the types
/// forbid).
pub(super) fn acquisition_of(value: &[u8], mod_revision: i64) -> Result<(Acquisition, u64)> {
    let bad = |c: Corrupt| bad_value(&format!("acquisition record: {c}"));
    let acq = serde_json::from_slice::<Acquisition>(value)
        .map_err(|e| bad_value(&format!("acquisition record: {e}")))?;
    let token = decode::signed_token("mod revision", mod_revision).map_err(bad)?;
    decode::holder_id("holder", acq.holder.clone()).map_err(bad)?;
    if let Some(p) = &acq.prev {
        decode::previous(Some(p.holder.clone()), Some(p.token), Some(&p.end)).map_err(bad)?;
    }
    Ok((acq, token))
}

/// The value of `state` and its mod revision; an error when it is no
/// state record (not JSON of its shape, an unknown phase).
pub(super) fn state_of(value: &[u8], mod_revision: i64) -> Result<(State, i64)> {
    let state = serde_json::from_slice::<State>(value)
        .map_err(|e| bad_value(&format!("lease state: {e}")))?;
    if Phase::parse(&state.phase).is_none() {
        return Err(bad_value(&format!(
            "lease state: phase: {:?} is no phase",
            state.phase
        )));
    }
    Ok((state, mod_revision))
}

/// The keys of one work ID as one read saw them.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) live: Option<KeyValue>,
    /// The acquisition and its mod revision (its fencing token).
    pub(super) acq: Option<(Acquisition, u64)>,
    /// The state and its mod revision.
    pub(super) state: Option<(State, i64)>,
    /// The checkpoint, when asked for.
    pub(super) checkpoint: Option<Bytes>,
}

impl Snapshot {
    /// Builds a snapshot from the responses of gets of `live`, `acq`,
    /// `state` and (optionally) `ckpt`, in that order.
    pub(super) fn from_responses(responses: Vec<TxnOpResponse>) -> Result<Self> {
        let mut kvs = responses.into_iter().map(|r| match r {
            TxnOpResponse::Get(mut g) => Ok(g.take_kvs().into_iter().next()),
            other => Err(bad_value(&format!("a read answered {other:?}"))),
        });
        let mut next = || kvs.next().transpose().map(Option::flatten);
        let live = next()?;
        let acq = match next()? {
            Some(kv) => Some(acquisition_of(kv.value(), kv.mod_revision())?),
            None => None,
        };
        let state = match next()? {
            Some(kv) => Some(state_of(kv.value(), kv.mod_revision())?),
            None => None,
        };
        let checkpoint = next()?.map(|kv| Bytes::from(kv.into_key_value().1));
        Ok(Self {
            live,
            acq,
            state,
            checkpoint,
        })
    }

    /// The token of the last acquisition.
    pub(super) fn token(&self) -> Option<u64> {
        self.acq.as_ref().map(|(_, t)| *t)
    }

    /// The `live` key, when it belongs to the last acquisition.
    pub(super) fn live_of_current(&self) -> Option<&KeyValue> {
        let token = self.token()?;
        self.live
            .as_ref()
            .filter(|l| token_of(l.create_revision()) == token)
    }

    /// The state of the acquisition `token`, if `state` is about it.
    pub(super) fn state_of(&self, token: u64) -> Option<&State> {
        self.state
            .as_ref()
            .map(|(s, _)| s)
            .filter(|s| s.token == token)
    }

    /// The phase of the last acquisition (held while `live` is there).
    pub(super) fn phase(&self) -> Option<Phase> {
        let token = self.token()?;
        Some(
            self.state_of(token)
                .and_then(|s| Phase::parse(&s.phase))
                .filter(|p| *p != Phase::Held)
                .unwrap_or(Phase::Held),
        )
    }

    /// How the last acquisition ended, were it over now.
    pub(super) fn end(&self) -> LeaseEnd {
        match self.phase() {
            Some(Phase::Released) => LeaseEnd::Released,
            Some(Phase::Revoked) => LeaseEnd::Revoked,
            _ => LeaseEnd::Expired,
        }
    }

    /// The TTL etcd granted the lease now attached to `live`, in seconds.
    pub(super) fn granted(&self) -> i64 {
        let Some((acq, token)) = &self.acq else {
            return 0;
        };
        self.state_of(*token)
            .filter(|s| s.phase == Phase::Held.as_str() && s.granted_s > 0)
            .map_or(acq.granted_s, |s| s.granted_s)
    }

    /// The TTL its holder counts for the version of the lease this
    /// snapshot shows: that of the renewal that wrote `state`, else that
    /// of the acquisition; rounded up to whole etcd seconds, and at least
    /// what etcd granted the holder's etcd lease.
    pub(super) fn holder_ttl(&self) -> Duration {
        let Some((acq, token)) = &self.acq else {
            return Duration::ZERO;
        };
        let ms = self
            .state_of(*token)
            .filter(|s| s.phase == Phase::Held.as_str() && s.ttl_ms > 0)
            .map_or(acq.ttl_ms, |s| s.ttl_ms);
        let asked = secs(ttl_secs(Duration::from_millis(ms)));
        asked.max(secs(self.granted()))
    }

    /// The mod revision of `state` (0: absent).
    pub(super) fn state_rev(&self) -> i64 {
        self.state.as_ref().map_or(0, |(_, r)| *r)
    }

    /// How the lease would stand for the next acquisition, were `live`
    /// gone: the revisions it compares and the predecessor it records.
    pub(super) fn free(&self) -> Free {
        Free {
            acq_rev: self.token().unwrap_or(0),
            state_rev: self.state_rev(),
            prev: self.acq.as_ref().map(|(acq, token)| StoredPrevious {
                holder: acq.holder.clone(),
                token: *token,
                end: self.end().as_str().to_string(),
            }),
        }
    }

    /// The previous holder, as the last acquisition recorded it.
    pub(super) fn previous(&self) -> Option<PreviousHolder> {
        let p = self.acq.as_ref()?.0.prev.as_ref()?;
        Some(PreviousHolder {
            holder_id: p.holder.clone(),
            fencing_token: p.token,
            ended: LeaseEnd::from_str(&p.end)?,
        })
    }

    /// `Ok` with the `live` key when `lease` is the current, live
    /// acquisition; else why not (S3 in the crate docs).
    pub(super) fn check(&self, lease: LeaseRef<'_>) -> Result<&KeyValue> {
        if let Some(live) = &self.live {
            if token_of(live.create_revision()) == lease.fencing_token
                && live.value() == lease.holder_id.as_str().as_bytes()
            {
                return Ok(live);
            }
        }
        Err(self.refusal(lease))
    }

    /// Why `lease` is not the current, live acquisition.
    pub(super) fn refusal(&self, lease: LeaseRef<'_>) -> Error {
        match &self.acq {
            Some((acq, token))
                if *token == lease.fencing_token && acq.holder == lease.holder_id.as_str() =>
            {
                if self.phase() == Some(Phase::Revoked) {
                    Error::fenced(lease)
                } else {
                    Error::expired(lease)
                }
            }
            _ => Error::fenced(lease),
        }
    }
}

/// What an acquisition of a free lease compares and records: the mod
/// revisions of `acq` (0: never acquired) and `state` as last seen, and
/// the predecessor. A store keeps it for the work IDs it released or found
/// free, so that the next acquisition is one transaction.
#[derive(Debug, Clone, Default)]
pub(super) struct Free {
    pub(super) acq_rev: u64,
    pub(super) state_rev: i64,
    pub(super) prev: Option<StoredPrevious>,
}

/// Gets of the keys a [`Snapshot`] reads.
pub(super) fn snapshot_ops(keys: &EtcdKeys, with_checkpoint: bool) -> Vec<TxnOp> {
    let mut ops = vec![
        TxnOp::get(keys.live.as_str(), None),
        TxnOp::get(keys.acquisition.as_str(), None),
        TxnOp::get(keys.state.as_str(), None),
    ];
    if with_checkpoint {
        ops.push(TxnOp::get(keys.checkpoint.as_str(), None));
    }
    ops
}

impl Core {
    /// Reads the keys of each of `work_ids` in one batch (a nested
    /// transaction of gets per work ID, laid out by `layout.rs`).
    pub(super) async fn read_batch(
        &self,
        work_ids: &[&WorkId],
        budget: Budget,
    ) -> Result<Vec<Snapshot>> {
        let parts: Vec<Part> = work_ids
            .iter()
            .map(|w| {
                let keys = self.keys(w);
                Part {
                    bytes: 3 * (keys.live.len() + OP_BYTES),
                    op: TxnOp::txn(Txn::new().and_then(snapshot_ops(&keys, false))),
                }
            })
            .collect();
        self.send_batch(parts, |_| Vec::new(), "read leases", budget)
            .await?
            .into_iter()
            .map(|r| Snapshot::from_responses(r.txn.op_responses()))
            .collect()
    }

    /// Reads the keys of one work ID in one (linearizable) transaction.
    pub(super) async fn snapshot(
        &self,
        keys: &EtcdKeys,
        with_checkpoint: bool,
        budget: Budget,
    ) -> Result<Snapshot> {
        let resp = self
            .txn(
                Txn::new().and_then(snapshot_ops(keys, with_checkpoint)),
                "read a lease",
                budget,
            )
            .await?;
        Snapshot::from_responses(resp.op_responses())
    }

    /// The snapshot a transaction's failure branch read.
    pub(super) fn failure_snapshot(resp: &TxnResponse) -> Result<Snapshot> {
        Snapshot::from_responses(resp.op_responses())
    }
}
