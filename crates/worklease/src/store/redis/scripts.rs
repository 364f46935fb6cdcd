//! The Lua scripts (each with the shared prelude) and how they run: by SHA
//! with `EVALSHA`, loaded again on `NOSCRIPT`, tried once more on a dropped
//! connection, and acquisitions (single or batch) pipelined with `WAIT`.

use std::sync::LazyLock;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, Script, ScriptInvocation, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::limits::ceil_millis;
use crate::store::record;
use crate::store::LeaseRef;

use super::reply::{array, bad_reply, store_err, text};
use super::{RedisStore, WaitForReplicas};

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
    acquire_many: script!("acquire_many.lua"),
    renew_many: script!("renew_many.lua"),
    release_many: script!("release_many.lua"),
});

impl RedisStore {
    /// Runs a script on the command connection and returns its reply's
    /// elements.
    ///
    /// A request that meets a connection the server (or the network) had
    /// already dropped — `is_connection_dropped`: broken pipe, reset,
    /// unexpected EOF — is tried once more: the connection manager has
    /// reconnected by then. That is safe for every script run here: each
    /// is conditioned on the work ID, holder and fencing token, so running
    /// one twice cannot break S1–S3 (at worst a release that did apply
    /// reports `Expired`). Without it, the first call after a dropped
    /// connection failed although the server was fine (issue 9's
    /// `network_faults` test, "after a cut the next operation reconnects").
    pub(super) async fn run(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        let mut conn = self.connections().await?.main.clone();
        let reply: Value = match invocation.invoke_async(&mut conn).await {
            Err(e) if e.is_connection_dropped() => {
                tracing::debug!(error = %e, "the connection had been dropped: trying once more");
                invocation.invoke_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| store_err(what, e))?;
        array(reply)
    }

    /// Runs an acquire script (`what`: single or batch) then `WAIT` in one
    /// pipeline on the acquisition connection; returns the script's reply
    /// and the number of replicas that acknowledged.
    pub(super) async fn run_and_wait(
        &self,
        conn: &ConnectionManager,
        invocation: &ScriptInvocation<'_>,
        wait: WaitForReplicas,
        what: &str,
    ) -> Result<(Vec<Value>, i64)> {
        let mut conn = conn.clone();
        let pipeline = || {
            let mut p = redis::pipe();
            p.invoke_script(invocation)
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(ceil_millis(wait.timeout));
            p
        };
        let mut result: redis::RedisResult<(Value, i64)> = pipeline().query_async(&mut conn).await;
        if matches!(&result, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)) {
            invocation
                .load_async(&mut conn)
                .await
                .map_err(|e| store_err(&format!("cannot load the {what} script"), e))?;
            result = pipeline().query_async(&mut conn).await;
        }
        let (reply, acked) = result.map_err(|e| store_err(what, e))?;
        Ok((array(reply)?, acked))
    }

    /// Runs a script that names `lease` and ends in `ok`, `fenced` or
    /// `expired`; returns the reply's elements after the status.
    pub(super) async fn run_on_lease(
        &self,
        lease: LeaseRef<'_>,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        lease_outcome(lease, self.run(invocation, what).await?)
    }
}

/// One lease's reply to a script that ends in `ok`, `fenced` or `expired`:
/// the reply's elements after `ok`, or the lease's error.
pub(super) fn lease_outcome(lease: LeaseRef<'_>, mut reply: Vec<Value>) -> Result<Vec<Value>> {
    let status = text(reply.first(), "status")?;
    match status.as_str() {
        "ok" => Ok(reply.split_off(1)),
        "fenced" => Err(record::fenced(lease)),
        "expired" => Err(Error::Expired {
            work_id: lease.work_id.to_string(),
            fencing_token: lease.fencing_token,
        }),
        other => Err(bad_reply(&format!("status {other:?}"))),
    }
}
