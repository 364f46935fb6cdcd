//! worklease's fault simulation on the example's `TableStore`: many
//! holders through fault-injecting links (delays, lost replies, outages,
//! frozen holders, clock drift) on a paused clock, checked against S1–S5.
//! `WORKLEASE_SIM_SEEDS=N` runs more seeds; a failure prints the seed to
//! replay with `WORKLEASE_SIM_SEED=S`.

use std::sync::Arc;

use worklease::sim::{self, Backend, Campaign, StoreFactory};
use worklease::LeaseStore;
use worklease_example_store::TableStore;

#[test]
fn the_table_store_keeps_the_contract_under_faults() {
    let backend = Backend::Custom {
        name: "example-table",
        open: StoreFactory(Arc::new(|| {
            vec![Arc::new(TableStore::new()) as Arc<dyn LeaseStore>]
        })),
    };
    let report = Campaign::new(backend, sim::seeds_from_env(200)).run();
    println!("{report}");
    assert!(report.failures.is_empty(), "{report}");
}
