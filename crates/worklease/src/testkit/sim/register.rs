//! Faults of the register underneath the register adapter: delays that make
//! adapters (processes) interleave between their read and their
//! compare-and-swap, and writes that fail or whose reply is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::Rng;

use crate::error::StoreError;
use crate::limits::WorkId;
use crate::store::register::{Handle, MemoryRegister, Register, RegisterError};

use super::config::RegisterFaults;
use super::history::{FaultKind, World};

/// One adapter's (one process's) view of the shared register, with faults
/// from a seeded stream of its own.
pub(crate) struct SimRegister {
    inner: Arc<MemoryRegister>,
    world: Arc<World>,
    faults: RegisterFaults,
    rng: Mutex<StdRng>,
}

impl SimRegister {
    pub fn new(
        inner: Arc<MemoryRegister>,
        world: Arc<World>,
        faults: RegisterFaults,
        rng: StdRng,
    ) -> Self {
        Self {
            inner,
            world,
            faults,
            rng: Mutex::new(rng),
        }
    }

    fn rng(&self) -> std::sync::MutexGuard<'_, StdRng> {
        self.rng.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn pause(&self, d: Duration, kind: FaultKind) {
        if d > Duration::ZERO {
            self.world.fault(kind);
            tokio::time::sleep(d).await;
        }
    }

    fn error(what: &str) -> RegisterError {
        StoreError::new("memory-register", format!("simulated fault: {what}")).into()
    }
}

#[async_trait]
impl Register for SimRegister {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let (before, after) = {
            let mut rng = self.rng();
            let before = self.faults.read_delay.draw(&mut rng);
            let after = self.faults.read_delay.draw(&mut rng);
            (before, after)
        };
        self.pause(before, FaultKind::RegisterReadDelay).await;
        let r = self.inner.read(key).await;
        self.pause(after, FaultKind::RegisterReadDelay).await;
        r
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        let (delay, fail, lose) = {
            let mut rng = self.rng();
            let delay = self.faults.write_delay.draw(&mut rng);
            let fail = rng.gen::<f64>() < self.faults.write_error;
            let lose = rng.gen::<f64>() < self.faults.write_lost_reply;
            (delay, fail, lose)
        };
        self.pause(delay, FaultKind::RegisterWriteDelay).await;
        if fail {
            self.world.fault(FaultKind::RegisterWriteError);
            return Err(Self::error("write failed before taking effect"));
        }
        let r = self.inner.write(key, previous, value).await;
        if lose && r.is_ok() {
            self.world.fault(FaultKind::RegisterLostReply);
            return Err(Self::error("write took effect but its reply was lost"));
        }
        r
    }

    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.inner.delete(key, handle).await
    }

    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.inner.list().await
    }

    /// With a read's delays, so that a floor read can fall between a
    /// collector's raise and its delete.
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        let before = self.faults.read_delay.draw(&mut self.rng());
        self.pause(before, FaultKind::RegisterReadDelay).await;
        self.inner.fencing_floor(key).await
    }

    async fn raise_fencing_floor(
        &self,
        key: &WorkId,
        fencing_token: u64,
    ) -> Result<bool, RegisterError> {
        let delay = self.faults.write_delay.draw(&mut self.rng());
        self.pause(delay, FaultKind::RegisterWriteDelay).await;
        self.inner.raise_fencing_floor(key, fencing_token).await
    }
}
