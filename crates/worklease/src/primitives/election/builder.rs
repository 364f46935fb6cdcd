//! The settings of an election and their checks: [`ElectorBuilder`]
//! (hoplock: the fields of `Elector`, validated up front as client-go's
//! `LeaderElectionConfig` is, each error naming the rule it broke).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::record::check_value;
use super::{Clock, Elector, SystemClock};
use crate::error::Result;
use crate::lease::renewal::RenewalOptions;
use crate::lease::{Config, Leases};
use crate::store::LeaseStore;

/// Settings of an [`Elector`], checked by [`ElectorBuilder::build`].
pub struct ElectorBuilder {
    store: Arc<dyn LeaseStore>,
    election: String,
    owner: String,
    ttl: Duration,
    renew_interval: Option<Duration>,
    poll_interval: Duration,
    release_timeout: Duration,
    clock: Arc<dyn Clock>,
    value: Option<Bytes>,
    resign_backoff: Option<Duration>,
    priority: Option<i32>,
}

impl std::fmt::Debug for ElectorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorBuilder")
            .field("election", &self.election)
            .field("owner", &self.owner)
            .field("ttl", &self.ttl)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

impl ElectorBuilder {
    /// The lease TTL of the leadership; default 15 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often the leader renews; default TTL/3. Must be shorter than
    /// TTL − safety margin (TTL/10), so that a failed renewal has time for
    /// retries.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// How often a candidate retries to lead; default 2 s; must be at least
    /// 1 ms. A release wakes candidates at once where the store notifies.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a release may take when leadership ends; default 5 s; must
    /// be at least 1 ms.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// The wall clock for [`State`](super::State); default [`SystemClock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long [`Elector::run`] waits, after its leader stepped down on a
    /// request ([`request_step_down`](super::request_step_down)), before it campaigns again, so that
    /// a standby takes over first; default one TTL. [`Elector::lead`]
    /// returns instead: its caller decides when to campaign again.
    ///
    /// On a step-down request, `run()` reports `Lost` (cause
    /// [`Error::Resigned`](crate::Error::Resigned)) and releases right after: its consumer must
    /// stop at `Lost`. `lead()` releases only once its function returned,
    /// so nobody else leads while the work is still stopping.
    pub fn resign_backoff(mut self, backoff: Duration) -> Self {
        self.resign_backoff = Some(backoff);
        self
    }

    /// This candidate's priority (Kubernetes coordinated leader election,
    /// a preferred candidate): while it waits, it watches the leader
    /// ([`Elector::observe`]) and asks one of a lower priority to step
    /// down ([`request_step_down`](super::request_step_down)), once per term; equal priorities never
    /// ask, so leadership never swings between them. A leader asked to
    /// step down releases only after its lost signal fired (no overlap),
    /// and backs off before campaigning again ([`Self::resign_backoff`]),
    /// so the preferred candidate usually leads next; when another standby
    /// wins the race, it is asked in turn. Default: none (0 in the
    /// record, and no watching while waiting, which costs a read per poll
    /// interval).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// A value this candidate publishes while it leads (etcd `Proclaim`):
    /// its address, say, so that followers forward to it. Observers
    /// ([`Elector::leader`], [`Elector::observe`]) read it with the leader;
    /// it is written with the record at the start of each term, and
    /// [`Leadership::publish`](super::Leadership::publish) changes it during a term. Default: none. At
    /// most [`crate::limits::MAX_PUBLISHED_VALUE_BYTES`] (4 KiB), checked by
    /// [`ElectorBuilder::build`].
    pub fn publish(mut self, value: impl Into<Bytes>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Checks the settings (like client-go's leader election: each rule
    /// that breaks is named) and builds the elector.
    ///
    /// # Errors
    /// [`Error::Invalid`](crate::Error::Invalid) for a bad election name (a work ID), owner (a
    /// holder ID) or TTL, a renew interval not shorter than TTL − safety
    /// margin, a poll interval or release timeout under 1 ms, or a
    /// published value over [`crate::limits::MAX_PUBLISHED_VALUE_BYTES`].
    pub fn build(self) -> Result<Elector> {
        if let Some(v) = &self.value {
            check_value(v)?;
        }
        let leases = Leases::new(self.store, Config::new(self.owner, self.ttl))?;
        let renewal = match self.renew_interval {
            Some(i) => RenewalOptions::new().interval(i),
            None => RenewalOptions::new(),
        };
        let mut elector = Elector::from_leases(
            leases,
            self.election,
            renewal,
            self.poll_interval,
            self.release_timeout,
            self.clock,
        )?;
        if let Some(inner) = Arc::get_mut(&mut elector.inner) {
            *inner.value.get_mut().unwrap_or_else(|p| p.into_inner()) = self.value;
            inner.resign_backoff = self.resign_backoff;
            inner.priority = self.priority;
        }
        Ok(elector)
    }
}

impl Elector {
    /// A candidate `owner` in `election` on `store`, with defaults: TTL
    /// 15 s, renew interval TTL/3, poll interval 2 s, release timeout 5 s,
    /// [`SystemClock`].
    pub fn builder(
        store: Arc<dyn LeaseStore>,
        election: impl Into<String>,
        owner: impl Into<String>,
    ) -> ElectorBuilder {
        ElectorBuilder {
            store,
            election: election.into(),
            owner: owner.into(),
            ttl: Duration::from_secs(15),
            renew_interval: None,
            poll_interval: crate::lease::DEFAULT_POLL_INTERVAL,
            release_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
            value: None,
            resign_backoff: None,
            priority: None,
        }
    }
}
