//! Checked identifiers and the limits every store shares.
//!
//! Work IDs and holder IDs are data: they are validated once, here, into
//! [`WorkId`] and [`HolderId`], and every store binds them as parameters or
//! escapes them. The limits are chosen so that every store the project
//! supports can hold them: a 1 KiB work ID fits in a PostgreSQL text
//! column, a Redis key and an etcd key (a store whose keys are shorter,
//! such as S3 with its 1,024-byte keys, maps long IDs to keys itself), and
//! a 1 MiB checkpoint fits under etcd's default request limit (1.5 MiB).

use std::fmt;
use std::time::Duration;

use crate::error::InvalidInput;

/// The longest work ID, in bytes (UTF-8).
pub const MAX_WORK_ID_BYTES: usize = 1024;
/// The longest holder ID, in bytes (UTF-8).
pub const MAX_HOLDER_ID_BYTES: usize = 256;
/// The largest checkpoint, in bytes.
pub const MAX_CHECKPOINT_BYTES: usize = 1024 * 1024;
/// The largest value a leader publishes with its leadership
/// ([`crate::election::ElectorBuilder::publish`]), in bytes: an address or a
/// small document that followers read with every observation, not a
/// store of state (use a checkpoint of a work ID of your own for that).
pub const MAX_PUBLISHED_VALUE_BYTES: usize = 4096;
/// The longest TTL: one week. Longer leases are better served by a database
/// row than a lease; the limit keeps every store's millisecond arithmetic
/// far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most leases one batch call of [`crate::Leases`] names
/// ([`crate::Leases::acquire_many`], [`crate::Leases::renew_many`],
/// [`crate::Leases::release_many`]): as many work IDs as a pool covers. The
/// lease layer splits a batch into store calls of at most the store's
/// [`crate::LeaseStore::max_batch`] leases each.
pub const MAX_BATCH: usize = 100_000;

fn check_id(
    s: &str,
    what: &'static str,
    max: usize,
    empty: InvalidInput,
) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(empty);
    }
    if s.len() > max {
        return Err(if what == "work ID" {
            InvalidInput::WorkIdTooLong { len: s.len(), max }
        } else {
            InvalidInput::HolderIdTooLong { len: s.len(), max }
        });
    }
    if let Some(ch) = s
        .chars()
        .find(|c| c.is_control() || is_invisible_format(*c))
    {
        return Err(InvalidInput::ControlCharacter { what, ch });
    }
    Ok(())
}

/// Format characters that change how text is displayed without being
/// visible (bidirectional overrides, zero-width characters, line and
/// paragraph separators, the byte-order mark): refused like control
/// characters, since IDs end up in logs and terminals.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

macro_rules! checked_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:ident, $empty:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            #[doc = concat!("Checks `s` and wraps it.\n\n# Errors\n[`InvalidInput`] when `s` is empty, longer than [`", stringify!($max), "`] bytes, or contains a control character.")]
            pub fn new(s: impl Into<String>) -> Result<Self, InvalidInput> {
                let s: String = s.into();
                check_id(&s, $what, $max, InvalidInput::$empty { max: $max })?;
                Ok(Self(s.into()))
            }

            /// The ID as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(s: &str) -> Result<Self, InvalidInput> {
                Self::new(s)
            }
        }
    };
}

checked_id!(
    /// A checked work ID: 1 to [`MAX_WORK_ID_BYTES`] bytes of UTF-8 without
    /// control characters. Any other character (`/`, `:`, `{`, spaces,
    /// non-ASCII) is allowed and kept distinct by every store. Clones
    /// share the text.
    WorkId, "work ID", MAX_WORK_ID_BYTES, EmptyWorkId
);

impl WorkId {
    /// The work ID's shared text as a metrics label, without a copy (the
    /// per-lease gauges are set at every renewal).
    pub(crate) fn label(&self) -> metrics::SharedString {
        metrics::SharedString::from(self.0.clone())
    }
}

checked_id!(
    /// A checked holder ID: 1 to [`MAX_HOLDER_ID_BYTES`] bytes of UTF-8
    /// without control characters. Clones share the text (every token of
    /// a handle names its holder).
    HolderId, "holder ID", MAX_HOLDER_ID_BYTES, EmptyHolderId
);

/// Checks a TTL: at least 1 ms, at most [`MAX_TTL`].
///
/// # Errors
/// [`InvalidInput::ZeroTtl`] below 1 ms, [`InvalidInput::TtlTooLong`] above
/// [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<Duration, InvalidInput> {
    if ttl < Duration::from_millis(1) {
        return Err(InvalidInput::ZeroTtl { ttl });
    }
    if ttl > MAX_TTL {
        return Err(InvalidInput::TtlTooLong { ttl, max: MAX_TTL });
    }
    Ok(ttl)
}

