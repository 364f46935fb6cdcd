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
//! started through this same binary,
//! [`EXEC_CHILD`]: the new process asks for its parent-death signal, checks
//! that its parent is still the supervisor, and `exec`s the command
//! (the signal request survives `exec`).
//!
//! The command is found in `PATH` by the supervisor before it starts the
//! child ([`resolve`]), so a missing or non-executable command is still an
//! error of the spawn (127 / 126 for `run`, the end of a `pool`), not a
//! child that exits 127.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::PathBuf;

/// The hidden first argument that makes `worklease` start a child:
/// `worklease __worklease-exec-child PARENT_PID PROGRAM ARGV0 ARGS...`.
pub const EXEC_CHILD: &str = "__worklease-exec-child";

/// The path of this binary as the kernel knows it: it still names this
/// binary after the file was replaced or removed (an upgrade while a pool
/// runs).
#[cfg(target_os = "linux")]
pub const SELF_EXE: &str = "/proc/self/exe";

/// Where `program` is: itself when it names a path (it holds a `/`),
/// else the first executable of that name in `PATH`.
///
/// # Errors
/// `NotFound` (ENOENT) when there is no such file or none in `PATH`;
/// `PermissionDenied` (EACCES) when the file is a directory or not
/// executable: the errors `exec` would give, with its messages.
pub fn resolve(program: &OsStr) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if !program.as_bytes().contains(&b'/') {
        return which::which(program).map_err(|_| io::Error::from_raw_os_error(nix::libc::ENOENT));
    }
    let path = PathBuf::from(program);
    let meta = std::fs::metadata(&path)?;
    let executable = nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_ok();
    if meta.is_dir() || !executable {
        return Err(io::Error::from_raw_os_error(nix::libc::EACCES));
    }
    Ok(path)
}

/// In a process started as [`EXEC_CHILD`]: asks for SIGKILL when the
/// supervisor dies, then becomes the command. Returns only if that fails,
/// with the exit status a shell would give (127 not found, 126 otherwise),
/// after saying why on stderr.
#[cfg(target_os = "linux")]
pub fn exec_child(args: &[OsString]) -> u8 {
    use std::os::unix::process::CommandExt;
    let [parent, program, argv0, rest @ ..] = args else {
        eprintln!("worklease: {EXEC_CHILD} needs PARENT_PID PROGRAM ARGV0 [ARGS...]");
        return crate::exit::USAGE;
    };
    let parent = parent
        .to_str()
        .and_then(|p| p.parse::<i32>().ok())
        .map(nix::unistd::Pid::from_raw);
    // The request covers only a living parent: die now if it is gone
    // already (this process was reparented).
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
        || parent != Some(nix::unistd::getppid())
    {
        return crate::exit::SOFTWARE;
    }
    let e = std::process::Command::new(program)
        .arg0(argv0)
        .args(rest)
        .exec();
    eprintln!("worklease: cannot run {argv0:?}: {e}");
    if e.kind() == io::ErrorKind::NotFound {
        crate::exit::COMMAND_NOT_FOUND
    } else {
        crate::exit::CANNOT_EXECUTE
    }
}
