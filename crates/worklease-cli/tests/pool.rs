//! End-to-end tests of `worklease pool`: real pool processes and real
//! children over a SQLite file in a temporary directory.
//!
//! Synchronisation is by what the processes leave behind (the store as
//! `worklease status --json` shows it, files the children write, exit
//! statuses), polled in bounded loops; no sleep stands in for an event.

mod common;
use common::{group_stopped, holder_script, poll_until, process_gone, stopped, World, LONG};

use std::collections::{BTreeMap, BTreeSet};

use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

/// The TTL of every pool here: short, so that a takeover is quick.
const TTL: Duration = Duration::from_secs(2);
const SHARDS: usize = 12;
const POOLS: [&str; 3] = ["pool-a", "pool-b", "pool-c"];

/// A pool's round interval: the renewal interval, TTL/3.
fn round() -> Duration {
    TTL / 3
}

fn shard(i: usize) -> String {
    format!("shard-{i:02}")
}

fn all_shards() -> Vec<String> {
    (0..SHARDS).map(shard).collect()
}

/// One test's world (the store in a temporary directory), with the
/// pool-specific helpers below.
type Fleet = World;

impl World {
    /// Starts `worklease pool -v --holder HOLDER ARGS -- sh SCRIPT` with
    /// `env` added; its stderr goes to `$D/<holder>.stderr`.
    fn pool(&self, holder: &str, extra: &[&str], script: &str, env: &[(&str, &str)]) -> Running {
        let script = self.path(script);
        let mut args = vec!["pool", "-v", "--holder", holder];
        args.extend_from_slice(extra);
        args.extend(["--", "sh", script.to_str().expect("a UTF-8 path")]);
        let stderr =
            std::fs::File::create(self.path(&format!("{holder}.stderr"))).expect("stderr file");
        self.cmd(&args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map(Running)
            .expect("spawn worklease pool")
    }

    /// Every lease in the store (`status --json`); none before the store
    /// exists.
    fn status(&self) -> Vec<Value> {
        let out = self.cmd(&["status", "--json"]).output().expect("status");
        if !out.status.success() {
            return Vec::new();
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// The text of `name`, empty while it does not exist.
    fn read_or_empty(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn write_script(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).expect("write the script");
    }
}

/// A pool process, SIGKILLed (and its children with it) if the test ends
/// first.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn field<'a>(lease: &'a Value, name: &str) -> &'a Value {
    lease.get(name).unwrap_or(&Value::Null)
}

fn work_id(lease: &Value) -> &str {
    field(lease, "work_id").as_str().unwrap_or("")
}

fn holder(lease: &Value) -> &str {
    field(lease, "holder_id").as_str().unwrap_or("")
}

fn live(lease: &Value) -> bool {
    field(lease, "expired") == &Value::Bool(false)
}

/// Holder → the shards whose lease it holds live now.
fn live_shards(status: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_holder: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for l in status
        .iter()
        .filter(|l| live(l) && work_id(l).starts_with("shard-"))
    {
        by_holder
            .entry(holder(l).to_string())
            .or_default()
            .insert(work_id(l).to_string());
    }
    by_holder
}

/// Shard → the done record `<name>/done/<shard>`.
fn done_records<'a>(status: &'a [Value], name: &str) -> BTreeMap<String, &'a Value> {
    let prefix = format!("{name}/done/");
    status
        .iter()
        .filter_map(|l| Some((work_id(l).strip_prefix(&prefix)?.to_string(), l)))
        .collect()
}

fn lease<'a>(status: &'a [Value], id: &str) -> Option<&'a Value> {
    status.iter().find(|l| work_id(l) == id)
}

/// How many children of `parent` run (zombies left out).
fn running_children(parent: u32) -> usize {
    let parent = parent.to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...; comm may hold spaces and ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.get(1) == Some(&parent.as_str()) && !matches!(f.first(), Some(&("Z" | "X")))
        })
        .count()
}

fn pid(child: &Child) -> i32 {
    i32::try_from(child.id()).expect("a pid")
}

fn signal(child: &Child, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid(child)), sig).expect("send a signal");
}

