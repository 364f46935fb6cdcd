//! The observer: a programmatic hook on every lease operation (Go:
//! `LeaseObserver`).
//!
//! Each method is called once per operation, after it finished, with the
//! duration of the final store call (not of a wait loop) and the error where
//! it failed. Methods run on the caller's task: keep them quick and never
//! block. Every method has a no-op default, so an observer implements only
//! what it needs.

use std::time::Duration;

use crate::error::Error;
use crate::limits::WorkId;
use crate::token::Token;

/// The operation an event is about, where several share an event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// A renewal (manual or background).
    Renew,
    /// A checkpoint write.
    Checkpoint,
    /// A release.
    Release,
}

/// An acquisition finished.
#[derive(Debug)]
#[non_exhaustive]
pub struct AcquireEvent<'a> {
    /// The work ID asked for.
    pub work_id: &'a WorkId,
    /// The new token, on success.
    pub token: Option<&'a Token>,
    /// The error, on failure.
    pub error: Option<&'a Error>,
    /// How many store calls the acquisition made (more than one when it
    /// waited).
    pub attempts: u32,
    /// Duration of the final store call.
    pub duration: Duration,
}

/// A renewal attempt finished.
#[derive(Debug)]
#[non_exhaustive]
pub struct RenewEvent<'a> {
    /// The token renewed (as it was before the renewal).
    pub token: &'a Token,
    /// The error, on failure.
    pub error: Option<&'a Error>,
    /// 1 for the first attempt of a renewal, more for its retries.
    pub attempt: u32,
    /// Duration of the store call.
    pub duration: Duration,
}

/// A checkpoint write finished.
#[derive(Debug)]
#[non_exhaustive]
pub struct CheckpointEvent<'a> {
    /// The token the checkpoint was written with.
    pub token: &'a Token,
    /// The checkpoint's size, in bytes.
    pub size: usize,
    /// The error, on failure.
    pub error: Option<&'a Error>,
    /// Duration of the store call.
    pub duration: Duration,
}

/// A checkpoint read finished.
#[derive(Debug)]
#[non_exhaustive]
pub struct ReadCheckpointEvent<'a> {
    /// The token the checkpoint was read with.
    pub token: &'a Token,
    /// Size of the checkpoint read, in bytes (0 when there was none or on
    /// failure).
    pub size: usize,
    /// Whether the hand-off was clean (false on failure).
    pub clean_handoff: bool,
    /// The error, on failure.
    pub error: Option<&'a Error>,
    /// Duration of the store call.
    pub duration: Duration,
}

/// A release finished.
#[derive(Debug)]
#[non_exhaustive]
pub struct ReleaseEvent<'a> {
    /// The token released.
    pub token: &'a Token,
    /// The error, on failure.
    pub error: Option<&'a Error>,
    /// Duration of the store call.
    pub duration: Duration,
}

/// An operation found its token fenced (taken over or revoked). Fires on
/// renew, checkpoint and release, in addition to that operation's own
/// event.
#[derive(Debug)]
#[non_exhaustive]
pub struct FencedEvent<'a> {
    /// The stale token.
    pub token: &'a Token,
    /// The operation that was refused.
    pub operation: Operation,
    /// The `Fenced` error.
    pub error: &'a Error,
}

/// Hooks on lease operations. All methods default to doing nothing.
pub trait LeaseObserver: Send + Sync {
    /// After every acquisition (successful or not).
    fn on_acquire(&self, _event: &AcquireEvent<'_>) {}
    /// After every renewal attempt, manual or background.
    fn on_renew(&self, _event: &RenewEvent<'_>) {}
    /// After every checkpoint write.
    fn on_checkpoint(&self, _event: &CheckpointEvent<'_>) {}
    /// After every checkpoint read.
    fn on_read_checkpoint(&self, _event: &ReadCheckpointEvent<'_>) {}
    /// After every release.
    fn on_release(&self, _event: &ReleaseEvent<'_>) {}
    /// When renew, checkpoint or release was refused with `Fenced`.
    fn on_fenced(&self, _event: &FencedEvent<'_>) {}
}

/// The observer that does nothing; the default.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl LeaseObserver for NoopObserver {}

/// An observer that logs every event through `tracing` (target
/// `worklease::observe`): successes at DEBUG, failures at WARN (fenced
/// operations and failed renewals), `Held` and wait ends at DEBUG. Fields
/// are recorded lazily: with no subscriber, or one that filters these
/// events out, it formats nothing.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use worklease::{Config, TracingObserver};
/// let config = Config::new("worker-1", Duration::from_secs(15)).observer(Arc::new(TracingObserver));
/// # let _ = config;
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingObserver;

/// One `tracing` event of [`TracingObserver`] about `token`'s lease, at
/// `level`: the target and the lease's identity (work ID, fencing token)
/// that every such event carries, then the event's own fields and message.
macro_rules! lease_event {
    ($level:ident, $token:expr, $($fields_and_message:tt)+) => {
        tracing::$level!(
            target: "worklease::observe",
            work_id = %$token.work_id,
            fencing_token = $token.fencing_token,
            $($fields_and_message)+
        )
    };
}

impl LeaseObserver for TracingObserver {
    fn on_acquire(&self, event: &AcquireEvent<'_>) {
        match (event.token, event.error) {
            (Some(token), _) => tracing::debug!(
                target: "worklease::observe",
                work_id = %event.work_id,
                fencing_token = token.fencing_token,
                attempts = event.attempts,
                duration = ?event.duration,
                "acquired"
            ),
            (None, Some(error)) => tracing::debug!(
                target: "worklease::observe",
                work_id = %event.work_id,
                attempts = event.attempts,
                duration = ?event.duration,
                %error,
                "acquisition failed"
            ),
            (None, None) => {}
        }
    }

    fn on_renew(&self, event: &RenewEvent<'_>) {
        let (token, attempt, duration) = (event.token, event.attempt, event.duration);
        match event.error {
            None => lease_event!(debug, token, attempt, duration = ?duration, "renewed"),
            Some(error) => lease_event!(
                warn, token, attempt, duration = ?duration, %error, "renewal failed"
            ),
        }
    }

    fn on_checkpoint(&self, event: &CheckpointEvent<'_>) {
        let (token, size) = (event.token, event.size);
        match event.error {
            None => lease_event!(
                debug, token, size, duration = ?event.duration, "checkpoint written"
            ),
            Some(error) => lease_event!(warn, token, size, %error, "checkpoint failed"),
        }
    }

    fn on_read_checkpoint(&self, event: &ReadCheckpointEvent<'_>) {
        let token = event.token;
        match event.error {
            None => lease_event!(
                debug,
                token,
                size = event.size,
                clean_handoff = event.clean_handoff,
                duration = ?event.duration,
                "checkpoint read"
            ),
            Some(error) => lease_event!(warn, token, %error, "checkpoint read failed"),
        }
    }

    fn on_release(&self, event: &ReleaseEvent<'_>) {
        let token = event.token;
        match event.error {
            None => lease_event!(debug, token, duration = ?event.duration, "released"),
            Some(error) => lease_event!(warn, token, %error, "release failed"),
        }
    }

    fn on_fenced(&self, event: &FencedEvent<'_>) {
        lease_event!(
            warn,
            event.token,
            operation = ?event.operation,
            error = %event.error,
            "fenced: another holder took the lease, or it was revoked"
        );
    }
}
