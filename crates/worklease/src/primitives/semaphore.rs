//! Semaphores: at most N holders at once across a fleet, each permit a
//! lease of its own with its own fencing token (Consul semaphores,
//! Curator's `InterProcessSemaphoreV2`, Redisson's
//! `RPermitExpirableSemaphore`, none of which fences a permit).
//!
//! A semaphore named `NAME` with `N` permits is the `N` work IDs
//! `NAME/permit/0` to `NAME/permit/{N-1}` ([`Semaphore::permit_ids`]).
//! Taking a permit is acquiring any free one of them
//! ([`Leases::acquire_any`]): a first store call over 16 permits, then one
//! per [`crate::LeaseStore::max_batch`] permits, so one round trip when a
//! permit is free among the first 16 tried, whatever `N`. The permits are
//! tried from a random one on, so that concurrent acquirers rarely race
//! for the same free permit, and a free semaphore's first call usually
//! grants the first permit it names. The permit comes back as a [`Token`]: renew,
//! checkpoint, read, release and background renewal are those of any
//! lease, through the same [`Leases`] handle (its session renews every
//! permit with its other leases).
//!
//! What it guarantees, on every store (the conformance suite checks it):
//! * **S1 of the semaphore**: at no moment do more than N holders each
//!   believe they hold a live permit, since each permit is one lease and
//!   S1 holds per lease.
//! * **S2–S5 per permit**: each permit's fencing tokens strictly increase,
//!   its checkpoint survives, its hand-off flag tells a release from an
//!   expiry. Tokens also increase across the permits of one semaphore (and
//!   across all work IDs) on the stores with one fencing sequence (memory,
//!   SQLite, PostgreSQL, etcd); on Redis and the register stores they
//!   increase per permit only. A downstream system fences a permit holder
//!   by its permit's work ID and token: it keeps the highest token seen per
//!   permit and refuses a lower one. (Keeping one highest token per
//!   semaphore would refuse live holders that took their permits earlier
//!   than another, whatever the stores' sequences.)
//! * **A dead holder's permit** is free when its lease expires: within its
//!   TTL, and a waiter gets it within the TTL plus one poll interval (L1).
//!
//! **Changing N.** `N` is each process's own setting, not kept in the
//! store: every process of one semaphore should use the same `N`. Raising
//! it takes effect at once (the new permits are free). Lowering it takes
//! effect as permits are released: holders of the permits at or above the
//! new `N` are not cut off, and processes with the new `N` never take
//! those permits again. While processes with different settings run side
//! by side, the bound is the larger `N`.
//!
//! **Fair waiting** ([`AcquireOptions::fair`]): waiters of a permit are
//! served in arrival order ([`crate::fair`]); without it, waiters are woken
//! by the store's notifications or their poll interval, and the first to
//! come wins.

use std::sync::Arc;

use rand::Rng;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::{AcquireOptions, Leases};
use crate::limits::{WorkId, MAX_WORK_ID_BYTES};
use crate::store::LeaseInfo;
use crate::token::Token;

/// The most permits a semaphore may have. Acquiring tries up to all of
/// them (a full semaphore costs `ceil(N / max_batch)` store calls to fail
/// fast) and `status` lists them, so the bound keeps both cheap.
pub const MAX_PERMITS: usize = 10_000;

pub use crate::internal::LINE_SUFFIX;

/// What separates a semaphore's name from a permit's number in the
/// permit's work ID (`NAME/permit/K`).
pub const PERMIT_INFIX: &str = "/permit/";

/// A semaphore of `N` permits over the leases of one handle. Cheap to
/// clone (the permit IDs are shared).
#[derive(Clone, Debug)]
pub struct Semaphore {
    leases: Leases,
    name: Arc<str>,
    /// The permit IDs twice over: the `N` from any start are one slice.
    permit_ids: Arc<[WorkId]>,
}

