//! Acquisitions, single or batch: the acquire script (with the replica
//! wait when one is set), each work ID's reply read as a [`Grant`] or
//! `Held`, and the grants too few replicas acknowledged ended again.

use std::time::{Duration, SystemTime};

use redis::{ScriptInvocation, Value};

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{Grant, Handoff};

use super::reply::{array, bad_reply, int, opt_text, previous, text, token};
use super::scripts::SCRIPTS;
use super::{RedisStore, WaitForReplicas, KIND};

/// What an acquire script replies.
#[derive(Clone, Copy)]
pub(super) enum Replies {
    /// One work ID's reply (`acquire.lua`).
    One,
    /// One reply per work ID tried, in order (`acquire_many.lua`).
    Each,
}

impl RedisStore {
    /// Runs `invocation`, an acquire script for `work_ids` (in order) and
    /// `holder_id`, waits for replicas when the store is set to, and
    /// returns the outcome of each work ID the script tried. With too few
    /// replicas acknowledging, every grant of the call is ended again (one
    /// `abandon` call) and fails with a store error.
    pub(super) async fn acquisitions(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
        replies: Replies,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Vec<Result<Grant>>> {
        self.connections().await?;
        self.first_subscription().await;
        let (reply, acked) = match self.config.wait {
            Some(wait) => {
                let (reply, acked) = self.run_and_wait(invocation, wait, what).await?;
                (reply, Some((acked, wait)))
            }
            None => (self.run(invocation, what).await?, None),
        };
        let replies = match replies {
            Replies::One => vec![reply],
            Replies::Each => reply.into_iter().map(array).collect::<Result<_>>()?,
        };
        if replies.len() > work_ids.len() {
            return Err(bad_reply(&format!(
                "{} replies to an acquisition of {} work IDs",
                replies.len(),
                work_ids.len()
            )));
        }
        let mut out: Vec<Result<Grant>> = work_ids
            .iter()
            .zip(&replies)
            .map(|(id, reply)| grant(id, reply, ttl))
            .collect();
        if let Some((acked, wait)) = acked.filter(|(acked, w)| *acked < i64::from(w.replicas)) {
            let granted: Vec<(&WorkId, u64)> = work_ids
                .iter()
                .zip(&out)
                .filter_map(|(id, r)| Some((id, r.as_ref().ok()?.fencing_token)))
                .collect();
            self.abandon(holder_id, &granted).await;
            for (id, r) in work_ids.iter().zip(out.iter_mut()) {
                if r.is_ok() {
                    *r = Err(unreplicated(id, acked, wait));
                }
            }
        }
        Ok(out)
    }

    /// Ends the `granted` acquisitions (work ID, fencing token) of
    /// `holder_id` as if they had expired, in one script call; a failure
    /// is logged (they then expire with their TTL).
    async fn abandon(&self, holder_id: &HolderId, granted: &[(&WorkId, u64)]) {
        if granted.is_empty() {
            return;
        }
        let mut inv = SCRIPTS.abandon.prepare_invoke();
        inv.arg(holder_id.as_str()).arg(self.channel());
        for (id, fencing_token) in granted {
            let keys = self.lease_keys(id);
            inv.key(&keys.state)
                .key(&keys.live)
                .arg(fencing_token)
                .arg(id.as_str());
        }
        if let Err(e) = self.run(&inv, "abandon unreplicated acquisitions").await {
            let ids: Vec<&str> = granted.iter().map(|(id, _)| id.as_str()).collect();
            tracing::warn!(work_ids = ?ids, error = %e, "cannot end acquisitions too few replicas acknowledged: they expire with their TTL");
        }
    }
}

/// One work ID's reply to an acquire script: a grant of `ttl`, or `Held`.
fn grant(work_id: &WorkId, reply: &[Value], ttl: Duration) -> Result<Grant> {
    match text(reply.first(), "status")?.as_str() {
        "held" => {
            let pttl = int(reply.get(2), "PTTL")?;
            Err(Error::Held {
                work_id: work_id.to_string(),
                holder_id: opt_text(reply.get(1), "holder")?
                    .unwrap_or_else(|| "(unknown)".to_string()),
                expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
            })
        }
        "ok" => Ok(Grant {
            fencing_token: token(reply.get(1), "token")?,
            expires_at: SystemTime::now() + ttl,
            handoff: Handoff {
                previous: previous(reply.get(2..5).unwrap_or(&[]))?,
            },
        }),
        other => Err(bad_reply(&format!("status {other:?}"))),
    }
}

fn unreplicated(work_id: &WorkId, acked: i64, wait: WaitForReplicas) -> Error {
    StoreError::new(
        KIND,
        format!(
            "only {acked} of the {} replicas asked for acknowledged the acquisition of {work_id:?} within {:?}: not granted",
            wait.replicas, wait.timeout
        ),
    )
    .into()
}
