//! The item layout of the DynamoDB store (module docs, "Items"): the
//! partition key of a work ID's lease item and of its fencing-floor item,
//! the attribute names, and the checks of table names and prefixes.

use crate::limits::WorkId;

/// The table's partition key (a string): the only key attribute.
pub(super) const PK: &str = "pk";
/// The lease item's version (a string, random per write): the handle the
/// conditional writes name.
pub(super) const VERSION: &str = "v";
/// The lease item's record (binary, the register's `WLR1` encoding).
pub(super) const RECORD: &str = "rec";
/// The fencing-floor item's highest token (a number).
pub(super) const FLOOR: &str = "fence";

/// Between the prefix and the kind of item, and between the kind and the
/// work ID. A prefix never contains it, so the key names its prefix
/// unambiguously; the work ID after the second one is taken verbatim.
const SEPARATOR: char = '#';
/// The kind of a lease item.
const LEASE: &str = "lease";
/// The kind of a fencing-floor item.
const FENCE: &str = "fence";

/// `<prefix>#lease#<work ID>`: the key of the work ID's lease item.
pub(super) fn lease_key(prefix: &str, work_id: &WorkId) -> String {
    format!("{prefix}{SEPARATOR}{LEASE}{SEPARATOR}{}", work_id.as_str())
}

/// `<prefix>#fence#<work ID>`: the key of the work ID's fencing floor.
pub(super) fn fence_key(prefix: &str, work_id: &WorkId) -> String {
    format!("{prefix}{SEPARATOR}{FENCE}{SEPARATOR}{}", work_id.as_str())
}

/// The start every lease key of `prefix` has (to list them).
pub(super) fn lease_key_start(prefix: &str) -> String {
    format!("{prefix}{SEPARATOR}{LEASE}{SEPARATOR}")
}

/// The work ID of a lease key of `prefix`, or `None` for another key.
pub(super) fn work_id_of(prefix: &str, key: &str) -> Option<WorkId> {
    let rest = key.strip_prefix(&lease_key_start(prefix))?;
    WorkId::new(rest).ok()
}

/// Why `prefix` cannot be a key prefix, or `None`: empty, longer than
/// [`super::MAX_PREFIX_BYTES`], with a `#` (the separator) or control
/// characters.
pub(super) fn check_prefix(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("the prefix is empty".into());
    }
    if prefix.len() > super::MAX_PREFIX_BYTES {
        return Some(format!(
            "the prefix is {} bytes, over the limit of {} bytes",
            prefix.len(),
            super::MAX_PREFIX_BYTES
        ));
    }
    if prefix.contains(SEPARATOR) || prefix.chars().any(char::is_control) {
        return Some(format!(
            "the prefix {prefix:?} has a `{SEPARATOR}` or a control character"
        ));
    }
    None
}

/// Why `table` is no DynamoDB table name (3 to 255 of ASCII letters,
/// digits, `_`, `-` and `.`), or `None`.
pub(super) fn check_table(table: &str) -> Option<String> {
    if table.is_empty() {
        return Some("the URL names no table: write dynamodb://TABLE".into());
    }
    let ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    (!ok).then(|| {
        format!(
            "table name {table:?} is not 3 to 255 of ASCII letters, digits, `_`, `-` and `.` \
             (DynamoDB's rule)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkId {
        WorkId::new(s).unwrap()
    }

    #[test]
    fn keys_name_their_prefix_and_work_id_unambiguously() {
        for (prefix, work) in [
            ("wl", "a"),
            ("wl", "x#lease#y"),
            ("w/l", "#"),
            ("p q", "日本/..//"),
        ] {
            let key = lease_key(prefix, &id(work));
            assert_eq!(work_id_of(prefix, &key), Some(id(work)), "{key}");
            assert_ne!(key, fence_key(prefix, &id(work)));
            assert!(key.starts_with(&lease_key_start(prefix)));
        }
        // Another prefix's keys, and fence keys, are not ours.
        assert_eq!(work_id_of("wl", &lease_key("wl2", &id("a"))), None);
        assert_eq!(work_id_of("wl", &fence_key("wl", &id("a"))), None);
        // The work ID "lease#a" of prefix "x" is not the work ID "a" of a
        // prefix "x#lease" (which is refused).
        assert!(check_prefix("x#lease").is_some());
    }

    #[test]
    fn prefixes_and_tables_are_checked() {
        assert!(check_prefix("worklease").is_none());
        assert!(check_prefix("ci/run 1").is_none());
        for bad in ["", "a#b", "a\nb"] {
            assert!(check_prefix(bad).is_some(), "{bad:?}");
        }
        assert!(
            check_prefix(&"p".repeat(super::super::MAX_PREFIX_BYTES + 1))
                .unwrap()
                .contains("256")
        );
        assert!(check_table("worklease-leases_1.x").is_none());
        for bad in ["", "ab", "a b", "tä", &"t".repeat(256)] {
            assert!(check_table(bad).is_some(), "{bad:?}");
        }
    }
}
