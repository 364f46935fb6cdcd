//! The runner, typed checkpoints and the one-call leader, on the in-memory
//! and SQLite stores, on a paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use worklease::leader::{elect, LeaderConfig};
use worklease::runner::{RunError, Runner};
use worklease::store::fault::FaultStore;
use worklease::store::memory::MemoryStore;
use worklease::store::sqlite::{SqliteStore, TokioClock};
use worklease::{
    typed, AcquireOptions, Config, Error, LeaseEnd, LeaseStore, Leases, RenewalOptions, WorkId,
};

const TTL: Duration = Duration::from_secs(9);

/// Both stores, each behind a [`FaultStore`]; SQLite judges time by the
/// paused tokio clock.
fn stores() -> Vec<(&'static str, Arc<FaultStore>)> {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let sqlite = SqliteStore::open_with_clock(dir.join("leases.db"), Arc::new(TokioClock::new()))
        .expect("open");
    vec![
        (
            "memory",
            Arc::new(FaultStore::new(Arc::new(MemoryStore::new()))),
        ),
        ("sqlite", Arc::new(FaultStore::new(Arc::new(sqlite)))),
    ]
}

fn leases(store: &Arc<FaultStore>, holder: &str) -> Leases {
    Leases::new(store.clone(), Config::new(holder, TTL)).unwrap()
}

async fn ended(store: &Arc<FaultStore>, work_id: &str) -> Option<LeaseEnd> {
    let info = store
        .inspect(&[WorkId::new(work_id).unwrap()])
        .await
        .unwrap();
    info[0].ended
}

type Out = Result<(), RunError<String>>;

