//! What the demo works on: the text files under DIR and their shards, the
//! store, and the scratch directory.

use std::ops::Range;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use worklease::store::url::{self, StoreSpec};

use super::protocol::{read_text, Counts};
use crate::exit::{self, Failure};

/// A text file of the demo's input, counted in the one direct pass.
pub(super) struct TextFile {
    pub(super) path: String,
    pub(super) counts: Counts,
}

/// The text files under `root`, sorted by path, and how many files were
/// skipped (binary, not UTF-8, unreadable, or a path that is not UTF-8).
pub(super) fn collect_text_files(root: &Path) -> Result<(Vec<TextFile>, usize), Failure> {
    let mut files = Vec::new();
    let mut skipped = 0;
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(root.join(&dir)) {
            Ok(entries) => entries,
            Err(e) if dir.as_os_str().is_empty() => {
                return Err(Failure::usage(format!(
                    "cannot read the directory {}: {e}",
                    root.display()
                )))
            }
            Err(_) => {
                skipped += 1;
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else {
                skipped += 1;
                continue;
            };
            let name = entry.file_name();
            let path = dir.join(&name);
            // Symlinks are neither followed nor read: no loops, nothing
            // outside DIR.
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => {
                    if name != "target" && name != ".git" {
                        dirs.push(path);
                    }
                }
                Ok(kind) if kind.is_file() => match (path.to_str(), read_text(&root.join(&path))) {
                    (Some(name), Ok(text)) => files.push(TextFile {
                        path: name.to_string(),
                        counts: Counts::of(&text),
                    }),
                    _ => skipped += 1,
                },
                Ok(_) => {}
                Err(_) => skipped += 1,
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, skipped))
}

/// `shards` ranges of consecutive indexes covering `0..files`, their sizes
/// differing by one at most.
pub(super) fn split(files: usize, shards: usize) -> Vec<Range<usize>> {
    (0..shards)
        .map(|k| k * files / shards..(k + 1) * files / shards)
        .collect()
}

/// The directory the demo works on.
pub(super) fn input_dir(dir: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let dir = dir.unwrap_or_else(|| {
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if built_from.join("Cargo.toml").is_file() {
            built_from
        } else {
            PathBuf::from(".")
        }
    });
    std::fs::canonicalize(&dir).map_err(|e| Failure::usage(format!("DIR {}: {e}", dir.display())))
}

/// A private temporary directory, removed when dropped.
pub(super) struct Scratch(PathBuf);

impl Scratch {
    pub(super) fn create() -> Result<Self, Failure> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut last = None;
        for attempt in 0..100u32 {
            let path = std::env::temp_dir().join(format!(
                "worklease-demo-{}-{}",
                std::process::id(),
                nanos + u128::from(attempt)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(e) => last = Some(e),
            }
        }
        Err(Failure::new(
            exit::IO,
            format!(
                "cannot create a scratch directory under {}: {}",
                std::env::temp_dir().display(),
                last.map_or_else(String::new, |e| e.to_string())
            ),
        ))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--store` checked and made absolute; `None` without `--store`.
pub(super) fn given_store(given: Option<&str>) -> Result<Option<String>, Failure> {
    let Some(given) = given else {
        return Ok(None);
    };
    match url::parse(given)?.absolute() {
        StoreSpec::Memory => Err(Failure::usage(
            "--store memory: lives in one process, and the demo's workers are separate processes: \
             use sqlite:PATH",
        )),
        spec => Ok(Some(spec.to_url())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_file_once_in_order() {
        for files in 1..40 {
            for shards in 1..=files.min(9) {
                let ranges = split(files, shards);
                assert_eq!(ranges.len(), shards);
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[shards - 1].end, files);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                }
                assert!(ranges.iter().all(|r| !r.is_empty()));
            }
        }
    }
}
