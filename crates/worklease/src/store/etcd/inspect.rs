//! What `status` shows: one lease from a snapshot, and the listing of
//! every work ID under the prefix.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use etcd_client::GetOptions;

use crate::error::Result;
use crate::limits::WorkId;
use crate::store::record::Phase;
use crate::store::{Handoff, LeaseInfo};

use super::keys::{prefix_end, work_id_of, ACQ};
use super::rpc::Budget;
use super::snapshot::Snapshot;
use super::{wall, Core};

/// How many `acq` keys one page of `inspect` lists.
const PAGE: i64 = 1000;

impl Core {
    /// Everything `status` shows of one work ID, or `None` when it was
    /// never acquired.
    pub(super) async fn inspect_one(&self, work_id: WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.keys(&work_id);
        let budget = Budget::plain(&self.config);
        let snap = self.snapshot(&keys, true, budget).await?;
        let left = match snap.live_of_current() {
            Some(live) => self.time_left(live.lease(), budget).await,
            None => None,
        };
        Ok(lease_info(work_id, &snap, left))
    }

    /// Every work ID with an acquisition under the prefix, listed in pages.
    pub(super) async fn list_work_ids(&self) -> Result<BTreeSet<WorkId>> {
        let base = format!("{}{ACQ}", self.config.prefix);
        let end = prefix_end(base.as_bytes());
        let mut from = base.clone().into_bytes();
        let mut ids = BTreeSet::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(PAGE);
            let resp = self
                .rpc("list the leases", Budget::plain(&self.config), |mut c| {
                    let (from, options) = (from.clone(), options.clone());
                    async move { c.get(from, Some(options)).await }
                })
                .await?;
            self.saw(resp.header());
            let kvs = resp.kvs();
            ids.extend(
                kvs.iter()
                    .filter_map(|kv| work_id_of(&self.config.prefix, ACQ, kv.key())),
            );
            match kvs.last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(ids),
            }
        }
    }
}

/// A [`LeaseInfo`] from a snapshot (with its checkpoint) and the time
/// left on the live lease, if any.
pub(super) fn lease_info(
    work_id: WorkId,
    snap: &Snapshot,
    left: Option<Duration>,
) -> Option<LeaseInfo> {
    let (acq, token) = snap.acq.as_ref()?;
    let live = snap.live_of_current().is_some();
    let phase = snap.phase().unwrap_or(Phase::Held);
    let now = SystemTime::now();
    let expires_in = if live {
        Some(left.unwrap_or_default())
    } else {
        None
    };
    let expires_at = match (expires_in, snap.state_of(*token)) {
        (Some(left), _) => now + left,
        (None, Some(state)) => wall(state.at_ms),
        (None, None) => wall(acq.exp_ms),
    };
    Some(LeaseInfo {
        work_id,
        holder_id: acq.holder.clone(),
        fencing_token: *token,
        expires_at,
        expires_in,
        expired: !live,
        released: !live && phase == Phase::Released,
        ended: (!live).then(|| snap.end()),
        checkpoint_bytes: snap.checkpoint.as_ref().map_or(0, Bytes::len),
        handoff: Handoff {
            previous: snap.previous(),
        },
    })
}

/// Fuzzing (`crate::fuzz::etcd_values`): the lease info of the values of
/// `acq` and `state` (with their mod revisions) as a read without `live`
/// finds them, or the error decoding them; the TTL its holder counts and
/// what the next acquisition would record are worked out too.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_values(
    acq: (&[u8], i64),
    state: Option<(&[u8], i64)>,
) -> Result<Option<LeaseInfo>> {
    use super::snapshot::{acquisition_of, state_of};
    let snap = Snapshot {
        live: None,
        acq: Some(acquisition_of(acq.0, acq.1)?),
        state: state.map(|(v, rev)| state_of(v, rev)).transpose()?,
        checkpoint: None,
    };
    let _ = (snap.holder_ttl(), snap.free());
    Ok(lease_info(WorkId::new("fuzz")?, &snap, None))
}
