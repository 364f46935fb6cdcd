//! Step-down requests: any process asks the current leader to give up
//! (Vault `operator step-down`, etcd `Resign` from outside, Curator's
//! cooperative revocation), as opposed to taking its lease away
//! (`revoke`, `worklease release --force`), which leaves its work running
//! until its next renewal fails.
//!
//! A request is a lease of its own, on the work ID `ELECTION/step-down`:
//! the requester acquires it with the holder ID `TERM/REQUESTER`, naming
//! the term it asks to end, and releases it at once. The release wakes the
//! leader where the store notifies ([`LeaseStore::watch`]); the leader also
//! reads the request lease once per renewal interval. A leader resigns
//! ([`super::Leadership::resign`]) when the request names its own term, so
//! a request that arrives after a hand-over never ends the next term, and
//! the request lease's fencing token counts the requests. Nothing new in
//! the store contract: every store has step-down requests.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::observe::read_leader;
use super::{Clock, State, SystemClock};
use crate::error::{Error, InvalidInput, Result};
use crate::lease::{AcquireOptions, Config, Leases};
use crate::limits::{WorkId, MAX_WORK_ID_BYTES};
use crate::store::LeaseStore;

pub use crate::internal::STEP_DOWN_SUFFIX;

/// The TTL of a request's lease: how long a requester that died between
/// its acquisition and its release delays the next request.
pub const REQUEST_TTL: Duration = Duration::from_secs(10);

/// Checks that `name` can name an election: a valid work ID short enough
/// to carry its step-down requests' suffix, and not itself such a
/// requests' work ID. The checks [`super::ElectorBuilder::build`] makes,
/// for a caller (the CLI) that wants to refuse a name before it opens a
/// store.
///
/// ```
/// assert!(worklease::election::check_name("scheduler").is_ok());
/// assert!(worklease::election::check_name("scheduler/step-down").is_err());
/// ```
///
/// # Errors
/// [`Error::Invalid`] naming the limit: not a work ID (empty, over
/// [`MAX_WORK_ID_BYTES`], a control character), over
/// [`MAX_WORK_ID_BYTES`] − 10 bytes, or reserved
/// ([`crate::is_internal_work_id`]: ending with `/step-down`,
/// `/fair-queue` or `/fair-waiter/<n>`).
pub fn check_name(name: &str) -> Result<WorkId> {
    let election = WorkId::new(name)?;
    requests_id(&election)?;
    Ok(election)
}

/// The work ID of `election`'s step-down requests.
///
/// # Errors
/// [`Error::Invalid`] when `election` is too long to carry the suffix
/// (an election name is at most [`MAX_WORK_ID_BYTES`] − 10 bytes), or
/// is a work ID worklease keeps for itself ([`crate::is_internal_work_id`]:
/// `NAME/step-down` is reserved for `NAME`'s requests, `T/fair-queue`
/// and `T/fair-waiter/<n>` for the fair line of `T`).
pub(crate) fn requests_id(election: &WorkId) -> Result<WorkId> {
    crate::internal::user_work_id(election.as_str())?;
    let id = format!("{election}{STEP_DOWN_SUFFIX}");
    if id.len() > MAX_WORK_ID_BYTES {
        return Err(InvalidInput::Config(format!(
            "election name is {} bytes: the limit is {} bytes (its step-down requests use the \
             work ID NAME{STEP_DOWN_SUFFIX}, at most {MAX_WORK_ID_BYTES} bytes)",
            election.as_str().len(),
            MAX_WORK_ID_BYTES - STEP_DOWN_SUFFIX.len()
        ))
        .into());
    }
    Ok(WorkId::new(id)?)
}

/// Asks the current leader of `election` on `store` to step down, as
/// `requester` (a holder ID, for the record): the leader resigns when it
/// sees the request, at once where the store notifies, within one
/// renewal interval otherwise, and its standbys campaign. Returns the
/// leader that was asked. Three store round trips (read the leader,
/// acquire and release the request lease); it waits, up to
/// [`REQUEST_TTL`], while another request is being made.
///
/// A request asks; it does not take leadership away: a leader that cannot
/// reach the store goes on until its deadline, as after any loss.
///
/// # Errors
/// [`Error::NoLease`] when nobody leads; [`Error::Invalid`] for a bad
/// election name or requester; [`Error::WaitTimedOut`] when another
/// request's lease stayed held for [`REQUEST_TTL`]; [`Error::Store`] when
/// the store fails.
pub async fn request_step_down(
    store: Arc<dyn LeaseStore>,
    election: impl Into<String>,
    requester: impl Into<String>,
) -> Result<State> {
    let election = WorkId::new(election.into())?;
    let id = requests_id(&election)?;
    let requester = requester.into();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let leader = read_leader(&store, &election, &clock)
        .await?
        .ok_or_else(|| Error::NoLease {
            election: election.to_string(),
        })?;
    ask(store, &id, leader.generation, &requester).await?;
    tracing::info!(election = %election, leader = %leader.owner, term = leader.generation, "asked the leader to step down");
    Ok(leader)
}

