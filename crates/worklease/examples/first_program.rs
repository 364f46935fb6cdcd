//! A new user's first program (issue 37): the three things that cost a
//! newcomer compile rounds, written the way that compiles — who leads
//! (`Elector::leader` answers `None` when nobody does), awaiting the lost
//! signal (a `CancellationToken`: `.cancelled().await`), and checkpoints
//! from borrowed data (`line.as_bytes()`).
//!
//! ```sh
//! cargo run -p worklease --example first_program -- /tmp/first.db
//! ```

use std::sync::Arc;
use std::time::Duration;

use worklease::election::Elector;
use worklease::store::sqlite::SqliteStore;
use worklease::{AcquireOptions, Config, Leases, RenewalOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("worklease-first.db")
            .display()
            .to_string()
    });
    let store = Arc::new(SqliteStore::open(&path)?);

    // Who leads "scheduler"? None when nobody does.
    let elector = Elector::builder(store.clone(), "scheduler", "host-a")
        .ttl(Duration::from_secs(5))
        .build()?;
    match elector.leader().await? {
        Some(state) => println!("{} leads, term {}", state.owner, state.generation),
        None => println!("nobody leads \"scheduler\""),
    }

    // Lead for a moment: the lost signal is a CancellationToken to await.
    let term = elector
        .lead(|leadership| async move {
            let lost = leadership.lost();
            tokio::select! {
                () = lost.cancelled() => println!("lost: {:?}", leadership.lost_cause()),
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            leadership.generation()
        })
        .await?;
    println!("led term {term}");

    // A lease with progress checkpoints written from borrowed data.
    let leases = Leases::new(store, Config::new("host-a", Duration::from_secs(15)))?;
    let token = leases.acquire("import", AcquireOptions::new()).await?;
    let prior = leases.read_checkpoint(&token).await?;
    println!("resuming from {:?}", prior.data);
    let renewal = leases.start_renewal(token, RenewalOptions::new())?;
    for batch in 1..=3 {
        let line = format!("batch={batch}");
        // A &[u8] of a String on the stack: no 'static needed.
        leases.checkpoint(&renewal.token(), line.as_bytes()).await?;
    }
    let token = renewal.stop().await?;
    leases.release(token).await?;
    Ok(())
}
