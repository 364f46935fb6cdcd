//! The processes of the pool scenario: each started in a process group of
//! its own and marked by an environment variable that its descendants
//! inherit (the pools' children too), so that every group this scenario
//! started can be killed at the end, also on an error (when the guard is
//! dropped), and `/proc` can be searched for any of them left.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgrp, Pid};

/// The environment variable that marks the scenario's processes; its value
/// names one measurement.
pub const MARK: &str = "WORKLEASE_BENCH_POOL";

/// The processes one measurement started, killed (by group) when dropped.
pub struct Procs {
    mark: String,
    children: Vec<Child>,
}

impl Procs {
    /// None yet; `mark` names the measurement (unique to this run).
    pub fn new(mark: String) -> Self {
        Self {
            mark,
            children: Vec::new(),
        }
    }

    /// Starts `cmd` in a process group of its own, marked.
    pub fn spawn(&mut self, cmd: &mut Command) -> std::io::Result<()> {
        let child = cmd.env(MARK, &self.mark).process_group(0).spawn()?;
        self.children.push(child);
        Ok(())
    }

    /// How many of the processes started here have exited.
    pub fn exited(&mut self) -> usize {
        self.children
            .iter_mut()
            .map(Child::try_wait)
            .filter(|w| matches!(w, Ok(Some(_))))
            .count()
    }

    /// Kills every group started here, reaps them, then kills the group of
    /// every marked process still alive (the pools' children, in groups
    /// the pools made) until none is left or `grace` passes. Blocking.
    /// Returns the marked processes still there after `grace`.
    pub fn end(mut self, grace: Duration) -> usize {
        self.kill_groups();
        for mut c in std::mem::take(&mut self.children) {
            let _ = c.wait();
        }
        let until = Instant::now() + grace;
        loop {
            let left = marked(&self.mark);
            if left.is_empty() {
                return 0;
            }
            for pid in &left {
                kill_marked(*pid);
            }
            if Instant::now() >= until {
                return left.len();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill_groups(&self) {
        for c in &self.children {
            if let Ok(pid) = i32::try_from(c.id()) {
                // Its own group: the child's pid.
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        // On an error path: kill, reap what is ours, kill the marked rest.
        self.kill_groups();
        for c in &mut self.children {
            let _ = c.wait();
        }
        for pid in marked(&self.mark) {
            kill_marked(pid);
        }
    }
}

/// SIGKILL to the group of marked process `pid` (its own group, as every
/// child of a pool has), or to the process alone where its group is this
/// program's or not readable.
fn kill_marked(pid: i32) {
    match group_of(pid) {
        Some(pgid) if pgid > 1 && pgid != getpgrp().as_raw() => {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        _ => {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The processes (of this user: `/proc/PID/environ` of others is not
/// readable) whose environment has [`MARK`] = `mark`. Zombies have no
/// environment left and are not counted.
pub fn marked(mark: &str) -> Vec<i32> {
    let needle = format!("{MARK}={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// The process group of `pid`, from `/proc/PID/stat` (after the command
/// name in parentheses: state, parent, group).
fn group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_processes_are_found_and_killed_by_group() {
        let mark = format!("test-{}", std::process::id());
        let mut procs = Procs::new(mark.clone());
        // A shell whose child (a group of its own) outlives it: found by
        // its mark, killed by `end`.
        procs
            .spawn(Command::new("/bin/sh").args(["-c", "setsid sleep 30 & exec sleep 30"]))
            .expect("spawn sh");
        let until = Instant::now() + Duration::from_secs(5);
        while marked(&mark).len() < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(marked(&mark).len(), 2, "the shell and its child");
        assert_eq!(procs.end(Duration::from_secs(5)), 0);
        assert!(marked(&mark).is_empty());
    }
}
