//! Property tests of the lease rules (issue 23): invariants over any
//! sequence of operations, which example-based tests and a fuzzer cannot
//! state. Run on the in-memory store with a paused clock, so that expiry
//! is part of the sequences; the conformance suite runs the same rules on
//! every store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use worklease::store::memory::MemoryStore;
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, Token, WorkId};

#[derive(Debug, Clone)]
enum Op {
    /// Holder `h` tries to acquire work ID `w`.
    Acquire {
        h: usize,
        w: usize,
    },
    /// Holder `h` renews, checkpoints or releases the last lease it got on
    /// `w` (stale or not).
    Renew {
        h: usize,
        w: usize,
    },
    Release {
        h: usize,
        w: usize,
    },
    /// An operator revokes `w`.
    Revoke {
        w: usize,
    },
    /// Time passes, in milliseconds (the TTL is 100 ms).
    Pass {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..2usize).prop_map(|(h, w)| Op::Acquire { h, w }),
        2 => (0..3usize, 0..2usize).prop_map(|(h, w)| Op::Renew { h, w }),
        2 => (0..3usize, 0..2usize).prop_map(|(h, w)| Op::Release { h, w }),
        1 => (0..2usize).prop_map(|w| Op::Revoke { w }),
        2 => (0..150u64).prop_map(|ms| Op::Pass { ms }),
    ]
}

const TTL: Duration = Duration::from_millis(100);

/// Runs `ops` and checks, after every step: fencing tokens of a work ID
/// only go up (S2: every grant is larger than every earlier one); a grant
/// is refused while another holder's lease is live by its deadline (S1);
/// a stale token's renewal or release fails with `Fenced` or `Expired`
/// (S3) and never succeeds.
async fn check(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = Arc::new(MemoryStore::new());
    let holders: Vec<Leases> = (0..3)
        .map(|i| {
            let config = Config::new(format!("h{i}"), TTL).safety_margin(Duration::ZERO);
            Leases::new(store.clone(), config).expect("valid config")
        })
        .collect();
    let work = ["w0", "w1"];
    // The highest fencing token granted per work ID.
    let mut highest: HashMap<usize, u64> = HashMap::new();
    // The current acquisition per work ID (holder, token) until it is
    // released or revoked, and the last token each holder got.
    let mut current: HashMap<usize, (usize, Token)> = HashMap::new();
    let mut tokens: HashMap<(usize, usize), Token> = HashMap::new();
    let is_current = |current: &HashMap<usize, (usize, Token)>, w: usize, t: &Token| {
        current
            .get(&w)
            .is_some_and(|(_, c)| c.fencing_token() == t.fencing_token())
    };
    for op in ops {
        match op {
            Op::Acquire { h, w } => {
                let live_other = current
                    .get(&w)
                    .is_some_and(|(oh, t)| *oh != h && t.remaining().is_some_and(|r| !r.is_zero()));
                match holders[h].acquire(work[w], AcquireOptions::new()).await {
                    Ok(t) => {
                        prop_assert!(
                            !live_other,
                            "S1: {} granted to h{} while another holder's lease was live",
                            work[w],
                            h
                        );
                        let before = highest.get(&w).copied().unwrap_or(0);
                        prop_assert!(
                            t.fencing_token() > before,
                            "S2: token {} after {}",
                            t.fencing_token(),
                            before
                        );
                        highest.insert(w, t.fencing_token());
                        current.insert(w, (h, t.clone()));
                        tokens.insert((h, w), t);
                    }
                    Err(Error::Held { .. }) => {}
                    Err(e) => prop_assert!(false, "acquire: {e}"),
                }
            }
            Op::Renew { h, w } => {
                let Some(t) = tokens.get(&(h, w)).cloned() else {
                    continue;
                };
                match holders[h].renew(&t).await {
                    Ok(t2) => {
                        prop_assert!(
                            is_current(&current, w, &t),
                            "S3: a stale token (h{}, {}) was renewed",
                            h,
                            t.fencing_token()
                        );
                        prop_assert_eq!(t2.fencing_token(), t.fencing_token());
                        current.insert(w, (h, t2.clone()));
                        tokens.insert((h, w), t2);
                    }
                    Err(Error::Fenced { .. } | Error::Expired { .. }) => {}
                    Err(e) => prop_assert!(false, "renew: {e}"),
                }
            }
            Op::Release { h, w } => {
                let Some(t) = tokens.get(&(h, w)).cloned() else {
                    continue;
                };
                match holders[h].release(t.clone()).await {
                    Ok(()) => {
                        prop_assert!(
                            is_current(&current, w, &t),
                            "S3: a stale token (h{}, {}) was released",
                            h,
                            t.fencing_token()
                        );
                        current.remove(&w);
                    }
                    Err(Error::Fenced { .. } | Error::Expired { .. }) => {}
                    Err(e) => prop_assert!(false, "release: {e}"),
                }
            }
            Op::Revoke { w } => {
                let id = WorkId::new(work[w]).expect("valid");
                store.revoke(&id).await.expect("revoke");
                current.remove(&w);
            }
            Op::Pass { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn fencing_tokens_only_go_up_and_stale_tokens_never_win(ops in proptest::collection::vec(op(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(check(ops))?;
    }
}
