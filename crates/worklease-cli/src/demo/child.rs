//! The child: `worklease demo-shard`, which processes one shard under the
//! lease `worklease run` holds for it, from its checkpoint on.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use worklease::store::url;
use worklease::{Config, Error, Leases, Token};

use super::protocol::{read_text, ChildEvent, Counts, Manifest, Previous, ShardState};
use crate::exit::{self, Failure};
use crate::status::write_stdout;

/// Arguments of `worklease demo-shard`, the child `worklease demo` runs
/// under `worklease run`.
#[derive(Args, Debug)]
pub struct DemoShardArgs {
    /// The manifest `worklease demo` wrote: the files of every shard.
    #[arg(long, value_name = "PATH")]
    manifest: PathBuf,

    /// Which shard to process.
    #[arg(long, value_name = "K")]
    shard: usize,

    /// Time taken per file on top of reading it.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = crate::parse_duration, allow_hyphen_values = true)]
    pace: Duration,

    /// The lease token (set by `worklease run`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WORKLEASE_TOKEN",
        hide_env_values = true
    )]
    token: String,

    /// The store URL (set by `worklease run`).
    #[arg(
        long,
        value_name = "URL",
        env = "WORKLEASE_STORE",
        hide_env_values = true
    )]
    store: String,
}

/// A lease error of the child, with what it means for its exit status.
fn lease_failure(error: Error, what: &str) -> Failure {
    if error.is_lease_lost() {
        Failure::new(exit::LOST, format!("{what}: {error}"))
    } else {
        error.into()
    }
}

/// Runs `worklease demo-shard`: processes one shard from its checkpoint on.
pub async fn demo_shard(args: DemoShardArgs) -> Result<u8, Failure> {
    let manifest: Manifest = std::fs::read(&args.manifest)
        .map_err(|e| e.to_string())
        .and_then(|data| serde_json::from_slice(&data).map_err(|e| e.to_string()))
        .map_err(|e| {
            Failure::usage(format!(
                "cannot read the manifest {}: {e}",
                args.manifest.display()
            ))
        })?;
    let files = manifest.shards.get(args.shard).ok_or_else(|| {
        Failure::usage(format!(
            "shard {} is not in the manifest ({} shards)",
            args.shard,
            manifest.shards.len()
        ))
    })?;
    let token: Token = args
        .token
        .parse()
        .map_err(|e| Failure::usage(format!("--token / WORKLEASE_TOKEN: {e}")))?;
    let store = url::open(&args.store)?;
    let leases = Leases::new(store, Config::new(token.holder_id().as_str(), token.ttl()))?;
    let holder = token.holder_id().as_str().to_string();
    let fencing_token = token.fencing_token();

    let checkpoint = leases
        .read_checkpoint(&token)
        .await
        .map_err(|e| lease_failure(e, "cannot read the checkpoint"))?;
    let fresh = || ShardState::fresh(&manifest.run, args.shard, files.len());
    let (mut state, discarded) = match checkpoint.data.as_deref() {
        None => (fresh(), None),
        Some(data) => match serde_json::from_slice::<ShardState>(data) {
            Ok(s) if s.demo == manifest.run && s.shard == args.shard && s.files == files.len() => {
                (s, None)
            }
            Ok(s) => (fresh(), Some(format!("from another demo run ({})", s.demo))),
            Err(e) => (fresh(), Some(format!("not a demo checkpoint: {e}"))),
        },
    };
    emit(&ChildEvent::Start {
        pid: std::process::id(),
        holder: holder.clone(),
        token: fencing_token,
        next: state.next,
        files: files.len(),
        complete: state.complete,
        clean_handoff: checkpoint.clean_handoff(),
        previous: checkpoint.handoff.previous.as_ref().map(|p| Previous {
            holder: p.holder_id.clone(),
            token: p.fencing_token,
            ended: p.ended.as_str().to_string(),
        }),
        discarded,
    })?;
    if state.complete {
        return Ok(0);
    }

    state.holders.insert(fencing_token, holder.clone());
    state.holder = holder;
    for (index, file) in files.iter().enumerate().skip(state.next) {
        let path = manifest.root.join(file);
        let text = read_text(&path)
            .map_err(|why| Failure::new(1, format!("{}: {why}", path.display())))?;
        let counts = Counts::of(&text);
        tokio::time::sleep(args.pace).await;
        state.totals.add(counts);
        state.processed.push((index, fencing_token));
        state.next = index + 1;
        state.complete = state.next == files.len();
        let data = serde_json::to_vec(&state)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
        leases
            .checkpoint(&token, data)
            .await
            .map_err(|e| lease_failure(e, "checkpoint not saved, nothing was written"))?;
        emit(&ChildEvent::Checkpoint {
            token: fencing_token,
            next: state.next,
            files: files.len(),
        })?;
    }
    emit(&ChildEvent::Complete {
        token: fencing_token,
        files: files.len(),
    })?;
    Ok(0)
}

fn emit(event: &ChildEvent) -> Result<(), Failure> {
    let mut line = serde_json::to_string(event)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
    line.push('\n');
    write_stdout(line.as_bytes())
}
