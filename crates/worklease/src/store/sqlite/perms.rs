//! Who may share the database file: the checks [`super::SqliteStore::open`]
//! makes before SQLite touches the path, and the new file's mode.
//!
//! Anyone who can write the file, or replace it or a directory on its way,
//! can take or forge any lease in it. The path is first resolved
//! ([`super::path::resolve`]): symbolic links in its directories, and a
//! symbolic link at the file's name followed to the file it names. Then
//! every directory from `/` down to the file's, and to each symbolic
//! link's, is opened by handle ([`super::path::walk`]) and judged by what
//! the handle shows, with the rule OpenSSH's `StrictModes` applies to the
//! directories above `authorized_keys` (`safe_path()`: each directory up to
//! `/` must be owned by root or the user, and not writable by others),
//! which this module applies as follows:
//!
//! * a directory that every user may write to is refused unless it has the
//!   sticky bit (`/tmp`, `/dev/shm`): there only an entry's owner may
//!   rename or delete it, and the entry below is checked in turn;
//! * a directory owned by another user than root or the effective one is
//!   refused (its owner can rename what is in it, or `chmod` it). Root
//!   also accepts the owner of the file's own directory (a service
//!   account's `/var/lib/worklease`, inspected with `sudo`): that user
//!   can write the file anyway;
//! * a directory that its group may write to is accepted (OpenSSH refuses
//!   it): the group's members are trusted as a group that shares the file
//!   is (an existing file's mode is left as it is).
//!
//! Then the files, opened in the directory's handle and never through a
//! symbolic link:
//!
//! * a symbolic link followed to the file must be owned by a trusted user
//!   (root, the effective user, for root the store's owner);
//! * an existing database file, or an existing `-wal`, `-shm` or
//!   `-journal` companion, owned by another user than the effective one
//!   is refused (in a shared directory such as `/tmp`, another user could
//!   have planted it); root also accepts the owner of the file's
//!   directory, as above. A companion that is a symbolic link is refused:
//!   SQLite would follow it to a file nothing checked;
//! * a new file is created with mode 0600 in its real directory before
//!   SQLite opens it (an empty file is an empty database). SQLite creates
//!   the `-wal` and `-shm` files with the main file's mode (and, run by
//!   root, its owner). The mode of an existing file is left as it is.
//!
//! SQLite is then given the canonical path (absolute, so never read as a
//! `file:` URI), and once it has opened the file [`Checked::recheck`]
//! checks that the path still names the file checked and that the
//! companions SQLite created or found are still trusted users'.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result, StoreError};

use super::file::FileIdentity;
use super::path::{handle_flags, io_error, links_followed, resolve, walk, Step};
use super::KIND;

/// The SQLite companions of the database file whose owner is checked too.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Whose files and directories are trusted.
#[derive(Debug, Clone, Copy)]
struct Trust {
    /// This process's effective user.
    euid: u32,
    /// The owner of the file's directory, trusted by root.
    store_owner: u32,
}

impl Trust {
    /// May own the database file and its companions.
    fn file(&self, uid: u32) -> bool {
        uid == self.euid || (self.euid == 0 && uid == self.store_owner)
    }

    /// May own a directory on the way to the file, or a symbolic link.
    fn dir(&self, uid: u32) -> bool {
        uid == 0 || self.file(uid)
    }
}

/// The file the checks accepted, for SQLite to open.
#[derive(Debug)]
pub(super) struct Checked {
    /// The file checked (and created, if it was missing).
    pub(super) identity: FileIdentity,
    site: Site,
}

impl Checked {
    /// The canonical path SQLite is given.
    pub(super) fn path(&self) -> &Path {
        &self.site.path
    }

    /// After SQLite opened [`Checked::path`]: the path still names the file
    /// checked, and the companions SQLite created or found (another user
    /// could have put one in a shared directory since the first check) are
    /// trusted users' and no symbolic links.
    pub(super) fn recheck(&self) -> Result<()> {
        self.identity.check(&self.site.path)?;
        self.site.check_companions()
    }
}

/// The file's directory, as walked, and what the checks in it need.
#[derive(Debug)]
struct Site {
    /// The file's canonical path.
    path: PathBuf,
    /// The path the caller gave, which errors name.
    given: PathBuf,
    /// The handle of the file's directory.
    dir: OwnedFd,
    name: OsString,
    trust: Trust,
}

/// Refuses `path` when another local user could write or replace the file
/// (see the module docs), then creates it with mode 0600 if it does not
/// exist. Nothing is written when this fails.
///
/// # Errors
/// [`Error::UnsafeStoreFile`] naming `path` and, in its reason, the
/// offending directory or file and the fix; a [`StoreError`] when a
/// directory or file cannot be read or created, or changed while it was
/// checked.
pub(super) fn prepare(path: &Path) -> Result<Checked> {
    let resolved = resolve(path)?;
    let (dir, steps) = walk(&resolved.dir)?;
    let trust = Trust {
        euid: nix::unistd::geteuid().as_raw(),
        store_owner: steps.last().map_or(0, |s| s.stat.st_uid),
    };
    let refuse = |reason: String| Error::UnsafeStoreFile {
        path: path.to_path_buf(),
        reason,
    };
    check_dirs(&steps, trust).map_err(refuse)?;
    // A symbolic link on the way, in a directory or at the file's name,
    // chooses the file: only root's and this user's are followed, never
    // the store owner's that root otherwise trusts (the link's owner would
    // choose the directory, and so that owner).
    for (link, uid) in links_followed(path)? {
        if uid != 0 && uid != trust.euid {
            return Err(refuse(format!(
                "the symbolic link {:?} is owned by uid {uid}, neither root nor this                  process's user (uid {}): that user chooses the file it leads to; name the                  file without the link, or run as uid {uid}",
                link.display(),
                trust.euid
            )));
        }
    }
    for (link_dir, link) in &resolved.links {
        let (fd, steps) = walk(link_dir)?;
        check_dirs(&steps, trust).map_err(refuse)?;
        let shown = link_dir.join(link);
        let stat = rustix::fs::statat(&fd, link, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_error("cannot read the metadata of", &shown, e.into()))?;
        if !trust.dir(stat.st_uid) {
            return Err(refuse(owned_by(&shown, stat.st_uid, trust)));
        }
    }
    let site = Site {
        path: resolved.path(),
        given: path.to_path_buf(),
        dir,
        name: resolved.name,
        trust,
    };
    site.check_companions()?;
    let identity = site.create_or_check()?;
    Ok(Checked { identity, site })
}