/// Waits (bounded) for every pool to exit; their statuses by holder.
fn wait_all(
    pools: &mut BTreeMap<&'static str, Running>,
    timeout: Duration,
) -> BTreeMap<&'static str, ExitStatus> {
    let mut ended = BTreeMap::new();
    let all = poll_until(timeout, || {
        for (h, child) in pools.iter_mut() {
            if !ended.contains_key(h) {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    ended.insert(*h, status);
                }
            }
        }
        ended.len() == pools.len()
    });
    assert!(
        all,
        "pools still running after {timeout:?}: ended {ended:?}"
    );
    ended
}

/// The shard's work: `STEPS` steps. Each step's effect is a record in
/// `$D/log/<shard>` (`step K TOKEN`), and the step is committed by a
/// checkpoint that lists every committed step with the fencing token that
/// committed it (`1:T 2:T ...`), ending with `done:T`. A child resumes from
/// the checkpoint, so only a step whose effect was recorded but not yet
/// committed when its child was killed is done again (by a later token).
/// `$FAIL`'s first run exits 3 after two steps. When the checkpoint is
/// complete the child copies it to `$D/result/<shard>` and exits 0 (at
/// once, if it already was).
const SHARD_SCRIPT: &str = r#"
id=$WORKLEASE_WORK_ID
tok=$WORKLEASE_FENCING_TOKEN
log="$D/log/$id"
cp=$("$WL" checkpoint get 2>>"$D/checkpoint-errors") || exit 1
echo "start $tok $WORKLEASE_HOLDER_ID $$" >> "$log"
case " $cp " in
  *" done:"*) printf '%s' "$cp" > "$D/result/$id"; exit 0 ;;
esac
set -- $cp
k=$#
while [ "$k" -lt "$STEPS" ]; do
  if [ "$id" = "$FAIL" ] && [ "$k" -ge 2 ] && mkdir "$D/failed" 2>/dev/null; then
    echo "fail $tok" >> "$log"
    exit 3
  fi
  k=$((k + 1))
  echo "step $k $tok" >> "$log"
  sleep "$STEP"
  cp="${cp:+$cp }$k:$tok"
  "$WL" checkpoint set "$cp" 2>>"$D/checkpoint-errors" || exit 1
done
cp="$cp done:$tok"
"$WL" checkpoint set "$cp" 2>>"$D/checkpoint-errors" || exit 1
printf '%s' "$cp" > "$D/result/$id"
echo "done $tok" >> "$log"
"#;

/// Steps per shard, and how long each takes: long enough that no shard is
/// done before the pools are balanced and one of them is killed.
const STEPS: usize = 20;
const STEP: &str = "0.2";

/// One line of a shard's log.
struct Record {
    kind: String,
    step: usize,
    token: u64,
}

fn records(log: &str) -> Vec<Record> {
    log.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |i: usize| -> u64 {
                f.get(i)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or_else(|| panic!("malformed log line {line:?}"))
            };
            match f[0] {
                "step" => Record {
                    kind: "step".into(),
                    step: usize::try_from(num(1)).expect("a step"),
                    token: num(2),
                },
                kind => Record {
                    kind: kind.into(),
                    step: 0,
                    token: num(1),
                },
            }
        })
        .collect()
}

