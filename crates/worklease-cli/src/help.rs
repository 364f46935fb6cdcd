//! The help texts of `worklease` and its subcommands (`--help` after the
//! options, and the man pages' DETAILS sections), beside the command-line
//! definitions of `main.rs`.

pub const ABOUT: &str =
    "Run commands under distributed work leases: at most one holder per work ID, \
fencing tokens, checkpoints handed from one holder to the next.";

pub const MAIN_HELP: &str = "\
Examples:
  # Run the nightly report in one process at a time; the others exit 75.
  # (The default SQLite store coordinates the processes of one host; across
  # machines, all of them need one networked store such as PostgreSQL or Redis.)
  worklease run nightly-report -- ./report.sh

  # Queue up instead: wait until the current holder is done or dies.
  worklease run --wait nightly-report -- ./report.sh

  # Inside the child: save progress, and read it back after a crash.
  worklease checkpoint set \"page 7\"
  worklease checkpoint get

  # A fleet shares 12 shards: run this on every machine; each runs its
  # share, one child per shard (the shard in WORKLEASE_WORK_ID).
  worklease pool --work-ids shard-0,shard-1,...,shard-11 -- ./process-shard.sh

  # Who holds what?
  worklease status

Store: --store URL, else WORKLEASE_STORE, else `store = \"URL\"` in the
configuration: /etc/worklease/config.toml, overridden key by key by
$XDG_CONFIG_HOME/worklease/config.toml (else ~/.config/worklease/config.toml),
or WORKLEASE_CONFIG=FILE alone; `require_shared_store = true` (or
--require-shared-store, WORKLEASE_REQUIRE_SHARED_STORE) makes run, elect and
pool refuse a per-host store (exit 78). Across machines:
postgres://user@host:5432/db?table=worklease_leases,
mysql://user@host:3306/db?table=worklease_leases (or mariadb://; waiters poll),
redis://host:6379/0?prefix=worklease: (rediss://...&cacert=PATH[&cert=PATH&key=PATH]
for TLS; redis+sentinel://S1:26379,S2:26379/PRIMARY?prefix=...;
redis+cluster://H1:7000,H2:7001?prefix=...), etcd://host:2379,host:2379?prefix=worklease/
(etcds://...&cacert=PATH[&cert=PATH&key=PATH] for TLS)
s3://BUCKET/PREFIX?endpoint=URL&region=REGION or
dynamodb://TABLE?region=REGION&prefix=P[&create=true] (endpoint and region
optional; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or
another AWS_* source), or azblob://CONTAINER/PREFIX?account=NAME (credentials
from the AZURE_* variables); these judge expiry by observation, see
`status --help`.
Passwords are never printed. On one host: sqlite:PATH; the default is the SQLite file
$WORKLEASE_HOME/leases.db, else $XDG_DATA_HOME/worklease/leases.db, else
$HOME/.local/share/worklease/leases.db, else /var/lib/worklease/leases.db.
status, release and checkpoint never create a store: a missing SQLite file or
PostgreSQL/MySQL table is an error (exit 69).
Logs go to stderr (warnings by default; -v debug, -vv trace, -q errors only, or RUST_LOG;
--log-format json for one JSON object per line). run, elect and pool serve Prometheus metrics
with --metrics-addr 127.0.0.1:PORT (docs/metrics.md).
";

pub const RUN_HELP: &str = "\
The child gets WORKLEASE_WORK_ID, WORKLEASE_HOLDER_ID, WORKLEASE_FENCING_TOKEN,
WORKLEASE_TOKEN and WORKLEASE_STORE. It runs in its own process group; SIGINT,
SIGTERM, SIGHUP and SIGQUIT are forwarded to it, each followed by SIGCONT (so
that a stopped child acts on it), and so are SIGUSR1 and SIGUSR2. If stdin is
a terminal, the child gets /dev/null as stdin instead (reading the terminal
from its own process group would stop it while it holds the lease); input
through a pipe or a file reaches it as usual.

The lease is renewed every TTL/3 and released when the child exits. Processes
the child left running in its process group get SIGTERM, then SIGKILL after
--grace, before the lease is released.

The child is gone by the lease deadline: this holder counts the lease as its
own until the send time of its last successful renewal + TTL - TTL/10; after
that another holder may take it. While renewals fail, the child's process
group gets SIGTERM once less than --grace is left before that deadline, and
SIGKILL at the deadline (a renewal that succeeds meanwhile cancels the
SIGKILL). If the lease is taken away (revoked with `release --force`, taken
over, expired), the group gets SIGTERM at once and SIGKILL after --grace. Then
run exits 76. --grace defaults to TTL/4, at most 10s, and may not exceed TTL/2.
A renewal is sent TTL/3 after the last one, when 0.9 TTL - TTL/3 is left
before the deadline: one that has not succeeded --grace before the deadline
counts as failing. The default leaves a renewal 0.3 TTL or more to answer; a
--grace of TTL/2 only TTL/15.

