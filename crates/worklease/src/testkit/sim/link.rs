//! The seeded fault-injecting decorator: one per holder, between its
//! `Leases` handle and the store, as the network between a process and its
//! store. It records every call in the run's history.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{
    Checkpoint, ExpiryClock, Grant, LeaseInfo, LeaseRef, LeaseStore, OwnedLease, StoredCheckpoint,
};

use super::config::{whole_ms, FaultConfig};
use super::history::{Applied, Delivery, FaultKind, OpKind, Outcome, World};

/// A reply the link records and whose wall-clock expiry a wall-clock step
/// moves.
pub(crate) trait Reply: Send + 'static {
    fn note(&self, _applied: &mut Applied) {}
    fn shift_wall(&mut self, _offset_ms: i64) {}
}

fn shift(t: &mut SystemTime, offset_ms: i64) {
    let d = Duration::from_millis(offset_ms.unsigned_abs());
    let moved = if offset_ms >= 0 {
        t.checked_add(d)
    } else {
        t.checked_sub(d)
    };
    if let Some(m) = moved {
        *t = m;
    }
}

impl Reply for Grant {
    fn note(&self, applied: &mut Applied) {
        applied.grant = Some((self.fencing_token, self.handoff.clone()));
    }
    fn shift_wall(&mut self, offset_ms: i64) {
        shift(&mut self.expires_at, offset_ms);
    }
}

impl Reply for SystemTime {
    fn shift_wall(&mut self, offset_ms: i64) {
        shift(self, offset_ms);
    }
}

impl Reply for Checkpoint {
    fn note(&self, applied: &mut Applied) {
        applied.read = Some(self.clone());
    }
}

impl Reply for () {}

/// The faults of one call, all drawn when it is sent. The number of values
/// drawn never depends on the outcome, so one decision never shifts the
/// others of the seed.
struct Plan {
    delay_before: Duration,
    delay_after: Duration,
    error_before: bool,
    lost_reply: bool,
}

/// What the network made of a request.
enum Net<T> {
    Refused,
    Failed,
    Reply(Result<T>),
}

/// Marks the call abandoned if the caller drops its future first.
struct Abandon<'a> {
    world: &'a World,
    id: usize,
    done: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.done {
            let at = self.world.stamp();
            self.world.op(self.id, |op| {
                op.delivery = Delivery::Abandoned;
                op.completed = Some(at);
            });
        }
    }
}

/// One holder's link to the store. Once sent, a request is in the
/// network: it reaches the store (or not) whatever its caller does, as a
/// request on a socket does; the caller can only stop waiting for the reply.
pub(crate) struct SimStore {
    inner: Arc<dyn LeaseStore>,
    holder: usize,
    world: Arc<World>,
    faults: FaultConfig,
    rng: Mutex<StdRng>,
    wall_rng: Mutex<StdRng>,
    wall_offset_ms: Mutex<i64>,
}

impl SimStore {
    pub fn new(
        inner: Arc<dyn LeaseStore>,
        holder: usize,
        world: Arc<World>,
        faults: FaultConfig,
        rng: StdRng,
        wall_rng: StdRng,
    ) -> Self {
        Self {
            inner,
            holder,
            world,
            faults,
            rng: Mutex::new(rng),
            wall_rng: Mutex::new(wall_rng),
            wall_offset_ms: Mutex::new(0),
        }
    }

    fn plan(&self) -> Plan {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let f = &self.faults;
        let delay_before = f.delay_before.draw(&mut rng);
        let delay_after = f.delay_after.draw(&mut rng);
        let error_before = rng.gen::<f64>() < f.error_before;
        let lost_reply = rng.gen::<f64>() < f.lost_reply;
        Plan {
            delay_before,
            delay_after,
            error_before,
            lost_reply,
        }
    }

    /// The wall-clock offset for the next reply: steps forward or back at
    /// random, from a stream of its own (turning steps on or off changes no
    /// other decision of the seed).
    fn wall_offset(&self) -> i64 {
        let mut rng = self.wall_rng.lock().unwrap_or_else(|p| p.into_inner());
        let (hit, size, back) = (rng.gen::<f64>(), rng.gen::<f64>(), rng.gen_bool(0.5));
        let mut offset = self
            .wall_offset_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if hit < self.faults.wall_step {
            let step = (self.faults.wall_step_max.as_millis() as f64 * size) as i64 + 1;
            *offset += if back { -step } else { step };
            self.world.fault(FaultKind::WallStep);
        }
        *offset
    }

    fn error(&self, what: &str) -> crate::Error {
        StoreError::new(self.inner.kind(), format!("simulated fault: {what}")).into()
    }

