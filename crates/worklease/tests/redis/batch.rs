//! The Redis store's batches: one command on the server per batch, and
//! hostile work IDs in a batch (a module of `tests/redis.rs`, which holds
//! the shared fixtures).

use std::collections::{BTreeMap, HashMap};

use worklease::store::redis::MAX_BATCH;

use super::*;

/// How often the server ran each command (`INFO commandstats`; the
/// commands a script calls count too).
pub(crate) async fn command_counts(
    conn: &mut redis::aio::MultiplexedConnection,
) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands run since `before` (the counting `INFO` left out).
pub(crate) async fn ran_since(
    conn: &mut redis::aio::MultiplexedConnection,
    before: &HashMap<String, u64>,
) -> BTreeMap<String, u64> {
    let after = command_counts(conn).await;
    after
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, n)| (n - before.get(&name).copied().unwrap_or(0), name))
        .filter(|(n, _)| *n > 0)
        .map(|(n, name)| (name, n))
        .collect()
}

/// A batch of [`MAX_BATCH`] leases is one `EVALSHA` on the server (each
/// lease's commands run inside it), and release_many announces each
/// released work ID as a single release does. Work IDs that are hash tags,
/// braces or glob patterns, under a prefix that is a glob pattern itself,
/// stay distinct leases with keys of their own under the prefix.
#[tokio::test]
async fn a_batch_is_one_command_and_hostile_ids_stay_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = OwnServer::start(dir.path(), None, &[], READY);
    let prefix = "t*?[x]\\:";
    let config = RedisConfig::from_url(&server.url())
        .expect("URL")
        .prefix(prefix)
        .expect("prefix");
    let store = RedisStore::new(config).expect("store");
    let hostile = [
        "{a}", "a", "{a", "a}", "}{", "{}", "{{a}}", "*", "?", "[a-z]", "\\", "%7Ba%7D",
        "x}:state", "{a}:live", "b{a}c",
    ];
    let mut ids: Vec<WorkId> = hostile.iter().map(|s| id(s)).collect();
    ids.extend((ids.len()..MAX_BATCH).map(|i| id(&format!("{{jobs}}/{i}*"))));
    let (a, b) = (
        HolderId::new("batch-a").expect("holder"),
        HolderId::new("batch-b").expect("holder"),
    );
    let ttl = Duration::from_secs(30);
    // Each script loaded first (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    let warm = [id("warm-up")];
    let g = store
        .acquire_many(&warm, &a, ttl, 1)
        .await
        .expect("acquire_many");
    let fencing_token = g[0].as_ref().expect("granted").fencing_token;
    let w = LeaseRef {
        work_id: &warm[0],
        holder_id: &a,
        fencing_token,
    };
    store.renew_many(&[w], ttl).await.expect("renew_many");
    store.release_many(&[w]).await.expect("release_many");

    let mut conn = raw(&server.url()).await;
    let one_evalsha = |ran: &BTreeMap<String, u64>, what: &str| {
        assert_eq!(
            ran.get("evalsha"),
            Some(&1),
            "{what} of {MAX_BATCH} leases: {ran:?}"
        );
    };
    let before = command_counts(&mut conn).await;
    let grants = store
        .acquire_many(&ids, &a, ttl, MAX_BATCH)
        .await
        .expect("acquire_many");
    one_evalsha(&ran_since(&mut conn, &before).await, "acquire_many");
    let tokens: Vec<u64> = grants
        .iter()
        .map(|g| g.as_ref().expect("granted").fencing_token)
        .collect();
    let mut leases: Vec<LeaseRef> = ids
        .iter()
        .zip(&tokens)
        .map(|(work_id, &fencing_token)| LeaseRef {
            work_id,
            holder_id: &a,
            fencing_token,
        })
        .collect();
    let keys: Vec<Vec<u8>> = redis::AsyncCommands::keys(&mut conn, "*")
        .await
        .expect("KEYS");
    assert!(
        keys.iter().all(|k| k.starts_with(prefix.as_bytes())),
        "a key outside the prefix"
    );
    assert_eq!(
        keys.len(),
        3 * MAX_BATCH + 2,
        "state, live and fence of each, and the warm-up's state and fence"
    );
    let listed = store.inspect(&ids).await.expect("inspect");
    assert_eq!(
        listed.len(),
        MAX_BATCH,
        "every work ID is a lease of its own"
    );
    assert!(listed
        .iter()
        .all(|l| l.holder_id == "batch-a" && !l.expired));

    // One stale token: that lease alone is fenced, in one command.
    leases[0].fencing_token += 1;
    let before = command_counts(&mut conn).await;
    let renewed = store.renew_many(&leases, ttl).await.expect("renew_many");
    let ran = ran_since(&mut conn, &before).await;
    one_evalsha(&ran, "renew_many");
    assert_eq!(
        ran.get("hmget"),
        Some(&(MAX_BATCH as u64)),
        "each lease checked inside: {ran:?}"
    );
    assert!(
        matches!(renewed[0], Err(Error::Fenced { .. })),
        "{:?}",
        renewed[0]
    );
    assert!(renewed[1..].iter().all(|r| r.is_ok()), "{renewed:?}");
    let held = store
        .acquire_many(&ids, &b, ttl, MAX_BATCH)
        .await
        .expect("acquire_many");
    assert!(held
        .iter()
        .all(|r| matches!(r, Err(Error::Held { holder_id, .. }) if holder_id == "batch-a")));

    let client = redis::Client::open(server.url()).expect("URL");
    let mut pubsub = client.get_async_pubsub().await.expect("pub/sub");
    pubsub
        .subscribe(format!("{prefix}released:db0"))
        .await
        .expect("SUBSCRIBE");
    let before = command_counts(&mut conn).await;
    let released = store.release_many(&leases).await.expect("release_many");
    one_evalsha(&ran_since(&mut conn, &before).await, "release_many");
    assert!(
        matches!(released[0], Err(Error::Fenced { .. })),
        "{:?}",
        released[0]
    );
    assert!(released[1..].iter().all(|r| r.is_ok()), "{released:?}");
    let mut messages = pubsub.on_message();
    for want in &ids[1..] {
        let msg = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::StreamExt::next(&mut messages),
        )
        .await
        .expect("an announcement per released work ID")
        .expect("message");
        assert_eq!(msg.get_payload::<String>().expect("text"), want.as_str());
    }
    drop(messages);
    leases[0].fencing_token -= 1;
    store.release(leases[0]).await.expect("release");
    let again = store
        .acquire_many(&ids, &b, ttl, MAX_BATCH)
        .await
        .expect("acquire_many");
    for (g, token) in again.iter().zip(&tokens) {
        let g = g.as_ref().expect("every released lease is free");
        assert!(g.handoff.is_clean() && g.fencing_token > *token, "{g:?}");
    }
    server.stop().await;
}
