//! The session leases of a store: one etcd lease per (holder ID, TTL in
//! whole etcd seconds), shared by the `live` keys of that holder's
//! acquisitions with that TTL, and the registry of every session lease
//! this store granted and has not seen end (a renewal of a lease on one
//! of them is a compare, and the batch moves the session's key: see
//! `batch.rs`).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::limits::HolderId;

use super::rpc::Budget;
use super::Core;

/// A session lease is given to a new acquisition only while it has this
/// much left by this host's clock since its last grant or keep-alive
/// (etcd may be ending it after that); the acquisition keeps it alive
/// again in any case.
const SESSION_MARGIN: Duration = Duration::from_secs(1);
/// How long after its TTL ran out by this host's clock (since its last
/// grant or keep-alive) the registry forgets a session lease nobody kept
/// alive: etcd has ended it by then (its sweep runs every 500 ms), and
/// with it every key attached to it.
const SESSION_FORGET_AFTER: Duration = Duration::from_secs(5);

/// A TTL as etcd takes it: whole seconds, rounded up, at least 1.
pub(super) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// Whole etcd seconds as a duration.
pub(super) fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// One session lease: the etcd lease a holder's keys of one TTL share.
#[derive(Debug, Clone, Copy)]
pub(super) struct Session {
    pub(super) id: i64,
    /// The TTL etcd granted, in seconds.
    pub(super) ttl_s: i64,
    /// When the request that last started its countdown (grant or
    /// keep-alive) was sent, by this host's monotonic clock.
    renewed: Instant,
}

/// The session leases of a store.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// The session new acquisitions of a holder and TTL (etcd seconds)
    /// go to.
    current: HashMap<(HolderId, i64), i64>,
    /// Every session lease this store granted and has not seen end, by
    /// its etcd lease ID.
    granted: HashMap<i64, Session>,
}

impl Sessions {
    /// Whether `id` is a session lease of this store that etcd has not
    /// ended, as far as the store knows.
    pub(super) fn has(&self, id: i64) -> bool {
        self.granted.contains_key(&id)
    }

    /// The IDs of every session lease of this store (a few: one per
    /// holder and TTL in use, while etcd has them).
    pub(super) fn ids(&self) -> Vec<i64> {
        self.granted.keys().copied().collect()
    }
}

impl Core {
    /// Grants a new etcd lease of `ttl` (whole seconds, rounded up).
    async fn grant(&self, ttl: Duration, budget: Budget) -> Result<Session> {
        let sent = Instant::now();
        let resp = self
            .rpc("grant an etcd lease", budget, |mut c| async move {
                c.lease_grant(ttl_secs(ttl), None).await
            })
            .await?;
        self.saw(resp.header());
        Ok(Session {
            id: resp.id(),
            ttl_s: resp.ttl(),
            renewed: sent,
        })
    }

    /// The session lease of `holder` for `ttl`, and whether it must be
    /// kept alive before an acquisition or renewal sent at `sent` may
    /// count on it (false for one granted after `sent`). Grants one when
    /// there is none, or when the one there may be ending.
    pub(super) async fn session_for(
        &self,
        holder: &HolderId,
        ttl: Duration,
        sent: Instant,
        budget: Budget,
    ) -> Result<(Session, bool)> {
        let key = (holder.clone(), ttl_secs(ttl));
        let now = Instant::now();
        let known = self.sessions.lock().ok().and_then(|s| {
            let id = s.current.get(&key)?;
            s.granted.get(id).copied()
        });
        if let Some(s) = known.filter(|s| s.renewed + secs(s.ttl_s) > now + SESSION_MARGIN) {
            return Ok((s, s.renewed < sent));
        }
        let granted = self.grant(ttl, budget).await?;
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.current.insert(key, granted.id);
            sessions.granted.insert(granted.id, granted);
        }
        Ok((granted, false))
    }

    /// Whether `id` is a session lease of this store that etcd has not
    /// ended, as far as the store knows.
    pub(super) fn is_session(&self, id: i64) -> bool {
        self.sessions.lock().is_ok_and(|s| s.has(id))
    }

    /// Notes a keep-alive of etcd lease `id` sent at `sent`: its answer,
    /// whether etcd still has it (a session it ended is forgotten).
    pub(super) fn kept_alive(&self, id: i64, sent: Instant, alive: bool) {
        if alive {
            if let Ok(mut sessions) = self.sessions.lock() {
                if let Some(s) = sessions.granted.get_mut(&id) {
                    s.renewed = s.renewed.max(sent);
                }
            }
        } else {
            self.session_gone(id);
        }
    }

    /// Forgets session lease `id` (etcd no longer has it).
    pub(super) fn session_gone(&self, id: i64) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.granted.remove(&id);
            sessions.current.retain(|_, s| *s != id);
        }
        if let Ok(mut keepers) = self.keepers.lock() {
            keepers.remove(&id);
        }
    }

    /// Forgets the session leases nobody kept alive for longer than
    /// their TTL and [`SESSION_FORGET_AFTER`]: etcd has ended them.
    pub(super) fn forget_ended_sessions(&self, now: Instant) {
        let ended: Vec<i64> = self.sessions.lock().map_or_else(
            |_| Vec::new(),
            |s| {
                s.granted
                    .values()
                    .filter(|s| s.renewed + secs(s.ttl_s) + SESSION_FORGET_AFTER < now)
                    .map(|s| s.id)
                    .collect()
            },
        );
        for id in ended {
            self.session_gone(id);
        }
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
