//! `worklease gc`: an operator deletes the records of leases that ended
//! long ago ([`worklease::gc::collect`]), never a live lease and never
//! lowering a fencing token.

use std::time::{Duration, SystemTime};

use clap::Args;
use serde::Serialize;
use worklease::gc::{collect, GcOptions, GcReport};
use worklease::store::url;
use worklease::{LeaseEnd, LeaseInfo};

use crate::exit::{self, Failure};
use crate::status::write_stdout;
use crate::StoreArg;
use worklease_cli::values::parse_duration;

/// Shown below `worklease gc --help`.
pub const HELP: &str = "\
Deletes the records of leases that ended at least --older-than ago:
released, revoked and expired leases with their checkpoints, a pool's
membership and done records (a pool's work ID whose done record is
deleted counts as not done again: choose an age longer than a pool runs),
and worklease's own internal records once they ended. A live lease is
never deleted: each deletion is one atomic step of the store, conditional
on the lease listed and decided by the store's own clock, so a lease
acquired meanwhile stays. Fencing tokens never go down: the next
acquisition of a deleted work ID gets a token larger than every earlier
one (the store's fencing sequence or fencing floor outlives the record).

The age is the time since the lease ended (its release, revocation or
expiry) by the wall clock: bookkeeping only, never used to decide whether
a lease is live. Stores that judge expiry by observation (s3://,
dynamodb://) delete only released and revoked leases; azblob:// has no
conditional delete, and gc refuses there (exit 69).

Prints one line per work ID deleted (with --dry-run: that would be
deleted), then a count. With --json, one JSON object instead: dry_run,
count, changed (ended leases that changed before their deletion and were
kept), kept (live or too young), and leases: [{work_id, holder_id,
fencing_token, ended, ended_at (RFC 3339)}].

Exit status: 0 (also when nothing was old enough); 64 usage error; 69
store failure (also: no store at the path; the leases deleted before the
failure stay deleted, and running again is safe).

Examples:
  worklease gc --older-than 30d
  worklease gc --older-than 7d --prefix nightly- --dry-run
  # crontab: every night at 03:17
  17 3 * * * worklease gc --older-than 30d --store postgres://wl@db/leases";

/// Arguments of `worklease gc`.
#[derive(Args, Debug)]
pub struct GcArgs {
    #[command(flatten)]
    store: StoreArg,

    /// Delete leases that ended at least this long ago, e.g. 30d, 12h, 0s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Duration,

    /// Only work IDs starting with these bytes (a plain prefix, no pattern).
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,

    /// Delete nothing: print what would be deleted.
    #[arg(long)]
    dry_run: bool,

    /// Print one JSON object instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct GcJson<'a> {
    dry_run: bool,
    count: usize,
    changed: usize,
    kept: usize,
    leases: Vec<LeaseJson<'a>>,
}

#[derive(Serialize)]
struct LeaseJson<'a> {
    work_id: &'a str,
    holder_id: &'a str,
    fencing_token: u64,
    ended: &'static str,
    ended_at: String,
}

/// How a collected lease ended.
fn ended(info: &LeaseInfo) -> &'static str {
    info.ended.unwrap_or(LeaseEnd::Expired).as_str()
}

/// Runs `worklease gc` and returns its exit status.
pub async fn gc(args: GcArgs) -> Result<u8, Failure> {
    let (store_url, store) = args.store.open_existing()?;
    let options = GcOptions {
        older_than: args.older_than,
        prefix: args.prefix.clone(),
        dry_run: args.dry_run,
    };
    let report = collect(&*store, &options).await.map_err(|e| {
        let code = exit::code_of(&e);
        Failure::new(
            code,
            format!("gc of {} stopped: {e}", url::redact(&store_url)),
        )
    })?;
    let out = if args.json {
        json(&report, args.dry_run)?
    } else {
        text(&report, args.dry_run, args.older_than)
    };
    write_stdout(out.as_bytes())?;
    Ok(0)
}

fn json(report: &GcReport, dry_run: bool) -> Result<String, Failure> {
    let object = GcJson {
        dry_run,
        count: report.collected.len(),
        changed: report.changed,
        kept: report.kept,
        leases: report
            .collected
            .iter()
            .map(|l| LeaseJson {
                work_id: l.work_id.as_str(),
                holder_id: &l.holder_id,
                fencing_token: l.fencing_token,
                ended: ended(l),
                ended_at: humantime::format_rfc3339_millis(l.expires_at).to_string(),
            })
            .collect(),
    };
    let mut line = serde_json::to_string(&object)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
    line.push('\n');
    Ok(line)
}

fn text(report: &GcReport, dry_run: bool, older_than: Duration) -> String {
    let verb = if dry_run { "would delete" } else { "deleted" };
    let now = SystemTime::now();
    let mut out = String::new();
    for l in &report.collected {
        let age = now
            .duration_since(l.expires_at)
            .map(|d| Duration::from_secs(d.as_secs()))
            .unwrap_or_default();
        out.push_str(&format!(
            "{verb} {:?} ({}, holder {:?}, fencing token {}, ended {} ago)\n",
            l.work_id.as_str(),
            ended(l),
            l.holder_id,
            l.fencing_token,
            humantime::format_duration(age)
        ));
    }
    out.push_str(&format!(
        "{verb} {} ended lease(s); kept {} (live or ended less than {} ago){}\n",
        report.collected.len(),
        report.kept,
        humantime::format_duration(older_than),
        if report.changed > 0 {
            format!(
                "; {} changed before their deletion and were kept",
                report.changed
            )
        } else {
            String::new()
        }
    ));
    out
}
