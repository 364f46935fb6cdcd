//! `worklease status`: the leases in the store, as a table or JSON Lines.

use std::io::{IsTerminal, Write};

use serde::Serialize;
use worklease::store::{url, ExpiryClock};
use worklease::{LeaseEnd, LeaseInfo, LeaseStore, PreviousHolder};

use crate::exit::{self, Failure};
use crate::run::fmt_secs;
use crate::say::say;
use crate::status_select::Selection;
use crate::StatusArgs;

/// One lease as `status --json` prints it: the eight fields of SPEC §4,
/// then how the lease ended, who held it before, and how the store judges
/// expiry.
#[derive(Serialize)]
struct LeaseJson<'a> {
    work_id: &'a str,
    holder_id: &'a str,
    fencing_token: u64,
    /// `null` for a held lease in a store that judges expiry by
    /// observation: one look cannot tell when it expires.
    expires_at: Option<String>,
    /// False until the lease is known to have ended; in a store that judges
    /// expiry by observation, a held lease counts as expired only once this
    /// process has seen it unchanged for a TTL (`--watch`).
    expired: bool,
    released: bool,
    checkpoint_bytes: usize,
    clean_handoff: bool,
    /// `null` while the lease is live, else `released`, `expired` or
    /// `revoked`.
    ended: Option<&'static str>,
    /// `null` on the first acquisition of the work ID.
    previous_holder: Option<PreviousJson<'a>>,
    /// `by-store-clock` or `by-observation` (see [`expiry_name`]).
    expiry: &'static str,
}

/// How `status` names a store's [`ExpiryClock`].
fn expiry_name(clock: ExpiryClock) -> &'static str {
    match clock {
        ExpiryClock::Store => "by-store-clock",
        ExpiryClock::Observation => "by-observation",
    }
}

/// True for a lease whose end one look cannot tell: held, in a store that
/// judges expiry by observation, and not yet seen unchanged for its TTL.
fn unconfirmed(info: &LeaseInfo, clock: ExpiryClock) -> bool {
    clock == ExpiryClock::Observation && !info.expired
}

/// The holder before the current acquisition, as `status --json` and
/// `checkpoint get --json` print it.
#[derive(Serialize)]
pub struct PreviousJson<'a> {
    holder_id: &'a str,
    fencing_token: u64,
    ended: &'static str,
}

impl<'a> From<&'a PreviousHolder> for PreviousJson<'a> {
    fn from(p: &'a PreviousHolder) -> Self {
        Self {
            holder_id: &p.holder_id,
            fencing_token: p.fencing_token,
            ended: p.ended.as_str(),
        }
    }
}

impl<'a> LeaseJson<'a> {
    /// `info` from a store whose expiry is judged by `clock`.
    fn new(info: &'a LeaseInfo, clock: ExpiryClock) -> Self {
        Self {
            work_id: info.work_id.as_str(),
            holder_id: &info.holder_id,
            fencing_token: info.fencing_token,
            expires_at: (!unconfirmed(info, clock))
                .then(|| humantime::format_rfc3339_millis(info.expires_at).to_string()),
            expired: info.expired,
            released: info.released,
            checkpoint_bytes: info.checkpoint_bytes,
            clean_handoff: info.handoff.is_clean(),
            ended: info.ended.map(LeaseEnd::as_str),
            previous_holder: info.handoff.previous.as_ref().map(PreviousJson::from),
            expiry: expiry_name(clock),
        }
    }
}

/// How often `status --watch` redraws.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Clears a terminal and moves the cursor home (ANSI).
const CLEAR_SCREEN: &[u8] = b"\x1b[H\x1b[2J";

/// Runs `worklease status` and returns its exit status.
pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    if let Some(n) = args.permits {
        return semaphore(args, n).await;
    }
    let selection = Selection::new(&args.work_ids, args.prefix.clone(), args.all, args.sort)?;
    let (store_url, store) = args.store.open_existing()?;
    if args.watch {
        return watch(&args, &selection, &store_url, store.as_ref()).await;
    }
    let leases = leases(store.as_ref(), &selection).await?;
    let out = render(&leases, store.as_ref(), &store_url, args.json)?;
    write_stdout(&out)?;

    if !selection.exact_only() {
        return Ok(0);
    }
    let unknown: Vec<&str> = selection
        .exact()
        .iter()
        .filter(|w| !leases.iter().any(|l| &l.work_id == *w))
        .map(|w| w.as_str())
        .collect();
    if unknown.is_empty() {
        return Ok(0);
    }
    for work_id in unknown {
        say!("no lease on {work_id:?} in the store");
    }
    Ok(exit::NOT_FOUND)
}

