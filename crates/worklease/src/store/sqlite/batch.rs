//! The batch operations' transaction (their entry points are in
//! `ops.rs`): each batch is one IMMEDIATE transaction in which
//! every lease takes the step its single call takes, with the statements
//! prepared once for the whole batch.

use crate::error::{Error, Result, StoreError};
use crate::store::{LeaseRef, OwnedLease};

use super::row::Statements;
use super::{ClockReading, SqliteStore};

/// The most leases one batch call names ([`crate::LeaseStore::max_batch`]).
/// A batch is one write transaction, which holds the file's write lock:
/// every other process's writer waits for it. See "Batches" in the module
/// docs for the measured cost at this size.
pub const MAX_BATCH: usize = 500;

/// A lease's outcome in a batch: its own error is its outcome, as its
/// single call would have returned (`Held`, `Fenced`, `Expired`, or a
/// stored row that cannot be decoded); a failure of SQLite itself (a failed
/// statement, I/O, a full disk) fails the whole batch, which is then
/// rolled back, since SQLite may have ended the transaction with it.
pub(super) fn outcome<T>(r: Result<T>) -> Result<Result<T>> {
    match r {
        Err(Error::Store(e)) if !is_unreadable_row(&e) => Err(Error::Store(e)),
        r => Ok(r),
    }
}

/// True when `e` is a row's value that cannot be decoded: the statement
/// ran, and the transaction is intact.
fn is_unreadable_row(e: &StoreError) -> bool {
    use rusqlite::Error as E;
    e.source
        .as_deref()
        .and_then(|s| s.downcast_ref::<E>())
        .is_some_and(|e| {
            matches!(
                e,
                E::InvalidColumnType(..)
                    | E::FromSqlConversionFailure(..)
                    | E::IntegralValueOutOfRange(..)
                    | E::Utf8Error(..)
            )
        })
}

impl SqliteStore {
    /// `step` for each of `leases`, in one transaction; `ending` when the
    /// step may end leases (see [`SqliteStore::ending_tx`]).
    pub(super) async fn each<T: Send + 'static>(
        &self,
        leases: &[LeaseRef<'_>],
        ending: bool,
        step: impl Fn(&mut Statements<'_>, &ClockReading, LeaseRef<'_>) -> Result<T> + Send + 'static,
    ) -> Result<Vec<Result<T>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let leases: Vec<OwnedLease> = leases.iter().map(|l| OwnedLease::of(*l)).collect();
        let all = move |tx: &rusqlite::Transaction<'_>, now: &ClockReading| {
            let mut st = Statements::new(tx);
            leases
                .iter()
                .map(|l| outcome(step(&mut st, now, l.lease())))
                .collect()
        };
        if ending {
            self.ending_tx(all).await
        } else {
            self.tx(all).await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::limits::{HolderId, WorkId};
    use crate::store::sqlite::TokioClock;
    use crate::store::{LeaseInfo, LeaseStore};

    const TTL: Duration = Duration::from_secs(60);

    struct Fixture {
        _dir: tempfile::TempDir,
        store: SqliteStore,
        raw: rusqlite::Connection,
        ids: Vec<WorkId>,
        holder: HolderId,
        tokens: Vec<u64>,
    }

    impl Fixture {
        /// A store holding `a`, `b` and `c`, and a second connection to
        /// its file.
        async fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("leases.db");
            let store =
                SqliteStore::open_with_clock(&path, Arc::new(TokioClock::new())).expect("open");
            let ids: Vec<WorkId> = ["a", "b", "c"]
                .iter()
                .map(|s| WorkId::new(*s).expect("valid"))
                .collect();
            let holder = HolderId::new("h").expect("valid");
            let tokens = store
                .acquire_many(&ids, &holder, TTL, 3)
                .await
                .expect("acquire_many")
                .into_iter()
                .map(|g| g.expect("granted").fencing_token)
                .collect();
            let raw = rusqlite::Connection::open(&path).expect("open");
            Self {
                _dir: dir,
                store,
                raw,
                ids,
                holder,
                tokens,
            }
        }

        fn leases(&self) -> Vec<LeaseRef<'_>> {
            self.ids
                .iter()
                .zip(&self.tokens)
                .map(|(work_id, t)| LeaseRef {
                    work_id,
                    holder_id: &self.holder,
                    fencing_token: *t,
                })
                .collect()
        }

        async fn left(&self) -> Vec<Option<Duration>> {
            let infos: Vec<LeaseInfo> = self.store.inspect(&[]).await.expect("inspect");
            infos.into_iter().map(|i| i.expires_in).collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_row_fails_alone() {
        let f = Fixture::new().await;
        f.raw
            .execute_batch("UPDATE worklease_leases SET phase = 'bogus' WHERE work_id = 'b'")
            .expect("corrupt");
        let out = f.store.renew_many(&f.leases(), TTL).await.expect("batch");
        assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
        assert!(matches!(out[1], Err(Error::Store(_))), "{:?}", out[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_statement_rolls_the_whole_batch_back() {
        let f = Fixture::new().await;
        tokio::time::advance(Duration::from_secs(10)).await;
        let before = f.left().await;
        // SQLite itself fails the last lease's statement.
        f.raw
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE UPDATE ON worklease_leases
                 WHEN OLD.work_id = 'c' BEGIN SELECT RAISE(ABORT, 'refused'); END;
                 CREATE TRIGGER refuse_new BEFORE INSERT ON worklease_leases
                 WHEN NEW.work_id = 'z' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .expect("trigger");
        let e = f.store.renew_many(&f.leases(), TTL).await.unwrap_err();
        assert!(matches!(e, Error::Store(_)), "{e:?}");
        assert_eq!(
            f.left().await,
            before,
            "the renewals of a and b were rolled back"
        );
        let e = f
            .store
            .release_many(&f.leases())
            .await
            .expect_err("release_many");
        assert!(matches!(e, Error::Store(_)), "{e:?}");
        assert_eq!(f.left().await, before, "the releases were rolled back");
        let more: Vec<WorkId> = ["x", "y", "z"]
            .iter()
            .map(|s| WorkId::new(*s).expect("valid"))
            .collect();
        let e = f
            .store
            .acquire_many(&more, &f.holder, TTL, 3)
            .await
            .expect_err("acquire_many");
        assert!(matches!(e, Error::Store(_)), "{e:?}");
        assert_eq!(
            f.left().await.len(),
            3,
            "the grants of x and y were rolled back"
        );

        f.raw
            .execute_batch("DROP TRIGGER refuse; DROP TRIGGER refuse_new;")
            .expect("drop");
        let out = f.store.renew_many(&f.leases(), TTL).await.expect("batch");
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
        assert!(f.left().await.iter().all(|l| *l > before[0]), "renewed");
        let g = f
            .store
            .acquire_many(&more, &f.holder, TTL, 3)
            .await
            .expect("acquire_many");
        let next = g[0].as_ref().expect("granted").fencing_token;
        assert_eq!(
            next,
            f.tokens[2] + 1,
            "the rolled-back grants used no fencing token"
        );
    }
}