/// `d` in whole milliseconds, rounded up: stores keep milliseconds, and a
/// store must never end a lease before its holder's own deadline.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if !d.subsec_nanos().is_multiple_of(1_000_000) {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Checks a checkpoint's size against [`MAX_CHECKPOINT_BYTES`] and a
/// store's own limit `store_max` (its
/// [`crate::store::LeaseStore::max_checkpoint_bytes`]), whichever is lower.
///
/// # Errors
/// [`InvalidInput::CheckpointTooLarge`] above the limit, naming it.
pub fn check_checkpoint(len: usize, store_max: usize) -> Result<(), InvalidInput> {
    let max = MAX_CHECKPOINT_BYTES.min(store_max);
    if len > max {
        return Err(InvalidInput::CheckpointTooLarge { len, max });
    }
    Ok(())
}

/// Checks a batch's work IDs: at most [`MAX_BATCH`] of them, none twice.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`] over the limit,
/// [`InvalidInput::DuplicateWorkId`] for a work ID named twice (the first
/// one found).
pub fn check_batch<'a>(
    work_ids: impl ExactSizeIterator<Item = &'a WorkId>,
) -> Result<(), InvalidInput> {
    let len = work_ids.len();
    if len > MAX_BATCH {
        return Err(InvalidInput::BatchTooLarge {
            len,
            max: MAX_BATCH,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(len);
    for id in work_ids {
        if !seen.insert(id) {
            return Err(InvalidInput::DuplicateWorkId {
                work_id: id.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_limits() {
        assert!(WorkId::new("").unwrap_err().to_string().contains("1024"));
        let long = "x".repeat(MAX_WORK_ID_BYTES + 1);
        let e = WorkId::new(long).unwrap_err().to_string();
        assert!(e.contains("1025") && e.contains("1024"), "{e}");
        assert!(WorkId::new("é".repeat(MAX_WORK_ID_BYTES / 2)).is_ok());
        assert!(HolderId::new("a\nb").is_err());
        assert!(WorkId::new("evil\u{202E}txt").is_err());
        assert!(WorkId::new("zero\u{200B}width").is_err());
        assert!(WorkId::new("jobs/a b:{ü}").is_ok());
        assert!(check_ttl(Duration::ZERO)
            .unwrap_err()
            .to_string()
            .contains("1ms"));
        assert!(check_checkpoint(MAX_CHECKPOINT_BYTES, usize::MAX).is_ok());
        assert_eq!(ceil_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ceil_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
        assert!(check_checkpoint(MAX_CHECKPOINT_BYTES + 1, usize::MAX).is_err());
        assert!(check_checkpoint(1000, 1000).is_ok());
        match check_checkpoint(1001, 1000) {
            Err(InvalidInput::CheckpointTooLarge {
                len: 1001,
                max: 1000,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn batches_name_their_limits() {
        let ids: Vec<WorkId> = (0..3)
            .map(|i| WorkId::new(format!("w{i}")).unwrap())
            .collect();
        assert!(check_batch(ids.iter()).is_ok());
        let twice = [ids[0].clone(), ids[1].clone(), ids[0].clone()];
        let e = check_batch(twice.iter()).unwrap_err().to_string();
        assert!(e.contains("\"w0\"") && e.contains("twice"), "{e}");
        let many: Vec<WorkId> = (0..=MAX_BATCH)
            .map(|i| WorkId::new(format!("w{i}")).unwrap())
            .collect();
        let e = check_batch(many.iter()).unwrap_err().to_string();
        assert!(e.contains("100001") && e.contains("100000"), "{e}");
    }
}

/// Valid work and holder IDs for property tests: short strings of the
/// characters that mean something in keys, paths, URLs, globs, hash tags
/// and the token's text form, or of any printable characters.
#[cfg(test)]
pub(crate) mod arbitrary {
    use proptest::prelude::*;
    use proptest::string::string_regex;

    use super::{HolderId, WorkId};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            string_regex(r"[a-z0-9/%{}:;=. ?#*\[\]\\é日🚀+-]{1,40}").expect("a valid regex"),
            string_regex(r"\PC{1,40}").expect("a valid regex"),
            Just(".".to_string()),
            Just("..".to_string()),
        ]
    }

    /// Any valid work ID.
    pub(crate) fn work_id() -> impl Strategy<Value = WorkId> {
        text().prop_filter_map("a valid work ID", |s| WorkId::new(s).ok())
    }

    /// Any valid holder ID.
    pub(crate) fn holder_id() -> impl Strategy<Value = HolderId> {
        text().prop_filter_map("a valid holder ID", |s| HolderId::new(s).ok())
    }
}
