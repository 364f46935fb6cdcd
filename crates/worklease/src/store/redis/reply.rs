//! Reading the scripts' replies: errors, strings, numbers, fencing tokens,
//! the previous holder and the lease info.

use std::time::{Duration, SystemTime};

use redis::{RedisError, Value};

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
use crate::store::decode::{self, Corrupt};
use crate::store::record::Phase;
use crate::store::{Handoff, LeaseEnd, LeaseInfo, PreviousHolder};

use super::{scripts, KIND};

/// A store error for `e`, a failure of `what`. A permission the server's
/// ACL denies (`NOPERM`, also from a command inside a script) says so and
/// quotes the server's reason, which names the command, key or channel.
pub(super) fn store_err(what: &str, e: RedisError) -> Error {
    match denied(&e) {
        Some(reason) => StoreError::with_source(
            KIND,
            format!(
                "{what}: the Redis user lacks a permission the store needs ({reason}); \
                 grant it with ACL SETUSER (the line is in the Redis store's docs)"
            ),
            e,
        )
        .into(),
        None => StoreError::with_source(KIND, what.to_string(), e).into(),
    }
}

/// The server's reason when `e` is an ACL denial (`NOPERM`, or a
/// script's "can't run this command" / "no permissions"), with the
/// command a script was denied named from the script's line.
fn denied(e: &RedisError) -> Option<String> {
    if e.code() == Some("NOPERM") {
        return Some(format!("NOPERM {}", e.detail().unwrap_or_default()));
    }
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if !(lower.contains("noperm")
        || lower.contains("can't run this command")
        || lower.contains("no permissions")
        || lower.contains("can't access"))
    {
        return None;
    }
    // A denial inside a script: "... script: SHA, on @user_script:LINE."
    let start = text
        .find("NOPERM")
        .or_else(|| text.find("The user"))
        .unwrap_or(0);
    let reason = text[start..].split(" script: ").next().unwrap_or_default();
    let command = text.split(" script: ").nth(1).and_then(|rest| {
        let (hash, line) = rest.split_once(", on @user_script:")?;
        let line: usize = line.trim_end_matches('.').trim().parse().ok()?;
        scripts::command_at(hash, line)
    });
    Some(match command {
        Some(command) => format!(
            "{reason}: the script runs '{}'",
            command.to_ascii_lowercase()
        ),
        None => reason.to_string(),
    })
}

pub(super) fn bad_reply(what: &str) -> Error {
    StoreError::new(KIND, format!("unexpected reply from the server: {what}")).into()
}

pub(super) fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(bad_reply(&format!("{other:?}"))),
    }
}

/// The bytes of a string reply; `None` for a nil (RESP2) or a Lua `false`
/// (a RESP3 boolean).
pub(super) fn opt_bytes<'a>(v: Option<&'a Value>, what: &str) -> Result<Option<&'a [u8]>> {
    match v {
        None | Some(Value::Nil) | Some(Value::Boolean(false)) => Ok(None),
        Some(Value::BulkString(b)) => Ok(Some(b)),
        Some(Value::SimpleString(s)) => Ok(Some(s.as_bytes())),
        Some(Value::VerbatimString { text, .. }) => Ok(Some(text.as_bytes())),
        Some(other) => Err(bad_reply(&format!("{what}: {other:?}"))),
    }
}

pub(super) fn opt_text(v: Option<&Value>, what: &str) -> Result<Option<String>> {
    opt_bytes(v, what)?
        .map(|b| {
            String::from_utf8(b.to_vec()).map_err(|_| bad_reply(&format!("{what} is not UTF-8")))
        })
        .transpose()
}

