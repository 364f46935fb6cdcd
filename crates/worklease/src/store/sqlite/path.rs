//! Where the database file really is: its path with every symbolic link
//! resolved, and its directories opened one by one from `/` down, so that
//! [`super::perms`] judges the directories SQLite will use and not those a
//! link or a swapped directory shows in their place.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, Stat};

use crate::error::{Error, Result, StoreError};

use super::KIND;

/// How many symbolic links [`resolve`] follows at the file's name before it
/// gives up: Linux's own limit for one path (`MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Opening a file or directory only to read its metadata (and, for a
/// directory, to open what is in it), never through a symbolic link: no
/// read permission needed (`O_PATH` on Linux and Android; a read-only open
/// elsewhere).
pub(super) fn handle_flags() -> OFlags {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let access = OFlags::PATH;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let access = OFlags::RDONLY;
    access | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn dir_flags() -> OFlags {
    handle_flags() | OFlags::DIRECTORY
}

/// The database file's real place: a canonical directory (absolute, no
/// symbolic link, no `.` or `..`) and the file's name in it, and the
/// symbolic links followed to get there (each as its canonical directory
/// and its name there), whose directories are checked too: whoever can
/// swap a link chooses the file.
#[derive(Debug)]
pub(super) struct Resolved {
    pub(super) dir: PathBuf,
    pub(super) name: OsString,
    pub(super) links: Vec<(PathBuf, OsString)>,
}

impl Resolved {
    /// The file's canonical path, which is what SQLite is given (it starts
    /// with `/`, so SQLite can never read it as a `file:` URI).
    pub(super) fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

/// A failed file-system call on `path`, as a [`StoreError`].
pub(super) fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    StoreError::with_source(KIND, format!("{what} {:?}", path.display()), e).into()
}

/// Resolves `path` to the file SQLite would open: the symbolic links in its
/// directories, and a symbolic link at the file's own name followed to the
/// file it names, also one that does not exist yet (SQLite would create
/// it there).
///
/// # Errors
/// A [`StoreError`] when a directory on the way does not exist or cannot
/// be read, `path` names no file (`/`, a trailing `..`), or links at the
/// file's name form a loop or a chain longer than [`MAX_LINKS`].
pub(super) fn resolve(path: &Path) -> Result<Resolved> {
    let mut next = path.to_path_buf();
    let mut links = Vec::new();
    for _ in 0..=MAX_LINKS {
        let name = next.file_name().map(OsString::from).ok_or_else(|| {
            StoreError::new(KIND, format!("{:?} does not name a file", next.display()))
        })?;
        let parent = next.parent().filter(|p| !p.as_os_str().is_empty());
        let parent = parent.unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(parent)
            .map_err(|e| io_error("cannot resolve the directory", parent, e))?;
        let file = dir.join(&name);
        match std::fs::symlink_metadata(&file) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&file)
                    .map_err(|e| io_error("cannot read the symbolic link", &file, e))?;
                // An absolute target replaces `dir`; a relative one is
                // read from the link's directory.
                next = dir.join(target);
                links.push((dir, name));
            }
            Ok(_) => return Ok(Resolved { dir, name, links }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Resolved { dir, name, links })
            }
            Err(e) => return Err(io_error("cannot read the metadata of", &file, e)),
        }
    }
    Err(StoreError::new(
        KIND,
        format!(
            "{:?}: more than {MAX_LINKS} symbolic links (a loop?)",
            path.display()
        ),
    )
    .into())
}

/// Every symbolic link the kernel would follow to open `path`, in its
/// directories and at its name, chains included, with each link's owner:
/// `path` is followed one component at a time (made absolute from the
/// current directory; `..` after a link goes up from the link's target, as
/// the kernel does). Components that do not exist yet end the walk.
///
/// # Errors
/// A [`StoreError`] when a component cannot be read or more than
/// [`MAX_LINKS`] links are followed (a loop).
pub(super) fn links_followed(path: &Path) -> Result<Vec<(PathBuf, u32)>> {
    use std::os::unix::fs::MetadataExt;
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| io_error("cannot read the current directory for", path, e))?
            .join(path)
    };
    let parts = |p: &Path| -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    };
    let mut pending: std::collections::VecDeque<OsString> = parts(&absolute).into();
    let mut done = PathBuf::from("/");
    let mut links = Vec::new();
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            done.pop();
            continue;
        }
        let next = done.join(&part);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                if links.len() == MAX_LINKS {
                    return Err(StoreError::new(
                        KIND,
                        format!(
                            "{:?}: more than {MAX_LINKS} symbolic links (a loop?)",
                            path.display()
                        ),
                    )
                    .into());
                }
                let target = std::fs::read_link(&next)
                    .map_err(|e| io_error("cannot read the symbolic link", &next, e))?;
                links.push((next, m.uid()));
                if target.is_absolute() {
                    done = PathBuf::from("/");
                }
                for p in parts(&target).into_iter().rev() {
                    pending.push_front(p);
                }
            }
            Ok(_) => done = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(io_error("cannot read the metadata of", &next, e)),
        }
    }
    Ok(links)
}

/// One directory of the walk: its path and its metadata, read from the
/// handle the walk opened.
pub(super) struct Step {
    pub(super) path: PathBuf,
    pub(super) stat: Stat,
}

/// Opens `dir` (canonical, from [`resolve`]) one directory at a time from
/// `/` down, each in the one above it (`openat`) and never through a
/// symbolic link, and returns the handle of `dir` with every directory's
/// metadata from the top down (`/` first). The metadata are those of the
/// directories opened, whatever their names show afterwards.
///
/// # Errors
/// A [`StoreError`] when a directory cannot be opened, or is no longer a
/// directory or is now a symbolic link (changed since [`resolve`]).
pub(super) fn walk(dir: &Path) -> Result<(OwnedFd, Vec<Step>)> {
    let open = |at: &OwnedFd, name: &std::ffi::OsStr, path: &Path| {
        rustix::fs::openat(at, name, dir_flags(), Mode::empty()).map_err(|e| {
            io_error(
                "cannot open the directory (changed while it was checked?)",
                path,
                e.into(),
            )
        })
    };
    let stat = |fd: &OwnedFd, path: &Path| {
        rustix::fs::fstat(fd)
            .map_err(|e| io_error("cannot read the metadata of the directory", path, e.into()))
    };
    let root = Path::new("/");
    let mut fd = rustix::fs::open(root, dir_flags(), Mode::empty())
        .map_err(|e| io_error("cannot open the directory", root, e.into()))?;
    let mut steps = vec![Step {
        path: root.to_path_buf(),
        stat: stat(&fd, root)?,
    }];
    let mut path = root.to_path_buf();
    for component in dir.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => {
                path.push(name);
                fd = open(&fd, name, &path)?;
                steps.push(Step {
                    stat: stat(&fd, &path)?,
                    path: path.clone(),
                });
            }
            _ => {
                return Err(StoreError::new(
                    KIND,
                    format!("{:?} is not a canonical directory", dir.display()),
                )
                .into())
            }
        }
    }
    Ok((fd, steps))
}
