//! The shared conformance suite on every store that needs no server.

use std::sync::Arc;

use worklease::conformance::Suite;
use worklease::store::memory::MemoryStore;
use worklease::store::register::{MemoryRegister, RegisterStore};
use worklease::store::sqlite::{SqliteStore, TokioClock};

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