/// The reason a directory on the way fails the rule of the module docs,
/// from the top down (the highest offender is named).
fn check_dirs(steps: &[Step], trust: Trust) -> std::result::Result<(), String> {
    for step in steps {
        let mode = Mode::from_raw_mode(step.stat.st_mode);
        if mode.contains(Mode::WOTH) && !mode.contains(Mode::SVTX) {
            return Err(format!(
                "the directory {:?} is writable by every user and lacks the sticky bit \
                 (mode {:o}): another user could rename what is in it (the file, or the \
                 directory on its way) and put their own in its place; make it writable only \
                 by its users (chmod o-w), or set the sticky bit (chmod +t)",
                step.path.display(),
                mode.bits() & 0o7777
            ));
        }
        if !trust.dir(step.stat.st_uid) {
            return Err(owned_by(&step.path, step.stat.st_uid, trust));
        }
    }
    Ok(())
}

/// Why a directory or symbolic link owned by `uid` is refused.
fn owned_by(path: &Path, uid: u32, trust: Trust) -> String {
    format!(
        "{:?} is owned by uid {uid}, neither root nor this process's user (uid {}): \
         that user could replace the file; keep the store under directories of your own \
         or root's, or run as uid {uid}",
        path.display(),
        trust.euid
    )
}

impl Site {
    fn refuse(&self, reason: String) -> Error {
        Error::UnsafeStoreFile {
            path: self.given.clone(),
            reason,
        }
    }

    /// The name of the file with `suffix`, and its path for messages.
    fn named(&self, suffix: &str) -> (OsString, PathBuf) {
        let mut name = self.name.clone();
        name.push(suffix);
        let shown = self.path.with_file_name(&name);
        (name, shown)
    }

    /// Refuses a companion that another user owns or that is a symbolic
    /// link.
    fn check_companions(&self) -> Result<()> {
        for suffix in COMPANIONS {
            let (name, shown) = self.named(suffix);
            let stat = match rustix::fs::statat(&self.dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(io_error("cannot read the metadata of", &shown, e.into())),
            };
            if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
                return Err(self.refuse(format!(
                    "{:?} is a symbolic link: SQLite would follow it to a file these checks do \
                     not cover; remove it (SQLite makes the file itself)",
                    shown.display()
                )));
            }
            self.check_owner(&shown, stat.st_uid)?;
        }
        Ok(())
    }

    fn check_owner(&self, shown: &Path, uid: u32) -> Result<()> {
        if self.trust.file(uid) {
            return Ok(());
        }
        Err(self.refuse(format!(
            "{:?} is owned by uid {uid}, not by this process's user (uid {}): that user can \
             take or forge any lease in it; run as its owner, or use a store file of your own",
            shown.display(),
            self.trust.euid
        )))
    }

    /// Creates the file (mode 0600) unless it exists, then checks the file
    /// there: not a symbolic link (one appeared since the path was
    /// resolved), owned by a trusted user. Returns its identity.
    fn create_or_check(&self) -> Result<FileIdentity> {
        let (_, shown) = self.named("");
        let created = rustix::fs::openat(
            &self.dir,
            &self.name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        );
        let fd = match created {
            Ok(fd) => fd,
            Err(Errno::EXIST) => self.open_existing(&shown)?,
            Err(e) => {
                return Err(io_error(
                    "cannot create the database file",
                    &shown,
                    e.into(),
                ))
            }
        };
        let meta = std::fs::File::from(fd)
            .metadata()
            .map_err(|e| io_error("cannot read the metadata of", &shown, e))?;
        if !meta.file_type().is_file() {
            // A device would be written over (`sqlite:/dev/sda`), a FIFO
            // or a directory fails later with a puzzling I/O error.
            return Err(self.refuse(format!(
                "{:?} is not a regular file ({}): the SQLite store needs a file of its own",
                shown.display(),
                kind_of(meta.file_type())
            )));
        }
        self.check_owner(&shown, meta.uid())?;
        Ok(FileIdentity::of_metadata(&meta))
    }

    /// Opens the existing file for its metadata only, never through a
    /// symbolic link.
    fn open_existing(&self, shown: &Path) -> Result<OwnedFd> {
        rustix::fs::openat(&self.dir, &self.name, handle_flags(), Mode::empty()).map_err(
            |e| match e {
                Errno::LOOP => StoreError::new(
                    KIND,
                    format!(
                        "{:?} became a symbolic link while it was checked: try again",
                        shown.display()
                    ),
                )
                .into(),
                e => io_error("cannot open the database file", shown, e.into()),
            },
        )
    }
}

/// What a file that is not a regular file is, for messages.
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}