#[test]
fn three_pools_finish_twelve_shards_exactly_once_though_one_pool_is_sigkilled() {
    let f = Fleet::new();
    for dir in ["log", "result"] {
        std::fs::create_dir(f.path(dir)).expect("mkdir");
    }
    f.write_script("shard.sh", SHARD_SCRIPT);
    let failing = shard(5);
    let started = Instant::now();
    let steps = STEPS.to_string();
    let ids = all_shards().join(",");
    // The children's parameters come through the pools' environment.
    let env = [
        ("STEPS", steps.as_str()),
        ("STEP", STEP),
        ("FAIL", failing.as_str()),
    ];
    let mut pools: BTreeMap<&'static str, Running> = POOLS
        .iter()
        .map(|h| {
            let args = ["--ttl", "2s", "--pool-name", "batch", "--backoff", "200ms"];
            let args = [&args[..], &["--work-ids", &ids]].concat();
            (*h, f.pool(h, &args, "shard.sh", &env))
        })
        .collect();
    let victim = "pool-b";

    // Balanced (4 shards each), progress made on the victim's shards (their
    // checkpoints are not empty) and no shard done yet: SIGKILL the victim.
    let mut at_kill: BTreeSet<String> = BTreeSet::new();
    let mut seen = String::new();
    let ready = poll_until(LONG, || {
        let st = f.status();
        let live = live_shards(&st);
        seen = format!("{live:?}");
        let balanced = POOLS
            .iter()
            .all(|h| live.get(*h).map_or(0, BTreeSet::len) == SHARDS / POOLS.len());
        let Some(mine) = live.get(victim) else {
            return false;
        };
        let progressed = mine.iter().all(|w| {
            lease(&st, w).is_some_and(|l| field(l, "checkpoint_bytes").as_u64() > Some(0))
        });
        if balanced && progressed && done_records(&st, "batch").is_empty() {
            at_kill = mine.clone();
            return true;
        }
        false
    });
    assert!(
        ready,
        "the pools did not balance 4/4/4 with progress before any shard was done: last seen {seen}"
    );
    let ready_after = started.elapsed();
    let mut victim_child = pools.remove(victim).expect("the victim");
    signal(&victim_child, Signal::SIGKILL);
    let killed = Instant::now();
    victim_child.wait().expect("wait for the victim");

    // Every shard the victim held is taken over by a survivor (or was done
    // by the victim itself in the instant before the kill).
    let mut seen = String::new();
    let covered = poll_until(LONG, || {
        let st = f.status();
        let done = done_records(&st, "batch");
        seen = format!("{:?}", live_shards(&st));
        at_kill.iter().all(|w| {
            done.contains_key(w.as_str())
                || lease(&st, w).is_some_and(|l| live(l) && holder(l) != victim)
        })
    });
    let takeover = killed.elapsed();
    assert!(
        covered,
        "the victim's shards {at_kill:?} were not taken over: {seen}"
    );
    eprintln!(
        "pool: balanced 4/4/4 with progress {ready_after:?} after the start; the SIGKILLed pool's {} shards taken over {takeover:?} after the kill (TTL {TTL:?}, round {:?})",
        at_kill.len(),
        round()
    );
    // Its leases expire within the TTL, and the survivors notice at their
    // next rounds: TTL + 2 rounds, plus one round for the time the rounds
    // and the store calls take.
    assert!(
        takeover <= TTL + 3 * round(),
        "takeover took {takeover:?}: more than TTL + 3 rounds"
    );

    // The survivors finish every shard, then exit 0 on their own.
    let ended = wait_all(&mut pools, LONG);
    for (h, status) in &ended {
        assert_eq!(
            status.code(),
            Some(0),
            "{h} exited {status:?}; its stderr:\n{}",
            f.read_or_empty(&format!("{h}.stderr"))
        );
    }
    eprintln!(
        "pool: every shard done {:?} after the start",
        started.elapsed()
    );

    let st = f.status();
    let done = done_records(&st, "batch");
    // Fencing token → the pool that held it (from the children's start records).
    let mut token_holder: BTreeMap<u64, String> = BTreeMap::new();
    let mut victim_children = Vec::new();
    for w in all_shards() {
        for line in f.read_or_empty(&format!("log/{w}")).lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f[0] == "start" {
                let token: u64 = f[1].parse().expect("a token");
                token_holder.insert(token, f[2].to_string());
                if f[2] == victim {
                    victim_children.push(f[3].parse::<i32>().expect("a pid"));
                }
            }
        }
    }
    // The victim's children died with it.
    assert!(
        poll_until(LONG, || victim_children.iter().all(|p| process_gone(*p))),
        "children of the SIGKILLed pool still run: {victim_children:?}"
    );

    let mut redone = 0;
    for w in all_shards() {
        // Committed exactly once: the final checkpoint lists steps 1..STEPS
        // once each, in order, then done, with tokens that never decrease.
        let result = f.read_or_empty(&format!("result/{w}"));
        let entries: Vec<(&str, u64)> = result
            .split(' ')
            .map(|e| {
                let (k, t) = e
                    .split_once(':')
                    .unwrap_or_else(|| panic!("{w}: {result:?}"));
                (k, t.parse().expect("a token"))
            })
            .collect();
        let expected: Vec<String> = (1..=STEPS)
            .map(|k| k.to_string())
            .chain(["done".to_string()])
            .collect();
        let keys: Vec<&str> = entries.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, expected, "{w}: final checkpoint {result:?}");
        assert!(
            entries.windows(2).all(|p| p[0].1 <= p[1].1),
            "{w}: tokens decrease in {result:?}"
        );
        let l = lease(&st, &w).unwrap_or_else(|| panic!("no lease for {w}"));
        assert_eq!(
            field(l, "checkpoint_bytes").as_u64(),
            Some(result.len() as u64),
            "{w}: the result file is not the stored checkpoint"
        );
        assert_eq!(field(l, "released"), &Value::Bool(true), "{w}: {l}");
        // Recorded done exactly once: one acquisition of its done record.
        let record = done
            .get(&w)
            .unwrap_or_else(|| panic!("{w} has no done record"));
        assert_eq!(field(record, "released"), &Value::Bool(true), "{record}");
        assert_eq!(field(record, "previous_holder"), &Value::Null, "{record}");
        // Never acquired again once done (the pools read the done records
        // before acquiring): the shard's last holder is the pool that
        // recorded it done, and its fencing token is that of the last
        // child started for it.
        assert_eq!(holder(l), holder(record), "{w}: {l} but {record}");
        let last_start = records(&f.read_or_empty(&format!("log/{w}")))
            .iter()
            .rev()
            .find(|r| r.kind == "start")
            .map(|r| r.token);
        assert_eq!(field(l, "fencing_token").as_u64(), last_start, "{w}: {l}");

        // Effects: no two holders at once (the tokens of the records never
        // decrease), and a step is done again only by a later token, when
        // its earlier run was not committed; the committed run is the last.
        let recs = records(&f.read_or_empty(&format!("log/{w}")));
        assert!(
            recs.windows(2).all(|p| p[0].token <= p[1].token),
            "{w}: a record with a smaller token after a larger one: two holders at once"
        );
        for (k, committed) in entries.iter().take(STEPS) {
            let k: usize = k.parse().expect("a step");
            let runs: Vec<u64> = recs
                .iter()
                .filter(|r| r.kind == "step" && r.step == k)
                .map(|r| r.token)
                .collect();
            assert!(
                runs.windows(2).all(|p| p[0] < p[1]),
                "{w}: step {k} done twice by one token: {runs:?}"
            );
            assert_eq!(runs.last(), Some(committed), "{w}: step {k} runs {runs:?}");
            redone += runs.len() - 1;
        }
        let done_records = recs.iter().filter(|r| r.kind == "done").count();
        assert!(done_records <= 1, "{w}: {done_records} completions");
    }

    // The victim's unfinished shards were finished by the survivors.
    let finished_by = |w: &str| -> String {
        let result = f.read_or_empty(&format!("result/{w}"));
        let token: u64 = result
            .rsplit_once("done:")
            .and_then(|(_, t)| t.parse().ok())
            .expect("a done token");
        token_holder.get(&token).cloned().unwrap_or_default()
    };
    let taken_over: Vec<&String> = at_kill
        .iter()
        .filter(|w| holder(done[w.as_str()]) != victim)
        .collect();
    assert!(
        !taken_over.is_empty(),
        "the victim finished all its shards {at_kill:?} before the kill: nothing was taken over"
    );
    for w in &taken_over {
        assert_ne!(finished_by(w), victim, "{w}");
    }

    // The failing shard's first run exited 3, and it was started again.
    let recs = records(&f.read_or_empty(&format!("log/{failing}")));
    let fail = recs
        .iter()
        .position(|r| r.kind == "fail")
        .expect("the failing shard failed once");
    assert!(
        recs[fail + 1..]
            .iter()
            .any(|r| r.kind == "start" && r.token > recs[fail].token),
        "{failing} was not started again after it failed"
    );
    let logs: String = POOLS
        .iter()
        .map(|h| f.read_or_empty(&format!("{h}.stderr")))
        .collect();
    assert!(
        logs.lines()
            .any(|l| l.contains(failing.as_str()) && l.contains("exited with status 3")),
        "no pool said that {failing}'s command exited with status 3"
    );
    eprintln!(
        "pool: {redone} step effects done again after a kill or hand-off (each time by a later token)"
    );
}

