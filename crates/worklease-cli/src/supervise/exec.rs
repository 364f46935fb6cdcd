//! How a child is started cheaply and still dies with this process.
//!
//! A child that must get SIGKILL when its supervisor dies asks for it
//! itself (`PR_SET_PDEATHSIG`, Linux), between the fork and the exec. Doing
//! that in a `pre_exec` closure makes the standard library fork this
//! process, copying its page tables: a spawn then costs time in
//! proportion to this process's memory, and a `pool` starting thousands
//! of children on its one runtime thread stopped renewing its leases
//! meanwhile. Without a closure the standard library uses `posix_spawn`
//! (a vfork, whose cost does not grow with the process), so the child is
//! started through this same binary, [`EXEC_CHILD`]: the new process asks
//! for its parent-death signal, checks that its parent is still the
//! supervisor, clears its signal mask (the supervisor blocks job-control
//! signals around a spawn) and `exec`s the command (the signal request
//! survives `exec`).
//!
//! The command is found in `PATH` by the supervisor before it starts the
//! child ([`resolve`]), as `execvp` would (`/bin:/usr/bin` when `PATH` is
//! unset; a non-executable match is "permission denied"), and an `exec`
//! that fails anyway (a `#!` interpreter that does not exist, a missing ELF
//! loader, a file removed meanwhile) is reported back through a pipe
//! ([`ExecReport`]): either way a command that cannot run is an error of
//! the spawn (127 / 126 for `run`, the end of a `pool`), not a child that
//! exits 127.

use crate::say::say;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

/// The hidden first argument that makes `worklease` start a child:
/// `worklease __worklease-exec-child PARENT_PID REPORT_FD PROGRAM ARGV0
/// ARGS...`.
pub const EXEC_CHILD: &str = "__worklease-exec-child";

/// The path of this binary as the kernel knows it: it still names this
/// binary after the file was replaced or removed (an upgrade while a pool
/// runs).
#[cfg(target_os = "linux")]
pub const SELF_EXE: &str = "/proc/self/exe";

/// `execvp`'s search path when `PATH` is unset (glibc's `_CS_PATH`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Where `program` is: itself when it names a path (it holds a `/`),
/// else the first executable of that name in `PATH`.
///
/// # Errors
/// `NotFound` (ENOENT) when there is no such file or none in `PATH`;
/// `PermissionDenied` (EACCES) when the file is a directory or not
/// executable (in `PATH`: when only non-executable files of that name
/// exist): the errors `execvp` would give, with its messages.
pub fn resolve(program: &OsStr) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let denied = || io::Error::from_raw_os_error(nix::libc::EACCES);
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() || !executable(&path) {
            return Err(denied());
        }
        return Ok(path);
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    let cwd = std::env::current_dir()?;
    if let Ok(found) = which::which_in(program, Some(&search), &cwd) {
        return Ok(found);
    }
    // `which` skips files it cannot run; `execvp` says EACCES for them.
    let present = std::env::split_paths(&search).any(|dir| {
        let dir = if dir.as_os_str().is_empty() {
            cwd.clone()
        } else {
            dir
        };
        dir.join(program).is_file()
    });
    Err(if present {
        denied()
    } else {
        io::Error::from_raw_os_error(nix::libc::ENOENT)
    })
}

fn executable(path: &std::path::Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

/// The supervisor's end of the pipe a started child reports a failed
/// `exec` on: end of file when the `exec` succeeded (the child's end is
/// close-on-exec), the `errno` (4 bytes) when it failed.
pub struct ExecReport(OwnedFd);

/// The pipe for one spawn: the supervisor's end, and the child's end,
/// inheritable, whose number goes on the child's command line. Call from
/// the thread that spawns, and drop the child's end right after the
/// spawn: it is the only inheritable descriptor this process makes, and
/// this process starts no other program meanwhile.
///
/// # Errors
/// The `pipe2` or `fcntl` error (out of descriptors).
pub fn report_pipe() -> io::Result<(ExecReport, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(write.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok((ExecReport(read), write))
}

impl ExecReport {
    /// Waits (without blocking the runtime) until the child has `exec`ed
    /// the command or failed to.
    ///
    /// # Errors
    /// The `exec`'s error (its `errno`), or the pipe's.
    pub async fn wait(self) -> io::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(self.0)?;
        let mut buf = Vec::with_capacity(4);
        pipe.read_to_end(&mut buf).await?;
        match <[u8; 4]>::try_from(buf.as_slice()) {
            Ok(errno) => Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno))),
            // Nothing: the exec closed the child's end. A short read: the
            // child died before it reported; its exit status tells.
            Err(_) => Ok(()),
        }
    }
}

/// In a process started as [`EXEC_CHILD`]: asks for SIGKILL when the
/// supervisor dies, clears the signal mask, then becomes the command.
/// Returns only if that fails, with the exit status a shell would give
/// (127 not found, 126 otherwise), after writing the `errno` to the report
/// descriptor (or, when that fails, saying why on stderr).
#[cfg(target_os = "linux")]
pub fn exec_child(args: &[OsString]) -> u8 {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt;
    let [parent, report, program, argv0, rest @ ..] = args else {
        say!("{EXEC_CHILD} needs PARENT_PID REPORT_FD PROGRAM ARGV0 [ARGS...]");
        return crate::exit::USAGE;
    };
    let number = |s: &OsString| s.to_str().and_then(|p| p.parse::<i32>().ok());
    let (Some(parent), Some(report)) = (number(parent), number(report)) else {
        say!("{EXEC_CHILD}: PARENT_PID and REPORT_FD are numbers");
        return crate::exit::USAGE;
    };
    // The request covers only a living parent: give up if it is gone
    // already (this process was reparented).
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        say!("cannot ask for the parent-death signal: {e}");
        return crate::exit::SOFTWARE;
    }
    if nix::unistd::getppid() != nix::unistd::Pid::from_raw(parent) {
        say!("{EXEC_CHILD}: the supervisor (PID {parent}) is not this process's parent");
        return crate::exit::SOFTWARE;
    }
    // The command starts with no signal blocked.
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
    // SAFETY: the supervisor passed this descriptor for this process to
    // own; nothing else in this process uses it.
    let mut report = unsafe { std::fs::File::from_raw_fd(report) };
    let _ = nix::fcntl::fcntl(
        report.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let e = std::process::Command::new(program)
        .arg0(argv0)
        .args(rest)
        .exec();
    // The supervisor says why; say it here only if it cannot hear.
    if report
        .write_all(&e.raw_os_error().unwrap_or(nix::libc::EIO).to_ne_bytes())
        .is_err()
    {
        say!("cannot run {argv0:?}: {e}");
    }
    if e.kind() == io::ErrorKind::NotFound {
        crate::exit::COMMAND_NOT_FOUND
    } else {
        crate::exit::CANNOT_EXECUTE
    }
}
