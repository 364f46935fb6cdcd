//! worklease's shared conformance suite on the two example stores, as a
//! third-party store's own test file runs it: one `#[tokio::test]` per
//! check, on a paused tokio clock (both stores judge time by tokio's
//! clock; a store on a real server would say `paused = false`).

use std::sync::Arc;

use worklease::conformance::Suite;
use worklease::store::register::RegisterStore;
use worklease_example_store::{TableStore, VersionedRegister};

worklease::conformance_tests!(table_store, paused = true, async {
    Suite::new(Arc::new(TableStore::new()))
});

worklease::conformance_tests!(versioned_register, paused = true, async {
    Suite::new(Arc::new(RegisterStore::new(VersionedRegister::new())))
});