#[test]
fn three_pools_run_four_children_each_and_sigterm_releases_every_shard() {
    let f = Fleet::new();
    // The children exit 0 on SIGTERM: a child the pool stops (a hand-off
    // while the pools balance, the shutdown) must never count as done.
    f.write_script(
        "hold.sh",
        &format!(
            "trap 'exit 0' TERM; {}",
            holder_script("$WORKLEASE_WORK_ID")
        ),
    );
    let ids = all_shards().join(",");
    let started = Instant::now();
    let mut pools: BTreeMap<&'static str, Running> = POOLS
        .iter()
        .map(|h| {
            let args = ["--ttl", "2s", "--pool-name", "balance", "--work-ids", &ids];
            (*h, f.pool(h, &args, "hold.sh", &[]))
        })
        .collect();
    let mut seen = String::new();
    let balanced = poll_until(LONG, || {
        let st = f.status();
        let live = live_shards(&st);
        let children: BTreeMap<&str, usize> = pools
            .iter()
            .map(|(h, c)| (*h, running_children(c.id())))
            .collect();
        seen = format!("leases {live:?}, children {children:?}");
        // Each pool holds 4 shards and runs 4 children, and each shard's
        // child runs under the shard's current lease.
        POOLS.iter().all(|h| {
            live.get(*h).map_or(0, BTreeSet::len) == SHARDS / POOLS.len()
                && children[h] == SHARDS / POOLS.len()
        }) && all_shards().iter().all(|w| {
            let token = f.read_or_empty(&format!("{w}.token"));
            lease(&st, w)
                .is_some_and(|l| field(l, "fencing_token").as_u64() == token.trim().parse().ok())
        })
    });
    assert!(
        balanced,
        "the pools did not balance 4/4/4: last seen {seen}"
    );
    eprintln!(
        "pool: 3 pools over {SHARDS} shards run 4 children each {:?} after the start (round {:?})",
        started.elapsed(),
        round()
    );
    let pids: Vec<i32> = all_shards()
        .iter()
        .map(|w| {
            f.read_or_empty(&format!("{w}.pid"))
                .trim()
                .parse()
                .expect("a pid")
        })
        .collect();
    // Children started until then (4 each when the pools start within a
    // round of each other: the first round only writes the memberships).
    let started: BTreeMap<&str, usize> = POOLS
        .iter()
        .map(|h| {
            let log = f.read_or_empty(&format!("{h}.stderr"));
            (
                *h,
                log.lines().filter(|l| l.contains("slot acquired")).count(),
            )
        })
        .collect();
    eprintln!("pool: slots acquired per pool until balanced: {started:?}");

    for child in pools.values() {
        signal(child, Signal::SIGTERM);
    }
    let ended = wait_all(&mut pools, LONG);
    for (h, status) in &ended {
        assert_eq!(
            status.code(),
            Some(128 + Signal::SIGTERM as i32),
            "{h}: {status:?}; its stderr:\n{}",
            f.read_or_empty(&format!("{h}.stderr"))
        );
        assert!(
            f.read_or_empty(&format!("{h}.stderr"))
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("worklease: SIGTERM")),
            "{h} does not say why it exited"
        );
    }
    assert!(
        pids.iter().all(|p| process_gone(*p)),
        "children outlived their pools"
    );
    let st = f.status();
    for w in all_shards() {
        let l = lease(&st, &w).unwrap_or_else(|| panic!("no lease for {w}"));
        assert_eq!(field(l, "ended").as_str(), Some("released"), "{l}");
    }
    for h in POOLS {
        let m = lease(&st, &format!("balance/members/{h}")).expect("a membership");
        assert_eq!(field(m, "ended").as_str(), Some("released"), "{m}");
    }
    assert!(
        done_records(&st, "balance").is_empty(),
        "children stopped by their pools were recorded as done"
    );
}

