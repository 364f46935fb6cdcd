//! Who may share the database file: the checks [`super::SqliteStore::open`]
//! makes before SQLite touches the path, and the new file's mode.
//!
//! Anyone who can write the file can take or forge any lease in it, so:
//!
//! * a directory that anyone may write to and that lacks the sticky bit is
//!   refused (another user could delete the file and put their own in its
//!   place);
//! * an existing database file, or an existing `-wal`, `-shm` or
//!   `-journal` companion, owned by another user than the effective one
//!   is refused (in a shared directory such as `/tmp`, another user could
//!   have planted it). Root (effective uid 0) also accepts a file owned by
//!   the user who owns the directory holding it: the store of a service
//!   account (`/var/lib/worklease/leases.db`, owned by `worklease`, which
//!   an operator inspects with `sudo worklease status`) belongs to the
//!   owner of its directory, while a file planted by another user in
//!   root's directory or in `/tmp` does not;
//! * a new file is created with mode 0600 before SQLite opens it (an empty
//!   file is an empty database). SQLite creates the `-wal` and `-shm`
//!   files with the main file's mode (and, run by root, its owner). The
//!   mode of an existing file is left as it is (a group may share it on
//!   purpose).
//!
//! On targets other than Unix these checks are skipped (no owner or mode
//! bits to compare); the file is created by SQLite with its defaults.

use std::path::Path;

use crate::error::{Error, Result, StoreError};

use super::KIND;

/// The SQLite companions of the database file whose owner is checked too.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Refuses `path` when another local user could write it (see the module
/// docs), then creates it with mode 0600 if it does not exist. Nothing is
/// written when this fails.
#[cfg(unix)]
pub(super) fn prepare(path: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    let refuse = |reason: String| Error::UnsafeStoreFile {
        path: path.to_path_buf(),
        reason,
    };
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => dir,
        None => Path::new("."),
    };
    let dir_meta = std::fs::metadata(dir).map_err(|e| {
        StoreError::with_source(
            KIND,
            format!(
                "cannot read the metadata of the directory {:?}",
                dir.display()
            ),
            e,
        )
    })?;
    let mode = dir_meta.mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(format!(
            "its directory {:?} is writable by every user and lacks the sticky bit \
             (mode {:o}): another user could replace the file; use a directory only \
             its users can write (chmod o-w), or set the sticky bit (chmod +t)",
            dir.display(),
            mode & 0o7777
        )));
    }
    let euid = nix::unistd::geteuid().as_raw();
    let trusted = |uid: u32| uid == euid || (euid == 0 && uid == dir_meta.uid());
    let mut names = vec![path.as_os_str().to_owned()];
    names.extend(COMPANIONS.iter().map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        name
    }));
    for name in &names {
        // The link itself and, for a symbolic link, the file it names.
        let untrusted = std::fs::symlink_metadata(name).map(|link| {
            let target = match link.file_type().is_symlink() {
                true => std::fs::metadata(name).map(|m| m.uid()).ok(),
                false => None,
            };
            [Some(link.uid()), target]
                .into_iter()
                .flatten()
                .find(|u| !trusted(*u))
        });
        match untrusted {
            Ok(Some(uid)) => {
                return Err(refuse(format!(
                    "{:?} is owned by uid {}, not by this process's user (uid {euid}): \
                     that user can take or forge any lease in it; run as its owner, \
                     or use a store file of your own",
                    Path::new(name).display(),
                    uid
                )))
            }
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(StoreError::with_source(
                    KIND,
                    format!(
                        "cannot read the metadata of {:?}",
                        Path::new(name).display()
                    ),
                    e,
                )
                .into())
            }
        }
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::with_source(
            KIND,
            format!("cannot create the database file {:?}", path.display()),
            e,
        )
        .into()),
    }
}

/// Non-Unix targets: no owner or mode bits to check (see the module docs).
#[cfg(not(unix))]
pub(super) fn prepare(_path: &Path) -> Result<()> {
    Ok(())
}
