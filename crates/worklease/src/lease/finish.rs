//! How a lease held under background renewal ends: the final checkpoint and
//! release, bounded by a timeout and run on a spawned task, so they complete
//! even when the future that held the lease is dropped (shutdown,
//! cancellation). Shared by [`crate::election::Elector::lead`] and
//! [`crate::runner::Runner::run`] (Go: the `ReleaseTimeout` of `hoplock`
//! and the final steps of `worker.Runner.Run`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result, StoreError};
use crate::lease::renewal::Renewal;
use crate::lease::Leases;

/// Ends a held lease: [`FinishGuard::finish`] on the normal path; when the
/// guard is dropped instead (the holding future was dropped), a release on a
/// spawned task. [`FinishGuard::abandon`] stops renewing without releasing
/// (the lease then expires).
pub(crate) struct FinishGuard {
    leases: Leases,
    timeout: Duration,
    renewal: Option<Arc<Renewal>>,
}

impl FinishGuard {
    /// A guard over `renewal`'s lease; `timeout` bounds the final
    /// checkpoint and release together.
    pub(crate) fn new(leases: Leases, renewal: Arc<Renewal>, timeout: Duration) -> Self {
        Self {
            leases,
            timeout,
            renewal: Some(renewal),
        }
    }

    /// Stops the renewal, writes `state` as the final checkpoint (when
    /// given) and releases, on a spawned task bounded by the timeout: if
    /// this future is dropped, the task still completes.
    ///
    /// # Errors
    /// The loss's cause when the lease was already lost (nothing is
    /// written); the checkpoint's or release's error; [`Error::Store`] when
    /// the timeout ran out or the task failed.
    pub(crate) async fn finish(mut self, state: Option<Bytes>) -> Result<()> {
        let Some(renewal) = self.renewal.take() else {
            return Ok(());
        };
        let kind = self.leases.store().kind();
        let task = self.leases.spawn_background(finish_within(
            self.leases.clone(),
            renewal,
            state,
            self.timeout,
        ));
        match task.await {
            Ok(r) => r,
            Err(e) => Err(StoreError::with_source(
                kind,
                "the final checkpoint and release task failed",
                e,
            )
            .into()),
        }
    }

    /// [`FinishGuard::finish`] without a final checkpoint; a failure is
    /// logged, and a lease already lost is left alone.
    pub(crate) async fn release(self) {
        if let Err(e) = self.finish(None).await {
            log_failure(&e);
        }
    }

    /// Stops renewing without releasing: the lease expires after its TTL
    /// (after a panic of the work, whose state is unknown).
    pub(crate) fn abandon(mut self) {
        if let Some(r) = self.renewal.take() {
            r.halt();
        }
    }
}

impl Drop for FinishGuard {
    fn drop(&mut self) {
        if let (Some(r), Ok(_)) = (self.renewal.take(), tokio::runtime::Handle::try_current()) {
            self.leases
                .spawn_background(release_within(self.leases.clone(), r, self.timeout));
        }
    }
}

/// Stops the renewal and releases its latest token within `timeout`,
/// unless the lease was already lost; a failure is logged.
pub(crate) async fn release_within(leases: Leases, renewal: Arc<Renewal>, timeout: Duration) {
    if let Err(e) = finish_within(leases, renewal, None, timeout).await {
        log_failure(&e);
    }
}

fn log_failure(e: &Error) {
    // A lease already lost was not ours to release: nothing to report.
    if !e.is_lease_lost() {
        tracing::warn!(error = %e, "final checkpoint or release failed");
    }
}

/// Stops the renewal, checkpoints `state` (when given) and releases, all
/// within `timeout`; nothing is written when the lease was already lost.
pub(crate) async fn finish_within(
    leases: Leases,
    renewal: Arc<Renewal>,
    state: Option<Bytes>,
    timeout: Duration,
) -> Result<()> {
    if let Some(cause) = renewal.lost_cause() {
        return Err(cause);
    }
    renewal.halt();
    let token = renewal.token();
    let steps = async {
        let token = match state {
            Some(state) => leases.checkpoint(&token, state).await?,
            None => token,
        };
        leases.release(token).await
    };
    match tokio::time::timeout(timeout, steps).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::new(
            leases.store().kind(),
            format!("the final checkpoint and release did not complete within {timeout:?}"),
        )
        .into()),
    }
}
