//! `worklease completions SHELL` and `worklease man`: the shell completion
//! scripts (clap_complete) and the roff man pages (clap_mangen), generated
//! from the command's own clap definitions, so that they name every
//! subcommand and option of this build.
//!
//! The man pages are git's kind: `worklease(1)` for the command (its
//! options, the list of subcommands, the store URLs and exit statuses) and
//! `worklease-SUBCOMMAND(1)` for each subcommand (`worklease-checkpoint-set(1)`
//! for a nested one). The Debian package ships them all (`man --out-dir`).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Command};

use crate::exit::{self, Failure};
use crate::status::write_stdout;

/// What `worklease completions --help` adds.
pub const COMPLETIONS_HELP: &str = "\
Prints the completion script for SHELL on stdout. Install it where the shell
looks (the Debian package does so for bash, zsh and fish):
  bash        worklease completions bash > ~/.local/share/bash-completion/completions/worklease
  zsh         worklease completions zsh > ~/.zfunc/_worklease   (with fpath+=(~/.zfunc) before compinit)
  fish        worklease completions fish > ~/.config/fish/completions/worklease.fish
  elvish      worklease completions elvish >> ~/.config/elvish/rc.elv
  powershell  worklease completions powershell >> $PROFILE

Exit status: 0; 64 usage error (unknown shell); 74 writing stdout failed.
";

/// What `worklease man --help` adds.
pub const MAN_HELP: &str = "\
Prints the roff man page of worklease, or of one of its subcommands, on
stdout; read it with `worklease man | man -l -`. With --out-dir, writes every
page instead (worklease.1, worklease-run.1, worklease-checkpoint-set.1, ...).
The pages are dated SOURCE_DATE_EPOCH (seconds since 1970, as reproducible
builds set it), else today.

Exit status: 0; 64 usage error (unknown subcommand); 74 writing the page
failed.

Examples:
  worklease man | man -l -
  worklease man elect | man -l -
  worklease man --out-dir target/man
";

/// Arguments of `worklease completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL", value_enum)]
    shell: clap_complete::Shell,
}

/// Arguments of `worklease man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write every page (the command's and each subcommand's) into DIR,
    /// one file per page, instead of printing one.
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    out_dir: Option<PathBuf>,

    /// The subcommand whose page to print, e.g. `elect`, or `checkpoint set`
    /// [default: the page of worklease itself].
    #[arg(value_name = "SUBCOMMAND", num_args = 1..)]
    subcommand: Vec<String>,
}

/// Runs `worklease completions`: the script for the shell on stdout.
pub fn completions(args: CompletionsArgs, cmd: Command) -> Result<u8, Failure> {
    let mut script = Vec::new();
    let name = cmd.get_name().to_owned();
    let mut cmd = without_hidden(&cmd);
    clap_complete::generate(args.shell, &mut cmd, name, &mut script);
    write_stdout(&script)?;
    Ok(0)
}

/// Runs `worklease man`: one page on stdout, or every page into a
/// directory.
pub fn man(args: ManArgs, cmd: Command) -> Result<u8, Failure> {
    // `help` is clap's, not worklease's: no page for it. Building names
    // each subcommand as its page does (`worklease-run`).
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    // Every page's footer names the release, a subcommand's too, and the
    // date.
    let source = format!("worklease {}", cmd.get_version().unwrap_or_default());
    let date = page_date()?;
    if let Some(dir) = args.out_dir {
        return std::fs::create_dir_all(&dir)
            .and_then(|()| write_pages(&cmd, &source, &date, &dir))
            .map(|()| 0)
            .map_err(|e| {
                Failure::new(
                    exit::IO,
                    format!("cannot write the man pages into {}: {e}", dir.display()),
                )
            });
    }
    let mut page_of = &cmd;
    for name in &args.subcommand {
        page_of = visible_subcommands(page_of)
            .find(|sub| sub.get_name() == name)
            .ok_or_else(|| {
                Failure::usage(format!(
                    "no subcommand {name:?} of `{}` has a man page (see `worklease --help`)",
                    page_of.get_display_name().unwrap_or(page_of.get_name())
                ))
            })?;
    }
    let mut text = Vec::new();
    render(page_of, &source, &date, &mut text)
        .map_err(|e| Failure::new(exit::IO, format!("cannot render the man page: {e}")))?;
    write_stdout(&text)?;
    Ok(0)
}

/// What the completion scripts offer: `cmd` with its arguments,
/// description and aliases, and its subcommands (recursively) but the
/// hidden ones (`demo-shard`, the demo's own child), which clap_complete
/// would offer too.
fn without_hidden(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_owned())
        .args(cmd.get_arguments().cloned())
        .subcommands(visible_subcommands(cmd).map(without_hidden))
        .visible_aliases(cmd.get_visible_aliases().map(str::to_owned));
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    out
}

/// The subcommands that have a page: all but the hidden ones.
fn visible_subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|sub| !sub.is_hide_set())
}