impl Semaphore {
    /// A semaphore named `name` with `permits` permits, taken with the
    /// holder ID and TTL of `leases`. Writes nothing.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `permits` is 0 or above [`MAX_PERMITS`], or
    /// when `name` is not a valid work ID, is one worklease keeps for itself
    /// ([`crate::is_internal_work_id`]), or is too long for its permits'
    /// work IDs (`NAME/permit/K` must fit [`MAX_WORK_ID_BYTES`]).
    pub fn new(leases: Leases, name: impl Into<String>, permits: usize) -> Result<Self> {
        let name: String = name.into();
        let ids = permit_ids(&name, permits)?;
        let twice: Vec<WorkId> = ids.iter().chain(&ids).cloned().collect();
        Ok(Self {
            leases,
            name: name.into(),
            permit_ids: twice.into(),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has (this process's setting).
    pub fn permits(&self) -> usize {
        self.permit_ids.len() / 2
    }

    /// The permits' work IDs, `NAME/permit/0` to `NAME/permit/{N-1}`.
    pub fn permit_ids(&self) -> &[WorkId] {
        &self.permit_ids[..self.permits()]
    }

    /// The handle permits are taken with: renew, checkpoint, read,
    /// release and [`Leases::start_renewal`] a permit through it.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Takes a permit: any free one, tried from a random one on, failing
    /// fast or, with [`AcquireOptions::wait_for_lease`], waiting until one
    /// is free (woken by a store notification on any permit, by the
    /// earliest expiry among their holders, or by the poll interval), as
    /// [`Leases::acquire_any`]. The token's work ID names the permit.
    ///
    /// # Errors
    /// * [`Error::PermitsHeld`] when every permit is held and waiting was
    ///   not asked for;
    /// * [`Error::WaitersAhead`] (naming the semaphore) when a fail-fast
    ///   fair acquisition finds fair waiters in line;
    /// * [`Error::Cancelled`] / [`Error::WaitTimedOut`] (naming the
    ///   semaphore) when a wait is cancelled or times out;
    /// * [`Error::Invalid`] for a bad poll interval; [`Error::Store`] when
    ///   the store fails.
    pub async fn acquire(&self, options: AcquireOptions) -> Result<Token> {
        let n = self.permits();
        let result = if options.is_fair() {
            self.check_fair_line()?;
            let try_target: crate::fair::TryTarget<'_> = Box::new(move |o| {
                Box::pin(async move { Ok((self.acquire_unfair(o).await?, None)) })
            });
            self.leases
                .acquire_fair(&self.line_target(), options, try_target)
                .await
                .map(|(token, _)| token)
        } else {
            self.acquire_unfair(options).await
        };
        match result {
            Ok(token) => Ok(token),
            Err(Error::Held { expires_in, .. } | Error::PermitsHeld { expires_in, .. }) => {
                Err(Error::PermitsHeld {
                    semaphore: self.name.to_string(),
                    permits: n,
                    expires_in,
                })
            }
            Err(Error::Cancelled { .. }) => Err(Error::Cancelled {
                work_id: self.name.to_string(),
            }),
            Err(Error::WaitTimedOut { waited, .. }) => Err(Error::WaitTimedOut {
                work_id: self.name.to_string(),
                waited,
            }),
            // Named by the semaphore, not by its line's reserved target.
            Err(Error::WaitersAhead { waiters, .. }) => Err(Error::WaitersAhead {
                target: self.name.to_string(),
                waiters,
            }),
            Err(e) => Err(e),
        }
    }

    /// The target of the semaphore's fair line, `NAME/permit/line` (its
    /// line is `NAME/permit/line/fair-queue` and
    /// `NAME/permit/line/fair-waiter/K`, beside the permits). The target is
    /// reserved ([`LINE_SUFFIX`]), so the line is apart from every user
    /// lease's, `NAME`'s and `NAME/permit`'s included.
    pub fn line_target(&self) -> String {
        line_target(&self.name)
    }

    /// A name too long for the fair line's work IDs, refused naming the
    /// semaphore (the line's own check would name its reserved target).
    fn check_fair_line(&self) -> Result<()> {
        let target = self.line_target();
        let longest = crate::fair::line::Line::longest(&target);
        if longest <= MAX_WORK_ID_BYTES {
            return Ok(());
        }
        let room = self.name.len() - (longest - MAX_WORK_ID_BYTES);
        Err(InvalidInput::Config(format!(
            "semaphore name of {} bytes is too long for fair permits: its line's work IDs \
             (NAME{LINE_SUFFIX}{}SLOT) are up to {longest} bytes, the limit is \
             {MAX_WORK_ID_BYTES}; a fair semaphore's name is at most {room} bytes",
            self.name.len(),
            crate::fair::WAITER_INFIX,
        ))
        .into())
    }

    /// Any free permit, tried from a random one on.
    async fn acquire_unfair(&self, options: AcquireOptions) -> Result<Token> {
        let n = self.permits();
        let start = rand::thread_rng().gen_range(0..n);
        self.leases
            .acquire_any_checked(&self.permit_ids[start..start + n], options)
            .await
    }

    /// The permits held now (live leases), as the store reports them; one
    /// store call per [`crate::LeaseStore::max_batch`] permits at most
    /// (`inspect` of the permit IDs).
    ///
    /// # Errors
    /// [`Error::Store`] when the store fails.
    pub async fn holders(&self) -> Result<Vec<LeaseInfo>> {
        let infos = self.leases.store().inspect(self.permit_ids()).await?;
        Ok(infos.into_iter().filter(|i| !i.expired).collect())
    }

    /// The permit number of `token` if it is a permit of this semaphore
    /// (any `N`: a permit above this process's setting counts too).
    pub fn permit_of(&self, token: &Token) -> Option<usize> {
        permit_number(&self.name, token.work_id().as_str())
    }
}

/// The target of semaphore `name`'s fair line ([`Semaphore::line_target`]).
pub fn line_target(name: &str) -> String {
    format!("{name}{LINE_SUFFIX}")
}

/// The work IDs of the `permits` permits of semaphore `name`:
/// `NAME/permit/0` to `NAME/permit/{permits-1}` (what `worklease status
/// --permits` lists).
///
/// # Errors
/// As [`Semaphore::new`].
pub fn permit_ids(name: &str, permits: usize) -> Result<Vec<WorkId>> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(InvalidInput::Config(format!(
            "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
        ))
        .into());
    }
    crate::internal::user_work_id(name)?;
    let longest = name.len() + PERMIT_INFIX.len() + (permits - 1).to_string().len();
    if longest > MAX_WORK_ID_BYTES {
        return Err(InvalidInput::Config(format!(
            "semaphore name {name:?} is too long for its permits: the permit work IDs \
             ({name}{PERMIT_INFIX}K) are up to {longest} bytes, the limit is {MAX_WORK_ID_BYTES}"
        ))
        .into());
    }
    Ok((0..permits)
        .map(|k| WorkId::new(format!("{name}{PERMIT_INFIX}{k}")))
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

/// The permit number of `work_id` if it is a permit of semaphore `name`
/// (`NAME/permit/K` with `K` written as [`Semaphore`] writes it).
pub fn permit_number(name: &str, work_id: &str) -> Option<usize> {
    let k = work_id.strip_prefix(name)?.strip_prefix(PERMIT_INFIX)?;
    let n: usize = k.parse().ok()?;
    (n.to_string() == k && n < MAX_PERMITS).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::LeaseStore;
    use crate::Config;
    use std::time::Duration;

    fn leases(holder: &str, store: &Arc<MemoryStore>) -> Leases {
        Leases::new(store.clone(), Config::new(holder, Duration::from_secs(10))).expect("config")
    }

    #[test]
    fn bad_settings_name_the_limit() {
        let store = Arc::new(MemoryStore::new());
        let l = leases("a", &store);
        let e = Semaphore::new(l.clone(), "s", 0).unwrap_err().to_string();
        assert!(e.contains("1 to 10000 permits"), "{e}");
        let e = Semaphore::new(l.clone(), "s", MAX_PERMITS + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 to 10000 permits"), "{e}");
        let e = Semaphore::new(l.clone(), "", 1).unwrap_err().to_string();
        assert!(e.contains("work ID is empty"), "{e}");
        let long = "x".repeat(MAX_WORK_ID_BYTES - PERMIT_INFIX.len());
        let e = Semaphore::new(l, long, 10).unwrap_err().to_string();
        assert!(
            e.contains(&format!("the limit is {MAX_WORK_ID_BYTES}")),
            "{e}"
        );
    }

    #[test]
    fn permit_numbers_round_trip() {
        let store = Arc::new(MemoryStore::new());
        let s = Semaphore::new(leases("a", &store), "jobs/db", 12).expect("semaphore");
        for (k, id) in s.permit_ids().iter().enumerate() {
            assert_eq!(permit_number("jobs/db", id.as_str()), Some(k));
        }
        assert_eq!(permit_number("jobs/db", "jobs/db/permit/01"), None);
        assert_eq!(permit_number("jobs/db", "jobs/dbx/permit/1"), None);
        assert_eq!(permit_number("jobs", "jobs/db/permit/1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_too_long_for_fair_permits_is_refused_naming_the_semaphore() {
        let store = Arc::new(MemoryStore::new());
        let name = "s".repeat(995);
        let s = Semaphore::new(leases("a", &store), name.clone(), 2).expect("permits fit");
        let e = s
            .acquire(AcquireOptions::new().fair())
            .await
            .expect_err("the line's work IDs do not fit")
            .to_string();
        assert!(e.contains("semaphore name of 995 bytes"), "{e}");
        assert!(e.contains("is at most 994 bytes"), "{e}");
        assert!(!e.contains(&name), "the name itself is not repeated: {e}");
        let written = store.inspect(&[]).await.expect("every lease");
        assert!(written.is_empty(), "nothing written: {written:?}");
        let fits = Semaphore::new(leases("a", &store), "s".repeat(994), 2).expect("fits");
        fits.acquire(AcquireOptions::new().fair())
            .await
            .expect("a fair permit of the longest name");
        s.acquire(AcquireOptions::new()).await.expect("unfair");
    }

    #[tokio::test(start_paused = true)]
    async fn n_permits_then_permits_held() {
        let store = Arc::new(MemoryStore::new());
        let holders: Vec<Semaphore> = (0..4)
            .map(|i| Semaphore::new(leases(&format!("h{i}"), &store), "s", 3).expect("semaphore"))
            .collect();
        let mut taken = Vec::new();
        for s in &holders[..3] {
            taken.push(
                s.acquire(AcquireOptions::new())
                    .await
                    .expect("a free permit"),
            );
        }
        let mut permits: Vec<_> = taken.iter().map(|t| holders[0].permit_of(t)).collect();
        permits.sort();
        assert_eq!(permits, vec![Some(0), Some(1), Some(2)]);
        match holders[3].acquire(AcquireOptions::new()).await {
            Err(Error::PermitsHeld {
                semaphore, permits, ..
            }) => assert_eq!((semaphore.as_str(), permits), ("s", 3)),
            other => panic!("expected PermitsHeld, got {other:?}"),
        }
        assert_eq!(holders[3].holders().await.expect("holders").len(), 3);
        let first = taken.remove(0);
        holders[0].leases().release(first).await.expect("release");
        holders[3]
            .acquire(AcquireOptions::new())
            .await
            .expect("the released permit");
    }
}