#[test]
fn bad_input_exits_64_naming_the_limit_and_writes_nothing() {
    let f = Fleet::new();
    let too_long = format!("a,{}", "x".repeat(1025));
    let too_long_for_done = format!("a,{}", "y".repeat(1020));
    // One more than the limit (100,000), in a file: one argument holds at
    // most 128 KiB on Linux.
    let too_many = f.path("too-many.txt");
    let ids: Vec<String> = (0..=100_000).map(|i| format!("w{i}")).collect();
    std::fs::write(&too_many, ids.join("\n")).expect("write the work-ID file");
    let too_many = too_many.to_str().expect("UTF-8 temp path").to_string();
    let cases: [(&[&str], &str); 15] = [
        (
            &["--work-ids", "", "--", "true"],
            "work ID is empty: it must be 1 to 1024 bytes",
        ),
        (
            &["--work-ids", "a,,b", "--", "true"],
            "work ID is empty: it must be 1 to 1024 bytes",
        ),
        (&["--", "true"], "no work IDs"),
        (
            &["--work-ids", "a,b,a", "--", "true"],
            "work ID \"a\" is listed twice",
        ),
        (
            &["--work-ids", &too_long, "--", "true"],
            "1025 bytes: the limit is 1024 bytes",
        ),
        (&["--work-ids", "a,b\u{7}", "--", "true"], "control"),
        (&["--work-ids", "a,b"], "<CMD>"),
        (
            &["--work-ids", "a,b", "--", ""],
            "no command: the program name after `--` is empty",
        ),
        (
            &["--backoff", "0s", "--work-ids", "a", "--", "true"],
            "'--backoff <DURATION>': 0s is too short: it must be at least 1ms",
        ),
        (
            &["--work-ids-file", &too_many, "--", "true"],
            "100001 work IDs: a pool takes at most 100000",
        ),
        (
            &["--work-ids", "a,pool/members/x", "--", "true"],
            "membership prefix",
        ),
        (
            &["--work-ids", &too_long_for_done, "--", "true"],
            "the limit is 1024 bytes",
        ),
        (
            &["--pool-name", "", "--work-ids", "a", "--", "true"],
            "pool name \"\" is not valid",
        ),
        (
            &["--pool-name", "a\u{7}", "--work-ids", "a", "--", "true"],
            "control",
        ),
        (
            &[
                "--ttl",
                "2s",
                "--grace",
                "1500ms",
                "--work-ids",
                "a",
                "--",
                "true",
            ],
            "TTL/2",
        ),
    ];
    for (args, expected) in cases {
        let out = f
            .cmd(&[&["pool"], args].concat())
            .output()
            .expect("run worklease pool");
        let err = String::from_utf8_lossy(&out.stderr);
        let shown: Vec<&str> = args.iter().map(|a| &a[..a.len().min(40)]).collect();
        assert_eq!(out.status.code(), Some(64), "{shown:?}: {err}");
        assert!(
            err.starts_with("worklease: ") && err.contains(expected),
            "{shown:?}: expected {expected:?} in {err}"
        );
        assert!(!f.path("store").exists(), "{shown:?} created the store");
    }
}