/// Asks the leader of `term` to step down: holds the request lease
/// `requests` as `TERM/REQUESTER` and releases it. Only the leader of that
/// term honours it, so a caller that decided on one leader (a higher
/// priority asking a lower one) never ends the term of another that took
/// over meanwhile.
pub(crate) async fn ask(
    store: Arc<dyn LeaseStore>,
    requests: &WorkId,
    term: u64,
    requester: &str,
) -> Result<()> {
    let holder = format!("{term}/{requester}");
    let leases = Leases::new(store, Config::new(holder, REQUEST_TTL))?;
    let wait = AcquireOptions::new()
        .wait_for_lease()
        .wait_timeout(REQUEST_TTL + Duration::from_secs(1));
    // The requests' own work ID is reserved: not through `acquire`, which
    // refuses it to users.
    let token = leases
        .acquire_first(std::slice::from_ref(requests), wait)
        .await?;
    leases.release(token).await
}

/// Completes when a step-down request for `term` is seen on `requests`:
/// read at once, when the store notifies, and every `interval`; a failed
/// read is tried again at the next of those. Ends early when `stop` fires.
pub(crate) async fn requested(
    store: Arc<dyn LeaseStore>,
    requests: WorkId,
    term: u64,
    interval: Duration,
    stop: CancellationToken,
) -> bool {
    loop {
        let woken = store.watch(&requests);
        match store.inspect(std::slice::from_ref(&requests)).await {
            Ok(infos) if infos.iter().any(|i| names_term(&i.holder_id, term)) => return true,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "reading step-down requests failed; trying again")
            }
        }
        let sleep = tokio::time::sleep(interval);
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = sleep => {}
            _ = async { if let Some(w) = woken { w.await } else { std::future::pending().await } } => {}
        }
    }
}

/// True when a request lease's holder ID names `term`.
fn names_term(holder: &str, term: u64) -> bool {
    holder
        .split_once('/')
        .is_some_and(|(t, _)| t.parse::<u64>() == Ok(term))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_one_term() {
        assert!(names_term("7/ops", 7));
        assert!(names_term("7/a/b", 7));
        assert!(!names_term("17/ops", 7));
        assert!(!names_term("7", 7));
        assert!(!names_term("x/7", 7));
    }

    /// A candidate of priority `priority` on `store` that leads until its
    /// leadership is lost, reporting (owner, term) when it starts and
    /// when it ends.
    fn candidate(
        store: Arc<dyn LeaseStore>,
        owner: &'static str,
        priority: i32,
        events: tokio::sync::mpsc::UnboundedSender<(&'static str, u64, bool)>,
    ) -> tokio::task::JoinHandle<()> {
        let e = super::super::Elector::builder(store, "e", owner)
            .ttl(Duration::from_secs(30))
            .poll_interval(Duration::from_secs(1))
            .priority(priority)
            .build()
            .expect("valid");
        tokio::spawn(async move {
            loop {
                let events = events.clone();
                let led = e
                    .lead(|l| async move {
                        let term = l.state().generation;
                        let _ = events.send((owner, term, true));
                        l.lost().cancelled().await;
                        let _ = events.send((owner, term, false));
                    })
                    .await;
                if led.is_err() {
                    return;
                }
            }
        })
    }

    /// Broke once (found by a break test): a higher priority that saw a
    /// lower leader asked "whoever leads now" to step down, and when a
    /// candidate of its own priority had taken over in between, ended that
    /// one's term: equal priorities swung. P sees every reply 100 ms late,
    /// so E takes over from L while P's request is on its way.
    #[tokio::test(start_paused = true)]
    async fn a_priority_request_ends_only_the_lower_term_it_saw() {
        use crate::store::fault::FaultStore;
        use crate::store::memory::MemoryStore;
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let l = candidate(store.clone(), "l", 1, tx.clone());
        assert_eq!(events.recv().await.map(|e| (e.0, e.2)), Some(("l", true)));
        let slow = Arc::new(FaultStore::new(store.clone()));
        slow.set_delay(Duration::from_millis(100));
        let p = candidate(slow, "p", 5, tx.clone());
        tokio::time::sleep(Duration::from_millis(250)).await;
        let e = candidate(store.clone(), "e", 5, tx);
        let mut led = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.recv()).await {
            led.push(ev);
        }
        // L gives way once, to a priority 5; that term is never ended.
        let starts: Vec<_> = led.iter().filter(|e| e.2).collect();
        assert_eq!(starts.len(), 1, "one hand-over only: {led:?}");
        assert!(
            !led.iter().any(|e| !e.2 && e.0 != "l"),
            "a priority-5 term ended: {led:?}"
        );
        for t in [l, p, e] {
            t.abort();
        }
    }

    #[test]
    fn an_election_too_long_for_the_suffix_is_refused_naming_the_limit() {
        let long = WorkId::new("e".repeat(MAX_WORK_ID_BYTES - 3)).expect("valid");
        let e = requests_id(&long).unwrap_err();
        assert!(e.to_string().contains("the limit is 1014 bytes"), "{e}");
        let reserved = WorkId::new("cy/step-down").expect("valid");
        let e = requests_id(&reserved).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let queue = WorkId::new("cy/fair-queue").expect("valid");
        let e = requests_id(&queue).unwrap_err();
        assert!(e.to_string().contains("fair line"), "{e}");
        let ok = WorkId::new("scheduler").expect("valid");
        assert_eq!(
            requests_id(&ok).expect("fits").as_str(),
            "scheduler/step-down"
        );
    }
}
