//! `worklease completions SHELL` and `worklease man` (issue 24): the
//! completion scripts and the man pages are generated from the command's
//! own definitions, so they know every subcommand `--help` lists.

mod common;
use common::{stderr, World};

use std::process::Output;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands `worklease --help` lists (clap's `help` aside).
fn listed_subcommands(w: &World) -> Vec<String> {
    let out = w.output(&["--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    let listed: Vec<String> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        // A long description wraps onto indented lines of its own.
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(listed.contains(&"elect".to_owned()), "{help}");
    listed
}

#[test]
fn completions_for_every_shell_name_every_subcommand() {
    let w = World::new();
    let subcommands = listed_subcommands(&w);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = w.output(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for name in &subcommands {
            assert!(script.contains(name.as_str()), "{shell}: no {name:?}");
        }
        // Options too, down to a subcommand's own.
        assert!(script.contains("work-ids"), "{shell}: no --work-ids");
        // Not the hidden child of `worklease demo`.
        assert!(!script.contains("demo-shard"), "{shell}: offers demo-shard");
    }
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    let w = World::new();
    let out = w.output(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).starts_with("worklease: "), "{}", stderr(&out));
}

/// `worklease ARGS` with the pages dated 2001-09-09 (SOURCE_DATE_EPOCH).
fn dated(w: &World, args: &[&str]) -> Output {
    w.cmd(args)
        .env("SOURCE_DATE_EPOCH", "1000000000")
        .output()
        .expect("run worklease")
}

#[test]
fn the_man_page_has_a_title_and_refers_to_every_subcommand_page() {
    let w = World::new();
    let out = dated(&w, &["man"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    let version = env!("CARGO_PKG_VERSION");
    let title = format!("\n.TH worklease 1 2001-09-09 \"worklease {version}\" ");
    assert!(page.contains(&title), "no {title:?} in {page}");
    assert!(page.contains("\n.SH SUBCOMMANDS"), "{page}");
    for name in listed_subcommands(&w) {
        // roff escapes the hyphen: worklease\-elect(1).
        let reference = format!("worklease\\-{name}(1)");
        assert!(page.contains(&reference), "no {reference} in {page}");
    }
    // The long help's exit statuses are part of the page, its table kept
    // as written (no-fill), one status per line.
    let details = page
        .split("\n.SH DETAILS\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no DETAILS section: {page}"));
    let table = details
        .split("Exit status:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no exit status: {details}"));
    assert!(
        table.starts_with(".PP\n.nf\n  0 "),
        "the exit status table is not kept as written: {table}"
    );
    assert!(table.contains("\n  64 "), "{table}");
}

/// Every page reads without a groff warning where groff is installed (the
/// Debian package's check runs it on every machine).
#[test]
fn every_page_is_free_of_groff_warnings() {
    let groff = std::process::Command::new("groff")
        .arg("--version")
        .output();
    if !groff.is_ok_and(|o| o.status.success()) {
        eprintln!("groff is not installed: packaging/check-deb.sh checks the pages");
        return;
    }
    let w = World::new();
    for page in [
        &["man"][..],
        &["man", "run"],
        &["man", "elect"],
        &["man", "pool"],
    ] {
        let out = dated(&w, page);
        let mut child = std::process::Command::new("groff")
            .args(["-man", "-z", "-ww"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("groff");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&out.stdout)
            .expect("write the page");
        let done = child.wait_with_output().expect("groff");
        assert!(done.status.success(), "{page:?}");
        let warnings = String::from_utf8_lossy(&done.stderr);
        assert!(warnings.is_empty(), "{page:?}: {warnings}");
    }
}

#[test]
fn a_subcommand_page_documents_its_own_options() {
    let w = World::new();
    let out = dated(&w, &["man", "elect"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    // A subcommand's page names the release too.
    let title = format!(
        ".TH worklease-elect 1 2001-09-09 \"worklease {}\" ",
        env!("CARGO_PKG_VERSION")
    );
    assert!(page.contains(&title), "no {title:?} in {page}");
    assert!(page.contains("\\-\\-grace"), "{page}");
    assert!(!page.contains("\\-\\-work\\-ids"), "pool's option: {page}");
    // The environment variable --store falls back to (clap_mangen's
    // OPTIONS leave it out).
    let env = page
        .split("\n.SH ENVIRONMENT\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no ENVIRONMENT section: {page}"));
    assert!(
        env.contains("WORKLEASE_STORE") && env.contains("\\-\\-store"),
        "{env}"
    );

    let out = w.output(&["man", "checkpoint", "set"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(".TH worklease-checkpoint-set 1 "));
}

#[test]
fn a_malformed_source_date_epoch_is_a_usage_error() {
    let w = World::new();
    let out = w
        .cmd(&["man"])
        .env("SOURCE_DATE_EPOCH", "yesterday")
        .output()
        .expect("run worklease");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("SOURCE_DATE_EPOCH"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_page_of_an_unknown_or_hidden_subcommand_is_a_usage_error() {
    let w = World::new();
    for name in ["nosuch", "demo-shard"] {
        let out = w.output(&["man", name]);
        assert_eq!(out.status.code(), Some(64), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(name), "{}", stderr(&out));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn man_out_dir_writes_one_page_per_visible_subcommand() {
    let w = World::new();
    let dir = w.path("man");
    let out = dated(&w, &["man", "--out-dir", dir.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut expected = vec![
        "worklease.1".to_owned(),
        "worklease-checkpoint-set.1".into(),
    ];
    expected.extend(
        listed_subcommands(&w)
            .iter()
            .map(|name| format!("worklease-{name}.1")),
    );
    for page in &expected {
        let text =
            std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        let name = page.trim_end_matches(".1");
        assert!(text.contains(&format!("\n.TH {name} 1 ")), "{page}: {text}");
    }
    // Nothing for the hidden internal subcommand nor for clap's `help`.
    assert!(!dir.join("worklease-demo-shard.1").exists());
    assert!(!dir.join("worklease-help.1").exists());
    // And the page printed is the page written.
    let printed = dated(&w, &["man", "elect"]);
    let written = std::fs::read(dir.join("worklease-elect.1")).expect("read");
    assert_eq!(printed.stdout, written);
}
