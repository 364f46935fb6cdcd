//! The Lua scripts (each with the shared prelude) and how they run: by SHA
//! with `EVALSHA`, loaded again on `NOSCRIPT`, tried once more on a dropped
//! connection, and acquisitions (single or batch) pipelined with `WAIT`.

use std::sync::LazyLock;

use redis::{ErrorKind, Script, ScriptInvocation, ServerErrorKind, Value};

use crate::error::{Error, Result, StoreError};
use crate::limits::ceil_millis;
use crate::store::LeaseRef;

use super::reply::{array, bad_reply, store_err, text};
use super::{RedisStore, WaitForReplicas, KIND};

macro_rules! source {
    ($file:literal) => {
        concat!(include_str!("common.lua"), include_str!($file))
    };
}

macro_rules! script {
    ($file:literal) => {
        Script::new(source!($file))
    };
}

/// The text of every script, to find the command on a line the server
/// names in an error.
const SOURCES: &[&str] = &[
    source!("acquire.lua"),
    source!("renew.lua"),
    source!("checkpoint.lua"),
    source!("read.lua"),
    source!("release.lua"),
    source!("abandon.lua"),
    source!("revoke.lua"),
    source!("inspect.lua"),
    source!("inspect_checkpoint.lua"),
    source!("delete_ended.lua"),
    source!("acquire_many.lua"),
    source!("renew_many.lua"),
    source!("release_many.lua"),
];

/// The command that line `line` (from 1) of the script with SHA1 `hash`
/// calls (`redis.call('NAME', ...)`), if it calls one.
pub(super) fn command_at(hash: &str, line: usize) -> Option<&'static str> {
    let source = SOURCES.iter().find(|s| Script::new(s).get_hash() == hash)?;
    let text = source.lines().nth(line.checked_sub(1)?)?;
    let call = &text[text.find("redis.call('")? + "redis.call('".len()..];
    Some(&call[..call.find('\'')?])
}

/// The store's scripts, each with the shared prelude.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) renew: Script,
    pub(super) checkpoint: Script,
    pub(super) read: Script,
    pub(super) release: Script,
    pub(super) abandon: Script,
    pub(super) revoke: Script,
    pub(super) inspect: Script,
    pub(super) inspect_checkpoint: Script,
    pub(super) delete_ended: Script,
    pub(super) acquire_many: Script,
    pub(super) renew_many: Script,
    pub(super) release_many: Script,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: script!("acquire.lua"),
    renew: script!("renew.lua"),
    checkpoint: script!("checkpoint.lua"),
    read: script!("read.lua"),
    release: script!("release.lua"),
    abandon: script!("abandon.lua"),
    revoke: script!("revoke.lua"),
    inspect: script!("inspect.lua"),
    inspect_checkpoint: script!("inspect_checkpoint.lua"),
    delete_ended: script!("delete_ended.lua"),
    acquire_many: script!("acquire_many.lua"),
    renew_many: script!("renew_many.lua"),
    release_many: script!("release_many.lua"),
});

impl RedisStore {
    /// Runs a script on the command connection (following a moved primary
    /// and retrying a dropped connection once, see `on_primary`) and
    /// returns its reply's elements. Without it, the first call after a
    /// dropped connection failed although the server was fine (issue 9's
    /// `network_faults` test, "after a cut the next operation reconnects").
    pub(super) async fn run(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        let reply: Value = self
            .on_primary(|c| {
                let mut conn = c.main.clone();
                Box::pin(async move { invocation.invoke_async(&mut conn).await })
            })
            .await?
            .map_err(|e| store_err(what, e))?;
        array(reply)
    }

    /// Runs a script that writes: with a replica wait, followed by `WAIT`
    /// (see [`RedisStore::run_and_wait`]), and failing with a store error
    /// when too few replicas acknowledged it; without one, as
    /// [`RedisStore::run`].
    pub(super) async fn run_write(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        let Some(wait) = self.config.wait else {
            return self.run(invocation, what).await;
        };
        let (reply, acked) = self.run_and_wait(invocation, wait, what).await?;
        if acked < i64::from(wait.replicas) {
            return Err(StoreError::new(
                KIND,
                format!(
                    "only {acked} of the {} replicas asked for acknowledged the {what} within {:?}: \
                     it may not survive a failover",
                    wait.replicas, wait.timeout
                ),
            )
            .into());
        }
        Ok(reply)
    }

    /// Runs a script (`what`) then `WAIT` in one pipeline on the waiting
    /// connection, so that `WAIT` covers that script's writes even across
    /// a reconnection; returns the script's reply and the number of
    /// replicas that acknowledged. On a Cluster the pipeline goes to the
    /// script's slot's primary, and the `redis` crate sends it whole again
    /// where a `MOVED` or `ASK` (with `ASKING`) points, or after a
    /// `TRYAGAIN`: `WAIT` always follows the script on the connection to
    /// the node that ran it (a `WAIT` sent alone could reach the slot's
    /// old owner during a migration and count replicas of other writes).
    pub(super) async fn run_and_wait(
        &self,
        invocation: &ScriptInvocation<'_>,
        wait: WaitForReplicas,
        what: &str,
    ) -> Result<(Vec<Value>, i64)> {
        let pipeline = || {
            let mut p = redis::pipe();
            p.invoke_script(invocation)
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(ceil_millis(wait.timeout));
            p
        };
        let result = self
            .on_primary(|c| {
                let pipeline = pipeline();
                Box::pin(async move {
                    let Some(mut conn) = c.waiting.clone() else {
                        return Err(redis::RedisError::from((
                            ErrorKind::Client,
                            "no waiting connection",
                        )));
                    };
                    let result: redis::RedisResult<(Value, i64)> =
                        pipeline.query_async(&mut conn).await;
                    match result {
                        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                            invocation.load_async(&mut conn).await?;
                            pipeline.query_async(&mut conn).await
                        }
                        other => other,
                    }
                })
            })
            .await?;
        let (reply, acked) = result.map_err(|e| store_err(what, e))?;
        Ok((array(reply)?, acked))
    }

    /// Runs a script that names `lease`, writes, and ends in `ok`,
    /// `fenced` or `expired`; returns the reply's elements after the
    /// status.
    pub(super) async fn run_on_lease(
        &self,
        lease: LeaseRef<'_>,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        lease_outcome(lease, self.run_write(invocation, what).await?)
    }
}

/// One lease's reply to a script that ends in `ok`, `fenced` or `expired`:
/// the reply's elements after `ok`, or the lease's error.
pub(super) fn lease_outcome(lease: LeaseRef<'_>, mut reply: Vec<Value>) -> Result<Vec<Value>> {
    let status = text(reply.first(), "status")?;
    match status.as_str() {
        "ok" => Ok(reply.split_off(1)),
        "fenced" => Err(Error::fenced(lease)),
        "expired" => Err(Error::expired(lease)),
        other => Err(bad_reply(&format!("status {other:?}"))),
    }
}
