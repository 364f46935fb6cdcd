//! The warning about a server that persists nothing (a restart would
//! start the fencing counters again): once per store, on its first
//! connection; none for a server with an append-only file, nor for a user
//! that may not read the settings. (A module of
//! `tests/redis_topologies.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use worklease::store::redis::{RedisConfig, RedisStore};
use worklease::{AcquireOptions, Config, Leases};

use super::server::{raw, OwnServer, READY};

/// The text of every log line written while it is the default subscriber.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

/// The warnings logged while a store for `url` acquires and releases a
/// lease three times.
async fn warnings_of(url: &str) -> String {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // The test runs on one thread: the store's calls log here.
    let _default = tracing::subscriber::set_default(subscriber);
    let store = Arc::new(RedisStore::connect(url).await.expect("connect"));
    let a = Leases::new(store, Config::new("persist", Duration::from_secs(30))).expect("config");
    for _ in 0..3 {
        let t = a
            .acquire("jobs/persist", AcquireOptions::new())
            .await
            .expect("acquire");
        a.release(t).await.expect("release");
    }
    log.text()
}

#[tokio::test]
async fn a_server_that_persists_nothing_is_warned_about_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bare = OwnServer::start(dir.path(), None, &["--appendonly", "no"], READY);
    let text = warnings_of(&bare.url()).await;
    assert_eq!(text.matches("persists nothing").count(), 1, "{text}");
    assert!(text.contains("WARN"), "{text}");

    let aof_dir = tempfile::tempdir().expect("tempdir");
    let aof = OwnServer::start(aof_dir.path(), None, &["--appendonly", "yes"], READY);
    let text = warnings_of(&aof.url()).await;
    assert!(!text.contains("persists nothing"), "{text}");

    // A user without CONFIG GET: nothing at warning level.
    let mut conn = raw(&bare.url()).await;
    let config = RedisConfig::from_url(&bare.url()).expect("URL");
    let rules = config.acl_rules().replace(" +config|get", "");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noconfig")
        .arg("on")
        .arg(">pw")
        .arg(rules.split_whitespace().collect::<Vec<_>>())
        .exec_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://noconfig:pw@127.0.0.1:{}/0", bare.port);
    let text = warnings_of(&url).await;
    assert!(text.is_empty(), "{text}");
}
