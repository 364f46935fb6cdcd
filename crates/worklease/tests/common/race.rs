//! A race of many clients for one free lease, which exactly one must win
//! (`tests/object_store.rs`, `tests/azure_blob.rs`, `tests/dynamodb.rs`:
//! stores that decide by a conditional write).

use worklease::{AcquireOptions, Error, Leases, Token};

/// Every one of `clients` tries to acquire `work` at once: exactly one
/// wins, every other one is told `Held`. Returns the winner's index and
/// token; `round` names the race in failures.
pub(crate) async fn one_winner(clients: &[Leases], work: &str, round: &str) -> (usize, Token) {
    let results = futures_util::future::join_all(
        clients
            .iter()
            .map(|l| l.acquire(work, AcquireOptions::new())),
    )
    .await;
    let mut winners = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(t) => winners.push((i, t)),
            Err(Error::Held { .. }) => {}
            Err(e) => panic!("{round}: racer {i} failed otherwise than Held: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "{round}: winners {winners:?}");
    winners.pop().expect("one winner")
}
