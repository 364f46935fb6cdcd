//! Before `worklease` exits on a signal: let the library finish what a
//! dropped acquisition left running in the background (issue 23). An
//! acquisition given up on SIGINT or SIGTERM may still be granted by the
//! store; the library releases such a grant on a task of its own, and this
//! process's runtime would drop that task at exit, leaving the lease taken
//! until its TTL.

use std::future::Future;
use std::time::Duration;

use worklease::Unsettled;

use crate::say::say;
use crate::supervise::Signals;

/// The longest `worklease` waits for its background releases before it
/// exits on a signal: a few round trips of any store, and less than the
/// time a user waits before pressing Ctrl-C again. Bounded by the TTL too
/// (a grant ends then anyway).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(3);

/// How long to wait for the background releases of a holder whose lease
/// TTL is `ttl`: [`SETTLE_LIMIT`], or the TTL if it is shorter.
pub fn bound(ttl: Duration) -> Duration {
    ttl.min(SETTLE_LIMIT)
}

/// Awaits `settle` (a `Leases::settle` or `Elector::settle` with
/// [`bound`]); when its bound passed first, says on stderr what is left:
/// those leases end with their TTL, and the exit status is unchanged. A
/// second terminating signal (Ctrl-C again) ends the wait at once, as it
/// does in most tools that wait on their way out. A release that failed
/// was logged as a warning by the library.
pub async fn before_exit(
    settle: impl Future<Output = Result<(), Unsettled>>,
    ttl: Duration,
    signals: &mut Signals,
) {
    let ttl_text = crate::run::fmt_secs(ttl);
    tokio::select! {
        settled = settle => {
            if let Err(e) = settled {
                say!("{e} (TTL {ttl_text}); exiting anyway");
            }
        }
        Some(sig) = signals.next_terminating() => say!(
            "{sig}, a second signal: exiting without waiting for the background releases; \
             a lease they leave ends when its TTL runs out (TTL {ttl_text})"
        ),
    }
}
