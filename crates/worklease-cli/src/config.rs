//! The configuration files of the `worklease` command: one file per host
//! (or per user) naming the fleet's store, so that cron's empty
//! environment does not fall back to a per-host store (issue 37, ADR 0024).
//!
//! Where they are read from, every command, lowest precedence first:
//!
//! 1. the system file [`SYSTEM_FILE`] (`/etc/worklease/config.toml`, shipped
//!    commented out by the Debian package);
//! 2. the user's file, `$XDG_CONFIG_HOME/worklease/config.toml` or
//!    `$HOME/.config/worklease/config.toml`: its keys override the system
//!    file's;
//!
//! or, when `WORKLEASE_CONFIG` names a file, that file alone (it must
//! exist). The environment (`WORKLEASE_STORE`) and the command line
//! (`--store`) override both. A missing file is no error; a file that
//! cannot be read, is not TOML, or has a key not listed here is one
//! ([`crate::exit::CONFIG`], naming the file), never silently skipped: a
//! fleet's store would otherwise fall back to the per-host default.
//!
//! The keys:
//!
//! ```toml
//! # The store every command uses unless --store or WORKLEASE_STORE says otherwise.
//! store = "postgres://worklease@db.internal/worklease"
//! # Refuse to run, elect or pool on a per-host store (sqlite:, memory:).
//! require_shared_store = true
//! ```

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::exit::{self, Failure};

/// The system-wide configuration file.
pub const SYSTEM_FILE: &str = "/etc/worklease/config.toml";

/// The keys of one configuration file, as written.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct File {
    store: Option<String>,
    require_shared_store: Option<bool>,
}

/// A value and the file that set it.
#[derive(Debug, Clone)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// The file it came from.
    pub file: PathBuf,
}

/// The configuration in force: each key from the file of highest
/// precedence that sets it.
#[derive(Debug, Default)]
pub struct Settings {
    /// `store`: the store URL.
    pub store: Option<Sourced<String>>,
    /// `require_shared_store`.
    pub require_shared_store: Option<Sourced<bool>>,
}

impl Settings {
    /// The settings of `files`, lowest precedence first; files that do not
    /// exist are skipped unless `must_exist`.
    fn read(files: &[PathBuf], must_exist: bool) -> Result<Self, Failure> {
        let mut settings = Settings::default();
        for path in files {
            let text = match read_bounded(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => continue,
                Err(e) => {
                    return Err(Failure::new(
                        exit::CONFIG,
                        format!("cannot read the configuration file {}: {e}", path.display()),
                    ))
                }
            };
            let file = parse(&text, path)?;
            if let Some(store) = file.store {
                settings.store = Some(Sourced {
                    value: store,
                    file: path.clone(),
                });
            }
            if let Some(require) = file.require_shared_store {
                settings.require_shared_store = Some(Sourced {
                    value: require,
                    file: path.clone(),
                });
            }
        }
        Ok(settings)
    }
}

/// The most bytes a configuration file may have.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The text of the file at `path`: a regular file (not a FIFO or a
/// device, which could block or never end) of at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes, the limit"
        )));
    }
    Ok(text)
}

/// One file's keys. Errors: text that is not TOML or a key this version
/// does not know, with the file's path and TOML's line and column.
fn parse(text: &str, path: &Path) -> Result<File, Failure> {
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        Failure::new(
            exit::CONFIG,
            format!(
                "the configuration file {}{} is not valid: {}",
                path.display(),
                line.map_or_else(String::new, |l| format!(", line {l}")),
                e.message().trim_end().replace('\n', " ")
            ),
        )
    })?;
    if let Some(store) = &file.store {
        if store.trim().is_empty() {
            return Err(Failure::new(
                exit::CONFIG,
                format!(
                    "the configuration file {} sets an empty store: name a store URL or remove the key",
                    path.display()
                ),
            ));
        }
    }
    Ok(file)
}

/// The files read, lowest precedence first, given the environment `var`.
fn files_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> (Vec<PathBuf>, bool) {
    if let Some(path) = var("WORKLEASE_CONFIG").filter(|p| !p.is_empty()) {
        return (vec![PathBuf::from(path)], true);
    }
    let mut files = vec![PathBuf::from(SYSTEM_FILE)];
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute(var("XDG_CONFIG_HOME")) {
        files.push(dir.join("worklease/config.toml"));
    } else if let Some(home) = absolute(var("HOME")) {
        files.push(home.join(".config/worklease/config.toml"));
    }
    (files, false)
}

/// The configuration in force for this process, read once.
///
/// # Errors
/// [`exit::CONFIG`] when a file cannot be read or is not valid, or
/// `WORKLEASE_CONFIG` names a file that does not exist.
pub fn settings() -> Result<&'static Settings, Failure> {
    static SETTINGS: OnceLock<Result<Settings, (u8, String)>> = OnceLock::new();
    let read = SETTINGS.get_or_init(|| {
        let (files, must_exist) = files_from(|name| std::env::var_os(name));
        Settings::read(&files, must_exist).map_err(|f| (f.code, f.message))
    });
    read.as_ref()
        .map_err(|(code, message)| Failure::new(*code, message.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_users_file_overrides_the_systems_key_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let system = write(
            dir.path(),
            "system.toml",
            "store = \"postgres://db/x\"\nrequire_shared_store = true\n",
        );
        let user = write(dir.path(), "user.toml", "store = \"redis://r/0\"\n");
        let s = Settings::read(&[system.clone(), user.clone()], false).unwrap();
        let store = s.store.unwrap();
        assert_eq!((store.value.as_str(), store.file), ("redis://r/0", user));
        let require = s.require_shared_store.unwrap();
        assert_eq!((require.value, require.file), (true, system));
    }

    #[test]
    fn missing_files_are_skipped_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.toml");
        let s = Settings::read(std::slice::from_ref(&missing), false).unwrap();
        assert!(s.store.is_none() && s.require_shared_store.is_none());
        let e = Settings::read(&[missing], true).unwrap_err();
        assert_eq!(e.code, exit::CONFIG);
        assert!(e.message.contains("none.toml"), "{}", e.message);
    }

    #[test]
    fn unknown_keys_bad_toml_and_empty_stores_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, says) in [
            ("stor = \"x\"\n", "unknown field `stor`"),
            ("store = \n", "config.toml"),
            ("store = \"  \"\n", "empty store"),
            ("require_shared_store = \"yes\"\n", "bool"),
        ] {
            let path = write(dir.path(), "config.toml", text);
            let e = Settings::read(&[path], false).unwrap_err();
            assert_eq!(e.code, exit::CONFIG, "{text}");
            assert!(e.message.contains(says), "{text}: {}", e.message);
            assert!(!e.message.contains('\n'), "{}", e.message);
        }
    }

    #[test]
    fn worklease_config_replaces_the_search_and_xdg_comes_before_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            files_from(env(&[("WORKLEASE_CONFIG", "/x/c.toml"), ("HOME", "/h")])),
            (vec![PathBuf::from("/x/c.toml")], true)
        );
        assert_eq!(
            files_from(env(&[("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")])).0,
            vec![
                PathBuf::from(SYSTEM_FILE),
                PathBuf::from("/x/worklease/config.toml")
            ]
        );
        assert_eq!(
            files_from(env(&[("XDG_CONFIG_HOME", "rel"), ("HOME", "/h")])).0,
            vec![
                PathBuf::from(SYSTEM_FILE),
                PathBuf::from("/h/.config/worklease/config.toml")
            ]
        );
        assert_eq!(files_from(env(&[])).0, vec![PathBuf::from(SYSTEM_FILE)]);
    }
}
