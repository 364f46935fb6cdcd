//! The connection and the queue of calls waiting for it.
//!
//! A value's calls run on its one connection one after another, in the
//! order they came. A call pushes its job; when no drain runs, it starts
//! one on tokio's blocking pool, which runs the queued jobs until none is
//! left. So a renewal waits behind the jobs queued before it, never behind
//! hundreds of blocking threads racing for one connection lock (a
//! `worklease pool` starting thousands of children lost leases that way),
//! and there is no runtime hop between two jobs. The drain is a blocking
//! task, so tokio's paused test clock does not jump ahead while a call
//! runs, as it would if the connection had a thread of its own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

/// A call's work on the connection.
pub(super) type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The connection and its queue.
pub(super) struct ConnQueue {
    conn: Mutex<Connection>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// A drain is running (or about to): it takes the jobs pushed now.
    draining: bool,
}

impl ConnQueue {
    pub(super) fn new(conn: Connection) -> Arc<Self> {
        Arc::new(Self {
            conn: Mutex::new(conn),
            state: Mutex::new(State::default()),
        })
    }

    /// Queues `job`, starting a drain when none runs. Must be called
    /// inside a tokio runtime.
    pub(super) fn push(self: &Arc<Self>, job: Job) {
        let mut state = lock(&self.state);
        state.jobs.push_back(job);
        if !state.draining {
            state.draining = true;
            let drain = Drain {
                queue: self.clone(),
                armed: true,
            };
            drop(state);
            tokio::task::spawn_blocking(move || drain.run());
        }
    }
}

/// The right to drain the queue. Dropped without running (the runtime
/// shut down before the blocking task started), it drops the queued jobs
/// (their callers get an error) and lets the next push start a drain.
struct Drain {
    queue: Arc<ConnQueue>,
    armed: bool,
}

impl Drain {
    fn run(mut self) {
        loop {
            let job = {
                let mut state = lock(&self.queue.state);
                match state.jobs.pop_front() {
                    Some(job) => job,
                    None => {
                        state.draining = false;
                        self.armed = false;
                        return;
                    }
                }
            };
            job(&mut lock(&self.queue.conn));
        }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if self.armed {
            let mut state = lock(&self.queue.state);
            state.jobs.clear();
            state.draining = false;
        }
    }
}

/// A lock that a panic elsewhere does not poison for good: the connection
/// is still usable (a panicking job's transaction was rolled back when it
/// was dropped).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