#[test]
fn a_command_that_cannot_run_stops_the_pool_with_127_and_releases_every_lease() {
    let f = Fleet::new();
    // Surrounding whitespace and CRs are trimmed; blank lines and
    // comments are skipped.
    std::fs::write(
        f.path("ids.txt"),
        "# the shards\r\n  b \r\n\n   \n  # not c\n\tc\r\n",
    )
    .expect("write the work IDs");
    let ids_file = f.path("ids.txt");
    let out = f
        .cmd(&[
            "pool",
            "--ttl",
            "2s",
            "--holder",
            "pool-alone",
            "--work-ids",
            "a",
            "--work-ids-file",
            ids_file.to_str().expect("a UTF-8 path"),
            "--",
            "/nonexistent/command",
        ])
        .output()
        .expect("run worklease pool");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.starts_with("worklease: cannot run \"/nonexistent/command\"")),
        "{err}"
    );
    let st = f.status();
    // Alone, the pool took every work ID of --work-ids and the file, then
    // released them all, and its membership.
    let ids: BTreeSet<&str> = st.iter().map(work_id).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["a", "b", "c", "pool/members/pool-alone"]),
        "{st:?}"
    );
    for l in &st {
        assert_eq!(field(l, "ended").as_str(), Some("released"), "{l}");
    }
}

