//! Which leases `worklease status` shows, and in what order: work IDs
//! named exactly, glob patterns (`'reidx*'`, `'shard-?'`), `--prefix`, and
//! `--sort` (work IDs in natural order by default: `shard-2` before
//! `shard-10`).
//!
//! A WORK_ID with a glob character (`*`, `?`, `[`) is a pattern, matched
//! against every work ID in the store (`*` also matches `/`); `[*]`
//! matches a literal `*`. Only work IDs named exactly are asked of the
//! store by name, and only they are "unknown" when absent (exit 4): a
//! pattern or prefix that matches nothing shows no leases and exits 0.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use worklease::{LeaseInfo, WorkId};

use crate::exit::Failure;

/// `status --sort`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Work ID, in natural order (digits as numbers).
    #[default]
    WorkId,
    /// Holder ID (natural order), then work ID.
    Holder,
    /// Fencing token, highest first.
    Token,
    /// Expiry (or release) time, soonest first.
    Expires,
}

/// The leases asked for.
#[derive(Debug)]
pub struct Selection {
    exact: Vec<WorkId>,
    patterns: Option<GlobSet>,
    prefix: Option<String>,
    all: bool,
    sort: SortKey,
}

/// Whether `s` has a glob character.
fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

impl Selection {
    /// The selection of `work_ids` (exact or patterns), `prefix`, `all`
    /// (worklease's own leases too) and `sort`.
    ///
    /// # Errors
    /// A usage failure for a pattern globset refuses (an unclosed `[`).
    pub fn new(
        work_ids: &[WorkId],
        prefix: Option<String>,
        all: bool,
        sort: SortKey,
    ) -> Result<Self, Failure> {
        let (patterns, exact): (Vec<&WorkId>, Vec<&WorkId>) =
            work_ids.iter().partition(|w| is_pattern(w.as_str()));
        let patterns = if patterns.is_empty() {
            None
        } else {
            let mut set = GlobSetBuilder::new();
            for p in patterns {
                let glob = GlobBuilder::new(p.as_str())
                    .literal_separator(false)
                    .backslash_escape(true)
                    .build()
                    .map_err(|e| Failure::usage(format!("bad pattern {:?}: {e}", p.as_str())))?;
                set.add(glob);
            }
            Some(
                set.build()
                    .map_err(|e| Failure::usage(format!("bad patterns: {e}")))?,
            )
        };
        Ok(Self {
            exact: exact.into_iter().cloned().collect(),
            patterns,
            prefix,
            all,
            sort,
        })
    }

    /// The work IDs to ask the store for: those named exactly when nothing
    /// else selects; else none (every lease, filtered here).
    pub fn to_inspect(&self) -> &[WorkId] {
        if self.patterns.is_none() && self.prefix.is_none() {
            &self.exact
        } else {
            &[]
        }
    }

    /// Whether only exact work IDs select (then absent ones are unknown).
    pub fn exact_only(&self) -> bool {
        self.patterns.is_none() && self.prefix.is_none() && !self.exact.is_empty()
    }

    /// The work IDs named exactly.
    pub fn exact(&self) -> &[WorkId] {
        &self.exact
    }

    /// Whether `info` is selected.
    fn selects(&self, info: &LeaseInfo) -> bool {
        let id = info.work_id.as_str();
        if let Some(prefix) = &self.prefix {
            if !id.starts_with(prefix.as_str()) {
                return false;
            }
        }
        let named = self.exact.iter().any(|w| w == &info.work_id);
        if named {
            return true;
        }
        if !self.all && worklease::is_internal_work_id(id) {
            return false;
        }
        match &self.patterns {
            Some(set) => set.is_match(id),
            None => self.exact.is_empty(),
        }
    }

