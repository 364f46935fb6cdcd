//! The shared conformance suite on every store that needs no server.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use worklease::conformance::Suite;
use worklease::store::memory::MemoryStore;
use worklease::store::register::{Handle, MemoryRegister, Register, RegisterError, RegisterStore};
use worklease::store::sqlite::{SqliteStore, TokioClock};
use worklease::WorkId;

worklease::conformance_tests!(memory, paused = true, async {
    Suite::new(Arc::new(MemoryStore::new()))
});

worklease::conformance_tests!(sqlite, paused = true, async {
    // One file per test; the directory lives as long as the process (tests
    // are short), and the store judges time by the paused tokio clock.
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let store = SqliteStore::open_with_clock(dir.join("leases.db"), Arc::new(TokioClock::new()))
        .expect("open");
    Suite::new(Arc::new(store))
});

worklease::conformance_tests!(register, paused = true, async {
    Suite::new(Arc::new(RegisterStore::new(MemoryRegister::new())))
});

/// A register whose read answers take 5 ms to come back (a remote
/// register's latency): reads of one adapter overlap its own writes, so
/// answers older than what the adapter already saw are ordinary and must
/// be read again, not fail the call (a new-user review found
/// `batch_acquisition_races_single` failing every time with this delay).
struct SlowReads(MemoryRegister);

#[async_trait::async_trait]
impl Register for SlowReads {
    fn kind(&self) -> &'static str {
        "slow-reads"
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let answer = self.0.read(key).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        answer
    }
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        self.0.write(key, previous, value).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.0.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.0.list().await
    }
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        self.0.fencing_floor(key).await
    }
    async fn raise_fencing_floor(&self, key: &WorkId, token: u64) -> Result<bool, RegisterError> {
        self.0.raise_fencing_floor(key, token).await
    }
}

worklease::conformance_tests!(register_slow_reads, paused = true, async {
    Suite::new(Arc::new(RegisterStore::new(SlowReads(
        MemoryRegister::new(),
    ))))
});