/// `status --permits N NAME`: the permits' leases of semaphore NAME, and
/// (in the table) how many of the N are held. Permits never taken are
/// free and not listed: exit 0 whatever is found.
async fn semaphore(mut args: StatusArgs, n: usize) -> Result<u8, Failure> {
    let name = match args.work_ids.as_slice() {
        [name] => name.clone(),
        _ => {
            return Err(Failure::usage(
                "status --permits N takes exactly one WORK_ID: the semaphore's name",
            ))
        }
    };
    if args.watch {
        return Err(Failure::usage("status --permits does not take --watch"));
    }
    args.work_ids = worklease::semaphore::permit_ids(name.as_str(), n)?;
    let selection = Selection::new(&[], None, args.all, args.sort)?;
    let (store_url, store) = args.store.open_existing()?;
    let leases = selection.apply(store.inspect(&args.work_ids).await?);
    let mut out = render(&leases, store.as_ref(), &store_url, args.json)?;
    if !args.json {
        let held = leases.iter().filter(|l| !l.expired).count();
        let line = worklease::semaphore::line_target(name.as_str());
        // A name too long for a fair line has nobody in one.
        let waiting = match worklease::fair::waiters(store.as_ref(), &line).await {
            Ok(w) => w.len(),
            Err(worklease::Error::Invalid(_)) => 0,
            Err(e) => return Err(e.into()),
        };
        out.extend_from_slice(
            format!(
                "semaphore {:?}: {held} of {n} permits held, {waiting} fair waiter(s) in line\n",
                name.as_str()
            )
            .as_bytes(),
        );
    }
    write_stdout(&out)?;
    Ok(0)
}

/// The leases `selection` selects, in its order ([`Selection`]).
async fn leases(store: &dyn LeaseStore, selection: &Selection) -> Result<Vec<LeaseInfo>, Failure> {
    let leases = store.inspect(selection.to_inspect()).await?;
    Ok(selection.apply(leases))
}

/// The table (after a `store:` line, and followed by a note on `held?`
/// when a row has it) or the JSON lines, of `leases` in `store`.
fn render(
    leases: &[LeaseInfo],
    store: &dyn LeaseStore,
    store_url: &str,
    json: bool,
) -> Result<Vec<u8>, Failure> {
    let clock = store.expiry_clock();
    let mut out = Vec::new();
    if json {
        for info in leases {
            let line = serde_json::to_string(&LeaseJson::new(info, clock))
                .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    } else {
        out.extend_from_slice(format!("store: {}\n", url::redact(store_url)).as_bytes());
        if let Some(note) = store_note(store.kind()) {
            out.extend_from_slice(note.as_bytes());
        }
        if leases.is_empty() {
            out.extend_from_slice(b"no leases\n");
        } else {
            out.extend_from_slice(table(leases, clock).as_bytes());
            if leases.iter().any(|l| unconfirmed(l, clock)) {
                out.extend_from_slice(held_note(store.kind()).as_bytes());
            }
        }
    }
    Ok(out)
}

/// `status --watch`: redraws every second until SIGINT or SIGTERM (exit
/// 0) or until the reader of stdout goes away (exit 0). A transient store
/// failure is said on stderr and retried at the next round.
async fn watch(
    args: &StatusArgs,
    selection: &Selection,
    store_url: &str,
    store: &dyn LeaseStore,
) -> Result<u8, Failure> {
    let mut stop = StopSignals::install()?;
    let terminal = std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(WATCH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // SQLite keeps reading a file deleted under it: check that it is still
    // there, or the watch would show a frozen picture.
    let file = match worklease::store::url::parse(store_url) {
        Ok(worklease::store::url::StoreSpec::Sqlite(path)) => Some(path),
        _ => None,
    };
    let mut first = true;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.recv() => return Ok(0),
        }
        if let Some(path) = file.as_ref().filter(|p| !p.exists()) {
            return Err(Failure::new(
                exit::UNAVAILABLE,
                format!("the store file {} is gone", path.display()),
            ));
        }
        let leases = match leases(store, selection).await {
            Ok(leases) => leases,
            Err(failure) if failure.code == exit::UNAVAILABLE && !first => {
                say!("{} (retrying)", failure.message);
                continue;
            }
            Err(failure) => return Err(failure),
        };
        let mut out = Vec::new();
        if !args.json {
            if terminal {
                out.extend_from_slice(CLEAR_SCREEN);
            } else if !first {
                out.push(b'\n');
            }
        }
        out.extend(render(&leases, store, store_url, args.json)?);
        first = false;
        if !write_stdout_until_closed(&out)? {
            return Ok(0);
        }
    }
}