Job control: Ctrl-Z (SIGTSTP; also SIGTTIN, SIGTTOU) stops the child's process
group, then worklease. On SIGCONT (fg, bg) the child continues if the lease is
still live; if its deadline passed meanwhile, the child's group gets SIGKILL
and run exits 76. A plain SIGSTOP of worklease cannot be caught: the child
runs on while worklease cannot renew, and the lease expires under it; the
fencing token is the guard then (`worklease checkpoint set` with the stale
token is refused with 76; pass WORKLEASE_FENCING_TOKEN to downstream writes).

With --permits N, WORK_ID names a semaphore: run holds any one of its N
permits (work IDs WORK_ID/permit/0 .. WORK_ID/permit/N-1), so at most N such
commands run at once across the fleet; the child's WORKLEASE_WORK_ID and
WORKLEASE_FENCING_TOKEN are its permit's (fence downstream writes per
permit). Without --wait, run exits 75 while all N are held. Every process of
one semaphore should give the same N: a smaller N takes effect as permits
are released (holders above it are not cut off), a larger one at once.

With --wait, a waiter is woken at once by a release or revocation on stores
with notifications (PostgreSQL, Redis, etcd, and SQLite also across
processes on one host, through the database file), and retries every --poll
otherwise. An expired lease is taken within TTL + --poll. An s3://
store has no clock and judges expiry by observation: without --wait, run
cannot say when the holder's lease expires; with --wait, a lease whose holder
stopped renewing is taken once the waiter has seen it unchanged for the
holder's TTL, that is within TTL + --poll of its last renewal or of the start
of the wait, whichever is later.

From cron on every host of a fleet: name the shared store in
/etc/worklease/config.toml (store = \"postgres://...\"), or every host uses its
own SQLite file (a warning says so; --require-shared-store refuses it), and
run with --if-held=ok (the losers exit 0 in silence) and --once (a late cron
skips a job that finished); --metrics-file writes the run's metrics at exit.

Exit status: the child's (128+N if signal N ended it); 0 also when skipped
(--if-held=ok, --once); 75 held by another (without --wait); 76 lease lost;
64 usage error; 69 store failure; 77 the SQLite store file is refused
(another user could write it, or it is not a regular file); 78 configuration
(a bad configuration file, or a per-host store where a shared one is
required); 126/127 the command cannot be run / was not found. The
child may exit with 64, 69, 75 or 76 itself. When the status is worklease's own, the last line
worklease writes to stderr starts with `worklease:` and says why (for 76:
`worklease: exit 76: ...`, with the child's own status); when it is the
child's, worklease writes no such line after the child ended (its log lines
start with a timestamp; `worklease checkpoint` run by the child writes
`worklease:` lines of its own, before the child ends).

Examples:
  worklease run nightly-report -- ./report.sh --date today
  worklease run --wait --poll 500ms --ttl 30s shard-7 -- ./process-shard 7
  worklease run --store sqlite:/srv/leases.db --holder web-1 migrate -- ./migrate.sh
  worklease run job -- sh -c 'echo \"token $WORKLEASE_FENCING_TOKEN\"; ./work'
  worklease run --if-held=ok --once nightly/$(date -u +\\%F) -- ./nightly.sh   # in a crontab
";

pub const ELECT_HELP: &str = "\
Campaigns in ELECTION (a work ID) and runs CMD only while this process leads.
Candidates retry every --poll until the leader steps down or its lease
expires. The leader's generation (its fencing token, larger with every change
of leader) is in WORKLEASE_FENCING_TOKEN; the child gets the same WORKLEASE_*
environment as under `run`. When the child exits, leadership is released: with
SQLite (also in another process), PostgreSQL, Redis and etcd, a standby is
woken at once; on S3 at its next poll; after a crash, within TTL + --poll.

The child is supervised as under `run` (see `worklease run --help`): forwarded
signals, Ctrl-Z and SIGCONT, stdin /dev/null when it is a terminal, leftover
processes stopped before the release. While renewals fail, the child's process
group gets SIGTERM once less than --grace is left before the lease deadline
and SIGKILL at it; if leadership is taken away (revoked, taken over), SIGTERM
at once and SIGKILL after --grace; then elect exits 76. --grace defaults to
TTL/4, at most 10s, and may not exceed TTL/2. A plain SIGSTOP of elect cannot
be caught: the fencing token (the generation) is the guard then.

