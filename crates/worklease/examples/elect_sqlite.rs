//! Two (or more) processes elect a leader through one SQLite file; the
//! leader prints its generation every second.
//!
//! ```sh
//! cargo run -p worklease --example elect_sqlite -- /tmp/elect.db alice &
//! cargo run -p worklease --example elect_sqlite -- /tmp/elect.db bob
//! kill -9 %1     # bob leads within TTL (5 s) + poll interval (500 ms)
//! ```

use std::sync::Arc;
use std::time::Duration;

use worklease::election::Elector;
use worklease::store::sqlite::SqliteStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(owner)) = (args.next(), args.next()) else {
        eprintln!("usage: elect_sqlite DB_PATH OWNER");
        std::process::exit(64);
    };
    let ttl = std::env::var("ELECT_TTL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let store = Arc::new(SqliteStore::open(&path)?);
    let elector = Elector::builder(store, "example-election", owner.as_str())
        .ttl(Duration::from_millis(ttl))
        .poll_interval(Duration::from_millis(500))
        .build()?;
    println!("{owner}: campaigning");
    loop {
        elector
            .lead(|l| async move {
                println!("{}: leading, generation {}", l.state().owner, l.generation());
                let lost = l.lost();
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = lost.cancelled() => {
                            println!("{}: lost leadership: {:?}", l.state().owner, l.lost_cause());
                            return;
                        }
                        _ = tick.tick() => println!("{}: generation {}", l.state().owner, l.generation()),
                    }
                }
            })
            .await?;
    }
}
