//! The key layout: one object `<prefix>/<escaped work ID>` per work ID
//! (module docs, "Key layout").

use object_store::path::Path;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{ObjectRegister, MAX_KEY_BYTES, MAX_PREFIX_BYTES};
use crate::error::{InvalidInput, Result, StoreError};
use crate::limits::WorkId;
use crate::store::register::RegisterError;

/// What the escaping of a work ID encodes: every byte but ASCII letters,
/// digits, `-`, `_` and `.` (non-ASCII bytes are always encoded).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

impl ObjectRegister {
    /// The object key of `work_id`'s lease: `<prefix>/<escaped work ID>`.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming [`MAX_KEY_BYTES`] when the key would
    /// be longer.
    pub fn key(&self, work_id: &WorkId) -> Result<Path> {
        self.path(work_id).map_err(|e| match e {
            RegisterError::Store(e) => e.into(),
            RegisterError::Invalid(e) => e.into(),
            other => StoreError::new(self.kind, other.to_string()).into(),
        })
    }

    pub(super) fn path(&self, work_id: &WorkId) -> std::result::Result<Path, RegisterError> {
        let key = format!("{}/{}", self.prefix, escape(work_id.as_str()));
        if key.len() > MAX_KEY_BYTES {
            return Err(InvalidInput::Config(format!(
                "work ID {:?}: its object key would be {} bytes, over the limit of \
                 {MAX_KEY_BYTES} bytes (prefix, `/` and the escaped work ID)",
                work_id.as_str(),
                key.len()
            ))
            .into());
        }
        Path::parse(&key).map_err(|e| {
            StoreError::with_source(
                self.kind,
                format!("work ID {:?}: no valid object key", work_id.as_str()),
                e,
            )
            .into()
        })
    }
}

/// The escaped form of a work ID: one object key segment.
pub(super) fn escape(work_id: &str) -> String {
    match work_id {
        // Not even these may be a relative path segment.
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => utf8_percent_encode(work_id, ESCAPED).to_string(),
    }
}

/// The work ID whose escaped form is `segment`, or `None` when `segment`
/// is not the canonical escaping of a valid work ID (an object of another
/// program under the prefix).
pub(super) fn unescape(segment: &str) -> Option<WorkId> {
    let id = percent_decode_str(segment).decode_utf8().ok()?;
    if escape(&id) != segment {
        return None;
    }
    WorkId::new(id.into_owned()).ok()
}

/// Why `prefix` cannot be a prefix of lease objects, or `None` when it can.
pub(super) fn check_prefix(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("the object prefix is empty".into());
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return Some(format!(
            "the object prefix is {} bytes, over the limit of {MAX_PREFIX_BYTES}",
            prefix.len()
        ));
    }
    if prefix.chars().any(char::is_control) {
        return Some("the object prefix has control characters".into());
    }
    if prefix
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Some(format!(
            "the object prefix {prefix:?} has an empty, `.` or `..` segment: write segments \
             separated by single `/`s, without a leading or trailing `/`"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn wid(s: &str) -> WorkId {
        WorkId::new(s).unwrap()
    }

    #[test]
    fn work_ids_are_one_segment_and_round_trip() {
        for id in [
            "a", "jobs/a", "jobs/a/b", "jobs%2Fa", ".", "..", "...", "a b?#[]", "日本", "-_.x",
        ] {
            let e = escape(id);
            assert!(!e.contains('/'), "{id:?} -> {e:?}");
            assert!(e != "." && e != "..", "{id:?} -> {e:?}");
            assert_eq!(unescape(&e).unwrap().as_str(), id);
        }
        assert_eq!(escape("jobs/a"), "jobs%2Fa");
        assert_eq!(escape("nightly-2024.01_x"), "nightly-2024.01_x");
        // Only the canonical escaping is ours.
        assert!(unescape("jobs%2fa").is_none());
        assert!(unescape("a%20").is_some());
        assert!(unescape("a ").is_none());
        assert!(unescape("%FF").is_none());
        assert!(unescape("").is_none());
    }

    #[test]
    fn keys_stay_under_the_prefix_and_within_the_limit() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let reg = ObjectRegister::new(store, "team/leases").unwrap();
        assert_eq!(
            reg.key(&wid("jobs/../x")).unwrap().as_ref(),
            "team/leases/jobs%2F..%2Fx"
        );
        assert_eq!(reg.key(&wid("..")).unwrap().as_ref(), "team/leases/%2E%2E");
        let at_limit = "x".repeat(MAX_KEY_BYTES - "team/leases/".len());
        assert!(reg.key(&wid(&at_limit)).is_ok());
        let e = reg.key(&wid(&format!("{at_limit}x"))).unwrap_err();
        assert!(e.to_string().contains(&MAX_KEY_BYTES.to_string()), "{e}");
        for bad in ["", "/x", "x/", "a//b", "a/./b", "..", "a\nb"] {
            let e = ObjectRegister::new(Arc::new(object_store::memory::InMemory::new()), bad);
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let long = "p".repeat(MAX_PREFIX_BYTES + 1);
        let e = ObjectRegister::new(Arc::new(object_store::memory::InMemory::new()), &long)
            .unwrap_err();
        assert!(e.to_string().contains(&MAX_PREFIX_BYTES.to_string()), "{e}");
    }

    proptest::proptest! {
        /// Every valid work ID escapes to one object key segment that is no
        /// relative path (`.`, `..`) and unescapes to itself.
        #[test]
        fn escaping_round_trips_and_stays_one_segment(id in crate::limits::arbitrary::work_id()) {
            let e = escape(id.as_str());
            proptest::prop_assert!(!e.contains('/') && e != "." && e != "..", "{:?} -> {:?}", id, e);
            proptest::prop_assert_eq!(unescape(&e), Some(id));
        }
    }
}
