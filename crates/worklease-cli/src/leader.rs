//! `worklease leader`: who leads an election, and (`--watch`) every change,
//! for processes and people that never campaign. Reads only
//! ([`worklease::election::observe`]).

use std::time::Duration;

use clap::Args;
use futures_util::StreamExt;
use serde::Serialize;
use worklease::election::{self, State};
use worklease::{Error, WorkId};

use crate::exit::{self, Failure};
use crate::run::default_holder;
use crate::say::say;
use crate::status::{write_stdout, write_stdout_until_closed, StopSignals};
use crate::{parse_election, parse_poll, StoreArg};

/// Shown below `worklease leader --help`.
pub const HELP: &str = "\
Reads only: the election's lease and the record its leader writes (the
value it publishes with `elect --publish`, when its term started, the
transitions so far). Prints one line: the leader, or with --json one JSON
object with the fields election, holder_id, value, fencing_token,
transitions, priority and since (holder_id and the rest null when nobody
leads).
A value that is not UTF-8 (published through the library) is printed with
U+FFFD in place of bad bytes.

Without --watch, an election that nobody leads exits 3 with a message
(with --json, after printing the object with holder_id null).
With --watch: one line now and one per change (a new leader, a new
published value, nobody leading), until SIGINT or SIGTERM (exit 0). A
change is seen at once where the store notifies a release (all but S3),
a new leader within a few round trips after that, and anything else
within --poll. A new leader is shown with its value once it has written
its term's record (one round trip after taking the lease); one that
writes none (a lease not taken by `elect`) is shown without after about
--poll.

--step-down asks the leader to give up instead (it sees the request at
once where the store notifies, within a third of its TTL otherwise): its
`worklease elect` stops the child as on a loss, releases, and stands by
for --backoff before campaigning again, so that a standby takes over.

Examples:
  worklease leader nightly-report
  worklease leader --step-down scheduler
  worklease leader --json --watch scheduler";

/// Arguments of `worklease leader`.
#[derive(Args, Debug)]
pub struct LeaderArgs {
    #[command(flatten)]
    store: StoreArg,

    /// One JSON object per line.
    #[arg(long)]
    json: bool,

    /// Print a line per change until SIGINT (Ctrl-C) or SIGTERM, then exit 0.
    #[arg(long)]
    watch: bool,

    /// Ask the current leader to step down instead: its `worklease elect`
    /// stops its child as on a loss, releases, and campaigns again only
    /// after its --backoff, so that a standby takes over. Prints who was
    /// asked; exits 3 when nobody leads.
    #[arg(long, conflicts_with_all = ["watch", "json"])]
    step_down: bool,

    /// With --watch: how late at most a change the store does not notify
    /// (a published value; a new leader on S3) is seen.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_poll, allow_hyphen_values = true)]
    poll: Duration,

    /// The election (a work ID: 1 to 1014 bytes, no control characters,
    /// not ending with `/step-down`, which names its step-down requests).
    #[arg(value_name = "ELECTION", value_parser = parse_election)]
    election: WorkId,
}

/// One line of `leader --json`.
#[derive(Serialize)]
struct LeaderJson<'a> {
    election: &'a str,
    holder_id: Option<&'a str>,
    value: Option<String>,
    fencing_token: Option<u64>,
    transitions: Option<u64>,
    priority: Option<i32>,
    /// RFC 3339, by the leader's wall clock; null until the new leader has
    /// written its record.
    since: Option<String>,
}

impl<'a> LeaderJson<'a> {
    fn new(election: &'a WorkId, state: Option<&'a State>) -> Self {
        Self {
            election: election.as_str(),
            holder_id: state.map(|s| s.owner.as_str()),
            value: state.and_then(value_text),
            fencing_token: state.map(|s| s.generation),
            transitions: state.map(|s| s.transitions),
            priority: state.map(|s| s.priority),
            since: state
                .and_then(|s| s.since)
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
        }
    }
}

fn value_text(state: &State) -> Option<String> {
    state
        .value
        .as_deref()
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// One line of `leader --json` (also `GET /leader` of `elect
/// --health-addr`), with its newline.
pub fn leader_json(election: &WorkId, state: Option<&State>) -> Result<Vec<u8>, Failure> {
    let mut out = serde_json::to_vec(&LeaderJson::new(election, state))
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
    out.push(b'\n');
    Ok(out)
}

/// One line of output for `state`.
fn line(election: &WorkId, state: Option<&State>, json: bool) -> Result<Vec<u8>, Failure> {
    if json {
        return leader_json(election, state);
    }
    let Some(s) = state else {
        return Ok(format!("election {:?}: nobody leads\n", election.as_str()).into_bytes());
    };
    let mut text = format!(
        "election {:?}: led by {:?}, term (fencing token) {}, transitions {}",
        election.as_str(),
        s.owner,
        s.generation,
        s.transitions
    );
    if s.priority != 0 {
        text.push_str(&format!(", priority {}", s.priority));
    }
    if let Some(since) = s.since {
        text.push_str(&format!(
            ", since {}",
            humantime::format_rfc3339_millis(since)
        ));
    }
    if let Some(v) = value_text(s) {
        text.push_str(&format!(", value {v:?}"));
    }
    text.push('\n');
    Ok(text.into_bytes())
}

/// Exit 3 ([`exit::NO_LEADER`]): nobody leads `election`.
fn no_leader(election: &WorkId) -> Failure {
    Failure::new(
        exit::NO_LEADER,
        format!("election {:?} has no leader", election.as_str()),
    )
}

/// Runs `worklease leader` and returns its exit status.
pub async fn leader(args: LeaderArgs) -> Result<u8, Failure> {
    let (_, store) = args.store.open_existing()?;
    if args.step_down {
        let asked = match election::request_step_down(
            store,
            args.election.as_str(),
            default_holder(),
        )
        .await
        {
            Err(Error::NoLease { .. }) => return Err(no_leader(&args.election)),
            other => other?,
        };
        let text = format!(
            "asked {:?} (term {}) to step down from {:?}\n",
            asked.owner,
            asked.generation,
            args.election.as_str()
        );
        write_stdout(text.as_bytes())?;
        if asked.since.is_none() {
            // No record of this term: a plain lease (or a term a moment
            // old). Nothing of worklease's honours a request there.
            say!(
                "note: {:?} has no election record for term {}: if it is a plain lease \
                 (not held by `worklease elect` or an Elector), nothing honours the request; \
                 `worklease release --force` takes a lease away",
                args.election.as_str(),
                asked.generation
            );
        }
        return Ok(0);
    }
    let mut changes = election::observe(store, args.election.as_str(), args.poll)?;
    if !args.watch {
        let now = changes.next().await.unwrap_or(Ok(None))?;
        let Some(state) = now else {
            // The null object too, so that `leader --json | jq` reads one.
            if args.json {
                write_stdout(&line(&args.election, None, true)?)?;
            }
            return Err(no_leader(&args.election));
        };
        write_stdout(&line(&args.election, Some(&state), args.json)?)?;
        return Ok(0);
    }
    let mut stop = StopSignals::install()?;
    let mut first = true;
    loop {
        let next = tokio::select! {
            _ = stop.recv() => return Ok(0),
            next = changes.next() => next,
        };
        let state = match next.unwrap_or(Ok(None)) {
            Ok(state) => state,
            Err(e) if !first => {
                say!("{} (retrying)", Failure::from(e).message);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        first = false;
        if !write_stdout_until_closed(&line(&args.election, state.as_ref(), args.json)?)? {
            return Ok(0);
        }
    }
}
