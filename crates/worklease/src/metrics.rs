//! Metrics, through the [`metrics`] facade crate.
//!
//! The library records; it never installs a recorder or an exporter. With no
//! recorder installed every metric goes to the facade's no-op recorder. To
//! export them, install any `metrics` recorder (for Prometheus,
//! `metrics-exporter-prometheus`; the `worklease` CLI does with
//! `--metrics-addr`) and, optionally, call [`describe`] once so that the
//! exporter knows each metric's unit and help text.
//!
//! Every metric the crate records:
//!
//! | name | type | unit | labels | meaning |
//! | --- | --- | --- | --- | --- |
//! | `worklease_acquisitions_total` | counter | acquisitions | `store`, `outcome` | finished acquisitions (a waiting one counts once, when it ends) |
//! | `worklease_renewals_total` | counter | attempts | `store`, `outcome` | renewal attempts, manual or background, retries included |
//! | `worklease_checkpoints_total` | counter | writes | `store`, `outcome` | checkpoint writes |
//! | `worklease_releases_total` | counter | releases | `store`, `outcome` | releases by the holder |
//! | `worklease_fenced_total` | counter | operations | `operation` (`renew`, `checkpoint`, `release`) | operations refused because the token was fenced (taken over or revoked) |
//! | `worklease_leases_lost_total` | counter | leases | `cause` (`fenced`, `expired`, `window_exhausted`) | leases a background renewal lost |
//! | `worklease_operation_seconds` | histogram | seconds | `store`, `operation` (`acquire`, `renew`, `checkpoint`, `read_checkpoint`, `release`) | duration of each store call (one per attempt; not the wait of a waiting acquisition) |
//! | `worklease_leases_held` | gauge | leases | `store` | leases with a background renewal running in this process |
//! | `worklease_lease_remaining_seconds` | gauge | seconds | `work_id` | at each successful renewal: how much of the holder's lifetime was left when the renewal came back (the safety margin it had; low values mean a lease nearly lost) |
//! | `worklease_lease_ttl_seconds` | gauge | seconds | `work_id` | the lease TTL, set with the previous gauge, to alert on their ratio |
//! | `worklease_is_leader` | gauge | 0 or 1 | `election` | 1 while this process leads the election, else 0 |
//!
//! `store` is the store kind ([`crate::LeaseStore::kind`], e.g. `sqlite`,
//! `memory`, `redis`, `postgres`). `outcome` is `ok` or the error kind:
//! `held`, `expired`, `fenced`, `window_exhausted`, `no_lease`, `cancelled`,
//! `wait_timed_out`, `invalid`, `unsafe_store_file`, `store_error` (see
//! [`outcome`]).
//!
//! Labels are bounded by the number of stores, operations and outcomes,
//! except `work_id` and `election`: one series per work ID or election this
//! process held or campaigned in.

use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use crate::error::Error;

/// `worklease_acquisitions_total`: counter of finished acquisitions.
pub const ACQUISITIONS_TOTAL: &str = "worklease_acquisitions_total";
/// `worklease_renewals_total`: counter of renewal attempts.
pub const RENEWALS_TOTAL: &str = "worklease_renewals_total";
/// `worklease_checkpoints_total`: counter of checkpoint writes.
pub const CHECKPOINTS_TOTAL: &str = "worklease_checkpoints_total";
/// `worklease_releases_total`: counter of releases.
pub const RELEASES_TOTAL: &str = "worklease_releases_total";
/// `worklease_fenced_total`: counter of operations refused as fenced.
pub const FENCED_TOTAL: &str = "worklease_fenced_total";
/// `worklease_leases_lost_total`: counter of leases a renewal lost.
pub const LEASES_LOST_TOTAL: &str = "worklease_leases_lost_total";
/// `worklease_operation_seconds`: histogram of store call durations.
pub const OPERATION_SECONDS: &str = "worklease_operation_seconds";
/// `worklease_leases_held`: gauge of leases under background renewal.
pub const LEASES_HELD: &str = "worklease_leases_held";
/// `worklease_lease_remaining_seconds`: gauge of the lifetime left at the
/// last renewal.
pub const LEASE_REMAINING_SECONDS: &str = "worklease_lease_remaining_seconds";
/// `worklease_lease_ttl_seconds`: gauge of the lease TTL.
pub const LEASE_TTL_SECONDS: &str = "worklease_lease_ttl_seconds";
/// `worklease_is_leader`: gauge, 1 while leading an election.
pub const IS_LEADER: &str = "worklease_is_leader";
/// `worklease_election_transitions`: gauge, the election's changes of
/// leader since its first leader, as the leader's record counts them (ADR
/// 0016); set by each leader when its term starts.
pub const ELECTION_TRANSITIONS: &str = "worklease_election_transitions";

