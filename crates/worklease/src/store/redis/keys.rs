//! The key layout of the Redis store.
//!
//! Every key of a work ID is `<prefix>{<escaped work ID>}:<kind>`. The
//! escaping is percent-encoding of `{`, `}`, `%`, control characters and
//! every non-ASCII byte, so:
//!
//! * the map from (prefix, work ID, kind) to key is injective: the prefix
//!   has no `{` (checked when it is set), so the key's first `{` ends it,
//!   and the escaped ID has no `}`, so the next `}` ends the ID;
//! * the hash tag (the text between the first `{` and the next `}`) is the
//!   escaped work ID, so one work ID's keys share one Redis Cluster slot and
//!   each script touches one slot only;
//! * every key starts with the prefix: nothing outside it is ever named.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::limits::WorkId;

/// What the escaping of a work ID encodes besides non-ASCII bytes, which
/// percent-encoding always encodes.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'{').add(b'}').add(b'%');

/// The suffix of the state hash's key, by which `inspect` finds work IDs.
const STATE: &str = "state";
const LIVE: &str = "live";
const CKPT: &str = "ckpt";
const FENCE: &str = "fence";

/// The Redis keys of one work ID (see the module docs of
/// [`crate::store::redis`] for what each holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    /// The state hash: holder, fencing token, TTL, phase, previous holder.
    /// Never expires.
    pub state: String,
    /// The live marker: exists, with a millisecond TTL, exactly while the
    /// lease is live by the server's clock.
    pub live: String,
    /// The checkpoint bytes. Never expires.
    pub checkpoint: String,
    /// The fencing counter. Never expires.
    pub fence: String,
}

impl LeaseKeys {
    /// The keys of `work_id` under `prefix`.
    pub(crate) fn new(prefix: &str, work_id: &WorkId) -> Self {
        let base = format!("{prefix}{{{}}}:", escape(work_id.as_str()));
        Self {
            state: format!("{base}{STATE}"),
            live: format!("{base}{LIVE}"),
            checkpoint: format!("{base}{CKPT}"),
            fence: format!("{base}{FENCE}"),
        }
    }
}

/// One key of a work ID, for the batch calls, which name thousands of
/// keys: [`KeyWriter::write`] reuses one buffer instead of allocating
/// every key of every lease ([`LeaseKeys`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    State,
    Live,
    Fence,
}

/// Writes keys into one reused buffer.
pub(crate) struct KeyWriter<'a> {
    prefix: &'a str,
    buf: String,
}

impl<'a> KeyWriter<'a> {
    pub(crate) fn new(prefix: &'a str) -> Self {
        Self {
            prefix,
            buf: String::new(),
        }
    }

    /// The key of `kind` of `work_id`: the same text as [`LeaseKeys`]'s.
    pub(crate) fn write(&mut self, work_id: &WorkId, kind: Kind) -> &[u8] {
        use std::fmt::Write as _;
        let suffix = match kind {
            Kind::State => STATE,
            Kind::Live => LIVE,
            Kind::Fence => FENCE,
        };
        self.buf.clear();
        // Writing to a String cannot fail.
        let _ = write!(
            self.buf,
            "{}{{{}}}:{suffix}",
            self.prefix,
            utf8_percent_encode(work_id.as_str(), ESCAPED)
        );
        self.buf.as_bytes()
    }
}

/// The escaped form of a work ID, as it stands in keys.
pub(crate) fn escape(work_id: &str) -> String {
    utf8_percent_encode(work_id, ESCAPED).to_string()
}

/// The work ID whose state hash is `key`, or `None` when `key` is not the
/// state key of a valid work ID under `prefix` (a key of another program
/// that happens to match the scan pattern).
pub(crate) fn work_id_of_state_key(prefix: &str, key: &[u8]) -> Option<WorkId> {
    let key = std::str::from_utf8(key).ok()?;
    let escaped = key
        .strip_prefix(prefix)?
        .strip_prefix('{')?
        .strip_suffix(STATE)?
        .strip_suffix("}:")?;
    let id = percent_decode_str(escaped).decode_utf8().ok()?;
    // Only our own, canonical escaping maps back to a key of ours.
    if escape(&id) != escaped {
        return None;
    }
    WorkId::new(id.into_owned()).ok()
}