Exit status: the child's (128+N if signal N ended it); 76 leadership lost;
128+N a signal ended the campaign; 64 usage error; 69 store failure; 77 the
SQLite store file is refused (another user could write it, or it is not a
regular file); 78 configuration (a bad configuration file, or a per-host
store where a shared one is required). When the status is elect's own, its last line on stderr
starts with `worklease:` (for 76: `worklease: exit 76: ...`, with the
child's own status), as under `run`.

Examples:
  # On every node: exactly one runs the scheduler; if it dies, another takes over.
  worklease elect --ttl 10s scheduler -- ./scheduler --generation-from-env
  worklease elect --store sqlite:/srv/leases.db --holder node-1 compactor -- ./compact
";

pub const POOL_HELP: &str = "\
Shares the work IDs between the pool processes of one --pool-name (on one
host with SQLite; across machines with a networked store): each holds a
membership lease <NAME>/members/<HOLDER> and, every TTL/3, takes its share
of the work IDs not done yet (W of them over n live pools: ceil(W/n) or
floor(W/n) each), gives back its surplus and takes free work IDs. A pool
starts its first commands one round (TTL/3) after it starts: it first
writes its membership, so that pools started together each start only
their share. Give every pool of one name the same work IDs; pools over
other sets need another name.

Work IDs and their checkpoints are global, not scoped by --pool-name (only
<NAME>/members/ and <NAME>/done/ are): give each run its own work IDs, e.g.
--work-ids reindex-2024-06/shard-0,reindex-2024-06/shard-1,... A work ID
reused from an earlier run resumes from that run's checkpoint (complete, if
it finished). One reuse is refused (64, nothing written): a work ID that a
pool of another name recorded done.