/// SIGINT and SIGTERM, which end the `--watch` modes (`status`, `leader`)
/// with exit 0.
pub struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers.
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install a handler for {name}: {e}"),
                )
            })
        };
        Ok(Self {
            int: install(SignalKind::interrupt(), "SIGINT")?,
            term: install(SignalKind::terminate(), "SIGTERM")?,
        })
    }

    /// Completes at the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Writes `bytes` to stdout. A reader that went away (`| head`) is not an
/// error; any other write failure is [`exit::IO`].
pub fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    write_stdout_until_closed(bytes).map(|_| ())
}

/// As [`write_stdout`]; false when the reader went away.
pub fn write_stdout_until_closed(bytes: &[u8]) -> Result<bool, Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Failure::new(
            exit::IO,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

/// What the table says below itself when a row is `held?`, for a store
/// of kind `kind` that judges expiry by observation.
/// What a store does not do that a reader of `status` should know.
fn store_note(kind: &str) -> Option<&'static str> {
    (kind == "mysql").then_some(
        "note: the mysql store has no notifications: waiters poll (every 2 s by default), \
         so a released lease passes to a waiter at its next poll\n",
    )
}

fn held_note(kind: &str) -> String {
    format!(
        "held?: held when last written. The {kind} store judges expiry by observation, so one \
         look cannot tell whether its holder still renews; status --watch shows such a lease \
         expired once it has seen it unchanged for a TTL, and run --wait takes it over then.\n"
    )
}

fn expires(info: &LeaseInfo, clock: ExpiryClock) -> String {
    if let Some(ended) = info.ended {
        ended.as_str().to_string()
    } else if info.expired {
        "expired".to_string()
    } else if unconfirmed(info, clock) {
        "held?".to_string()
    } else {
        match info.expires_in {
            Some(d) => fmt_secs(d),
            None => "live".to_string(),
        }
    }
}

fn handoff(info: &LeaseInfo) -> String {
    match &info.handoff.previous {
        None => "- (first holder)".to_string(),
        Some(p) if p.ended == LeaseEnd::Released => "yes".to_string(),
        Some(p) => format!("no ({})", p.ended.as_str()),
    }
}

/// A work or holder ID as a table cell: as it is, or quoted (Rust string
/// syntax, as the error messages write IDs) where whitespace or a leading
/// quote would make it look like another ID (`a/permit/line ` beside the
/// reserved `a/permit/line`) or split the column.
fn cell(id: &str) -> String {
    if id.is_empty() || id.starts_with('"') || id.chars().any(char::is_whitespace) {
        format!("{id:?}")
    } else {
        id.to_string()
    }
}

