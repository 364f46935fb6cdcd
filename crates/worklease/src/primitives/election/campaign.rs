//! The campaign of [`Elector::run`]: campaign, report each term's events,
//! campaign again after a loss; dropping the stream releases.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::record::Record;
use super::step_down;
use super::{Elector, Event, EventKind, State, Term};
use crate::error::Error;
use crate::lease::finish::release_within;
use crate::lease::renewal::Renewal;
use crate::metrics::LeaderGauge;

async fn campaign_loop(elector: Elector, tx: mpsc::Sender<Event>, stop: CancellationToken) {
    loop {
        let won = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tx.closed() => return,
            r = elector.campaign() => r,
        };
        let term = match won {
            Ok(won) => won,
            Err(e) => {
                tracing::warn!(election = %elector.inner.election, error = %e, "campaign failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(elector.inner.poll_interval) => continue,
                }
            }
        };
        if !lead_term(&elector, &tx, &stop, term).await {
            return;
        }
    }
}

/// Reports one term of leadership: `Acquired`, `Renewed`…, `Lost`. Returns
/// true when the term was lost (campaign again), false when the campaign
/// must stop, after releasing the lease.
async fn lead_term(
    elector: &Elector,
    tx: &mpsc::Sender<Event>,
    stop: &CancellationToken,
    term: Term,
) -> bool {
    let Term {
        token,
        mut renewal,
        started: record,
        record: written,
        record_failed,
    } = term;
    let _is_leader = LeaderGauge::new(elector.inner.election.as_str(), renewal.lost_signal());
    let clock = &elector.inner.clock;
    let mut event = Some(Event {
        kind: EventKind::Acquired,
        state: State::of_term(&token, &record, clock),
        error: None,
    });
    let watching = CancellationToken::new();
    let _stop_watching = watching.clone().drop_guard();
    let requested = step_down::requested(
        elector.inner.leases.store().clone(),
        elector.inner.step_down.clone(),
        token.fencing_token(),
        elector.inner.renew_interval,
        watching,
    );
    tokio::pin!(requested);
    loop {
        if let Some(ev) = event.take() {
            if tx.send(ev).await.is_err() {
                break; // the stream was dropped
            }
        }
        let change = tokio::select! {
            _ = stop.cancelled() => break,
            _ = tx.closed() => break,
            c = renewal.changed() => c,
            true = &mut requested => {
                return step_down(elector, tx, stop, &record, &written, renewal).await;
            }
            () = record_failed.failed() => Err(record_failed.error().unwrap_or_else(|| {
                lost_unexplained(&renewal)
            })),
        };
        event = Some(match change {
            Ok(t) => Event {
                kind: EventKind::Renewed,
                state: State::of_term(&t, &record, clock),
                error: None,
            },
            Err(e) => {
                let lost = Event {
                    kind: EventKind::Lost,
                    state: State::of_term(&renewal.token(), &record, clock),
                    error: Some(e),
                };
                // Heard first, then released (the lease may still be held
                // when the record's write failed), as on a step-down.
                let heard = tx.send(lost).await.is_ok();
                release_term(elector, &written, renewal).await;
                return heard;
            }
        });
    }
    release_term(elector, &written, renewal).await;
    false
}

/// Releases the term's lease once the first write of its record is done
/// (each bounded by the release timeout; nothing when the lease was lost).
async fn release_term(elector: &Elector, record: &tokio::sync::Mutex<Record>, renewal: Renewal) {
    let timeout = elector.inner.release_timeout;
    drop(tokio::time::timeout(timeout, record.lock()).await);
    let leases = elector.inner.leases.clone();
    release_within(leases, Arc::new(renewal), elector.inner.release_timeout).await;
}

/// The cause to report when a term ended without one recorded.
fn lost_unexplained(renewal: &Renewal) -> Error {
    let token = renewal.token();
    Error::WindowExhausted {
        work_id: token.work_id().to_string(),
        fencing_token: token.fencing_token(),
        last_error: None,
    }
}

/// A step-down request for this term arrived: report `Lost` with
/// [`Error::Resigned`], release, wait the resign back-off (one TTL by default), and
/// campaign again (true) unless the stream was dropped meanwhile.
async fn step_down(
    elector: &Elector,
    tx: &mpsc::Sender<Event>,
    stop: &CancellationToken,
    record: &Record,
    written: &tokio::sync::Mutex<Record>,
    renewal: Renewal,
) -> bool {
    tracing::info!(election = %elector.inner.election, "step-down requested: resigning");
    // Lost first, then the release: the consumer hears of the end of its
    // term before anyone else can lead (as the lost signal fires first).
    let lost = Event {
        kind: EventKind::Lost,
        state: State::of_term(&renewal.token(), record, &elector.inner.clock),
        error: Some(Error::Resigned {
            election: elector.inner.election.to_string(),
        }),
    };
    let heard = tx.send(lost).await.is_ok();
    release_term(elector, written, renewal).await;
    if !heard {
        return false;
    }
    let backoff = elector
        .inner
        .resign_backoff
        .unwrap_or_else(|| elector.inner.leases.ttl());
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tx.closed() => false,
        _ = tokio::time::sleep(backoff) => true,
    }
}

/// The event stream of [`Elector::run`]. Dropping it stops campaigning and
/// releases leadership (on a spawned task, bounded by the release timeout).
pub struct Campaign {
    rx: mpsc::Receiver<Event>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Campaign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Campaign")
            .field("stopped", &self.stop.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Campaign {
    /// Starts campaigning on a task of its own.
    pub(super) fn start(elector: Elector) -> Campaign {
        let (tx, rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        tokio::spawn(campaign_loop(elector, tx, stop.clone()));
        Campaign { rx, stop }
    }
}

impl Stream for Campaign {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
