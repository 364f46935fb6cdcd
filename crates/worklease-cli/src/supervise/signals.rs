//! The signals of a supervising process: the ones it forwards to its
//! children's process groups ([`Signals`]), and job control, which stops
//! every child's group before this process (the groups are registered in
//! [`CHILD_GROUPS`] while they are supervised).

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::exit::{self, Failure};

/// The signals forwarded to the child's process group.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The job-control signals that stop the child's group, then this process.
const JOB_STOP: [Signal; 3] = [Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU];

/// Whether `sig` ends a process by default (and ends a wait for the lease,
/// or a `pool`).
pub fn terminating(sig: Signal) -> bool {
    matches!(
        sig,
        Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// How many children may be supervised at once (a `pool` runs one per
/// work ID it holds, and takes at most this many work IDs): as many work
/// IDs as one batch call of the library names
/// ([`worklease::limits::MAX_BATCH`]).
pub const MAX_CHILDREN: usize = worklease::limits::MAX_BATCH;

/// The process groups of the supervised children (0: a free entry), for the
/// job-control handler, which stops them before stopping this process. It
/// reads them inside a signal handler: atomics, no lock.
static CHILD_GROUPS: [AtomicI32; MAX_CHILDREN] = [const { AtomicI32::new(0) }; MAX_CHILDREN];

/// Where the search for a free entry of [`CHILD_GROUPS`] starts: after the
/// last one taken, so that registering thousands of children does not
/// scan the taken entries again each time.
static NEXT_GROUP: AtomicUsize = AtomicUsize::new(0);

/// A child's entry in [`CHILD_GROUPS`], freed when dropped (when its
/// supervision ends, however it ends).
pub(super) struct GroupEntry(Option<usize>);

impl GroupEntry {
    pub(super) fn register(group: i32) -> Self {
        let start = NEXT_GROUP.load(Ordering::Relaxed);
        let entry = (0..MAX_CHILDREN)
            .map(|i| (start + i) % MAX_CHILDREN)
            .find(|&i| {
                CHILD_GROUPS[i]
                    .compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            });
        if let Some(i) = entry {
            NEXT_GROUP.store((i + 1) % MAX_CHILDREN, Ordering::Relaxed);
        }
        if entry.is_none() {
            tracing::warn!(
                "more than {MAX_CHILDREN} children at once: Ctrl-Z does not stop this one's process group"
            );
        }
        Self(entry)
    }
}

impl Drop for GroupEntry {
    fn drop(&mut self) {
        if let Some(g) = self.0.and_then(|i| CHILD_GROUPS.get(i)) {
            g.store(0, Ordering::SeqCst);
        }
    }
}

/// Blocks or unblocks SIGTSTP, SIGTTIN and SIGTTOU in the calling thread.
/// The runtime's other threads block them for good (`on_thread_start` in
/// `main`), so that the job-control handler runs on the main thread, and
/// not while it spawns a child.
pub fn job_control_mask(how: nix::sys::signal::SigmaskHow) -> std::io::Result<()> {
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in JOB_STOP {
        set.add(sig);
    }
    nix::sys::signal::pthread_sigmask(how, Some(&set), None)?;
    Ok(())
}

/// The job-control handler (SIGTSTP, SIGTTIN, SIGTTOU): stops the
/// children's process groups, then this process, as the default action
/// would have stopped this process alone. It runs synchronously, inside whatever
/// system call raised it (a write to the terminal raises SIGTTOU), and
/// makes only async-signal-safe calls (kill).
extern "C" fn on_job_stop(_signal: nix::libc::c_int) {
    let saved = nix::errno::Errno::last_raw();
    // SAFETY: kill(2) is async-signal-safe; the arguments are plain values.
    unsafe {
        for group in &CHILD_GROUPS {
            let group = group.load(Ordering::SeqCst);
            if group > 0 {
                nix::libc::kill(-group, nix::libc::SIGSTOP);
            }
        }
        nix::libc::kill(nix::libc::getpid(), nix::libc::SIGSTOP);
    }
    nix::errno::Errno::set_raw(saved);
}

/// Installs [`on_job_stop`] for SIGTSTP, SIGTTIN and SIGTTOU, except where
/// the signal is ignored (as a shell without job control leaves it).
fn install_job_control() -> Result<(), Failure> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let action = SigAction::new(
        SigHandler::Handler(on_job_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in JOB_STOP {
        // SAFETY: the handler only makes async-signal-safe calls.
        let old = unsafe { sigaction(sig, &action) }.map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("cannot install a handler for {sig}: {e}"),
            )
        })?;
        if old.handler() == SigHandler::SigIgn {
            // SAFETY: restoring the disposition this process started with.
            let _ = unsafe { sigaction(sig, &old) };
        }
    }
    Ok(())
}

/// The forwarded signals and SIGCONT, delivered through a channel.
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Installs handlers for [`FORWARDED`] and SIGCONT: from now on these
    /// signals no longer end this process, they are delivered by
    /// [`Signals::recv`]. Also installs the job-control handler.
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let (tx, rx) = mpsc::unbounded_channel();
        for sig in FORWARDED.into_iter().chain([Signal::SIGCONT]) {
            let mut stream = signal(SignalKind::from_raw(sig as i32)).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install a handler for {sig}: {e}"),
                )
            })?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            });
        }
        install_job_control()?;
        Ok(Self { rx })
    }

    /// A channel of signals for one of several supervised children (a
    /// `pool` slot): the sender hands it what this process received.
    pub fn channel() -> (mpsc::UnboundedSender<Signal>, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Self { rx })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Option<Signal> {
        self.rx.recv().await
    }

    /// The next signal that ends a wait (SIGINT, SIGTERM, SIGHUP,
    /// SIGQUIT), skipping the others: there is no child to forward them to
    /// yet.
    pub async fn next_terminating(&mut self) -> Option<Signal> {
        loop {
            let sig = self.rx.recv().await?;
            if terminating(sig) {
                return Some(sig);
            }
        }
    }
}