/// The `SCAN MATCH` pattern of every state key under `prefix`: the prefix
/// with the glob characters escaped.
pub(crate) fn state_pattern(prefix: &str) -> String {
    format!("{}{{*}}:{STATE}", glob_escape(prefix))
}

pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The pub/sub channel on which releases and revocations under `prefix`
/// in database `db` are announced (the message is the work ID). Pub/sub is
/// not scoped by database, so the channel names it.
pub(crate) fn channel(prefix: &str, db: i64) -> String {
    format!("{prefix}released:db{db}")
}

/// Why `prefix` cannot be a key prefix, or `None` when it can.
pub(crate) fn check_prefix(prefix: &str) -> Option<String> {
    if prefix.len() > MAX_PREFIX_BYTES {
        return Some(format!(
            "the key prefix is {} bytes: the limit is {MAX_PREFIX_BYTES} bytes",
            prefix.len()
        ));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_control())
    {
        return Some(format!(
            "the key prefix {prefix:?} contains {c:?}: braces (they would change the hash tag) \
             and control characters are not allowed"
        ));
    }
    None
}

/// The longest key prefix, in bytes.
pub const MAX_PREFIX_BYTES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_writer_writes_the_keys_of_lease_keys() {
        for id in ["a", "jobs/{x}%", "é ü"] {
            let id = WorkId::new(id.to_string()).expect("a valid work ID");
            let keys = LeaseKeys::new("p:", &id);
            let mut w = KeyWriter::new("p:");
            assert_eq!(w.write(&id, Kind::State), keys.state.as_bytes());
            assert_eq!(w.write(&id, Kind::Live), keys.live.as_bytes());
            assert_eq!(w.write(&id, Kind::Fence), keys.fence.as_bytes());
        }
    }

    fn id(s: &str) -> WorkId {
        WorkId::new(s).expect("valid")
    }

    /// The hash tag of a key, as Redis Cluster finds it.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a tag");
        let close = open + key[open..].find('}').expect("closed");
        &key[open + 1..close]
    }

    #[test]
    fn keys_are_injective_and_share_a_slot() {
        let ids = [
            "jobs/a",
            "jobs/a/b",
            "jobs/ab",
            "jobs/{a}",
            "jobs/%7Ba%7D",
            "jobs/%",
            "jobs/%25",
            "a}:state",
            "x y:ü🚀",
        ];
        let mut seen = std::collections::HashSet::new();
        for s in ids {
            let k = LeaseKeys::new("p:", &id(s));
            for key in [&k.state, &k.live, &k.checkpoint, &k.fence] {
                assert!(key.starts_with("p:{"), "{key}");
                assert!(seen.insert(key.clone()), "{key} collides");
                assert_eq!(hash_tag(key), escape(s), "{key}");
            }
            assert_eq!(work_id_of_state_key("p:", k.state.as_bytes()), Some(id(s)));
            assert_eq!(work_id_of_state_key("p:", k.live.as_bytes()), None);
            assert_eq!(work_id_of_state_key("q:", k.state.as_bytes()), None);
        }
    }

    #[test]
    fn foreign_keys_are_not_taken_for_work_ids() {
        for key in [
            "p:{%41}:state",
            "p:{a}b}:state",
            "p:{}:state",
            "p:{%zz}:state",
        ] {
            assert_eq!(work_id_of_state_key("p:", key.as_bytes()), None, "{key}");
        }
    }

    #[test]
    fn prefixes_are_checked_and_globs_escaped() {
        assert!(check_prefix("worklease:").is_none());
        assert!(check_prefix("a{b").is_some());
        assert!(check_prefix("a}b").is_some());
        assert!(check_prefix("a\nb").is_some());
        assert!(check_prefix(&"x".repeat(MAX_PREFIX_BYTES + 1)).is_some());
        assert_eq!(state_pattern("a*[?]\\:"), "a\\*\\[\\?\\]\\\\:{*}:state");
    }
}