#[test]
fn ctrl_z_stops_every_child_then_the_pool_and_sigcont_continues_them() {
    let f = Fleet::new();
    f.write_script("hold.sh", &holder_script("$WORKLEASE_WORK_ID"));
    // A TTL long enough that the leases outlive the stop.
    let args = ["--ttl", "10s", "--pool-name", "jobs", "--work-ids", "a,b,c"];
    let mut pool = f.pool("solo", &args, "hold.sh", &[]);
    let ids = ["a", "b", "c"];
    assert!(
        poll_until(LONG, || ids
            .iter()
            .all(|w| f.path(&format!("{w}.started")).exists())),
        "the children did not start"
    );
    // Each child leads its own process group.
    let groups: Vec<i32> = ids
        .iter()
        .map(|w| {
            f.read_or_empty(&format!("{w}.pid"))
                .trim()
                .parse()
                .expect("a pid")
        })
        .collect();
    signal(&pool, Signal::SIGTSTP);
    assert!(
        poll_until(LONG, || {
            stopped(pid(&pool)) && groups.iter().all(|g| group_stopped(*g))
        }),
        "the pool and its children's groups {groups:?} were not all stopped"
    );
    signal(&pool, Signal::SIGCONT);
    assert!(
        poll_until(LONG, || groups.iter().all(|g| !group_stopped(*g))),
        "the children were not continued"
    );
    // Each child exits 0 on its own: its work ID is done, and once all are,
    // the pool exits 0.
    for w in ids {
        std::fs::write(f.path(&format!("{w}.stop")), b"").expect("touch");
    }
    let ended = poll_until(LONG, || pool.try_wait().expect("try_wait").is_some());
    assert!(ended, "the pool did not exit once every work ID was done");
    let status = pool.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", f.read_or_empty("solo.stderr"));
    let st = f.status();
    let done: BTreeSet<String> = done_records(&st, "jobs").into_keys().collect();
    assert_eq!(done, ids.iter().map(|w| w.to_string()).collect(), "{st:?}");
}

#[test]
fn work_ids_done_by_another_pool_name_are_refused_and_done_ones_never_run_again() {
    let f = Fleet::new();
    f.write_script("mark.sh", "echo \"$WORKLEASE_WORK_ID\" >> \"$D/runs\"");
    let mark = f.path("mark.sh");
    let pool = |name: &str, ids: &str| {
        f.cmd(&[
            "pool",
            "--ttl",
            "2s",
            "--holder",
            "solo",
            "--pool-name",
            name,
            "--work-ids",
            ids,
            "--",
            "sh",
            mark.to_str().expect("a UTF-8 path"),
        ])
        .output()
        .expect("run worklease pool")
    };
    let runs = || -> Vec<String> {
        f.read_or_empty("runs")
            .lines()
            .map(str::to_string)
            .collect()
    };

    let out = pool("run-1", "a,b");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut first = runs();
    first.sort();
    assert_eq!(first, ["a", "b"]);
    let before = f.status();

    // The same run again: every work ID is done, so the pool exits 0
    // without acquiring any (their leases and tokens stay as they were).
    let out = pool("run-1", "a,b");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(runs().len(), 2, "a done work ID ran again");
    let after = f.status();
    for w in ["a", "b"] {
        assert_eq!(lease(&before, w), lease(&after, w), "{w}");
    }

    // Another pool name over the same work IDs would resume from their
    // finished checkpoints: refused, nothing written.
    let out = pool("run-2", "b,a");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.starts_with("worklease: work ID \"a\" was already done by the pool \"run-1\"")
            && err.contains("(and 1 more of the 2 work IDs)")
            && err.contains("\"run-2/a\""),
        "{err}"
    );
    let refused = f.status();
    assert_eq!(refused.len(), after.len(), "{refused:?}");
    assert_eq!(runs().len(), 2);

    // Work IDs that carry the run are new work.
    let out = pool("run-2", "run-2/a,run-2/b");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut all = runs();
    all.sort();
    assert_eq!(all, ["a", "b", "run-2/a", "run-2/b"]);
}
