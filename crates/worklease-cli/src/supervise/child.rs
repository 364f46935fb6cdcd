//! Starting a child in its own process group, with the `WORKLEASE_*`
//! environment of its lease.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::Stdio;

use worklease::Token;

use super::signals::{job_control_mask, GroupEntry};
use crate::exit::{self, Failure};

/// The failure for a command that cannot be started.
pub fn cannot_run(command: &[OsString], e: std::io::Error) -> Failure {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => exit::COMMAND_NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    };
    Failure::new(code, format!("cannot run {:?}: {e}", command[0]))
}

/// A child started by [`spawn`] or [`spawn_in_group`], leading its own
/// process group, which the job-control handler knows of until the child's
/// supervision ends.
pub struct Child {
    pub(super) process: tokio::process::Child,
    pub(super) _entry: Option<GroupEntry>,
}

/// Starts the child in its own process group with the `WORKLEASE_*`
/// environment; on Linux it is killed if this process dies. When stdin is a
/// terminal, the child gets `/dev/null` instead: in a background process
/// group, reading the terminal would stop it (SIGTTIN) while it holds the
/// lease.
pub async fn spawn(command: &[OsString], token: &Token, store_url: &str) -> std::io::Result<Child> {
    let terminal = std::io::stdin().is_terminal();
    if terminal {
        tracing::info!(
            "stdin is a terminal: the child gets /dev/null as its stdin (in its own process group, \
             reading the terminal would stop it while it holds the lease); pipe or redirect input \
             to give it some"
        );
    }
    spawn_in_group(command, token, store_url, terminal).await
}

/// Starts `command` in its own process group with the `WORKLEASE_*`
/// environment of `token` and `store_url`, registered for job control; on
/// Linux it is killed if this process dies. With `null_stdin` its stdin is
/// `/dev/null`, else this process's.
///
/// Returns once the command runs (its `exec` succeeded).
///
/// # Errors
/// The spawn's: `NotFound` when the program does not exist (or is not in
/// `PATH`, or its `#!` interpreter does not exist), `PermissionDenied`
/// when it is a directory or not executable, another `exec` error as it
/// came, `InvalidInput` for an empty `command`.
pub async fn spawn_in_group(
    command: &[OsString],
    token: &Token,
    store_url: &str,
    null_stdin: bool,
) -> std::io::Result<Child> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"))?;
    // Found here, so that a missing command is an error of the spawn.
    let resolved = super::exec::resolve(program)?;
    #[cfg(target_os = "linux")]
    let (report, child_end) = super::exec::report_pipe()?;
    #[cfg(target_os = "linux")]
    let mut cmd = child_command(&resolved, program, &child_end)?;
    #[cfg(not(target_os = "linux"))]
    let mut cmd = child_command(&resolved, program);
    cmd.args(rest)
        .env("WORKLEASE_WORK_ID", token.work_id().as_str())
        .env("WORKLEASE_HOLDER_ID", token.holder_id().as_str())
        .env("WORKLEASE_FENCING_TOKEN", token.fencing_token().to_string())
        .env("WORKLEASE_TOKEN", token.to_string())
        .env("WORKLEASE_STORE", store_url)
        .process_group(0);
    if null_stdin {
        cmd.stdin(Stdio::null());
    }
    tracing::debug!(command = ?command, "starting the child");
    // A job-control signal between the fork and the moment the child's
    // process group is recorded would stop this process but not the child:
    // hold such signals back meanwhile (only this thread takes them).
    job_control_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK)?;
    let spawned = cmd.spawn().map(|process| {
        let entry = process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(GroupEntry::register);
        Child {
            process,
            _entry: entry,
        }
    });
    // Cannot fail with a valid set; a child must never be dropped here.
    let _ = job_control_mask(nix::sys::signal::SigmaskHow::SIG_UNBLOCK);
    #[cfg(target_os = "linux")]
    {
        // Only the child holds its end now: end of file comes at its exec.
        drop(child_end);
        let child = spawned?;
        // An exec that failed: the starter exits at once (reaped in the
        // background once dropped), and the spawn fails as a direct exec
        // would have.
        report.wait().await?;
        crate::telemetry::child_started();
        Ok(child)
    }
    #[cfg(not(target_os = "linux"))]
    spawned.inspect(|_| crate::telemetry::child_started())
}

/// The command that starts `resolved`: through this binary
/// ([`super::exec::EXEC_CHILD`], which asks for the parent-death signal,
/// Linux), with `argv0` as the command's own name and `report` as the
/// descriptor it reports a failed `exec` on.
///
/// # Errors
/// `Other` when `/proc` is not mounted (this binary is started as
/// `/proc/self/exe`).
#[cfg(target_os = "linux")]
fn child_command(
    resolved: &std::path::Path,
    argv0: &std::ffi::OsStr,
    report: &std::os::fd::OwnedFd,
) -> std::io::Result<tokio::process::Command> {
    use std::os::fd::AsRawFd;
    if !std::path::Path::new(super::exec::SELF_EXE).exists() {
        return Err(std::io::Error::other(format!(
            "{} is missing (is /proc mounted?): worklease starts its children through it",
            super::exec::SELF_EXE
        )));
    }
    let mut cmd = tokio::process::Command::new(super::exec::SELF_EXE);
    cmd.arg(super::exec::EXEC_CHILD)
        .arg(nix::unistd::getpid().to_string())
        .arg(report.as_raw_fd().to_string())
        .arg(resolved)
        .arg(argv0);
    Ok(cmd)
}

/// The command that starts `resolved` itself, named `argv0` (no
/// parent-death signal off Linux).
#[cfg(not(target_os = "linux"))]
fn child_command(resolved: &std::path::Path, argv0: &std::ffi::OsStr) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(resolved);
    cmd.arg0(argv0);
    cmd
}
