//! The check that the database path still names the file the store opened.

use std::path::Path;

use crate::error::{Result, StoreError};

use super::KIND;

/// The device and inode of the database file as opened.
///
/// Every transaction checks that the path still names this file. If the
/// file was deleted (or replaced) under a running store, this process
/// would go on renewing leases in a file nobody else can open, while a new
/// process creates a fresh file at the path whose fencing tokens start
/// again at 1: two holders with one fencing token. Refusing every
/// operation instead makes the holders' renewals fail, so they give up by
/// their deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    pub(super) fn of(path: &Path) -> std::io::Result<Self> {
        Ok(Self::of_metadata(&std::fs::metadata(path)?))
    }

    /// The identity of the file these metadata were read from.
    pub(super) fn of_metadata(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }

    /// Fails unless `path` still names this file.
    pub(super) fn check(&self, path: &Path) -> Result<()> {
        match Self::of(path) {
            Ok(now) if now == *self => Ok(()),
            Ok(_) => Err(StoreError::new(
                KIND,
                format!(
                    "the database file {:?} was replaced while this store had it open: refusing to go on \
                     (its leases and fencing tokens are not the ones this store holds); restart with the new file",
                    path.display()
                ),
            )
            .into()),
            Err(e) => Err(StoreError::with_source(
                KIND,
                format!(
                    "the database file {:?} is gone (deleted while this store had it open?): refusing to go on, \
                     since a new file there would start fencing tokens again at 1",
                    path.display()
                ),
                e,
            )
            .into()),
        }
    }
}