#[tokio::test(start_paused = true)]
async fn first_run_then_resume_after_release_is_clean() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let r: Out = runner
            .run("w", |ctx| async move {
                assert!(ctx.prior().data.is_none(), "{name}");
                assert!(ctx.prior().handoff.previous.is_none(), "{name}");
                assert!(!ctx.prior().clean_handoff(), "{name}");
                assert_eq!(ctx.fencing_token(), 1);
                Ok(Some(Bytes::from_static(b"1")))
            })
            .await;
        r.unwrap();
        assert_eq!(ended(&store, "w").await, Some(LeaseEnd::Released), "{name}");
        let runner = Runner::new(leases(&store, "b"));
        let r: Out = runner
            .run("w", |ctx| async move {
                assert_eq!(ctx.prior().data.as_deref(), Some(&b"1"[..]), "{name}");
                assert!(ctx.prior().clean_handoff(), "{name}");
                assert_eq!(ctx.fencing_token(), 2);
                Ok(None) // keeps the checkpoint
            })
            .await;
        r.unwrap();
        let t = leases(&store, "c")
            .acquire("w", AcquireOptions::new())
            .await
            .unwrap();
        let cp = leases(&store, "c").read_checkpoint(&t).await.unwrap();
        assert_eq!(cp.data.as_deref(), Some(&b"1"[..]), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn resume_after_a_crash_is_not_clean() {
    for (name, store) in stores() {
        let crashed = leases(&store, "crashed");
        let t = crashed.acquire("w", AcquireOptions::new()).await.unwrap();
        crashed.checkpoint(&t, &b"5"[..]).await.unwrap();
        // The holder dies: no release; a waiting runner gets the lease
        // after the TTL.
        let runner = Runner::new(leases(&store, "b"))
            .acquire_options(AcquireOptions::new().wait_for_lease());
        let start = Instant::now();
        let r: Out = runner
            .run("w", |ctx| async move {
                assert_eq!(ctx.prior().data.as_deref(), Some(&b"5"[..]), "{name}");
                assert!(!ctx.prior().clean_handoff(), "{name}");
                let prev = ctx.prior().handoff.previous.clone().unwrap();
                assert_eq!(prev.ended, LeaseEnd::Expired, "{name}");
                assert_eq!(prev.holder_id, "crashed");
                Ok(Some(Bytes::from_static(b"6")))
            })
            .await;
        r.unwrap();
        assert!(start.elapsed() >= TTL, "{name}: waited for the expiry");
    }
}

#[tokio::test(start_paused = true)]
async fn fenced_mid_work_returns_fenced_without_releasing() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let s = store.clone();
        let r: Out = runner
            .run("w", |ctx| async move {
                ctx.checkpoint(&b"half"[..]).await.unwrap();
                s.revoke(&WorkId::new("w").unwrap()).await.unwrap();
                ctx.cancelled().cancelled().await; // at the next renewal
                assert!(matches!(ctx.lost_cause(), Some(Error::Fenced { .. })));
                Ok(Some(Bytes::from_static(b"done")))
            })
            .await;
        let e = r.unwrap_err();
        assert!(
            matches!(e, RunError::Lease(Error::Fenced { .. })),
            "{name}: {e:?}"
        );
        assert!(e.is_lease_lost());
        // Neither the final checkpoint nor a release was written.
        assert_eq!(ended(&store, "w").await, Some(LeaseEnd::Revoked), "{name}");
        let b = leases(&store, "b");
        let t = b.acquire("w", AcquireOptions::new()).await.unwrap();
        let cp = b.read_checkpoint(&t).await.unwrap();
        assert_eq!(cp.data.as_deref(), Some(&b"half"[..]), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_ends_in_window_exhausted() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let s = store.clone();
        let start = Instant::now();
        let r: Out = runner
            .run("w", |ctx| async move {
                s.set_unreachable(true);
                ctx.cancelled().cancelled().await;
                Ok(Some(Bytes::from_static(b"never written")))
            })
            .await;
        let e = r.unwrap_err();
        assert!(
            matches!(e, RunError::Lease(Error::WindowExhausted { .. })),
            "{name}: {e:?}"
        );
        assert!(start.elapsed() < TTL, "{name}: lost before the TTL ran out");
        store.set_unreachable(false);
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_stops_renewal_and_does_not_release() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let task = tokio::spawn(async move {
            let r: Out = runner
                .run("w", |_ctx| async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    panic!("the work broke");
                })
                .await;
            r
        });
        let e = task.await.unwrap_err();
        assert!(e.is_panic(), "{name}: the panic reaches the caller");
        let calls = store.calls();
        // No renewal after the panic, and no release: a second holder waits
        // for the expiry.
        let b = leases(&store, "b");
        assert!(matches!(
            b.acquire("w", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ));
        tokio::time::sleep(TTL).await;
        assert_eq!(store.calls(), calls + 1, "{name}: only b's acquire");
        let t = b.acquire("w", AcquireOptions::new()).await.unwrap();
        let cp = b.read_checkpoint(&t).await.unwrap();
        assert_eq!(
            cp.handoff.previous.unwrap().ended,
            LeaseEnd::Expired,
            "{name}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_finish_completes_when_the_caller_is_dropped_after_the_work() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let s = store.clone();
        let task = tokio::spawn(async move {
            let r: Out = runner
                .run("w", |_ctx| async move {
                    // Slow final steps: each store call takes 1 s.
                    s.set_delay(Duration::from_secs(1));
                    let _ = done_tx.send(());
                    Ok(Some(Bytes::from_static(b"final")))
                })
                .await;
            r
        });
        done_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        task.abort(); // the caller shuts down mid-checkpoint
        assert!(task.await.unwrap_err().is_cancelled());
        tokio::time::sleep(Duration::from_secs(3)).await;
        store.set_delay(Duration::ZERO);
        assert_eq!(ended(&store, "w").await, Some(LeaseEnd::Released), "{name}");
        let b = leases(&store, "b");
        let t = b.acquire("w", AcquireOptions::new()).await.unwrap();
        let cp = b.read_checkpoint(&t).await.unwrap();
        assert_eq!(cp.data.as_deref(), Some(&b"final"[..]), "{name}");
        assert!(cp.clean_handoff());
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_caller_mid_work_releases_and_keeps_the_checkpoint() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let run = async move {
            let r: Out = runner
                .run("w", |ctx| async move {
                    ctx.checkpoint(&b"step 1"[..]).await.unwrap();
                    std::future::pending::<()>().await;
                    Ok(None)
                })
                .await;
            r
        };
        assert!(tokio::time::timeout(Duration::from_secs(1), run)
            .await
            .is_err());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(ended(&store, "w").await, Some(LeaseEnd::Released), "{name}");
        let b = leases(&store, "b");
        let t = b.acquire("w", AcquireOptions::new()).await.unwrap();
        let cp = b.read_checkpoint(&t).await.unwrap();
        assert_eq!(cp.data.as_deref(), Some(&b"step 1"[..]), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn work_errors_release_and_the_finish_is_bounded() {
    for (name, store) in stores() {
        let runner = Runner::new(leases(&store, "a"));
        let r: Out = runner
            .run("w", |_ctx| async move { Err("bad input".to_string()) })
            .await;
        assert!(
            matches!(r, Err(RunError::Work(ref e)) if e == "bad input"),
            "{name}"
        );
        assert_eq!(ended(&store, "w").await, Some(LeaseEnd::Released), "{name}");

        let runner = runner.finish_timeout(Duration::from_millis(500));
        let s = store.clone();
        let r: Out = runner
            .run("w", |_ctx| async move {
                s.set_delay(Duration::from_secs(2));
                Ok(Some(Bytes::from_static(b"late")))
            })
            .await;
        store.set_delay(Duration::ZERO);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, RunError::Lease(Error::Store(_))),
            "{name}: {e:?}"
        );
        assert!(e.to_string().contains("within 500ms"), "{name}: {e}");

        let bad = Runner::new(leases(&store, "a"))
            .renewal_options(RenewalOptions::new().interval(TTL))
            .run("w2", |_ctx| async move { Ok(None) })
            .await;
        let bad: Out = bad;
        assert!(matches!(bad, Err(RunError::Lease(Error::Invalid(_)))));
        let w2 = store.inspect(&[WorkId::new("w2").unwrap()]).await.unwrap();
        assert!(w2.is_empty(), "{name}: nothing was written");
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Progress {
    page: u64,
    done: Vec<String>,
}

#[tokio::test(start_paused = true)]
async fn typed_checkpoints_round_trip_and_name_what_failed_to_decode() {
    for (name, store) in stores() {
        let a = leases(&store, "a");
        let t = a.acquire("jobs/7", AcquireOptions::new()).await.unwrap();
        let none = typed::read_checkpoint::<Progress>(&a, &t).await.unwrap();
        assert_eq!(none.value, None, "{name}");
        let p = Progress {
            page: 3,
            done: vec!["x".into()],
        };
        let t = typed::checkpoint(&a, &t, &p).await.unwrap();
        let back = typed::read_checkpoint::<Progress>(&a, &t).await.unwrap();
        assert_eq!(back.value.as_ref(), Some(&p), "{name}");
        assert!(!back.clean_handoff());

        let t = a.checkpoint(&t, &b"page=3"[..]).await.unwrap();
        let e = typed::read_checkpoint::<Progress>(&a, &t)
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, typed::CheckpointError::Decode { .. }), "{e:?}");
        assert!(msg.contains("\"jobs/7\""), "{name}: {msg}");
        assert!(msg.contains("runner::Progress"), "{name}: {msg}");
        assert!(msg.contains("JSON"), "{name}: {msg}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_runner_state_can_be_typed() {
    let (_, store) = stores().remove(0);
    let runner = Runner::new(leases(&store, "a"));
    for expected in [0, 1] {
        let r: Result<(), RunError<typed::CheckpointError>> = runner
            .run("w", |ctx| async move {
                let prior = typed::decode_with::<_, Progress>(&typed::Json, "w", ctx.prior())?;
                let page = prior.value.map_or(0, |p| p.page);
                assert_eq!(page, expected);
                let next = Progress {
                    page: page + 1,
                    done: vec![],
                };
                Ok(Some(typed::encode_with(&typed::Json, "w", &next)?))
            })
            .await;
        r.unwrap();
    }
}

#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Log {
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn config(log: &Arc<Log>, backoff: Duration) -> LeaderConfig {
    let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
    LeaderConfig::new()
        .backoff(backoff)
        .on_elected(move |s| l1.push(format!("elected {}", s.generation)))
        .on_lost(move |s, e| {
            let kind = if matches!(e, Error::Fenced { .. }) {
                "fenced"
            } else {
                "other"
            };
            l2.push(format!("lost {} {kind}", s.generation))
        })
        .on_relinquished(move |s| l3.push(format!("relinquished {}", s.generation)))
}

#[tokio::test(start_paused = true)]
async fn the_leader_callbacks_fire_in_order() {
    for (name, store) in stores() {
        let log = Arc::new(Log::default());
        let backoff = Duration::from_secs(30);
        let a = leases(&store, "a");

        // A normal return: elected, the work, relinquished; released; no
        // back-off.
        let start = Instant::now();
        let l = log.clone();
        let r = elect(&a, "leader", config(&log, backoff), |ld| async move {
            l.push(format!("work {}", ld.generation()));
            Ok::<_, String>(ld.generation())
        })
        .await;
        assert_eq!(r.unwrap(), 1, "{name}");
        assert!(start.elapsed() < backoff);
        assert_eq!(log.take(), ["elected 1", "work 1", "relinquished 1"]);
        assert_eq!(ended(&store, "leader").await, Some(LeaseEnd::Released));

        // Fenced: elected, lost; no back-off.
        let start = Instant::now();
        let s = store.clone();
        let r = elect(&a, "leader", config(&log, backoff), |ld| async move {
            s.revoke(&WorkId::new("leader").unwrap()).await.unwrap();
            ld.lost().cancelled().await;
            Ok::<_, String>(())
        })
        .await;
        assert!(
            matches!(r, Err(RunError::Lease(Error::Fenced { .. }))),
            "{name}: {r:?}"
        );
        assert!(start.elapsed() < backoff);
        assert_eq!(log.take(), ["elected 2", "lost 2 fenced"]);

        // A work error: relinquished, released, then the back-off.
        let start = Instant::now();
        let r = elect(&a, "leader", config(&log, backoff), |_ld| async move {
            Err::<(), _>("broken".to_string())
        })
        .await;
        assert!(matches!(r, Err(RunError::Work(_))), "{name}: {r:?}");
        assert!(start.elapsed() >= backoff);
        assert_eq!(log.take(), ["elected 3", "relinquished 3"]);

        // Window exhausted: lost (not fenced), then the back-off.
        let start = Instant::now();
        let s = store.clone();
        let r = elect(&a, "leader", config(&log, backoff), |ld| async move {
            s.set_unreachable(true);
            ld.lost().cancelled().await;
            Ok::<_, String>(())
        })
        .await;
        store.set_unreachable(false);
        assert!(
            matches!(r, Err(RunError::Lease(Error::WindowExhausted { .. }))),
            "{name}: {r:?}"
        );
        assert!(start.elapsed() >= backoff);
        assert_eq!(log.take(), ["elected 4", "lost 4 other"]);
    }
}
