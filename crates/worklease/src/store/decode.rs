//! The checks every store's decoder makes of a stored lease's fields
//! (issue 23): a corrupt record (a bad write, another program's, a
//! changed schema) is an error naming the bad field, never a panic nor a
//! lease whose holder, fencing token or predecessor the types forbid.

use crate::limits::HolderId;
use crate::store::{LeaseEnd, PreviousHolder};

/// A stored lease's field that breaks the rules: its name and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub(crate) struct Corrupt {
    /// The field (column, hash field, JSON key) as the store names it.
    pub(crate) field: &'static str,
    pub(crate) why: String,
}

impl Corrupt {
    pub(crate) fn new(field: &'static str, why: impl Into<String>) -> Self {
        Self {
            field,
            why: why.into(),
        }
    }
}

/// A holder ID within [`HolderId`]'s limits.
pub(crate) fn holder_id(field: &'static str, s: String) -> Result<String, Corrupt> {
    match HolderId::new(s.as_str()) {
        Ok(_) => Ok(s),
        Err(e) => Err(Corrupt::new(field, e.to_string())),
    }
}

/// A fencing token: tokens start at 1.
pub(crate) fn fencing_token(field: &'static str, token: u64) -> Result<u64, Corrupt> {
    if token == 0 {
        return Err(Corrupt::new(
            field,
            "0 is no fencing token (they start at 1)",
        ));
    }
    Ok(token)
}

/// A fencing token a store keeps in a signed 64-bit column.
#[cfg(any(feature = "sqlite", feature = "etcd"))]
pub(crate) fn signed_token(field: &'static str, token: i64) -> Result<u64, Corrupt> {
    let t =
        u64::try_from(token).map_err(|_| Corrupt::new(field, format!("{token} is negative")))?;
    fencing_token(field, t)
}

/// A count or a time a store keeps in a signed 64-bit column that is
/// never negative.
#[cfg(any(feature = "sqlite", feature = "redis"))]
pub(crate) fn unsigned(field: &'static str, n: i64) -> Result<u64, Corrupt> {
    u64::try_from(n).map_err(|_| Corrupt::new(field, format!("{n} is negative")))
}

/// A checkpoint's size in bytes.
#[cfg(feature = "redis")]
pub(crate) fn checkpoint_size(field: &'static str, n: i64) -> Result<usize, Corrupt> {
    usize::try_from(unsigned(field, n)?)
        .map_err(|_| Corrupt::new(field, format!("{n} bytes do not fit this host")))
}

/// The previous holder from its three fields: all absent on a first
/// acquisition, all present after; some without the others is corrupt.
pub(crate) fn previous(
    holder: Option<String>,
    token: Option<u64>,
    end: Option<&str>,
) -> Result<Option<PreviousHolder>, Corrupt> {
    match (holder, token, end) {
        (None, None, None) => Ok(None),
        (Some(holder), Some(token), Some(end)) => Ok(Some(PreviousHolder {
            holder_id: holder_id("prev_holder_id", holder)?,
            fencing_token: fencing_token("prev_fencing_token", token)?,
            ended: LeaseEnd::from_str(end)
                .ok_or_else(|| Corrupt::new("prev_end", format!("{end:?} is no lease end")))?,
        })),
        _ => Err(Corrupt::new(
            "prev_holder_id, prev_fencing_token, prev_end",
            "some are set without the others",
        )),
    }
}

/// What every decoded lease must be, whatever the store: a valid holder,
/// a fencing token of at least 1, a predecessor of the same kind, an end
/// exactly when it is expired, and no time left when it is (the fuzz
/// targets of the stores' decoders check it, `crate::fuzz`).
#[cfg(feature = "fuzzing")]
pub(crate) fn check_info(info: &crate::store::LeaseInfo) {
    assert!(HolderId::new(info.holder_id.as_str()).is_ok(), "{info:?}");
    assert!(info.fencing_token > 0, "{info:?}");
    if let Some(p) = &info.handoff.previous {
        assert!(HolderId::new(p.holder_id.as_str()).is_ok(), "{info:?}");
        assert!(p.fencing_token > 0, "{info:?}");
    }
    assert!(!info.expired || info.expires_in.is_none(), "{info:?}");
    assert_eq!(info.expired, info.ended.is_some(), "{info:?}");
}

#[cfg(all(test, feature = "sqlite", feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn fields_the_types_forbid_are_named() {
        assert_eq!(fencing_token("t", 0).unwrap_err().field, "t");
        assert_eq!(signed_token("t", -1).unwrap_err().field, "t");
        assert_eq!(signed_token("t", 7), Ok(7));
        assert_eq!(checkpoint_size("n", -5).unwrap_err().field, "n");
        assert_eq!(holder_id("h", String::new()).unwrap_err().field, "h");
        assert_eq!(
            previous(Some("a".into()), None, Some("released"))
                .unwrap_err()
                .field,
            "prev_holder_id, prev_fencing_token, prev_end"
        );
        assert_eq!(
            previous(Some("a".into()), Some(0), Some("released"))
                .unwrap_err()
                .field,
            "prev_fencing_token"
        );
        assert_eq!(
            previous(Some("a".into()), Some(3), Some("gone"))
                .unwrap_err()
                .field,
            "prev_end"
        );
        assert_eq!(previous(None, None, None), Ok(None));
    }
}
