//! The key layout: the four keys of a work ID under the prefix, the
//! escaping that makes a work ID one path segment, and the key of each
//! session lease.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::limits::WorkId;

/// The kinds of keys, each followed by the escaped work ID.
pub(super) const LIVE: &str = "live/";
pub(super) const ACQ: &str = "acq/";
const STATE: &str = "state/";
const CKPT: &str = "ckpt/";
/// The session keys, each followed by its etcd lease ID in hex.
pub(super) const SESS: &str = "sess/";

/// What the escaping of a work ID encodes besides non-ASCII bytes, which
/// percent-encoding always encodes: `/` keeps the ID one path segment.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'/').add(b'%');

/// The escaped form of a work ID, as it stands in keys.
fn escape(work_id: &str) -> String {
    utf8_percent_encode(work_id, ESCAPED).to_string()
}

/// Whether `id` stands as it is in keys: printable ASCII without `/` and
/// `%` (what `ESCAPED` leaves alone), as most work IDs are.
fn plain(id: &str) -> bool {
    id.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'/' && b != b'%')
}

/// The `live` key of `work_id` under `prefix` (what [`EtcdKeys::new`]
/// makes, built alone: a renewal needs no other key).
pub(super) fn live_key(prefix: &str, work_id: &WorkId) -> String {
    let id = work_id.as_str();
    let mut key = String::with_capacity(prefix.len() + LIVE.len() + id.len() + 8);
    key.push_str(prefix);
    key.push_str(LIVE);
    if plain(id) {
        key.push_str(id);
        return key;
    }
    for part in utf8_percent_encode(id, ESCAPED) {
        key.push_str(part);
    }
    key
}

/// The length of [`live_key`], without making it.
pub(super) fn live_key_len(prefix: &str, work_id: &WorkId) -> usize {
    let id = work_id.as_str();
    let escaped = if plain(id) {
        id.len()
    } else {
        utf8_percent_encode(id, ESCAPED).map(str::len).sum()
    };
    prefix.len() + LIVE.len() + escaped
}

/// The session key of etcd lease `lease` under `prefix`: attached to that
/// lease, put by every batch renewal of the session, so its mod revision
/// moves while the session's holder renews (the observation rule).
pub(super) fn session_key(prefix: &str, lease: i64) -> String {
    format!("{prefix}{SESS}{lease:016x}")
}

/// The etcd keys of one work ID (see the module docs for what each holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKeys {
    /// Exists, attached to an etcd lease, exactly while the lease is live;
    /// its create revision is the fencing token, its value the holder ID.
    pub live: String,
    /// The acquisition: holder, TTL, previous holder and how it ended.
    pub acquisition: String,
    /// Renewals, release or revocation of the current acquisition.
    pub state: String,
    /// The checkpoint bytes.
    pub checkpoint: String,
}

impl EtcdKeys {
    /// The keys of `work_id` under `prefix`.
    pub(super) fn new(prefix: &str, work_id: &WorkId) -> Self {
        let id = escape(work_id.as_str());
        Self {
            live: format!("{prefix}{LIVE}{id}"),
            acquisition: format!("{prefix}{ACQ}{id}"),
            state: format!("{prefix}{STATE}{id}"),
            checkpoint: format!("{prefix}{CKPT}{id}"),
        }
    }
}

/// The work ID of the key `key` of kind `kind` (`LIVE`, `ACQ`, ...) under
/// `prefix`, or `None` for a key that is not one of ours (another
/// program's, or a non-canonical escaping).
pub(super) fn work_id_of(prefix: &str, kind: &str, key: &[u8]) -> Option<WorkId> {
    let key = std::str::from_utf8(key).ok()?;
    let escaped = key.strip_prefix(prefix)?.strip_prefix(kind)?;
    let id = percent_decode_str(escaped).decode_utf8().ok()?;
    if escape(&id) != escaped {
        return None;
    }
    WorkId::new(id.into_owned()).ok()
}