/// Writes the page of `cmd` (a built command or subcommand): clap_mangen's
/// sections in its order, but the text after the options (`after_help`)
/// as [`details`] renders it, not as one filled paragraph per blank line.
fn render(cmd: &Command, source: &str, date: &str, w: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone())
        .date(date)
        .source(source)
        .manual("worklease manual");
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if visible_subcommands(cmd).next().is_some() {
        man.render_subcommands_section(w)?;
    }
    if let Some(text) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        w.write_all(details(&text.to_string()).as_bytes())?;
    }
    if let Some(section) = environment(cmd) {
        w.write_all(section.as_bytes())?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// The DETAILS section of a page from a command's help text: paragraphs
/// (lines up to a blank line, or up to a change of indentation) are
/// filled; indented lines (examples, the exit status table, URL forms)
/// are kept as written (`.nf`), so that groff neither joins nor breaks
/// them. The section ends with the page's adjustment and hyphenation
/// restored (`.ad b`, `.hy`) for the sections after it.
fn details(text: &str) -> String {
    let mut roff = roff::Roff::new();
    // Left-adjusted and unhyphenated: store URLs stay whole, and a long one
    // does not stretch the line before it.
    roff.control("SH", ["DETAILS"])
        .control("ad", ["l"])
        .control("nh", []);
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        let indented = line.starts_with(' ');
        let mut block = vec![line];
        while let Some(next) = lines.peek() {
            if next.trim().is_empty() || next.starts_with(' ') != indented {
                break;
            }
            block.extend(lines.next());
        }
        if indented {
            roff.control("PP", []).control("nf", []);
            for l in block {
                roff.text([roff::roman(l)]);
            }
            roff.control("fi", []);
        } else {
            roff.control("PP", []).text([roff::roman(block.join(" "))]);
        }
    }
    roff.control("ad", ["b"]).control("hy", []);
    roff.render()
}

/// The variables that choose the default store file, when neither
/// `--store` nor `WORKLEASE_STORE` names a store (`store::url::default_sqlite_path`).
const DEFAULT_STORE_VARS: [(&str, &str); 3] = [
    (
        "WORKLEASE_HOME",
        "The default store is the SQLite file leases.db in this directory.",
    ),
    (
        "XDG_DATA_HOME",
        "Without WORKLEASE_HOME, the default store is worklease/leases.db under this directory (an absolute path).",
    ),
    (
        "HOME",
        "Without either, the default store is .local/share/worklease/leases.db under it; without HOME, /var/lib/worklease/leases.db.",
    ),
];

/// The ENVIRONMENT section (clap_mangen's OPTIONS leave environment
/// variables out): each variable an option of `cmd` falls back to, the
/// variables of the default store where `cmd` takes `--store`, and on the
/// top page every one of them and `RUST_LOG`; `None` where there is none.
fn environment(cmd: &Command) -> Option<String> {
    let top = cmd.get_name() == "worklease";
    let mut vars: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let var = a.get_env()?.to_string_lossy().into_owned();
            let option = a
                .get_long()
                .map(|l| format!("--{l}"))
                .unwrap_or_else(|| a.get_id().to_string());
            Some((var, format!("Read when {option} is not given.")))
        })
        .collect();
    if top {
        vars.push((
            "WORKLEASE_STORE".into(),
            "The store URL of every subcommand that takes --store, when it is not given.".into(),
        ));
    }
    if top || cmd.get_arguments().any(|a| a.get_id() == "store") {
        vars.extend(
            DEFAULT_STORE_VARS
                .iter()
                .map(|(var, text)| ((*var).to_string(), (*text).to_string())),
        );
    }
    if top {
        vars.push((
            "RUST_LOG".into(),
            "The log filter (tracing's EnvFilter syntax) when neither -v nor -q is given.".into(),
        ));
    }
    if vars.is_empty() {
        return None;
    }
    let mut roff = roff::Roff::new();
    roff.control("SH", ["ENVIRONMENT"]);
    for (var, text) in vars {
        roff.control("TP", [])
            .text([roff::bold(var)])
            .text([roff::roman(text)]);
    }
    Some(roff.render())
}

/// Writes the page of `cmd` and of each of its visible subcommands, nested
/// ones included, into `dir` (`worklease-checkpoint-set.1`).
fn write_pages(cmd: &Command, source: &str, date: &str, dir: &Path) -> std::io::Result<()> {
    for sub in visible_subcommands(cmd) {
        write_pages(sub, source, date, dir)?;
    }
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let mut file = std::fs::File::create(dir.join(format!("{name}.1")))?;
    render(cmd, source, date, &mut file)?;
    file.flush()
}

/// The pages' date (YYYY-MM-DD, UTC): `SOURCE_DATE_EPOCH` (seconds since
/// the epoch, as reproducible builds set it; packaging/build-deb.sh uses
/// the last commit's time), else today.
fn page_date() -> Result<String, Failure> {
    let at = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(epoch) => {
            let secs: u64 = epoch.trim().parse().map_err(|_| {
                Failure::usage(format!(
                    "SOURCE_DATE_EPOCH={epoch:?} is not a number of seconds since 1970"
                ))
            })?;
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
        }
        Err(_) => std::time::SystemTime::now(),
    };
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    Ok(stamp.get(..10).unwrap_or(&stamp).to_owned())
}
