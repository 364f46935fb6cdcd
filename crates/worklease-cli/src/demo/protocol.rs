//! What the demo and its children share: the files' counts, the manifest
//! the demo hands its children, a shard's checkpoint, and the lines a
//! child writes on its stdout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Lines, words and bytes of a text, as `wc` counts them (lines are
/// newline characters, words are runs of non-whitespace).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) lines: u64,
    pub(super) words: u64,
    pub(super) bytes: u64,
}

impl Counts {
    pub(super) fn of(text: &str) -> Self {
        Self {
            lines: text.bytes().filter(|&b| b == b'\n').count() as u64,
            words: text.split_whitespace().count() as u64,
            bytes: text.len() as u64,
        }
    }

    pub(super) fn add(&mut self, other: Counts) {
        self.lines += other.lines;
        self.words += other.words;
        self.bytes += other.bytes;
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} lines, {} words, {} bytes",
            self.lines, self.words, self.bytes
        )
    }
}

/// The file's text, or why it is not text the demo counts: the OS error
/// when it cannot be read, a NUL byte (binary) or bytes that are not UTF-8.
pub(super) fn read_text(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.contains(&0) {
        return Err("holds a NUL byte (binary), no longer text".to_string());
    }
    String::from_utf8(bytes).map_err(|_| "is no longer UTF-8 text".to_string())
}

/// What `worklease demo` hands its children: the files of every shard.
#[derive(Serialize, Deserialize)]
pub(super) struct Manifest {
    /// This run of the demo: a checkpoint of another run is not resumed.
    pub(super) run: String,
    /// The directory the paths are relative to.
    pub(super) root: PathBuf,
    /// The files of each shard, relative to `root`.
    pub(super) shards: Vec<Vec<String>>,
}

/// A shard's checkpoint: its progress and, once complete, its result.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(super) struct ShardState {
    /// The demo run ([`Manifest::run`]).
    pub(super) demo: String,
    pub(super) shard: usize,
    /// How many files the shard has.
    pub(super) files: usize,
    /// The index of the next file to process.
    pub(super) next: usize,
    /// `next == files`: the shard's result is final.
    pub(super) complete: bool,
    /// The counts of files `0..next`.
    pub(super) totals: Counts,
    /// `(file index, fencing token)` of every processed file, in order.
    pub(super) processed: Vec<(usize, u64)>,
    /// The holder of each fencing token that processed files.
    pub(super) holders: BTreeMap<u64, String>,
    /// The holder that wrote this checkpoint.
    pub(super) holder: String,
}

impl ShardState {
    pub(super) fn fresh(demo: &str, shard: usize, files: usize) -> Self {
        Self {
            demo: demo.to_string(),
            shard,
            files,
            next: 0,
            complete: false,
            totals: Counts::default(),
            processed: Vec::new(),
            holders: BTreeMap::new(),
            holder: String::new(),
        }
    }
}

/// One line of a child's stdout.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(super) enum ChildEvent {
    /// The child read the checkpoint: where it starts.
    Start {
        pid: u32,
        holder: String,
        token: u64,
        next: usize,
        files: usize,
        complete: bool,
        clean_handoff: bool,
        previous: Option<Previous>,
        /// Why a checkpoint found was not resumed from (another demo run).
        discarded: Option<String>,
    },
    /// The checkpoint after a file was saved: `next` files are done.
    Checkpoint {
        token: u64,
        next: usize,
        files: usize,
    },
    /// The shard is complete (the last checkpoint says so).
    Complete { token: u64, files: usize },
}

/// The previous holder, as the child's acquisition saw it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(super) struct Previous {
    pub(super) holder: String,
    pub(super) token: u64,
    pub(super) ended: String,
}

pub(super) fn work_id(shard: usize) -> String {
    format!("demo/shard-{shard}")
}

pub(super) fn holder(worker: usize) -> String {
    format!("worker-{}", worker + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_wc_counts() {
        assert_eq!(
            Counts::of("one two\nthree\n\n  four"),
            Counts {
                lines: 3,
                words: 4,
                bytes: 21
            }
        );
        assert_eq!(Counts::of(""), Counts::default());
    }
}