/// The end of the key range of every key starting with `prefix` (etcd's
/// "prefix + 1"; `[0]`, the end of the key space, for a prefix of 0xff
/// bytes).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkId {
        WorkId::new(s).expect("valid")
    }

    #[test]
    fn keys_are_injective_and_stay_under_the_prefix() {
        let ids = [
            "jobs/a",
            "jobs/a/b",
            "jobs/ab",
            "jobs%2Fa",
            "jobs/%",
            "jobs/%25",
            "../../etc",
            "a/../../b",
            "x y:ü🚀",
            "live/x",
            "plain-id_0~",
        ];
        let mut seen = std::collections::HashSet::new();
        for s in ids {
            let k = EtcdKeys::new("p/", &id(s));
            for (key, kind) in [
                (&k.live, LIVE),
                (&k.acquisition, ACQ),
                (&k.state, STATE),
                (&k.checkpoint, CKPT),
            ] {
                assert!(key.starts_with(&format!("p/{kind}")), "{key}");
                let rest = &key[format!("p/{kind}").len()..];
                assert!(!rest.contains('/'), "{key}: the ID is one segment");
                assert!(seen.insert(key.clone()), "{key} collides");
            }
            assert_eq!(live_key("p/", &id(s)), k.live);
            assert_eq!(live_key_len("p/", &id(s)), k.live.len());
            assert_eq!(work_id_of("p/", ACQ, k.acquisition.as_bytes()), Some(id(s)));
            assert_eq!(work_id_of("p/", LIVE, k.live.as_bytes()), Some(id(s)));
            assert_eq!(work_id_of("p/", ACQ, k.live.as_bytes()), None);
            assert_eq!(work_id_of("q/", ACQ, k.acquisition.as_bytes()), None);
        }
        // Keys of another program, or of a store whose prefix extends ours.
        for key in ["p/acq/%41", "p/acq/a/b", "p/acq/", "p/acq/%zz"] {
            assert_eq!(work_id_of("p/", ACQ, key.as_bytes()), None, "{key}");
        }
    }

    #[test]
    fn session_keys_are_apart_from_work_ids() {
        assert_eq!(session_key("p/", 0x2a), "p/sess/000000000000002a");
        assert_eq!(
            work_id_of("p/", LIVE, session_key("p/", 7).as_bytes()),
            None
        );
        assert_eq!(work_id_of("p/", ACQ, session_key("p/", 7).as_bytes()), None);
    }

    #[test]
    fn prefix_ranges_end_right_after_the_prefix() {
        assert_eq!(prefix_end(b"p/acq/"), b"p/acq0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    proptest::proptest! {
        /// The keys of any two valid work IDs stay under the prefix, keep
        /// the ID one segment, map back to their ID, and differ when the
        /// IDs differ.
        #[test]
        fn keys_stay_under_the_prefix_and_are_injective(
            a in crate::limits::arbitrary::work_id(),
            b in crate::limits::arbitrary::work_id(),
        ) {
            let (ka, kb) = (EtcdKeys::new("p/", &a), EtcdKeys::new("p/", &b));
            for (k, id) in [(&ka, &a), (&kb, &b)] {
                for (key, kind) in [(&k.live, LIVE), (&k.acquisition, ACQ), (&k.state, STATE), (&k.checkpoint, CKPT)] {
                    let rest = key.strip_prefix(&format!("p/{kind}"));
                    proptest::prop_assert!(rest.is_some_and(|r| !r.is_empty() && !r.contains('/')), "{}", key);
                }
                proptest::prop_assert_eq!(live_key("p/", id), k.live.clone());
                proptest::prop_assert_eq!(live_key_len("p/", id), k.live.len());
                proptest::prop_assert_eq!(work_id_of("p/", ACQ, k.acquisition.as_bytes()), Some(id.clone()));
            }
            proptest::prop_assert_eq!(a == b, ka.acquisition == kb.acquisition);
        }
    }
}
