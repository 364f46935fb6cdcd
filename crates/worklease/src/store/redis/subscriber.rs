//! The store's one pub/sub connection, opened when the store first has a
//! waiter: it feeds release and revocation announcements into the
//! in-process [`Watchers`], checks its connection with a heartbeat, and
//! resubscribes after a drop, then wakes every waiter, since announcements
//! made while it was away are lost.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use redis::ProtocolVersion;

use crate::limits::WorkId;
use crate::store::notify::Watchers;

use super::primary::{with_protocol, Target};

/// How often the subscription's connection is checked with a `PING`: a
/// connection that died without closing (a host gone, a cable pulled) is
/// found within this plus the response timeout.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// The first wait before subscribing again after a failure or a drop; it
/// doubles up to [`RECONNECT_MAX`]. Waiters poll meanwhile.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The longest wait between reconnection attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Where announcements go.
pub(super) struct Wakeups {
    /// Waiters per work ID.
    pub watchers: Watchers,
    /// Bumped after each resubscription: wakes every waiter.
    pub resubscribed: watch::Sender<u64>,
}

impl Default for Wakeups {
    fn default() -> Self {
        Self {
            watchers: Watchers::default(),
            resubscribed: watch::channel(0).0,
        }
    }
}

/// How to (re)subscribe.
#[derive(Clone)]
pub(super) struct Subscription {
    /// The server to subscribe on (for Sentinel: the primary, looked up
    /// again at each subscription).
    pub target: Target,
    pub channel: String,
    pub connection_timeout: Duration,
    pub response_timeout: Duration,
}

/// Where the subscription stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SubState {
    /// The first subscription is under way.
    Starting,
    /// Subscribed: every announcement from now on arrives.
    Up,
    /// Not subscribed (the first attempt failed, or the connection
    /// dropped): trying again; waiters poll meanwhile and are all woken
    /// when it is back.
    Down,
}

/// A live subscription.
pub(super) struct Subscribed {
    sink: PubSubSink,
    stream: PubSubStream,
}

impl Subscription {
    /// Connects and subscribes; returns once the server confirmed the
    /// subscription, so every announcement after this reaches us.
    pub async fn subscribe(&self) -> redis::RedisResult<Subscribed> {
        let timed_out = || {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out subscribing to the release channel",
            ))
        };
        // Pub/sub on RESP2: a connection of its own in subscriber mode.
        let connect = async {
            with_protocol(&self.target.client().await?, ProtocolVersion::RESP2)?
                .get_async_pubsub()
                .await
        };
        let pubsub = tokio::time::timeout(self.connection_timeout, connect)
            .await
            .map_err(|_| timed_out())??;
        let (mut sink, stream) = pubsub.split();
        tokio::time::timeout(self.response_timeout, sink.subscribe(&self.channel))
            .await
            .map_err(|_| timed_out())??;
        Ok(Subscribed { sink, stream })
    }

    /// Subscribes, serves the subscription, and subscribes again after
    /// each drop, until `stop` fires; reports where it stands in `state`.
    pub async fn run(
        self,
        state: watch::Sender<SubState>,
        wakeups: Arc<Wakeups>,
        stop: CancellationToken,
    ) {
        let mut delay = RECONNECT_MIN;
        loop {
            let attempt = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.subscribe() => r,
            };
            match attempt {
                Ok(mut subscribed) => {
                    if state.send_replace(SubState::Up) == SubState::Down {
                        tracing::debug!(channel = %self.channel, "release subscription restored");
                        wakeups.resubscribed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    let since = tokio::time::Instant::now();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        () = self.serve(&mut subscribed, &wakeups) => {}
                    }
                    tracing::debug!(channel = %self.channel, "release subscription dropped: resubscribing");
                    state.send_replace(SubState::Down);
                    // Back off from the start only after a subscription
                    // that lasted: one dropped at once is backed off from.
                    if since.elapsed() >= RECONNECT_MAX {
                        delay = RECONNECT_MIN;
                    }
                }
                Err(e) => {
                    tracing::debug!(channel = %self.channel, error = %e, "subscribing failed");
                    state.send_replace(SubState::Down);
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RECONNECT_MAX);
        }
    }

    /// Delivers announcements until the connection drops or stops
    /// answering.
    async fn serve(&self, s: &mut Subscribed, wakeups: &Wakeups) {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        loop {
            tokio::select! {
                msg = s.stream.next() => match msg {
                    Some(msg) => {
                        let id = std::str::from_utf8(msg.get_payload_bytes())
                            .ok()
                            .and_then(|id| WorkId::new(id).ok());
                        if let Some(id) = id {
                            wakeups.watchers.notify(&id);
                        }
                    }
                    None => return,
                },
                _ = heartbeat.tick() => {
                    let pong = tokio::time::timeout(self.response_timeout, s.sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return;
                    }
                }
            }
        }
    }
}
