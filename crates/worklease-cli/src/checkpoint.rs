//! `worklease checkpoint set|get`: a child of `worklease run` saves and
//! reads its progress through the lease it runs under.
//!
//! The token (`--token` or `WORKLEASE_TOKEN`) names the lease; the
//! [`Leases`] handle is built with the token's holder ID and TTL, so a
//! checkpoint renews the lease as the parent's renewals do. `get --json`
//! prints one object: `work_id`, `fencing_token`, `checkpoint_bytes`,
//! `checkpoint_base64` (standard base64, `null` when there is no
//! checkpoint), `checkpoint_text` (the data when it is UTF-8, else `null`),
//! `clean_handoff` and `previous_holder` (`{holder_id, fencing_token,
//! ended}` or `null`).
//!
//! `get --work-id ID` is an operator's read of any work ID, without a
//! token ([`worklease::LeaseStore::inspect_checkpoint`]): it writes
//! nothing, and its `--json` adds `holder_id` and `state` (`live`, `held`
//! (on a store judging expiry by observation: not known to have ended),
//! `released`, `expired` or `revoked`).

use std::io::{IsTerminal, Read};
use std::os::unix::ffi::OsStringExt;

use base64::Engine;
use serde::Serialize;
use worklease::limits::{WorkId, MAX_CHECKPOINT_BYTES};
use worklease::store::{url, ExpiryClock};
use worklease::{Checkpoint, Config, Error, Leases, StoredCheckpoint, Token};

use crate::exit::{self, Failure};
use crate::say::say;
use crate::status::{write_stdout, PreviousJson};
use crate::{CheckpointGetArgs, CheckpointSetArgs, StoreArg, TokenArg};

/// The lease handle and token a `checkpoint` subcommand works with.
fn leases_for(token: &TokenArg, store: &StoreArg) -> Result<(Leases, Token), Failure> {
    let text = token.token.as_deref().filter(|t| !t.trim().is_empty()).ok_or_else(|| {
        Failure::usage(
            "no lease token: pass --token TOKEN, or run this inside `worklease run`, which sets WORKLEASE_TOKEN",
        )
    })?;
    let token: Token = text
        .parse()
        .map_err(|e| Failure::usage(format!("--token / WORKLEASE_TOKEN: {e}")))?;
    let (_, store) = store.open_existing()?;
    let leases = Leases::new(store, Config::new(token.holder_id().as_str(), token.ttl()))?;
    Ok((leases, token))
}

/// A lease error of a checkpoint call, with what it means for the caller.
fn lease_failure(error: Error, what: &str) -> Failure {
    if error.is_lease_lost() {
        Failure::new(exit::LOST, format!("{what}: {error}"))
    } else {
        error.into()
    }
}

/// Runs `worklease checkpoint set`.
pub async fn set(args: CheckpointSetArgs) -> Result<u8, Failure> {
    let (leases, token) = leases_for(&args.token, &args.store)?;
    let data = match args.data {
        Some(data) => data.into_vec(),
        None => read_stdin()?,
    };
    let size = data.len();
    leases
        .checkpoint(&token, data)
        .await
        .map_err(|e| lease_failure(e, "checkpoint not saved, nothing was written"))?;
    tracing::debug!(work_id = %token.work_id(), size, "checkpoint saved");
    Ok(0)
}

/// Reads standard input to its end, refusing more than the checkpoint
/// limit without reading it all.
fn read_stdin() -> Result<Vec<u8>, Failure> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(Failure::usage(
            "no DATA argument and stdin is a terminal: pass the checkpoint as DATA or pipe it in",
        ));
    }
    let mut data = Vec::new();
    stdin
        .lock()
        .take(MAX_CHECKPOINT_BYTES as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| {
            Failure::new(
                exit::IO,
                format!("cannot read the checkpoint from stdin: {e}"),
            )
        })?;
    if data.len() > MAX_CHECKPOINT_BYTES {
        return Err(Failure::usage(format!(
            "the checkpoint on stdin is over the limit of {MAX_CHECKPOINT_BYTES} bytes"
        )));
    }
    Ok(data)
}

#[derive(Serialize)]
struct CheckpointJson<'a> {
    work_id: &'a str,
    fencing_token: u64,
    checkpoint_bytes: usize,
    checkpoint_base64: Option<String>,
    checkpoint_text: Option<&'a str>,
    clean_handoff: bool,
    previous_holder: Option<PreviousJson<'a>>,
}

