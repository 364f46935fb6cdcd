//! The SQLite store's file permissions (issue 23): a new file is the
//! user's alone, and a file another local user could write is refused
//! before anything is written.
#![cfg(all(unix, feature = "sqlite"))]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use worklease::store::sqlite::SqliteStore;
use worklease::Error;

const NOBODY: u32 = 65534;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory with `mode` in a new temporary directory (kept while the
/// first value lives).
fn dir_with_mode(mode: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sub = subdir(dir.path(), "sub", mode);
    (dir, sub)
}

/// A new directory `name` with `mode` in `parent`.
fn subdir(parent: &Path, name: &str, mode: u32) -> PathBuf {
    let sub = parent.join(name);
    std::fs::create_dir(&sub).unwrap();
    chmod(&sub, mode);
    sub
}

/// Changing a file's owner needs root (CI runs as root); as another user
/// the cases that need it cannot be set up, so they are skipped with a
/// printed reason.
fn can_chown() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: chown to uid {NOBODY} needs root");
    }
    root
}

/// Creates an empty file at `path` owned by `nobody`.
fn plant(path: &Path) {
    std::fs::write(path, b"").unwrap();
    std::os::unix::fs::chown(path, Some(NOBODY), None).unwrap();
}

fn assert_refused(result: worklease::Result<SqliteStore>, path: &Path, reason_has: &str) {
    match result {
        Err(Error::UnsafeStoreFile { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains(reason_has), "{reason}");
            let message = Error::UnsafeStoreFile { path: p, reason }.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected UnsafeStoreFile for {path:?}, got {other:?}"),
    }
}

#[test]
fn a_new_file_and_its_wal_and_shm_are_the_users_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let _store = SqliteStore::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    // WAL mode makes SQLite create both companions at open.
    for suffix in ["-wal", "-shm"] {
        let companion = dir.path().join(format!("leases.db{suffix}"));
        assert_eq!(mode(&companion), 0o600, "{companion:?}");
    }
}

#[test]
fn an_existing_files_mode_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    drop(SqliteStore::open(&path).unwrap());
    chmod(&path, 0o640);
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(mode(&path), 0o640);
}

#[test]
fn a_world_writable_directory_without_the_sticky_bit_is_refused_and_nothing_written() {
    let (_dir, open) = dir_with_mode(0o777);
    let path = open.join("leases.db");
    assert_refused(SqliteStore::open(&path), &path, "sticky bit");
    let left: Vec<_> = std::fs::read_dir(&open).unwrap().collect();
    assert!(left.is_empty(), "files written: {left:?}");
}

#[test]
fn a_world_writable_directory_with_the_sticky_bit_is_accepted() {
    let (_dir, shared) = dir_with_mode(0o1777);
    let path = shared.join("leases.db");
    SqliteStore::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn a_file_or_companion_owned_by_another_user_is_refused() {
    if !can_chown() {
        return;
    }
    // Root's own directory: a file another user put there is not root's.
    for planted in ["leases.db", "leases.db-wal"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let file = dir.path().join(planted);
        plant(&file);
        assert_refused(SqliteStore::open(&path), &path, &format!("uid {NOBODY}"));
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            0,
            "{planted} was written"
        );
    }
}

#[test]
fn a_symbolic_link_to_another_users_file_is_refused() {
    if !can_chown() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("theirs.db");
    plant(&target);
    let path = dir.path().join("leases.db");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    assert_refused(SqliteStore::open(&path), &path, &format!("uid {NOBODY}"));
}

#[test]
fn root_accepts_the_store_of_the_user_who_owns_its_directory() {
    if !can_chown() {
        return;
    }
    // A service account's state directory and store, as the Debian
    // package sets them up, inspected by an operator as root.
    let (_dir, state) = dir_with_mode(0o750);
    let path = state.join("leases.db");
    drop(SqliteStore::open(&path).unwrap());
    for name in ["", "leases.db", "leases.db-wal", "leases.db-shm"] {
        let p = state.join(name);
        if p.exists() {
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let _store = SqliteStore::open(&path).unwrap();
    // SQLite run by root gives the companions it creates (again: the last
    // close removed them) the file's owner.
    for suffix in ["-wal", "-shm"] {
        let companion = state.join(format!("leases.db{suffix}"));
        assert_eq!(
            std::fs::metadata(&companion).unwrap().uid(),
            NOBODY,
            "{companion:?}"
        );
    }
}

/// The entries of `dir`, which the assertions below expect to be empty.
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn a_sqlite_file_uri_is_refused_and_nothing_written() {
    let (_dir, open) = dir_with_mode(0o777);
    let target = open.join("leases.db");
    // SQLite reads a name starting with `file:` as a URI: the checks would
    // look at `./file:...` while SQLite opened the file in `open`.
    let url = format!("sqlite:file:{}", target.display());
    match worklease::store::url::open(&url).err() {
        Some(Error::Invalid(worklease::InvalidInput::StoreUrl { reason, .. })) => {
            assert!(reason.contains("sqlite:/"), "{reason}")
        }
        other => panic!("expected a refused URL, got {other:?}"),
    }
    let name = PathBuf::from(format!("file:{}", target.display()));
    assert_refused(SqliteStore::open(&name), &name, "sqlite:/");
    assert!(entries(&open).is_empty());
    assert!(
        !Path::new("file:").exists(),
        "a file: directory was created"
    );
}

#[test]
fn a_symbolic_link_into_a_world_writable_directory_is_refused() {
    let (dir, open) = dir_with_mode(0o777);
    // A link to a file not made yet (SQLite would create it there), and
    // one to a file that exists.
    for existing in [false, true] {
        let target = open.join("leases.db");
        if existing {
            std::fs::write(&target, b"").unwrap();
        }
        let path = dir.path().join(format!("link-{existing}.db"));
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert_refused(SqliteStore::open(&path), &path, "sticky bit");
        let written: Vec<_> = entries(&open)
            .into_iter()
            .filter(|p| !existing || *p != target)
            .collect();
        assert!(written.is_empty(), "files written: {written:?}");
        assert_eq!(std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0), 0);
    }
}

#[test]
fn a_symbolic_link_to_a_private_directory_creates_the_file_there_as_0600() {
    let (dir, private) = dir_with_mode(0o700);
    let target = private.join("leases.db");
    let path = dir.path().join("leases.db");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(mode(&target), 0o600);
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_symlink());
    for suffix in ["-wal", "-shm"] {
        let companion = private.join(format!("leases.db{suffix}"));
        assert_eq!(mode(&companion), 0o600, "{companion:?}");
    }
    drop(store);
}

