//! Exit statuses of the `worklease` command, and the failure type that
//! carries one to `main`.
//!
//! The numbers follow `sysexits.h` where one fits (64, 69, 70, 74, 75, 77) and
//! the shells' conventions for commands that cannot be run (126, 127) or
//! were ended by a signal (128 + N).

use worklease::Error;

/// `release --force` or `checkpoint get --work-id` named a work ID the
/// store does not know.
pub const NOT_FOUND: u8 = 4;
/// EX_USAGE: bad arguments, invalid input (an empty work ID, a zero TTL, a
/// malformed token) or a malformed or unsupported store URL.
pub const USAGE: u8 = 64;
/// EX_UNAVAILABLE: the store cannot be opened or failed (I/O error, busy,
/// corrupt or newer schema).
pub const UNAVAILABLE: u8 = 69;
/// EX_SOFTWARE: an internal error of worklease itself.
pub const SOFTWARE: u8 = 70;
/// EX_IOERR: reading standard input or writing standard output failed.
pub const IO: u8 = 74;
/// EX_TEMPFAIL: the lease is held by another holder and `--wait` was not
/// given.
pub const HELD: u8 = 75;
/// The lease was lost while the child ran (expired, revoked or taken
/// over), or a `checkpoint` was refused because the token is stale.
pub const LOST: u8 = 76;
/// EX_NOPERM: the SQLite store file is refused because another local user
/// could write it (its directory is writable by all without the sticky bit,
/// or another user owns it).
pub const NOPERM: u8 = 77;
/// The command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const COMMAND_NOT_FOUND: u8 = 127;

/// The table of exit statuses, as shown by `worklease --help`.
pub const HELP: &str = "\
Exit status:
  0        success (run: the child succeeded; pool: every work ID is done)
  1-125    run: the child's own exit status
  4        release --force, checkpoint get --work-id: the store does not know the work ID
  64       usage error: bad arguments, empty work ID, zero TTL or one too
           short to renew, --grace over TTL/2, malformed token, malformed
           store URL (also a SQLite path starting with an unexpanded `~`)
           or unknown/unsupported store scheme
  69       the store cannot be opened or failed (I/O, busy, corrupt); for
           status, release and checkpoint also: no store at the path (they
           never create one)
  70       internal error of worklease (pool: a work ID failed for good)
  74       reading stdin or writing stdout failed
  75       the lease is held by another holder (run without --wait)
  76       the lease was lost while the child ran (expired, revoked by
           `release --force`, taken over, or renewals failed until the
           holder's deadline); checkpoint: stale token
  77       the SQLite store file is refused: another user could write it
           (its directory is writable by all without the sticky bit, or
           the file is another user's), or it is not a regular file;
           nothing was written
  126/127  run, pool: the command cannot be executed / was not found
  128+N    run: the child was ended by signal N (130 for SIGINT,
           143 for SIGTERM); also when worklease itself is interrupted
           while waiting for the lease, and when signal N stopped a pool
The child of run or elect may exit with 64-77 itself: when a status is
worklease's own, the last line worklease writes to stderr starts with
`worklease:` and says why (76: `worklease: exit 76: ...`).";

/// A failed subcommand: the exit status and a one-line message for stderr.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// What went wrong, without a trailing newline; already redacted.
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// A usage error (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }
}

/// The exit status for a library error.
pub fn code_of(error: &Error) -> u8 {
    match error {
        Error::Held { .. } | Error::PermitsHeld { .. } | Error::WaitersAhead { .. } => HELD,
        Error::Expired { .. } | Error::Fenced { .. } | Error::WindowExhausted { .. } => LOST,
        Error::Invalid(_) => USAGE,
        Error::UnsafeStoreFile { .. } => NOPERM,
        Error::Store(_) | Error::StoreSetup(_) => UNAVAILABLE,
        _ => SOFTWARE,
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self::new(code_of(&error), error.to_string())
    }
}

/// The exit status of a process that ended with `status`: its code, or 128
/// plus the signal that ended it.
pub fn of_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(SOFTWARE),
        (None, None) => SOFTWARE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_documented_statuses() {
        let held = Error::Held {
            work_id: "w".into(),
            holder_id: "h".into(),
            expires_in: None,
        };
        assert_eq!(code_of(&held), HELD);
        let fenced = Error::Fenced {
            work_id: "w".into(),
            holder_id: "h".into(),
            fencing_token: 1,
        };
        assert_eq!(code_of(&fenced), LOST);
        let invalid = Error::from(worklease::InvalidInput::EmptyWorkId { max: 1024 });
        assert_eq!(code_of(&invalid), USAGE);
        let store = Error::from(worklease::StoreError::new("sqlite", "disk on fire"));
        assert_eq!(code_of(&store), UNAVAILABLE);
        let unsafe_file = Error::UnsafeStoreFile {
            path: "/tmp/x/leases.db".into(),
            reason: "its directory is writable by every user".into(),
        };
        assert_eq!(code_of(&unsafe_file), NOPERM);
    }

    #[test]
    fn signals_become_128_plus_n() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(of_status(std::process::ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(of_status(std::process::ExitStatus::from_raw(9)), 137);
        assert_eq!(of_status(std::process::ExitStatus::from_raw(15)), 143);
    }
}