    async fn call<T: Reply>(
        &self,
        kind: OpKind,
        work_id: &WorkId,
        token: Option<u64>,
        data: Option<Bytes>,
        request: BoxFuture<'static, Result<T>>,
    ) -> Result<T> {
        let world = &self.world;
        let id = world.invoke(self.holder, kind, work_id.as_str(), token, data);
        let mut guard = Abandon {
            world,
            id,
            done: false,
        };
        // A frozen process sends nothing.
        world.thawed(self.holder).await;
        let plan = self.plan();
        let sent = Instant::now();
        if plan.delay_before > Duration::ZERO {
            world.op_fault(id, FaultKind::DelayBefore);
        }
        let net = {
            let world = world.clone();
            let flight = world.in_flight();
            let delay = plan.delay_before;
            let error_before = plan.error_before;
            tokio::spawn(async move {
                let _flight = flight;
                if delay > Duration::ZERO {
                    tokio::time::sleep(delay).await;
                }
                if world.unreachable_now() {
                    world.op_fault(id, FaultKind::Unreachable);
                    return Net::Refused;
                }
                if error_before {
                    world.op_fault(id, FaultKind::ErrorBefore);
                    return Net::Failed;
                }
                let start = world.stamp();
                world.op(id, |op| {
                    op.applied = Some(Applied {
                        start,
                        end: None,
                        outcome: None,
                        grant: None,
                        read: None,
                    })
                });
                let r = if world.stop_the_world {
                    stop_the_world(request)
                } else {
                    request.await
                };
                let end = world.stamp();
                world.op(id, |op| {
                    if let Some(a) = op.applied.as_mut() {
                        a.end = Some(end);
                        a.outcome = Some(Outcome::of(&r));
                        if let Ok(v) = &r {
                            v.note(a);
                        }
                    }
                });
                Net::Reply(r)
            })
        };
        let net = match net.await {
            Ok(net) => net,
            Err(e) => {
                world.note(format!("op #{id}: the network task failed: {e}"));
                Net::Failed
            }
        };
        let (delivery, result) = match net {
            Net::Refused => (
                Delivery::Refused,
                Err(self.error("store unreachable (connection refused)")),
            ),
            Net::Failed => (
                Delivery::Reply(Outcome::Store),
                Err(self.error("request failed before reaching the store")),
            ),
            Net::Reply(_) if plan.lost_reply => {
                world.op_fault(id, FaultKind::LostReply);
                tokio::time::sleep_until(sent + self.faults.reply_timeout).await;
                (
                    Delivery::LostReply,
                    Err(self.error("reply lost after the store applied the request: timed out")),
                )
            }
            Net::Reply(mut r) => {
                if plan.delay_after > Duration::ZERO {
                    world.op_fault(id, FaultKind::DelayAfter);
                    tokio::time::sleep(whole_ms(plan.delay_after)).await;
                }
                if let Ok(v) = &mut r {
                    v.shift_wall(self.wall_offset());
                }
                (Delivery::Reply(Outcome::of(&r)), r)
            }
        };
        // A frozen process handles no reply.
        world.thawed(self.holder).await;
        let at = world.stamp();
        world.op(id, |op| {
            op.delivery = delivery;
            op.completed = Some(at);
        });
        guard.done = true;
        result
    }
}

/// Runs `request` to completion on this thread, parking it while the
/// request waits: no other task of the (current-thread) runtime runs, and
/// simulated time stands still, until it returns. For stores whose calls
/// run on blocking threads (SQLite): their completion would otherwise be
/// noticed at a point among the tasks of the same instant that depends on
/// the host's thread timing. Unconstrained, so that tokio's cooperative
/// budget never answers `Pending` to a poll that nobody would retry.
fn stop_the_world<T>(request: BoxFuture<'static, T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut request = std::pin::pin!(tokio::task::unconstrained(request));
    loop {
        if let std::task::Poll::Ready(v) = request.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[async_trait]
impl LeaseStore for SimStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let (s, w, h) = (self.inner.clone(), work_id.clone(), holder_id.clone());
        let request = Box::pin(async move { s.acquire(&w, &h, ttl).await });
        self.call(OpKind::Acquire, work_id, None, None, request)
            .await
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let (s, l) = (self.inner.clone(), OwnedLease::of(lease));
        let request = Box::pin(async move { s.renew(l.lease(), ttl).await });
        self.call(
            OpKind::Renew,
            lease.work_id,
            Some(lease.fencing_token),
            None,
            request,
        )
        .await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let (s, l, d) = (self.inner.clone(), OwnedLease::of(lease), data.clone());
        let request = Box::pin(async move { s.checkpoint(l.lease(), ttl, d).await });
        self.call(
            OpKind::Checkpoint,
            lease.work_id,
            Some(lease.fencing_token),
            Some(data),
            request,
        )
        .await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let (s, l) = (self.inner.clone(), OwnedLease::of(lease));
        let request = Box::pin(async move { s.read_checkpoint(l.lease()).await });
        self.call(
            OpKind::ReadCheckpoint,
            lease.work_id,
            Some(lease.fencing_token),
            None,
            request,
        )
        .await
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let (s, l) = (self.inner.clone(), OwnedLease::of(lease));
        let request = Box::pin(async move { s.release(l.lease()).await });
        self.call(
            OpKind::Release,
            lease.work_id,
            Some(lease.fencing_token),
            None,
            request,
        )
        .await
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        self.inner.inspect(work_ids).await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        self.inner.revoke(work_id).await
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        self.inner.inspect_checkpoint(work_id).await
    }

    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        self.inner.delete_ended(work_id, fencing_token).await
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.inner.watch(work_id)
    }

    fn expiry_clock(&self) -> ExpiryClock {
        self.inner.expiry_clock()
    }
}
