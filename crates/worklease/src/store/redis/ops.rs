//! The store's operations ([`LeaseStore`] for [`RedisStore`]): each one
//! script call on the lease's keys (a batch: one call per hash slot, its
//! script calls in `batch.rs`), and `inspect` over a `SCAN` of the state
//! keys.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::error::Result;
use crate::limits::{ceil_millis, HolderId, WorkId};
use crate::store::{Checkpoint, Grant, Handoff, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint};

use super::acquire::Replies;
use super::batch::{missing, slot_of};
use super::conn::Conn;
use super::keys;
use super::reply::{bad_reply, int, lease_info, opt_bytes, previous, store_err, text};
use super::scripts::{lease_outcome, SCRIPTS};
use super::{RedisStore, KIND, MAX_BATCH};

/// How many keys one `SCAN` step asks for when listing every lease.
const SCAN_COUNT: usize = 1000;

impl RedisStore {
    async fn inspect_one(&self, work_id: WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.lease_keys(&work_id);
        let mut inv = SCRIPTS.inspect.prepare_invoke();
        inv.key(&keys.state).key(&keys.live).key(&keys.checkpoint);
        let reply = self.run(&inv, "inspect").await?;
        match text(reply.first(), "status")?.as_str() {
            "none" => Ok(None),
            "ok" => Ok(Some(lease_info(work_id, reply.get(1))?)),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    /// Every work ID with a state hash under the prefix (on a Cluster: on
    /// every primary).
    async fn scan_work_ids(&self) -> Result<BTreeSet<WorkId>> {
        let conn = self.connections().await?.main.clone();
        let mut ids = BTreeSet::new();
        match conn {
            Conn::One(mut c) => self.scan_node(&mut c, None, &mut ids).await?,
            Conn::Cluster(mut c) => {
                for (host, port) in primaries(&mut c).await? {
                    let node = SingleNodeRoutingInfo::ByAddress { host, port };
                    self.scan_node(&mut c, Some(node), &mut ids).await?;
                }
            }
        }
        Ok(ids)
    }

    /// `SCAN`s one server (a Cluster node: `node`) for state keys under
    /// the prefix, adding their work IDs to `ids`.
    async fn scan_node(
        &self,
        conn: &mut (impl ConnectionLike + ClusterRoute),
        node: Option<SingleNodeRoutingInfo>,
        ids: &mut BTreeSet<WorkId>,
    ) -> Result<()> {
        let pattern = keys::state_pattern(&self.config.prefix);
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let reply = conn
                .run_on(cmd, node.clone())
                .await
                .map_err(|e| store_err("cannot list the leases (SCAN)", e))?;
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                .map_err(|e| store_err("cannot list the leases (SCAN)", e.into()))?;
            ids.extend(
                keys.iter()
                    .filter_map(|k| keys::work_id_of_state_key(&self.config.prefix, k)),
            );
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// A command sent to one chosen node (a Cluster) or the connection's
/// server.
trait ClusterRoute {
    /// Runs `cmd` on `node`, or where the connection sends it.
    fn run_on(
        &mut self,
        cmd: redis::Cmd,
        node: Option<SingleNodeRoutingInfo>,
    ) -> BoxFuture<'_, redis::RedisResult<Value>>;
}

impl ClusterRoute for redis::aio::ConnectionManager {
    fn run_on(
        &mut self,
        cmd: redis::Cmd,
        _node: Option<SingleNodeRoutingInfo>,
    ) -> BoxFuture<'_, redis::RedisResult<Value>> {
        Box::pin(async move { cmd.query_async(self).await })
    }
}

impl ClusterRoute for redis::cluster_async::ClusterConnection {
    fn run_on(
        &mut self,
        cmd: redis::Cmd,
        node: Option<SingleNodeRoutingInfo>,
    ) -> BoxFuture<'_, redis::RedisResult<Value>> {
        let routing = RoutingInfo::SingleNode(node.unwrap_or(SingleNodeRoutingInfo::Random));
        Box::pin(async move { self.route_command(cmd, routing).await })
    }
}

/// `host:port` of every primary of the Cluster (`CLUSTER SLOTS`).
async fn primaries(
    conn: &mut redis::cluster_async::ClusterConnection,
) -> Result<BTreeSet<(String, u16)>> {
    let slots: Vec<Vec<Value>> = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .and_then(|v| redis::from_redis_value(v).map_err(Into::into))
        .map_err(|e| store_err("cannot list the Cluster's primaries", e))?;
    let mut out = BTreeSet::new();
    for range in slots {
        if let Some(Value::Array(node)) = range.get(2) {
            let host = text(node.first(), "host")?;
            let port =
                u16::try_from(int(node.get(1), "port")?).map_err(|_| bad_reply("a node's port"))?;
            out.insert((host, port));
        }
    }
    Ok(out)
}

#[async_trait]
impl LeaseStore for RedisStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.acquire.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.fence)
            .arg(holder_id.as_str())
            .arg(ceil_millis(ttl));
        let ids = std::slice::from_ref(work_id);
        self.acquisitions(&inv, "acquire", Replies::One, ids, holder_id, ttl)
            .await?
            .pop()
            .unwrap_or_else(|| Err(bad_reply("no reply to an acquisition")))
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.renew.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(ceil_millis(ttl));
        self.run_on_lease(lease, &inv, "renew").await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.checkpoint.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(ceil_millis(ttl))
            .arg(data.as_ref());
        self.run_on_lease(lease, &inv, "checkpoint").await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.read.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token);
        let reply = lease_outcome(lease, self.run(&inv, "read checkpoint").await?)?;
        Ok(Checkpoint {
            data: opt_bytes(reply.first(), "checkpoint")?.map(Bytes::copy_from_slice),
            handoff: Handoff {
                previous: previous(reply.get(1..4).unwrap_or(&[]))?,
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.release.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(self.channel())
            .arg(lease.work_id.as_str());
        self.run_on_lease(lease, &inv, "release").await?;
        Ok(())
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    /// `renew_many`: one call per hash slot on a Cluster, else one call.
    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let Some(groups) = self.slot_groups(leases) else {
            return self.renew_slot(leases, ttl).await;
        };
        let mut out: Vec<Option<Result<SystemTime>>> = leases.iter().map(|_| None).collect();
        for group in groups {
            let part: Vec<LeaseRef> = group.iter().map(|&i| leases[i]).collect();
            for (i, r) in group.into_iter().zip(self.renew_slot(&part, ttl).await?) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().map(missing).collect())
    }

    /// `acquire_many` on a Cluster: one call per run of consecutive work
    /// IDs in one hash slot (a script names keys of one slot only), in
    /// order, each with the grants still wanted; elsewhere one call.
    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        if work_ids.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        if !self.is_cluster() {
            return self.acquire_slot(work_ids, holder_id, ttl, max).await;
        }
        let mut out = Vec::new();
        let mut granted = 0;
        let mut start = 0;
        while start < work_ids.len() && granted < max {
            let slot = slot_of(&work_ids[start]);
            let end = (start..work_ids.len())
                .find(|&i| slot_of(&work_ids[i]) != slot)
                .unwrap_or(work_ids.len());
            let part = self
                .acquire_slot(&work_ids[start..end], holder_id, ttl, max - granted)
                .await?;
            granted += part.iter().filter(|r| r.is_ok()).count();
            out.extend(part);
            start = end;
        }
        Ok(out)
    }

    /// `release_many`: one call per hash slot on a Cluster, else one call.
    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let Some(groups) = self.slot_groups(leases) else {
            return self.release_slot(leases).await;
        };
        let mut out: Vec<Option<Result<()>>> = leases.iter().map(|_| None).collect();
        for group in groups {
            let part: Vec<LeaseRef> = group.iter().map(|&i| leases[i]).collect();
            for (i, r) in group.into_iter().zip(self.release_slot(&part).await?) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().map(missing).collect())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        crate::store::inspect_each(work_ids, self.scan_work_ids(), |id| self.inspect_one(id)).await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.revoke.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(self.channel())
            .arg(work_id.as_str());
        let reply = self.run_write(&inv, "revoke").await?;
        match text(reply.first(), "status")?.as_str() {
            "none" => Ok(None),
            "ok" => Ok(Some(lease_info(work_id.clone(), reply.get(1))?)),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.inspect_checkpoint.prepare_invoke();
        inv.key(&keys.state).key(&keys.live).key(&keys.checkpoint);
        let reply = self.run(&inv, "inspect_checkpoint").await?;
        match text(reply.first(), "status")?.as_str() {
            "none" => Ok(None),
            "ok" => Ok(Some(StoredCheckpoint {
                lease: lease_info(work_id.clone(), reply.get(1))?,
                data: opt_bytes(reply.get(2), "checkpoint")?.map(Bytes::copy_from_slice),
            })),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    /// One script: deletes the state and checkpoint keys of an ended lease
    /// whose token is `fencing_token`; the work ID's fencing counter stays
    /// as its floor (a Redis Cluster script cannot reach a store-wide key
    /// in another slot).
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.delete_ended.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .key(&keys.fence)
            .arg(fencing_token.to_string());
        let reply = self.run_write(&inv, "delete_ended").await?;
        match text(reply.first(), "status")?.as_str() {
            "deleted" => Ok(true),
            "kept" => Ok(false),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    /// Registers the waiter, then starts the subscription if this is the
    /// store's first waiter. The subscription is confirmed before the
    /// store's next acquisition attempt runs (see `first_subscription`),
    /// which is what a waiter does after `watch`: a release after that
    /// attempt is announced to it, one before it is seen by the attempt.
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let one = self.wakeups.watchers.watch(work_id)?;
        if !self.start_subscriber() {
            return None;
        }
        let mut all = self.wakeups.resubscribed.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                () = one => {}
                // An error means the store is gone: nothing more will change.
                _ = all.changed() => {}
            }
        }))
    }
}