#[test]
fn a_world_writable_ancestor_without_the_sticky_bit_is_refused() {
    // open (0777) / sub (0755, this user's) / leases.db: another user can
    // rename `sub` away and put their own directory in its place.
    let (_dir, open) = dir_with_mode(0o777);
    let sub = subdir(&open, "sub", 0o755);
    let path = sub.join("leases.db");
    assert_refused(SqliteStore::open(&path), &path, "sticky bit");
    match SqliteStore::open(&path) {
        Err(e) => assert!(
            e.to_string().contains(&format!("{:?}", open.display())),
            "{e}"
        ),
        Ok(_) => unreachable!(),
    }
    assert!(entries(&sub).is_empty());
}

#[test]
fn an_ancestor_owned_by_another_user_is_refused() {
    if !can_chown() {
        return;
    }
    // theirs (nobody's, 0755) / mine (this user's, 0700) / leases.db:
    // nobody can rename `mine` away.
    let (_dir, theirs) = dir_with_mode(0o755);
    let mine = subdir(&theirs, "mine", 0o700);
    std::os::unix::fs::chown(&theirs, Some(NOBODY), None).unwrap();
    let path = mine.join("leases.db");
    assert_refused(SqliteStore::open(&path), &path, &format!("uid {NOBODY}"));
    assert!(entries(&mine).is_empty());
}

#[test]
fn another_users_symbolic_link_is_not_followed_even_by_root() {
    if !can_chown() {
        return;
    }
    // A shared, sticky directory like /tmp, where nobody made a directory
    // of their own and, beside it, links into it: root, which trusts the
    // owner of a store file's directory, must not be led there by them.
    let (_dir, shared) = dir_with_mode(0o1777);
    let theirs = subdir(&shared, "theirs", 0o755);
    std::os::unix::fs::chown(&theirs, Some(NOBODY), None).unwrap();
    let file_link = shared.join("victim.db");
    std::os::unix::fs::symlink(theirs.join("victim.db"), &file_link).unwrap();
    let dir_link = shared.join("lnkdir");
    std::os::unix::fs::symlink(&theirs, &dir_link).unwrap();
    for link in [&file_link, &dir_link] {
        std::os::unix::fs::lchown(link, Some(NOBODY), None).unwrap();
    }
    for path in [file_link.clone(), dir_link.join("x.db")] {
        assert_refused(SqliteStore::open(&path), &path, "symbolic link");
    }
    assert!(entries(&theirs).is_empty(), "{:?}", entries(&theirs));
}

#[test]
fn a_fifo_or_a_directory_is_refused_as_the_store_file() {
    let (_dir, mine) = dir_with_mode(0o700);
    let fifo = mine.join("fifo.db");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert_refused(SqliteStore::open(&fifo), &fifo, "a FIFO");
    let dir = subdir(&mine, "dir.db", 0o700);
    assert_refused(SqliteStore::open(&dir), &dir, "a directory");
    let mut left = entries(&mine);
    left.sort();
    assert_eq!(left, vec![dir, fifo], "nothing else is written");
}

#[test]
fn a_directory_that_cannot_be_made_is_refused_saying_why() {
    let (_dir, mine) = dir_with_mode(0o700);
    // A loop of symbolic links and a plain file where a directory goes:
    // "File exists" would say neither.
    std::os::unix::fs::symlink(mine.join("b"), mine.join("a")).unwrap();
    std::os::unix::fs::symlink(mine.join("a"), mine.join("b")).unwrap();
    std::fs::write(mine.join("f"), "").unwrap();
    for (dir, why) in [("a", "symbolic links"), ("f", "not a directory")] {
        let url = format!("sqlite:{}", mine.join(dir).join("leases.db").display());
        let e = worklease::store::url::open(&url).err().expect("refused");
        let text = format!("{e}: {:?}", std::error::Error::source(&e));
        assert!(
            text.contains("cannot create the directory") && text.contains(why),
            "{text}"
        );
    }
}
