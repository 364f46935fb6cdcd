//! Transient failures of the SQL stores: a statement the server rolled back
//! whole (a serialization failure, a deadlock's victim, a lock it could not
//! get in time) changed nothing, so it runs again, after a short jittered
//! pause, a bounded number of times. The retries are backon's.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use crate::error::{Error, Result};

/// How many times a statement runs again after a transient failure before
/// its error is the caller's (a store error, which the lease layer treats
/// as transient: a waiting acquisition keeps waiting, renewal retries).
pub(crate) const TRANSIENT_RETRIES: usize = 7;

/// The pause before the first retry; each next one doubles, up to
/// [`MAX_PAUSE`], each jittered (so that the statements that collided do
/// not collide again): about 0.5 s over all retries at most.
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The longest pause between two runs of a statement.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// The retry schedule of a statement that failed transiently.
fn transient_retries() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(MAX_PAUSE)
        .with_max_times(TRANSIENT_RETRIES)
        .with_jitter()
}

/// Why one run of a statement failed: before it reached the server (no
/// connection, the schema check: already a store error), or in the driver
/// (`D`, its error), with what was being done.
#[derive(Debug)]
pub(crate) enum Failure<D> {
    Store(Error),
    Driver(&'static str, D),
}

impl<D> From<Error> for Failure<D> {
    fn from(e: Error) -> Self {
        Failure::Store(e)
    }
}

/// Runs `attempt` until it succeeds, fails other than transiently (as
/// `transient` judges a driver error), or has been run again
/// [`TRANSIENT_RETRIES`] times, pausing as [`transient_retries`] says in
/// between; a driver error becomes the caller's through `to_error` (the
/// store's own wording, with the context).
pub(crate) async fn retry_transient<T, D, F, Fut>(
    attempt: F,
    transient: fn(&D) -> bool,
    to_error: fn(&'static str, D) -> Error,
) -> Result<T>
where
    D: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, Failure<D>>>,
{
    attempt
        .retry(transient_retries())
        .sleep(tokio::time::sleep)
        .when(|f: &Failure<D>| matches!(f, Failure::Driver(_, e) if transient(e)))
        .notify(|f: &Failure<D>, pause: Duration| {
            if let Failure::Driver(context, e) = f {
                tracing::debug!(error = %e, context, ?pause, "a transient failure: running the statement again");
            }
        })
        .await
        .map_err(|f| match f {
            Failure::Store(e) => e,
            Failure::Driver(context, e) => to_error(context, e),
        })
}
