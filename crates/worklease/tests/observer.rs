//! The observer hears every operation once, with its facts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use worklease::observe::*;
use worklease::store::memory::MemoryStore;
use worklease::{AcquireOptions, Config, LeaseStore, Leases, WorkId};

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Recorder {
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl LeaseObserver for Recorder {
    fn on_acquire(&self, e: &AcquireEvent<'_>) {
        self.push(format!(
            "acquire ok={} attempts={}",
            e.token.is_some(),
            e.attempts
        ));
    }
    fn on_renew(&self, e: &RenewEvent<'_>) {
        self.push(format!(
            "renew ok={} attempt={}",
            e.error.is_none(),
            e.attempt
        ));
    }
    fn on_checkpoint(&self, e: &CheckpointEvent<'_>) {
        self.push(format!(
            "checkpoint ok={} size={}",
            e.error.is_none(),
            e.size
        ));
    }
    fn on_read_checkpoint(&self, e: &ReadCheckpointEvent<'_>) {
        self.push(format!("read size={} clean={}", e.size, e.clean_handoff));
    }
    fn on_release(&self, e: &ReleaseEvent<'_>) {
        self.push(format!("release ok={}", e.error.is_none()));
    }
    fn on_fenced(&self, e: &FencedEvent<'_>) {
        self.push(format!("fenced {:?}", e.operation));
    }
}

#[tokio::test(start_paused = true)]
async fn every_operation_is_observed_once() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let rec = Arc::new(Recorder::default());
    let ttl = Duration::from_secs(10);
    let a = Leases::new(store.clone(), Config::new("a", ttl).observer(rec.clone())).unwrap();
    let b = Leases::new(store.clone(), Config::new("b", ttl).observer(rec.clone())).unwrap();

    let t = a.acquire("job", AcquireOptions::new()).await.unwrap();
    let t = a.checkpoint(&t, &b"12345"[..]).await.unwrap();
    let t = a.renew(&t).await.unwrap();
    a.release(t).await.unwrap();
    let t = b.acquire("job", AcquireOptions::new()).await.unwrap();
    b.read_checkpoint(&t).await.unwrap();
    assert_eq!(
        rec.take(),
        [
            "acquire ok=true attempts=1",
            "checkpoint ok=true size=5",
            "renew ok=true attempt=1",
            "release ok=true",
            "acquire ok=true attempts=1",
            "read size=5 clean=true",
        ]
    );

    // A waiting acquisition is one event, with its attempts counted.
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire(
                "job",
                AcquireOptions::new()
                    .wait_for_lease()
                    .poll_interval(Duration::from_secs(1)),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.revoke(&WorkId::new("job").unwrap()).await.unwrap();
    let ta = waiter.await.unwrap().unwrap();
    let events = rec.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("acquire ok=true attempts=") && !events[0].ends_with("=1"),
        "{events:?}"
    );

    // The old holder is fenced on every write; each fires its event and the fenced event.
    assert!(b.renew(&t).await.is_err());
    assert!(b.checkpoint(&t, &b"x"[..]).await.is_err());
    assert!(b.release(t).await.is_err());
    assert_eq!(
        rec.take(),
        [
            "renew ok=false attempt=1",
            "fenced Renew",
            "checkpoint ok=false size=1",
            "fenced Checkpoint",
            "release ok=false",
            "fenced Release",
        ]
    );
    a.release(ta).await.unwrap();
}
