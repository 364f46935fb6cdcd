//! The progress line of a long wait (`run --wait`, an `elect` campaign):
//! "waiting for WORK_ID: held by HOLDER, expires in 3.1s", redrawn in
//! place (`\r`) about once a second, on a terminal only. The holder comes
//! from the store's `inspect` of the one work ID, read once a second while
//! the wait lasts (a cheap read); when stderr is not a terminal nothing is
//! read and nothing is written.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use worklease::{LeaseInfo, LeaseStore, WorkId};

use crate::run::fmt_secs;

/// How often the line is refreshed.
const EVERY: Duration = Duration::from_secs(1);

/// Erases the current terminal line: back to column 0, clear to its end.
const ERASE: &str = "\r\x1b[K";

/// A progress line being drawn; [`Progress::stop`] (or dropping it)
/// erases it.
pub struct Progress {
    stop: CancellationToken,
    /// Whether a line is on the screen. Held while writing, so that no
    /// line is drawn after `stop`.
    drawn: Arc<Mutex<bool>>,
}

impl Progress {
    /// Starts refreshing the line for `work_id` when stderr is a terminal;
    /// else does nothing. Needs a Tokio runtime.
    pub fn start(store: Arc<dyn LeaseStore>, work_id: &WorkId) -> Self {
        let id = work_id.clone();
        Self::watching(store, vec![work_id.clone()], move |leases| {
            line(&id, leases.iter().find(|l| l.work_id == id))
        })
    }

    /// Starts refreshing the line for a wait for a permit of semaphore
    /// `name` ("waiting for a permit of NAME: 3 of 3 held, the first
    /// expires in 2.1s"), as [`Progress::start`].
    pub fn start_permits(store: Arc<dyn LeaseStore>, name: &str, permits: &[WorkId]) -> Self {
        let (name, n) = (name.to_string(), permits.len());
        Self::watching(store, permits.to_vec(), move |leases| {
            permits_line(&name, n, leases)
        })
    }

    /// The line `render` makes of the leases of `work_ids`, refreshed.
    fn watching(
        store: Arc<dyn LeaseStore>,
        work_ids: Vec<WorkId>,
        render: impl Fn(&[LeaseInfo]) -> String + Send + 'static,
    ) -> Self {
        let progress = Self {
            stop: CancellationToken::new(),
            drawn: Arc::new(Mutex::new(false)),
        };
        if !std::io::stderr().is_terminal() {
            return progress;
        }
        let (stop, drawn) = (progress.stop.clone(), progress.drawn.clone());
        tokio::spawn(async move {
            // The first line after a second: a wait that ends sooner (an
            // election won at once) shows none.
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                let leases = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = store.inspect(&work_ids) => match r {
                        Ok(leases) => leases,
                        // Keep the last line; the wait itself reports store failures.
                        Err(_) => continue,
                    },
                };
                let text = fit(&render(&leases), columns());
                let mut drawn = drawn.lock().unwrap_or_else(|e| e.into_inner());
                if stop.is_cancelled() {
                    return;
                }
                let mut err = std::io::stderr().lock();
                if write!(err, "{ERASE}{text}")
                    .and_then(|()| err.flush())
                    .is_ok()
                {
                    *drawn = true;
                }
            }
        });
        progress
    }

    /// Stops refreshing and erases the line, if one is drawn. Idempotent.
    pub fn stop(&self) {
        let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
        self.stop.cancel();
        if *drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{ERASE}").and_then(|()| err.flush());
            *drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The text of the line for the lease `info` on `work_id`.
fn line(work_id: &WorkId, info: Option<&LeaseInfo>) -> String {
    let id = work_id.as_str();
    let Some(info) = info else {
        return format!("waiting for {id}: no lease yet");
    };
    let holder: String = info.holder_id.chars().filter(|c| !c.is_control()).collect();
    if let Some(ended) = info.ended {
        format!("waiting for {id}: {holder}'s lease {}", ended.as_str())
    } else if info.expired {
        format!("waiting for {id}: {holder}'s lease expired")
    } else {
        match info.expires_in {
            Some(d) => format!(
                "waiting for {id}: held by {holder}, expires in {}",
                fmt_secs(d)
            ),
            None => format!("waiting for {id}: held by {holder}"),
        }
    }
}

/// The text of the line for a semaphore `name` of `n` permits whose
/// permits' leases are `leases`.
fn permits_line(name: &str, n: usize, leases: &[LeaseInfo]) -> String {
    let held: Vec<&LeaseInfo> = leases.iter().filter(|l| !l.expired).collect();
    let first = held.iter().filter_map(|l| l.expires_in).min();
    let mut text = format!("waiting for a permit of {name}: {} of {n} held", held.len());
    if let Some(d) = first {
        text.push_str(&format!(", the first expires in {}", fmt_secs(d)));
    }
    text.chars().filter(|c| !c.is_control()).collect()
}

/// `text` cut to fit in `columns - 1` characters (a line that wraps could
/// not be redrawn in place), ending with `…` when cut.
fn fit(text: &str, columns: usize) -> String {
    let max = columns.saturating_sub(1).max(10);
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// The width of the terminal on stderr, else 80.
fn columns() -> usize {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer given, which
    // points to one.
    let ok = unsafe {
        nix::libc::ioctl(
            nix::libc::STDERR_FILENO,
            nix::libc::TIOCGWINSZ,
            &mut size as *mut nix::libc::winsize,
        )
    } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;
    use worklease::{Handoff, LeaseEnd};

    fn info(expires_in: Option<Duration>, expired: bool, ended: Option<LeaseEnd>) -> LeaseInfo {
        LeaseInfo {
            work_id: WorkId::new("job").unwrap(),
            holder_id: "host:1\x1b[2J".to_string(),
            fencing_token: 3,
            expires_at: UNIX_EPOCH,
            expires_in,
            expired,
            released: ended == Some(LeaseEnd::Released),
            ended,
            checkpoint_bytes: 0,
            handoff: Handoff { previous: None },
        }
    }

    #[test]
    fn the_line_says_who_holds_the_lease_and_when_it_expires() {
        let id = WorkId::new("job").unwrap();
        let live = info(Some(Duration::from_millis(3140)), false, None);
        // Control characters of a holder ID never reach the terminal.
        assert_eq!(
            line(&id, Some(&live)),
            "waiting for job: held by host:1[2J, expires in 3.1s"
        );
        let expired = info(None, true, Some(LeaseEnd::Expired));
        assert_eq!(
            line(&id, Some(&expired)),
            "waiting for job: host:1[2J's lease expired"
        );
        assert_eq!(line(&id, None), "waiting for job: no lease yet");
    }

    #[test]
    fn the_permits_line_counts_the_held_ones() {
        let leases = [
            info(Some(Duration::from_millis(2100)), false, None),
            info(Some(Duration::from_millis(900)), false, None),
            info(None, true, Some(LeaseEnd::Released)),
        ];
        assert_eq!(
            permits_line("db", 3, &leases),
            "waiting for a permit of db: 2 of 3 held, the first expires in 0.9s"
        );
        assert_eq!(
            permits_line("db", 3, &[]),
            "waiting for a permit of db: 0 of 3 held"
        );
    }

    #[test]
    fn a_long_line_is_cut_to_the_terminal_width() {
        assert_eq!(fit("short", 80), "short");
        let cut = fit(&"x".repeat(100), 40);
        assert_eq!(cut.chars().count(), 39);
        assert!(cut.ends_with('…'));
    }
}