/// Registers the unit and help text of every metric with the installed
/// recorder. Optional: metrics are recorded without it; exporters use it
/// for `# HELP` lines and units. Call it after installing the recorder.
pub fn describe() {
    describe_counter!(
        ACQUISITIONS_TOTAL,
        Unit::Count,
        "Finished lease acquisitions, by store and outcome."
    );
    describe_counter!(
        RENEWALS_TOTAL,
        Unit::Count,
        "Lease renewal attempts (retries included), by store and outcome."
    );
    describe_counter!(
        CHECKPOINTS_TOTAL,
        Unit::Count,
        "Checkpoint writes, by store and outcome."
    );
    describe_counter!(
        RELEASES_TOTAL,
        Unit::Count,
        "Lease releases, by store and outcome."
    );
    describe_counter!(
        FENCED_TOTAL,
        Unit::Count,
        "Operations refused because the token was fenced, by operation."
    );
    describe_counter!(
        LEASES_LOST_TOTAL,
        Unit::Count,
        "Leases lost by a background renewal, by cause."
    );
    describe_histogram!(
        OPERATION_SECONDS,
        Unit::Seconds,
        "Duration of each store call, by store and operation."
    );
    describe_gauge!(
        LEASES_HELD,
        Unit::Count,
        "Leases under background renewal in this process."
    );
    describe_gauge!(
        LEASE_REMAINING_SECONDS,
        Unit::Seconds,
        "Holder lifetime left when the last renewal came back (the safety margin)."
    );
    describe_gauge!(LEASE_TTL_SECONDS, Unit::Seconds, "The lease TTL.");
    describe_gauge!(
        IS_LEADER,
        Unit::Count,
        "1 while this process leads the election, 0 while it campaigns or after it lost."
    );
    describe_gauge!(
        ELECTION_TRANSITIONS,
        Unit::Count,
        "Changes of leader of the election since its first leader, kept in the store; set when a term starts."
    );
}

/// The `outcome` label of a result: `ok` or the error's kind.
pub fn outcome<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => error_kind(e),
    }
}

/// The kind of an error as a label value (`held`, also for a semaphore
/// whose permits are all held and for fair waiters ahead, `expired`, `fenced`,
/// `window_exhausted`, `no_lease`, `resigned`, `cancelled`,
/// `wait_timed_out`, `invalid`, `unsafe_store_file`, `store_error`,
/// `store_setup`).
pub fn error_kind(error: &Error) -> &'static str {
    match error {
        Error::Held { .. } | Error::PermitsHeld { .. } | Error::WaitersAhead { .. } => "held",
        Error::Expired { .. } => "expired",
        Error::Fenced { .. } => "fenced",
        Error::WindowExhausted { .. } => "window_exhausted",
        Error::NoLease { .. } => "no_lease",
        Error::Resigned { .. } => "resigned",
        Error::Cancelled { .. } => "cancelled",
        Error::WaitTimedOut { .. } => "wait_timed_out",
        Error::Invalid(_) => "invalid",
        Error::UnsafeStoreFile { .. } => "unsafe_store_file",
        Error::Store(_) => "store_error",
        Error::StoreSetup(_) => "store_setup",
    }
}

/// Records the duration of one store call.
pub(crate) fn store_call(store: &'static str, operation: &'static str, duration: Duration) {
    metrics::histogram!(OPERATION_SECONDS, "store" => store, "operation" => operation)
        .record(duration.as_secs_f64());
}

/// Records an operation's outcome on `counter`.
pub(crate) fn count<T>(counter: &'static str, store: &'static str, result: &Result<T, Error>) {
    metrics::counter!(counter, "store" => store, "outcome" => outcome(result)).increment(1);
}

/// Records the outcome and duration on an operation's span (fields
/// `outcome`, `duration_ms`, and `fencing_token` when given).
pub(crate) fn finish_span<T>(
    span: &tracing::Span,
    started: tokio::time::Instant,
    result: &Result<T, Error>,
    fencing_token: Option<u64>,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(t) = fencing_token {
        span.record("fencing_token", t);
    }
    span.record("outcome", outcome(result));
    span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
}

/// Holds `worklease_is_leader{election}` at 1 for one term of leadership:
/// it drops to 0 when the lease's lost signal fires or when the guard is
/// dropped (released, stepped down), whichever comes first.
pub(crate) struct LeaderGauge {
    election: String,
    done: tokio_util::sync::CancellationToken,
}

impl LeaderGauge {
    /// Sets the gauge to 1; `lost` is the renewal's lost signal.
    pub(crate) fn new(election: &str, lost: tokio_util::sync::CancellationToken) -> Self {
        let election = election.to_string();
        metrics::gauge!(IS_LEADER, "election" => election.clone()).set(1.0);
        let done = tokio_util::sync::CancellationToken::new();
        let (watch_done, label) = (done.clone(), election.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            // The metrics recorder may be a thread-local one (tests): keep
            // the watcher on this runtime, which runs it where it spawned.
            rt.spawn(async move {
                tokio::select! {
                    biased;
                    _ = watch_done.cancelled() => {}
                    _ = lost.cancelled() => {
                        if !watch_done.is_cancelled() {
                            metrics::gauge!(IS_LEADER, "election" => label).set(0.0);
                        }
                    }
                }
            });
        }
        Self { election, done }
    }
}

impl Drop for LeaderGauge {
    fn drop(&mut self) {
        self.done.cancel();
        metrics::gauge!(IS_LEADER, "election" => self.election.clone()).set(0.0);
    }
}