pub(super) fn text(v: Option<&Value>, what: &str) -> Result<String> {
    opt_text(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

fn opt_int(v: Option<&Value>, what: &str) -> Result<Option<i64>> {
    match v {
        Some(Value::Int(i)) => Ok(Some(*i)),
        other => opt_text(other, what)?
            .map(|s| {
                s.parse()
                    .map_err(|_| bad_reply(&format!("{what} {s:?} is not a number")))
            })
            .transpose(),
    }
}

pub(super) fn int(v: Option<&Value>, what: &str) -> Result<i64> {
    opt_int(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

fn opt_token(v: Option<&Value>, what: &str) -> Result<Option<u64>> {
    opt_text(v, what)?
        .map(|s| {
            s.parse()
                .map_err(|_| bad_reply(&format!("{what} {s:?} is not a fencing token")))
        })
        .transpose()
}

pub(super) fn token(v: Option<&Value>, what: &str) -> Result<u64> {
    opt_token(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

/// The previous holder from (holder, token, end) replies.
pub(super) fn previous(items: &[Value]) -> Result<Option<PreviousHolder>> {
    let holder = opt_text(items.first(), "previous holder")?;
    let token = opt_token(items.get(1), "previous token")?;
    let end = opt_text(items.get(2), "previous end")?;
    decode::previous(holder, token, end.as_deref()).map_err(corrupt)
}

/// The error for a stored field [`decode`]'s checks refuse.
fn corrupt(c: Corrupt) -> Error {
    bad_reply(&format!("a lease record is corrupt: {c}"))
}

/// A duration in milliseconds from a signed difference: `base` moved by
/// `delta_ms`.
fn shifted(base: SystemTime, delta_ms: i64) -> SystemTime {
    let d = Duration::from_millis(delta_ms.unsigned_abs());
    if delta_ms >= 0 {
        base + d
    } else {
        base.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// A [`LeaseInfo`] from the `info` reply of the scripts: holder, token,
/// ttl, phase, exp, prev_holder, prev_token, prev_end, pttl, checkpoint
/// length, server now.
pub(super) fn lease_info(work_id: WorkId, v: Option<&Value>) -> Result<LeaseInfo> {
    let items = match v {
        Some(Value::Array(items)) => items,
        other => return Err(bad_reply(&format!("lease info {other:?}"))),
    };
    let holder_id = decode::holder_id("holder", text(items.first(), "holder")?).map_err(corrupt)?;
    let fencing_token =
        decode::fencing_token("token", token(items.get(1), "token")?).map_err(corrupt)?;
    let phase_text = text(items.get(3), "phase")?;
    let phase =
        Phase::parse(&phase_text).ok_or_else(|| bad_reply(&format!("phase {phase_text:?}")))?;
    let exp = opt_int(items.get(4), "expiry")?;
    let previous = previous(items.get(5..8).unwrap_or(&[]))?;
    let pttl = int(items.get(8), "PTTL")?;
    let checkpoint_bytes = int(items.get(9), "checkpoint length")?;
    let server_now = int(items.get(10), "server time")?;
    let live = phase == Phase::Held && pttl != -2;
    let expires_in = (live && pttl >= 0).then(|| Duration::from_millis(pttl.unsigned_abs()));
    let now = SystemTime::now();
    let expires_at = match (expires_in, exp) {
        (Some(left), _) => now + left,
        (None, Some(exp)) => shifted(now, exp.saturating_sub(server_now)),
        (None, None) => now,
    };
    let ended = (!live).then_some(match phase {
        Phase::Held => LeaseEnd::Expired,
        Phase::Released => LeaseEnd::Released,
        Phase::Revoked => LeaseEnd::Revoked,
    });
    Ok(LeaseInfo {
        work_id,
        holder_id,
        fencing_token,
        expires_at,
        expires_in,
        expired: !live,
        released: phase == Phase::Released,
        ended,
        checkpoint_bytes: decode::checkpoint_size("checkpoint length", checkpoint_bytes)
            .map_err(corrupt)?,
        handoff: Handoff { previous },
    })
}

/// Fuzzing (`crate::fuzz::redis_reply`): the lease info of a script's
/// `info` reply as the server sends it (RESP bytes), when they parse.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_lease_info(data: &[u8]) -> Option<Result<LeaseInfo>> {
    let reply = redis::parse_redis_value(data).ok()?;
    let work_id = WorkId::new("fuzz").ok()?;
    Some(lease_info(work_id, Some(&reply)))
}
