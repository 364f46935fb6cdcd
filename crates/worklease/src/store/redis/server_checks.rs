//! Warnings about server settings that break the store's guarantees, read
//! with `CONFIG GET` when a store first connects (once per store: a CLI
//! run warns once). A user without `CONFIG GET` gets a debug line instead.

use std::collections::HashMap;

use super::conn::Conn;

/// What a settings check found wrong, as the warning's text, or `None`.
type Finding = Option<String>;

/// Logs a warning when the server may evict keys that must never go
/// (an `allkeys-*` policy), or persists nothing (`appendonly no` and
/// `save ""`): a restart then forgets every lease and starts the fencing
/// counters again, so tokens repeat.
pub(super) async fn warn_on_server_settings(conn: &Conn) {
    let mut conn = conn.clone();
    let mut settings = HashMap::new();
    for name in ["maxmemory-policy", "appendonly", "save"] {
        let got: redis::RedisResult<HashMap<String, String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(&mut conn)
            .await;
        match got {
            Ok(values) => settings.extend(values),
            Err(e) => {
                tracing::debug!(error = %e, setting = name, "cannot read a Redis setting");
                return;
            }
        }
    }
    for finding in [eviction(&settings), persistence(&settings)]
        .into_iter()
        .flatten()
    {
        tracing::warn!("{finding}");
    }
}

fn eviction(settings: &HashMap<String, String>) -> Finding {
    let policy = settings
        .get("maxmemory-policy")
        .filter(|p| p.starts_with("allkeys"))?;
    Some(format!(
        "Redis may evict fencing counters and checkpoints under memory pressure \
         (maxmemory-policy {policy}): use noeviction or a volatile-* policy"
    ))
}

fn persistence(settings: &HashMap<String, String>) -> Finding {
    let aof = settings.get("appendonly")?;
    let save = settings.get("save")?;
    (aof == "no" && save.trim().is_empty()).then(|| {
        "the Redis server persists nothing (appendonly no, save \"\"): a restart forgets \
         every lease and starts the fencing counters again, so fencing tokens repeat; \
         set appendonly yes (appendfsync always to survive a power loss)"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn findings_name_the_settings() {
        let none = settings(&[("appendonly", "no"), ("save", "")]);
        assert!(persistence(&none).is_some_and(|w| w.contains("persists nothing")));
        let rdb = settings(&[("appendonly", "no"), ("save", "3600 1")]);
        assert_eq!(persistence(&rdb), None);
        let aof = settings(&[("appendonly", "yes"), ("save", "")]);
        assert_eq!(persistence(&aof), None);
        let evicting = settings(&[("maxmemory-policy", "allkeys-lru")]);
        assert!(eviction(&evicting).is_some_and(|w| w.contains("allkeys-lru")));
        assert_eq!(
            eviction(&settings(&[("maxmemory-policy", "noeviction")])),
            None
        );
    }
}