/// Runs `worklease checkpoint get`.
pub async fn get(args: CheckpointGetArgs) -> Result<u8, Failure> {
    if let Some(work_id) = &args.work_id {
        return get_by_work_id(work_id, &args.store, args.json).await;
    }
    let (leases, token) = leases_for(&args.token, &args.store)?;
    let checkpoint = leases
        .read_checkpoint(&token)
        .await
        .map_err(|e| lease_failure(e, "cannot read the checkpoint"))?;
    if args.json {
        let mut line = serde_json::to_string(&to_json(&token, &checkpoint))
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
        line.push('\n');
        write_stdout(line.as_bytes())?;
    } else {
        if let Some(data) = &checkpoint.data {
            write_stdout(data)?;
        }
        say!("{}", summary(&token, &checkpoint));
    }
    Ok(0)
}

fn to_json<'a>(token: &'a Token, checkpoint: &'a Checkpoint) -> CheckpointJson<'a> {
    let data = checkpoint.data.as_deref();
    CheckpointJson {
        work_id: token.work_id().as_str(),
        fencing_token: token.fencing_token(),
        checkpoint_bytes: data.map_or(0, <[u8]>::len),
        checkpoint_base64: data.map(|d| base64::engine::general_purpose::STANDARD.encode(d)),
        checkpoint_text: data.and_then(|d| std::str::from_utf8(d).ok()),
        clean_handoff: checkpoint.clean_handoff(),
        previous_holder: checkpoint.handoff.previous.as_ref().map(PreviousJson::from),
    }
}

/// The one line `get` writes to stderr.
fn summary(token: &Token, checkpoint: &Checkpoint) -> String {
    let data = match &checkpoint.data {
        Some(d) => format!("{} bytes", d.len()),
        None => "none yet".to_string(),
    };
    let handoff = match &checkpoint.handoff.previous {
        None => "first holder of this work ID".to_string(),
        Some(p) => format!(
            "clean hand-off: {} (previous holder {:?}, fencing token {}, {})",
            if checkpoint.clean_handoff() {
                "yes"
            } else {
                "no"
            },
            p.holder_id,
            p.fencing_token,
            p.ended.as_str()
        ),
    };
    format!(
        "checkpoint of {:?} (fencing token {}): {data}; {handoff}",
        token.work_id().as_str(),
        token.fencing_token()
    )
}

#[derive(Serialize)]
struct StoredJson<'a> {
    work_id: &'a str,
    holder_id: &'a str,
    fencing_token: u64,
    state: &'static str,
    checkpoint_bytes: usize,
    checkpoint_base64: Option<String>,
    checkpoint_text: Option<&'a str>,
    clean_handoff: bool,
    previous_holder: Option<PreviousJson<'a>>,
}

/// The state of a lease as `get --work-id` names it.
fn state(stored: &StoredCheckpoint, clock: ExpiryClock) -> &'static str {
    match stored.lease.ended {
        Some(end) => end.as_str(),
        None if clock == ExpiryClock::Observation => "held",
        None => "live",
    }
}

/// `worklease checkpoint get --work-id ID`: any work ID's checkpoint,
/// read-only; exit 4 for a work ID the store does not know.
async fn get_by_work_id(work_id: &WorkId, store: &StoreArg, json: bool) -> Result<u8, Failure> {
    let (store_url, store) = store.open_existing()?;
    let Some(stored) = store.inspect_checkpoint(work_id).await? else {
        return Err(Failure::new(
            exit::NOT_FOUND,
            format!(
                "no lease on {:?} in {}: the store does not know the work ID",
                work_id.as_str(),
                url::redact(&store_url)
            ),
        ));
    };
    let state = state(&stored, store.expiry_clock());
    let data = stored.data.as_deref();
    if json {
        let object = StoredJson {
            work_id: work_id.as_str(),
            holder_id: &stored.lease.holder_id,
            fencing_token: stored.lease.fencing_token,
            state,
            checkpoint_bytes: data.map_or(0, <[u8]>::len),
            checkpoint_base64: data.map(|d| base64::engine::general_purpose::STANDARD.encode(d)),
            checkpoint_text: data.and_then(|d| std::str::from_utf8(d).ok()),
            clean_handoff: stored.lease.handoff.is_clean(),
            previous_holder: stored
                .lease
                .handoff
                .previous
                .as_ref()
                .map(PreviousJson::from),
        };
        let mut line = serde_json::to_string(&object)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
        line.push('\n');
        write_stdout(line.as_bytes())?;
    } else {
        if let Some(data) = data {
            write_stdout(data)?;
        }
        eprintln!(
            "worklease: checkpoint of {:?}: {}; holder {:?}, fencing token {}, {state}",
            work_id.as_str(),
            data.map_or_else(|| "none".to_string(), |d| format!("{} bytes", d.len())),
            stored.lease.holder_id,
            stored.lease.fencing_token,
        );
    }
    Ok(0)
}
