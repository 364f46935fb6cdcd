//! `worklease release --force`: an operator ends a lease, whoever holds it
//! ([`worklease::LeaseStore::revoke`]).

use worklease::store::url;
use worklease::LeaseEnd;

use crate::exit::{self, Failure};
use crate::status::write_stdout;
use crate::ReleaseArgs;

/// Runs `worklease release` and returns its exit status.
pub async fn release(args: ReleaseArgs) -> Result<u8, Failure> {
    let work_id = args.work_id.as_str();
    if !args.force {
        return Err(Failure::usage(format!(
            "refusing to release {work_id:?} without --force: this takes the lease away from \
             whoever holds it (its `worklease run` stops its child and exits 76); write \
             `worklease release --force {work_id}` to do it. A holder's own lease is released \
             when its `worklease run` child exits"
        )));
    }
    let (store_url, store) = args.store.open_existing()?;
    let Some(info) = store.revoke(&args.work_id).await? else {
        return Err(Failure::new(
            exit::NOT_FOUND,
            format!(
                "no lease on {work_id:?} in {}: nothing to release",
                url::redact(&store_url)
            ),
        ));
    };
    let message = if info.expired {
        let ended = info.ended.unwrap_or(if info.released {
            LeaseEnd::Released
        } else {
            LeaseEnd::Expired
        });
        format!(
            "the lease on {work_id:?} had already ended ({}; last holder {:?}, fencing token {}): nothing to revoke\n",
            ended.as_str(),
            info.holder_id,
            info.fencing_token
        )
    } else {
        format!(
            "revoked the lease on {work_id:?} held by {:?} (fencing token {}); its next renewal fails and its child is stopped\n",
            info.holder_id, info.fencing_token
        )
    };
    write_stdout(message.as_bytes())?;
    Ok(0)
}
