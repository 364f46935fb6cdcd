//! The SQLite store file refused through the command line (issue 23): a
//! file another local user could replace ends the command with exit 77
//! and a message naming the offending directory and the fix, a
//! `sqlite:file:` URL with exit 64; nothing is written.
#![cfg(unix)]

mod common;
use common::{stderr, World};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A new directory `name` with `mode` in the world's directory.
fn dir(w: &World, name: &str, mode: u32) -> PathBuf {
    let path = w.path(name);
    std::fs::create_dir(&path).expect("mkdir");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

fn run_on(w: &World, store: &str) -> std::process::Output {
    w.cmd(&["run", "--store", store, "job", "--", "true"])
        .output()
        .expect("run worklease")
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).expect("read_dir").collect();
    assert!(left.is_empty(), "written in {dir:?}: {left:?}");
}

#[test]
fn a_world_writable_ancestor_or_a_link_into_one_exits_77_naming_it() {
    let w = World::new();
    let open = dir(&w, "open", 0o777);
    let sub = open.join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    let link = w.path("link.db");
    std::os::unix::fs::symlink(open.join("leases.db"), &link).expect("symlink");
    for file in [sub.join("leases.db"), link] {
        let out = run_on(&w, &format!("sqlite:{}", file.display()));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(77), "{file:?}: {err}");
        assert!(
            err.contains(&format!("{:?}", open.display())) && err.contains("chmod o-w"),
            "{err}"
        );
    }
    assert_empty(&sub);
    let in_open: Vec<_> = std::fs::read_dir(&open)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(in_open, ["sub"], "written in {open:?}");
}

#[test]
fn a_sqlite_file_uri_exits_64_with_the_plain_form() {
    let w = World::new();
    let open = dir(&w, "open", 0o777);
    let out = run_on(
        &w,
        &format!("sqlite:file:{}/leases.db?mode=rwc", open.display()),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("sqlite:/"), "{err}");
    assert_empty(&open);
}
