//! The etcd leases of a store: one session lease per (holder ID, TTL in
//! whole etcd seconds), shared by every key of that holder's acquisitions
//! with that TTL, and what the store remembers of each of its own
//! acquisitions (which session lease its `live` key is attached to, when
//! its last renewal was sent, the revision of its `state`).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::limits::{HolderId, WorkId};
use crate::store::LeaseRef;

use super::rpc::Budget;
use super::EtcdStore;

/// How many of its own acquisitions a store remembers (a renewal of one
/// it forgot reads its keys first: one request more). Above the most
/// leases one process is meant to hold ([`crate::limits::MAX_BATCH`]).
const LEASE_CACHE: usize = 2 * crate::limits::MAX_BATCH;
/// A session lease is given to a new acquisition only while it has this
/// much left by this host's clock since its last grant or keep-alive
/// (etcd may be ending it after that); the acquisition keeps it alive
/// again in any case.
const SESSION_MARGIN: Duration = Duration::from_secs(1);

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
    /// When the store last looked for keys of it that their holder gave
    /// up ([`EtcdStore::abandoned`]).
    swept: Instant,
}

/// What a store knows of one of its acquisitions (or of one it renewed).
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
    /// The etcd lease `live` is attached to.
    pub(super) id: i64,
    /// The TTL etcd granted it, in seconds.
    pub(super) ttl_s: i64,
    /// The TTL of the last acquisition or renewal.
    pub(super) ttl: Duration,
    /// When the last successful acquisition or renewal of this lease was
    /// sent, by this host's monotonic clock: past this plus `ttl` its
    /// holder counts it lost (the crate docs' "Clocks"), and so does the
    /// store.
    pub(super) renewed: Instant,
    /// The mod revision of the work ID's `state` key as the acquisition
    /// last saw it (0: absent, as an acquisition leaves it). Checkpoints
    /// compare it: one that a hung member applies late, after a newer one,
    /// changes nothing; the sweep compares it too.
    pub(super) state_rev: i64,
}

impl Granted {
    /// Whether its holder's TTL ran out (by this host's clock) with no
    /// successful renewal since.
    pub(super) fn given_up(&self, now: Instant) -> bool {
        self.renewed + self.ttl <= now
    }
}

impl EtcdStore {
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
            swept: sent,
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
        let known = self.sessions.lock().ok().and_then(|s| s.get(&key).copied());
        if let Some(s) = known.filter(|s| s.renewed + secs(s.ttl_s) > now + SESSION_MARGIN) {
            return Ok((s, s.renewed < sent));
        }
        let granted = self.grant(ttl, budget).await?;
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(key, granted);
        }
        Ok((granted, false))
    }

    /// Notes a keep-alive of etcd lease `id` sent at `sent`: its answer,
    /// whether etcd still has it (a session it ended is forgotten).
    pub(super) fn kept_alive(&self, id: i64, sent: Instant, alive: bool) {
        if alive {
            if let Ok(mut sessions) = self.sessions.lock() {
                for s in sessions.values_mut().filter(|s| s.id == id) {
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
            sessions.retain(|_, s| s.id != id);
        }
        if let Ok(mut keepers) = self.keepers.lock() {
            keepers.remove(&id);
        }
    }

    /// The remembered leases attached to session lease `id` whose holder
    /// gave them up (their TTL ran out since their last renewal), at most
    /// once per a quarter of the session's TTL; they are forgotten. A
    /// keep-alive of the session would keep their keys alive in etcd: the
    /// caller deletes them first ([`EtcdStore::abandon`]).
    pub(super) fn abandoned(&self, id: i64) -> Vec<(WorkId, u64, Granted)> {
        let now = Instant::now();
        let due = self.sessions.lock().ok().is_some_and(|mut sessions| {
            let mut due = false;
            for s in sessions.values_mut().filter(|s| s.id == id) {
                if s.swept + secs(s.ttl_s) / 4 <= now {
                    s.swept = now;
                    due = true;
                }
            }
            due
        });
        if !due {
            return Vec::new();
        }
        let Ok(mut leases) = self.leases.lock() else {
            return Vec::new();
        };
        let gone: Vec<_> = leases
            .iter()
            .filter(|(_, g)| g.id == id && g.given_up(now))
            .map(|((w, t), g)| (w.clone(), *t, *g))
            .collect();
        for (w, t, _) in &gone {
            leases.remove(&(w.clone(), *t));
        }
        gone
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
            Some(g) if g.ttl_s > 0 => Budget::lease(&self.config, secs(g.ttl_s)),
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

/// The session leases of a store, by holder and TTL in etcd seconds.
pub(super) type Sessions = HashMap<(HolderId, i64), Session>;

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
