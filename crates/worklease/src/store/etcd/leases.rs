//! The etcd leases of a store's acquisitions: granting, keeping alive,
//! remembering, and the spares of released acquisitions.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::limits::WorkId;
use crate::store::LeaseRef;

use super::rpc::Budget;
use super::EtcdStore;

/// How many etcd lease IDs of its own acquisitions a store remembers (a
/// renewal of one it forgot reads the ID first: one request more).
const LEASE_CACHE: usize = 4096;
/// How many etcd leases of released acquisitions a store keeps for the
/// next ones.
const SPARES: usize = 64;
/// A spare etcd lease is used only while it has this much left by this
/// host's clock (etcd may be ending it after that).
const SPARE_MARGIN: Duration = Duration::from_secs(1);

/// A TTL as etcd takes it: whole seconds, rounded up, at least 1.
pub(super) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// An etcd lease a store uses for one of its acquisitions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
    pub(super) id: i64,
    /// The TTL etcd granted, in seconds.
    pub(super) ttl_s: i64,
    /// The TTL asked for, in seconds (0 when unknown: a lease learnt from
    /// a read, which is never reused).
    pub(super) asked_s: i64,
    /// When the request that last started its countdown (grant or
    /// keep-alive) was sent, by this host's monotonic clock.
    pub(super) renewed: Instant,
    /// The mod revision of the work ID's `state` key as the acquisition
    /// using it last saw it (0: absent, as an acquisition leaves it).
    /// Renewals and checkpoints compare it: one that a hung member applies
    /// late, after a newer one, changes nothing.
    pub(super) state_rev: i64,
}

impl Granted {
    /// Whether it lasts, by this host's clock, at least `margin` more.
    fn fresh(&self, margin: Duration) -> bool {
        let ttl = Duration::from_secs(u64::try_from(self.ttl_s).unwrap_or(0));
        self.renewed + ttl > Instant::now() + margin
    }
}

impl EtcdStore {
    pub(super) async fn grant(&self, ttl: Duration, budget: Budget) -> Result<Granted> {
        let sent = Instant::now();
        let resp = self
            .rpc("grant an etcd lease", budget, |mut c| async move {
                c.lease_grant(ttl_secs(ttl), None).await
            })
            .await?;
        self.saw(resp.header());
        Ok(Granted {
            id: resp.id(),
            ttl_s: resp.ttl(),
            asked_s: ttl_secs(ttl),
            renewed: sent,
            state_rev: 0,
        })
    }

    /// An etcd lease for a new acquisition with `ttl`: a spare one with
    /// the same TTL, renewed now (its countdown starts again after the
    /// caller sent its request, as a new one's would), or a new one.
    pub(super) async fn lease_for(&self, ttl: Duration, budget: Budget) -> Result<Granted> {
        let asked = ttl_secs(ttl);
        loop {
            let spare = self.spares.lock().ok().and_then(|mut spares| {
                // Stale ones are of no use: etcd may be ending them.
                spares.retain(|g| g.fresh(SPARE_MARGIN));
                let i = spares.iter().position(|g| g.asked_s == asked)?;
                Some(spares.swap_remove(i))
            });
            let Some(spare) = spare else {
                return self.grant(ttl, budget).await;
            };
            let sent = Instant::now();
            if self.keep_alive(spare.id, budget).await? {
                return Ok(Granted {
                    renewed: sent,
                    state_rev: 0,
                    ..spare
                });
            }
        }
    }

    /// Keeps the etcd lease of a released acquisition for the next one, or
    /// revokes it (one not granted by this store for an acquisition, one
    /// about to end, or one too many).
    pub(super) fn spare(&self, granted: Option<Granted>, id: i64) {
        if let Some(g) = granted.filter(|g| g.id == id && g.asked_s > 0) {
            if let Ok(mut spares) = self.spares.lock() {
                if spares.len() < SPARES && g.fresh(SPARE_MARGIN) {
                    spares.push(g);
                    return;
                }
            }
        }
        self.discard(id);
    }

    /// Revokes an etcd lease that no key of the store uses any more, in
    /// the background (best effort: unrevoked, it expires with its TTL).
    pub(super) fn discard(&self, id: i64) {
        let Some(mut client) = self.members.connected() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = client.lease_revoke(id).await {
                    tracing::debug!(lease = id, error = %e, "cannot revoke an unused etcd lease: it expires with its TTL");
                }
            });
        }
    }

    /// Renews etcd lease `id` once; false when etcd no longer has it.
    pub(super) async fn keep_alive(&self, id: i64, budget: Budget) -> Result<bool> {
        // A stream: `rpc`'s attempt timeout bounds the whole of it (the
        // reply may wait for a new leader), not only its opening.
        self.rpc("renew the etcd lease", budget, |mut c| async move {
            match c.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                // etcd answers a renewal of an unknown lease with a TTL of
                // 0, which the client turns into this error.
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// The time left on etcd lease `id`, rounded up to whole seconds
    /// (etcd reports whole seconds, rounded down); `None` when it is gone
    /// or cannot be read.
    pub(super) async fn time_left(&self, id: i64, budget: Budget) -> Option<Duration> {
        let resp = self
            .rpc("read an etcd lease", budget, |mut c| async move {
                c.lease_time_to_live(id, None).await
            })
            .await
            .ok()?;
        let ttl = u64::try_from(resp.ttl()).ok()?;
        Some(Duration::from_secs(ttl + 1))
    }

    pub(super) fn remember(&self, work_id: &WorkId, token: u64, granted: Granted) {
        if let Ok(mut leases) = self.leases.lock() {
            if leases.len() >= LEASE_CACHE {
                // Forgetting costs a read at the next renewal, nothing more.
                leases.clear();
            }
            leases.insert((work_id.clone(), token), granted);
        }
    }

    pub(super) fn forget(&self, work_id: &WorkId, token: u64) {
        if let Ok(mut leases) = self.leases.lock() {
            leases.remove(&(work_id.clone(), token));
        }
    }

    /// The budget of an operation on `lease` without a TTL of its own
    /// (release, read checkpoint): that of the TTL its etcd lease was
    /// granted, when this store knows it.
    pub(super) fn budget_of(&self, lease: LeaseRef<'_>) -> Budget {
        match self.remembered(lease.work_id, lease.fencing_token) {
            Some(g) if g.ttl_s > 0 => Budget::lease(
                &self.config,
                Duration::from_secs(u64::try_from(g.ttl_s).unwrap_or(0)),
            ),
            _ => Budget::plain(&self.config),
        }
    }

    pub(super) fn remembered(&self, work_id: &WorkId, token: u64) -> Option<Granted> {
        self.leases
            .lock()
            .ok()?
            .get(&(work_id.clone(), token))
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_secs(Duration::new(2, 1)), 3);
        assert_eq!(ttl_secs(crate::limits::MAX_TTL), 7 * 24 * 3600);
    }
}
