//! Sending a request: which failures go to the next member, how long an
//! operation's tries may take ([`Budget`]), and the loop over the members.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Client, ResponseHeader, Txn, TxnResponse};
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::store::url_parts::redact;

use super::{Core, EtcdConfig, KIND};

/// The share of a lease's TTL one request to one member may take before
/// the store sends it to the next member: TTL/5 (see `Budget::lease`).
const ATTEMPT_SHARE: u32 = 5;
/// The shortest time one request to one member is given, whatever the TTL:
/// a healthy member on a busy host may take a few hundred milliseconds.
const MIN_ATTEMPT: Duration = Duration::from_millis(250);

fn store_err(what: impl Into<String>, e: etcd_client::Error) -> Error {
    StoreError::with_source(KIND, what, e).into()
}

/// Whether a failed request certainly never reached a member able to serve
/// it: no connection could be made (a member down), or the member has no
/// leader and refused it before proposing anything. Such a request changed
/// nothing. Reported as "cannot reach the cluster" when every try failed so.
fn never_reached(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            if status.code() == tonic::Code::Unavailable && status.message().contains("no leader") {
                return true;
            }
            Some(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        _ => None,
    };
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whether the member refused the request for the user's permissions
/// (etcd's RBAC: the user's roles do not cover a key).
fn permission_denied(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::PermissionDenied)
}

/// Whether the member closed or reset the connection under a request
/// (hyper then cancels the request): what a member that serves TLS does to
/// a client that speaks plain HTTP/2, and one run with
/// `--client-cert-auth`, at times, to a client without a certificate (at
/// other times it sends an alert, which rustls reports as "received fatal
/// alert: BadCertificate"). Only used to add a hint to the error.
pub(super) fn closed_by_peer(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            if status.code() == tonic::Code::Cancelled {
                return true;
            }
            Some(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::IoError(io) => Some(io),
        _ => None,
    };
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof,
            };
            if matches!(
                io.kind(),
                BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
            ) {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// Whether a failed request is worth sending to another member: it never
/// reached one able to serve it, or the member did not answer in time
/// (hung: stopped, behind a black hole, or waiting for a new leader), or
/// the connection broke, or the member said it is unavailable (no leader,
/// leader changed, its own timeout). The outcome of all but the first is
/// unknown: the request may have been applied, once, by the time the
/// store sends it again. Every operation of the store is safe to send
/// again (see "Endpoints and fail-over" in the module docs). Any other
/// error (a refusal: permission, bad request, lease not found) is an
/// answer, the same from every member.
pub(super) fn fails_over(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => never_reached(e),
    }
}

/// How long one operation's requests may take: each attempt on one
/// member, and all of them together.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    /// How long one request to one member may take before the store gives
    /// up on that member and sends it to the next one.
    attempt: Duration,
    /// When the operation stops trying members (`None`: only the number of
    /// attempts bounds it).
    until: Option<Instant>,
}

impl Budget {
    /// An operation not tied to a lease (reads for `status`, revocation,
    /// [`EtcdStore::ready`]): the configured request timeout per attempt.
    pub(super) fn plain(config: &EtcdConfig) -> Self {
        Self {
            attempt: config.request_timeout,
            until: None,
        }
    }

    /// An operation on a lease of `ttl` (acquire, renew, checkpoint,
    /// release, read checkpoint): it is of no use after the TTL, and one
    /// member that hangs may cost it at most a fifth of the TTL (never
    /// more than the configured request timeout, never less than
    /// [`MIN_ATTEMPT`]) before it goes to the next member. With a single
    /// member there is nowhere else to go: the attempt may take the whole
    /// request timeout.
    pub(super) fn lease(config: &EtcdConfig, ttl: Duration) -> Self {
        let attempt = if config.hosts.len() > 1 {
            config
                .request_timeout
                .min((ttl / ATTEMPT_SHARE).max(MIN_ATTEMPT))
        } else {
            config.request_timeout
        };
        Self {
            attempt,
            until: Some(Instant::now() + ttl),
        }
    }

    /// The timeout of an attempt started now; `None` once past `until`.
    pub(super) fn attempt_now(&self) -> Option<Duration> {
        self.next_attempt()
    }

    /// The timeout of an attempt started now; `None` once past `until`.
    fn next_attempt(&self) -> Option<Duration> {
        match self.until {
            None => Some(self.attempt),
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| self.attempt.min(left))
            }
        }
    }
}

impl Core {
    fn unreachable(&self, e: etcd_client::Error) -> Error {
        store_err(
            format!(
                "cannot reach the etcd cluster at {}",
                redact(&self.config.to_url())
            ),
            e,
        )
    }

    /// Runs one request on the preferred member, and on the next ones
    /// while it fails over ([`fails_over`]: no connection, no leader, no
    /// reply within the attempt timeout of `budget`, a broken connection),
    /// up to twice per member and until `budget` runs out. Sending a
    /// request again whose outcome is unknown is safe for every request the
    /// store sends: see "Endpoints and fail-over" in the module docs.
    pub(super) async fn rpc<T, F, Fut>(&self, what: &str, budget: Budget, request: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let members = &self.members;
        let attempts = 2 * members.endpoints.len() + 1;
        let mut reached = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let i = members.preferred();
            let error = match budget.next_attempt() {
                None => tonic::Status::deadline_exceeded(format!(
                    "no member answered before the lease's TTL ran out ({} attempts)",
                    attempt - 1
                ))
                .into(),
                Some(limit) => {
                    let sent = async {
                        let client = members.client(i).await?;
                        request(client).await
                    };
                    match tokio::time::timeout(limit, sent).await {
                        Ok(Ok(v)) => return Ok(v),
                        Ok(Err(e)) => e,
                        Err(_) => tonic::Status::deadline_exceeded(format!(
                            "no reply from {} within {limit:?}",
                            members.endpoints[i]
                        ))
                        .into(),
                    }
                }
            };
            reached |= !never_reached(&error);
            let out_of_time = budget.next_attempt().is_none();
            if !fails_over(&error) || attempt >= attempts || out_of_time {
                return Err(if reached {
                    let hint = if closed_by_peer(&error) {
                        self.config.closed_hint().to_string()
                    } else if permission_denied(&error) {
                        self.config.permission_hint()
                    } else {
                        String::new()
                    };
                    store_err(format!("{what}{hint}"), error)
                } else {
                    self.unreachable(error)
                });
            }
            tracing::debug!(
                member = %members.endpoints[i],
                error = %error,
                attempt,
                "etcd request failed: sending it to the next member"
            );
            members.failed(i);
        }
    }

    /// Notes the revision of a reply.
    pub(super) fn saw(&self, header: Option<&ResponseHeader>) {
        if let Some(h) = header {
            self.seen.fetch_max(h.revision(), Ordering::Relaxed);
        }
    }

    pub(super) async fn txn(&self, txn: Txn, what: &str, budget: Budget) -> Result<TxnResponse> {
        self.txn_with(|| txn.clone(), what, budget).await
    }

    /// A transaction that `build` makes afresh for each try (`rpc` may
    /// send it to several members), so that the first try, usually the
    /// only one, sends it without a copy.
    pub(super) async fn txn_with(
        &self,
        build: impl Fn() -> Txn,
        what: &str,
        budget: Budget,
    ) -> Result<TxnResponse> {
        let resp = self
            .rpc(what, budget, |mut c| {
                let txn = build();
                async move { c.txn(txn).await }
            })
            .await?;
        self.saw(resp.header());
        Ok(resp)
    }
}