/// The leases as an aligned table with a header.
fn table(leases: &[LeaseInfo], clock: ExpiryClock) -> String {
    let header = [
        "WORK ID",
        "HOLDER",
        "FENCING TOKEN",
        "EXPIRES IN",
        "CHECKPOINT",
        "CLEAN HAND-OFF",
    ];
    let rows: Vec<[String; 6]> = leases
        .iter()
        .map(|info| {
            [
                cell(info.work_id.as_str()),
                cell(&info.holder_id),
                info.fencing_token.to_string(),
                expires(info, clock),
                format!("{} B", info.checkpoint_bytes),
                handoff(info),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if i + 1 < cells.len() {
                text.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(&text);
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};
    use worklease::{Handoff, PreviousHolder, WorkId};

    fn info(work_id: &str, released: bool, expired: bool) -> LeaseInfo {
        LeaseInfo {
            work_id: WorkId::new(work_id).unwrap(),
            holder_id: "host:1".to_string(),
            fencing_token: 7,
            expires_at: UNIX_EPOCH + Duration::from_millis(1_767_225_600_123),
            expires_in: (!expired).then(|| Duration::from_millis(4200)),
            expired,
            released,
            ended: if released {
                Some(LeaseEnd::Released)
            } else {
                expired.then_some(LeaseEnd::Expired)
            },
            checkpoint_bytes: 12,
            handoff: Handoff {
                previous: Some(PreviousHolder {
                    holder_id: "host:0".to_string(),
                    fencing_token: 6,
                    ended: LeaseEnd::Released,
                }),
            },
        }
    }

    #[test]
    fn json_has_the_spec_fields_and_how_the_lease_ended() {
        let i = info("job", false, false);
        let v: serde_json::Value =
            serde_json::to_value(LeaseJson::new(&i, ExpiryClock::Store)).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "checkpoint_bytes",
                "clean_handoff",
                "ended",
                "expired",
                "expires_at",
                "expiry",
                "fencing_token",
                "holder_id",
                "previous_holder",
                "released",
                "work_id"
            ]
        );
        assert_eq!(v["expires_at"], "2026-01-01T00:00:00.123Z");
        assert_eq!(v["expiry"], "by-store-clock");
        assert_eq!(v["clean_handoff"], true);
        assert_eq!(v["ended"], serde_json::Value::Null);
        assert_eq!(
            v["previous_holder"],
            serde_json::json!({"holder_id": "host:0", "fencing_token": 6, "ended": "released"})
        );

        let mut revoked = info("job", false, true);
        revoked.ended = Some(LeaseEnd::Revoked);
        revoked.handoff.previous = None;
        let v = serde_json::to_value(LeaseJson::new(&revoked, ExpiryClock::Store)).unwrap();
        assert_eq!(v["ended"], "revoked");
        assert_eq!(v["previous_holder"], serde_json::Value::Null);
        assert_eq!(v["clean_handoff"], false);
    }

    #[test]
    fn table_is_aligned_and_readable() {
        let t = table(
            &[info("a-long-work-id", false, false), info("b", true, true)],
            ExpiryClock::Store,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("WORK ID         HOLDER"), "{t}");
        assert!(
            lines[1].contains("4.2s") && lines[1].contains("12 B") && lines[1].ends_with("yes"),
            "{t}"
        );
        assert!(lines[2].contains("released"), "{t}");
        let col = lines[0].find("HOLDER").unwrap();
        assert_eq!(lines[1].find("host:1"), Some(col), "{t}");
        assert_eq!(lines[2].find("host:1"), Some(col), "{t}");
    }

    #[test]
    fn ids_with_whitespace_are_quoted_in_the_table() {
        let t = table(
            &[
                info("a/permit/line ", false, false),
                info("b c", false, false),
            ],
            ExpiryClock::Store,
        );
        assert!(t.contains("\"a/permit/line \"  host:1"), "{t}");
        assert!(t.contains("\"b c\""), "{t}");
        assert_eq!(cell("jobs/7"), "jobs/7");
        assert_eq!(cell("\"x"), "\"\\\"x\"");
    }

    /// A store that judges expiry by observation (a register, as S3): a
    /// held lease is `held?` with a note under the table, and in JSON has
    /// no `expires_at`; ended leases show as in any store.
    #[tokio::test]
    async fn a_lease_judged_by_observation_is_held_unconfirmed() {
        use worklease::store::register::{MemoryRegister, RegisterStore};
        use worklease::HolderId;
        let store = RegisterStore::new(MemoryRegister::new());
        let (held, released) = (WorkId::new("held").unwrap(), WorkId::new("rel").unwrap());
        let holder = HolderId::new("vm:1").unwrap();
        let ttl = Duration::from_secs(4);
        store.acquire(&held, &holder, ttl).await.unwrap();
        let grant = store.acquire(&released, &holder, ttl).await.unwrap();
        store
            .release(worklease::store::LeaseRef {
                work_id: &released,
                holder_id: &holder,
                fencing_token: grant.fencing_token,
            })
            .await
            .unwrap();
        let all = Selection::new(&[], None, true, Default::default()).unwrap();
        let leases = leases(&store, &all).await.unwrap();

        let text = String::from_utf8(render(&leases, &store, "memory:", false).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("held ") && lines[2].contains("held?"),
            "{text}"
        );
        assert!(!lines[2].contains("live"), "{text}");
        assert!(lines[3].contains("released"), "{text}");
        assert!(
            lines[4].starts_with("held?: ")
                && lines[4].contains("memory-register store judges expiry by observation"),
            "{text}"
        );

        let json = render(&leases, &store, "memory:", true).unwrap();
        let rows: Vec<serde_json::Value> = json
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(rows[0]["work_id"], "held");
        assert_eq!(rows[0]["expires_at"], serde_json::Value::Null);
        assert_eq!(rows[0]["expired"], false);
        assert_eq!(rows[0]["expiry"], "by-observation");
        assert_eq!(rows[1]["work_id"], "rel");
        assert!(rows[1]["expires_at"].is_string(), "{}", rows[1]);
        assert_eq!(rows[1]["expiry"], "by-observation");

        // A store with a clock never says held? nor adds the note.
        let memory = worklease::store::memory::MemoryStore::new();
        memory.acquire(&held, &holder, ttl).await.unwrap();
        let all = Selection::new(&[], None, true, Default::default()).unwrap();
        let leases = super::leases(&memory, &all).await.unwrap();
        let text = String::from_utf8(render(&leases, &memory, "memory:", false).unwrap()).unwrap();
        assert!(!text.contains("held?"), "{text}");
    }
}
