//! `worklease run --once`: skip a job whose previous holder finished it,
//! and record a finish ([`worklease::once`], ADR 0024).

use std::sync::Arc;

use worklease::{once, LeaseStore, Leases, Token};

use crate::exit::Failure;
use crate::run::release_after_failure;
use crate::say::{self, say};

/// `run --once`, with the lease held by `token`: true when the job
/// finished already in the acquisition before this one ([`once`]); then
/// this acquisition carries the record on, is released, and a line says
/// so (unless `-q`). A store failure releases the lease and fails the run
/// (nothing is run without knowing).
pub async fn finished_already(leases: &Leases, token: &Token) -> Result<bool, Failure> {
    let store = leases.store();
    let judged = async {
        let previous = leases
            .read_checkpoint(token)
            .await?
            .handoff
            .previous
            .map(|p| p.fencing_token);
        once::finished_before(store, token, previous).await
    }
    .await;
    let record = match judged {
        Ok(None) => return Ok(false),
        Ok(Some(record)) => record,
        Err(e) => {
            release_after_failure(leases, token.clone()).await;
            return Err(e.into());
        }
    };
    if let Err(e) = once::record_finished(store, token, Some(&record)).await {
        tracing::warn!(error = %e, "cannot carry the run-once record on: the next --once runs the job");
    }
    release_after_failure(leases, token.clone()).await;
    if !say::is_quiet() {
        say!(
            "{:?} finished already (run by {:?} with fencing token {}, finished {}): not running it again (--once)",
            token.work_id().as_str(),
            record.holder_id,
            record.finished_token,
            humantime::format_rfc3339_seconds(record.at)
        );
    }
    Ok(true)
}

/// Records that the child of `token` exited 0, while the lease is still
/// renewed; a failure is a warning (the next `--once` runs the job again).
pub async fn record(store: &Arc<dyn LeaseStore>, token: &Token) {
    if let Err(e) = once::record_finished(store, token, None).await {
        tracing::warn!(
            error = %e,
            "the child exited 0, but its finish could not be recorded: the next --once runs it again"
        );
    }
}
