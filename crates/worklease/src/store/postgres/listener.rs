//! The listener: the one connection that `LISTEN`s on the store's channel
//! and wakes the waiters of released and revoked leases.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt};
use rand::Rng;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::limits::WorkId;
use crate::store::notify::Watchers;

/// The first wait before the listener reconnects; doubled per failure.
const LISTEN_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest wait between the listener's reconnection attempts.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// What the listener and the watch futures share.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) watchers: Watchers,
    /// Work IDs with waiters since their last wake-up: woken all at once
    /// when the listener (re)connects, as notifications may have been lost.
    pub(super) watched: Mutex<HashSet<WorkId>>,
}

impl Shared {
    pub(super) fn notify(&self, work_id: &WorkId) {
        self.unwatch(work_id);
        self.watchers.notify(work_id);
    }

    /// Whether a waiter of this store watches `work_id` (true when the set
    /// cannot be read: a needless `wanted` mark costs only a notification).
    pub(super) fn is_watched(&self, work_id: &WorkId) -> bool {
        self.watched
            .lock()
            .map(|w| w.contains(work_id))
            .unwrap_or(true)
    }

    /// Forgets the waiters' interest in `work_id` (it was acquired).
    pub(super) fn unwatch(&self, work_id: &WorkId) {
        if let Ok(mut w) = self.watched.lock() {
            w.remove(work_id);
        }
    }

    fn notify_all(&self) {
        let ids: Vec<WorkId> = match self.watched.lock() {
            Ok(mut w) => w.drain().collect(),
            Err(_) => return,
        };
        for id in &ids {
            self.watchers.notify(id);
        }
    }
}

pub(super) type MessageStream = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;
pub(super) type ListenerConnect = Arc<
    dyn Fn() -> BoxFuture<
            'static,
            Result<(tokio_postgres::Client, MessageStream), tokio_postgres::Error>,
        > + Send
        + Sync,
>;

/// The listener: one connection that `LISTEN`s on the channel and wakes
/// waiters, reconnecting with backoff until `stop`.
pub(super) async fn listen(
    connect: ListenerConnect,
    channel: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tried: watch::Sender<bool>,
    connect_timeout: Duration,
) {
    let mut retry = LISTEN_RETRY_INITIAL;
    let mut connected_before = false;
    let listen_sql = format!("LISTEN \"{channel}\"");
    let deliver = |msg: AsyncMessage| {
        if let AsyncMessage::Notification(n) = msg {
            if n.channel() == channel {
                if let Ok(id) = WorkId::new(n.payload()) {
                    shared.notify(&id);
                }
            }
        }
    };
    loop {
        let attempt = async {
            let (client, mut messages) = connect().await?;
            {
                // Drive the connection while LISTEN is confirmed.
                let confirm = client.batch_execute(&listen_sql);
                tokio::pin!(confirm);
                loop {
                    tokio::select! {
                        r = &mut confirm => { r?; break; }
                        m = messages.next() => match m {
                            Some(Ok(msg)) => deliver(msg),
                            Some(Err(e)) => return Err(e),
                            None => return Ok(None),
                        },
                    }
                }
            }
            Ok(Some((client, messages)))
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(connect_timeout, attempt) => r,
        };
        tried.send_replace(true);
        match outcome {
            Ok(Ok(Some((client, mut messages)))) => {
                retry = LISTEN_RETRY_INITIAL;
                if connected_before {
                    // Notifications sent while we were away are lost.
                    shared.notify_all();
                }
                connected_before = true;
                tracing::debug!(channel = %channel, "postgres listener connected");
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => match m {
                            Some(Ok(msg)) => deliver(msg),
                            Some(Err(e)) => {
                                tracing::warn!(channel = %channel, error = %e, "postgres listener lost its connection");
                                break;
                            }
                            None => {
                                tracing::warn!(channel = %channel, "postgres listener connection closed");
                                break;
                            }
                        },
                    }
                }
                drop(client);
                shared.notify_all();
            }
            Ok(Ok(None)) => {
                tracing::warn!(channel = %channel, "postgres listener closed while starting")
            }
            Ok(Err(e)) => {
                tracing::warn!(channel = %channel, error = %e, "postgres listener cannot connect")
            }
            Err(_) => tracing::warn!(channel = %channel, "postgres listener timed out connecting"),
        }
        let nap = retry.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(nap) => {}
        }
        retry = (retry * 2).min(LISTEN_RETRY_MAX);
    }
}