For each work ID it holds, the pool runs CMD in its own process group with
the environment of `worklease run` (WORKLEASE_WORK_ID, WORKLEASE_HOLDER_ID,
WORKLEASE_FENCING_TOKEN, WORKLEASE_TOKEN, WORKLEASE_STORE) and stdin
/dev/null; stdout and stderr are the pool's. Inside, `worklease checkpoint
get|set` read and save that work ID's progress.

When the child exits:
  0 (on its own, lease held)  the work ID is done: the pool records it as
                              <NAME>/done/<WORK_ID> and releases it; no pool
                              of that name runs CMD for it again
  non-zero, or a signal       the work ID is released and CMD started again
                              after --backoff (here, or at once elsewhere)
A child the pool stops is never done, whatever its status: when its lease
is lost (SIGTERM at once, SIGKILL after --grace, at the lease deadline at
the latest), when its work ID is handed to another pool for balance
(SIGTERM, SIGKILL after --grace, then a clean release), and on shutdown.
SIGINT, SIGTERM, SIGHUP or SIGQUIT to the pool: that signal to every child's
group, SIGKILL after --grace, every work ID released, exit 128+N. SIGUSR1 and
SIGUSR2 are forwarded to every child; Ctrl-Z stops them all, then the pool.
If the pool dies, its children get SIGKILL and the other pools take its work
IDs over within TTL + 2 rounds. Every round reads the done records before
acquiring anything: a done work ID is never taken again (its lease keeps
the holder and fencing token that finished it) and leaves the shares. The
children's stdout and stderr are all the pool's, interleaved. `worklease
status` shows the members, who holds each work ID and the done records.

Exactly once: one child at a time per work ID, each work ID done once. A
killed child's successor resumes from the last checkpoint and may redo what
came after it: make CMD idempotent given its checkpoint, and exit 0 at once
when its checkpoint says it is complete (a pool that died right after its
child exited 0 leaves that work ID to run once more). Done records stay, as
checkpoints do: to run the same work again, use new work IDs (and a new
--pool-name).

Exit status: 0 every work ID is done; 128+N a signal stopped the pool; 64
usage error (no work IDs, more than 100000, a duplicate or invalid one, an
empty or invalid --pool-name, no command, a work ID done by a pool of
another name); 69 store failure; 70 a work ID failed for good; 77 the SQLite
store file is refused (another user could write it, or it is not a regular
file); 78 configuration (a bad configuration file, or a per-host store where
a shared one is required); 126/127 CMD cannot be executed / was not found
(every child is stopped first).

Examples:
  worklease pool --work-ids shard-0,shard-1,shard-2,shard-3 -- ./process-shard.sh
  worklease pool --store postgres://wl@db/leases --ttl 30s --work-ids-file shards.txt -- ./consume
  worklease pool --pool-name nightly-2024-06-01 \\
      --work-ids nightly-2024-06-01/a,nightly-2024-06-01/b -- sh -c './work \"$WORKLEASE_WORK_ID\"'
";

pub const STATUS_HELP: &str = "\
Columns: work ID, holder, fencing token, expires in (or expired, released,
revoked, held?), checkpoint size, and whether the last hand-off was clean (the
holder before released). --json prints one JSON object per lease per line with
the fields work_id, holder_id, fencing_token, expires_at (RFC 3339), expired,
released, checkpoint_bytes, clean_handoff, ended (null while live, else
released, expired or revoked), previous_holder (null on the first acquisition,
else {holder_id, fencing_token, ended}) and expiry (by-store-clock or
by-observation).

held? (expiry by-observation, expires_at null): the store has no clock (s3://)
and judges expiry by observation: a lease counts as expired only once it has
been seen unchanged for a full TTL, so one look cannot tell whether a held
lease's holder still renews, and such a lease shows expired: false even if its
holder died. status --watch keeps looking and shows it expired one TTL after
its first look; run --wait takes it over then.

status never creates a store: a SQLite file that does not exist is an error.

--watch redraws every second until SIGINT (Ctrl-C) or SIGTERM, then exits 0:
on a terminal the screen is cleared before each table; otherwise a blank line
separates the tables. With --json, one batch of JSON lines per second. A work
ID named but unknown is left out while watching (it may appear later).

Exit status: 0; 4 when a named work ID is unknown; 64 usage error; 69 store
failure (also: no store at the path).

Examples:
  worklease status
  worklease status nightly-report shard-7
  worklease status --watch
  worklease status --json | jq 'select(.expired | not) | .work_id'
      (leases not known to have ended: on s3://, also held? ones)
";

pub const CHECKPOINT_HELP: &str = "\
Run inside `worklease run`: the token and store come from WORKLEASE_TOKEN and
WORKLEASE_STORE. A checkpoint also renews the lease. A checkpoint from a stale
token (the lease expired or was taken over) writes nothing and exits 76. A
store that does not exist is an error (69); none is created.

Examples:
  worklease checkpoint set \"page 7\"
  tar c state/ | worklease checkpoint set
  worklease checkpoint get > state.bin
  worklease checkpoint get --json
";

pub const SET_HELP: &str = "\
Exit status: 0 saved; 76 stale token (the lease expired or was taken over:
nothing was written); 64 usage error (no token, malformed token, checkpoint
over the 1 MiB limit); 69 store failure; 74 reading stdin failed.

Examples:
  worklease checkpoint set \"page 7\"
  printf 'offset=%d' \"$n\" | worklease checkpoint set
  worklease checkpoint set < state.bin
";

pub const GET_HELP: &str = "\
Writes the checkpoint's raw bytes to stdout (nothing when there is none) and
one line to stderr: its size, whether the hand-off was clean (the previous
holder released) and who held the lease before. With --json, prints instead
one JSON object: work_id, fencing_token, checkpoint_bytes, checkpoint_base64
(the data in standard base64, null when there is no checkpoint),
checkpoint_text (the data as a string when it is UTF-8, else null),
clean_handoff, and previous_holder ({holder_id, fencing_token, ended} with
ended one of released/expired/revoked; null on the first acquisition).

--work-id ID: an operator's read of any work ID's last checkpoint, without a
token and whatever its lease's state (live, released, expired, revoked);
writes nothing. The raw bytes go to stdout and a line to stderr; with
--json, one object: work_id, holder_id, fencing_token, state (live, held on
a store judging expiry by observation, released, expired or revoked),
checkpoint_bytes, checkpoint_base64, checkpoint_text, clean_handoff and
previous_holder. A work ID the store does not know exits 4.

Exit status: 0; 4 unknown work ID (--work-id); 76 stale token; 64 usage
error; 69 store failure.

Examples:
  worklease checkpoint get > state.bin
  worklease checkpoint get --work-id nightly-report --json
  page=$(worklease checkpoint get 2>/dev/null)
  worklease checkpoint get --json | jq -r .checkpoint_text
";

pub const RELEASE_HELP: &str = "\
Ends the current lease on WORK_ID at once, whoever holds it: an operator's
tool for a stuck holder. The next acquirer may start at once, while the
revoked holder learns of it from the store's notification (milliseconds on
PostgreSQL, Redis, etcd and SQLite; with 100,000 leases on SQLite about two
seconds) or at its next renewal (within TTL/3; S3) and then stops its
child: for that window two children can run. Downstream writes
fenced by the fencing token reject the revoked one. The holder's next renewal fails, so `worklease run`
stops its child (SIGTERM, then SIGKILL after --grace) and exits 76; the next
acquirer sees an unclean hand-off (revoked). The checkpoint is kept.
A holder releases its own lease by ending: `worklease run` releases when its
child exits. release never creates a store.

Exit status: 0 revoked (or already ended); 4 unknown work ID; 64 usage error
(also without --force); 69 store failure (also: no store at the path).

Examples:
  worklease release --force nightly-report
  worklease release --force --store sqlite:/srv/leases.db shard-7
";