    /// `leases` as selected, in order.
    pub fn apply(&self, mut leases: Vec<LeaseInfo>) -> Vec<LeaseInfo> {
        leases.retain(|l| self.selects(l));
        let by_id = |a: &LeaseInfo, b: &LeaseInfo| {
            alphanumeric_sort::compare_str(a.work_id.as_str(), b.work_id.as_str())
        };
        leases.sort_by(|a, b| match self.sort {
            SortKey::WorkId => by_id(a, b),
            SortKey::Holder => {
                alphanumeric_sort::compare_str(&a.holder_id, &b.holder_id).then_with(|| by_id(a, b))
            }
            SortKey::Token => b
                .fencing_token
                .cmp(&a.fencing_token)
                .then_with(|| by_id(a, b)),
            SortKey::Expires => a.expires_at.cmp(&b.expires_at).then_with(|| by_id(a, b)),
        });
        leases
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn info(id: &str, holder: &str, token: u64, secs: u64) -> LeaseInfo {
        LeaseInfo {
            work_id: WorkId::new(id).unwrap(),
            holder_id: holder.into(),
            fencing_token: token,
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            expires_in: None,
            expired: true,
            released: true,
            ended: None,
            checkpoint_bytes: 0,
            handoff: Default::default(),
        }
    }

    fn ids(leases: &[LeaseInfo]) -> Vec<&str> {
        leases.iter().map(|l| l.work_id.as_str()).collect()
    }

    fn select(named: &[&str], prefix: Option<&str>, sort: SortKey) -> Selection {
        let named: Vec<WorkId> = named.iter().map(|n| WorkId::new(*n).unwrap()).collect();
        Selection::new(&named, prefix.map(String::from), false, sort).unwrap()
    }

    fn store() -> Vec<LeaseInfo> {
        vec![
            info("shard-10", "b", 3, 30),
            info("shard-2", "a", 9, 10),
            info("reidx/2026-12-01", "c", 1, 20),
            info("reidx/2026-12-02", "a", 2, 5),
            info("nightly/finished", "1/a", 4, 1),
        ]
    }

    #[test]
    fn natural_order_puts_2_before_10_and_hides_worklease_own() {
        assert_eq!(
            alphanumeric_sort::compare_str("shard-2", "shard-10"),
            std::cmp::Ordering::Less
        );
        let s = select(&[], None, SortKey::WorkId);
        assert_eq!(
            ids(&s.apply(store())),
            [
                "reidx/2026-12-01",
                "reidx/2026-12-02",
                "shard-2",
                "shard-10"
            ]
        );
    }

    #[test]
    fn globs_and_prefixes_select_and_exact_names_are_asked_by_name() {
        let s = select(&["reidx*"], None, SortKey::WorkId);
        assert!(s.to_inspect().is_empty() && !s.exact_only());
        assert_eq!(
            ids(&s.apply(store())),
            ["reidx/2026-12-01", "reidx/2026-12-02"]
        );
        let s = select(&["shard-?"], None, SortKey::WorkId);
        assert_eq!(ids(&s.apply(store())), ["shard-2"]);
        let s = select(&[], Some("shard-"), SortKey::Token);
        assert_eq!(ids(&s.apply(store())), ["shard-2", "shard-10"]);
        let s = select(&["shard-2"], None, SortKey::WorkId);
        assert!(s.exact_only());
        assert_eq!(s.to_inspect().len(), 1);
        // Named exactly, worklease's own are shown.
        let s = select(&["nightly/finished"], None, SortKey::WorkId);
        assert_eq!(ids(&s.apply(store())), ["nightly/finished"]);
        assert!(
            Selection::new(&[WorkId::new("a[").unwrap()], None, false, SortKey::WorkId).is_err()
        );
    }

    #[test]
    fn sorts_by_holder_token_and_expiry() {
        let s = select(&[], None, SortKey::Holder);
        assert_eq!(
            ids(&s.apply(store())),
            [
                "reidx/2026-12-02",
                "shard-2",
                "shard-10",
                "reidx/2026-12-01"
            ]
        );
        let s = select(&[], None, SortKey::Expires);
        assert_eq!(ids(&s.apply(store()))[0], "reidx/2026-12-02");
    }
}
