//! The lease token: what an acquisition hands to its holder.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use tokio::time::Instant;

use crate::error::InvalidInput;
use crate::limits::{ceil_millis, check_ttl, HolderId, WorkId};

/// The lease a renew, checkpoint, read or release names: the token's
/// identity without its times.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRef<'a> {
    /// The work ID.
    pub work_id: &'a WorkId,
    /// The holder that acquired the lease.
    pub holder_id: &'a HolderId,
    /// The fencing token of that acquisition.
    pub fencing_token: u64,
}

/// Characters escaped in the text form: the separators `;` and `=`, `%`
/// itself, spaces and everything outside ASCII printable range.
const TEXT_ESCAPE: &AsciiSet = &CONTROLS.add(b' ').add(b';').add(b'=').add(b'%');

/// Version tag at the start of the text form.
const TEXT_VERSION: &str = "wl1";

/// Proof of one acquisition of a lease (Go: `Token`).
///
/// The fencing token strictly increases with every acquisition of the work
/// ID: pass it to downstream systems so that they can reject a stale holder.
///
/// The [`Display`](fmt::Display) form is the stable text form, which
/// [`FromStr`] parses back (the CLI hands it to a child process), for example
/// `wl1;work=jobs%2F7;holder=host-1;fencing_token=42;expires_at_ms=1767225600000;ttl_ms=15000`.
/// The text form carries everything but the holder's local deadline, which
/// only the process that sent the acquire or renew request can know: a
/// parsed token has none, and the store alone judges whether it is current.
#[derive(Clone)]
pub struct Token {
    pub(crate) work_id: WorkId,
    pub(crate) holder_id: HolderId,
    pub(crate) fencing_token: u64,
    pub(crate) expires_at: SystemTime,
    pub(crate) ttl: Duration,
    pub(crate) deadline: Option<Instant>,
}

impl Token {
    /// The work ID this lease is for.
    pub fn work_id(&self) -> &WorkId {
        &self.work_id
    }

    /// The holder that acquired it.
    pub fn holder_id(&self) -> &HolderId {
        &self.holder_id
    }

    /// The fencing token: strictly larger than every earlier acquisition's of
    /// this work ID (S2 in the crate docs).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// When the lease expires, by the wall clock of this host: informational
    /// only (for display and `status`). Expiry is judged by the store's clock
    /// and the holder's monotonic [`Token::deadline`], never by this value.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// The TTL the lease was acquired or last renewed with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The monotonic instant at which this holder stops counting the lease as
    /// its own: the send time of the last successful acquire or renew request,
    /// plus the TTL, minus the safety margin (the crate docs' "Clocks"). `None` for a
    /// token parsed from text.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left before [`Token::deadline`]; `None` for a parsed token, zero
    /// once the deadline has passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

impl PartialEq for Token {
    /// Two tokens are equal when their text forms are: times are compared
    /// in whole milliseconds, and the local deadline is not compared.
    fn eq(&self, other: &Self) -> bool {
        self.work_id == other.work_id
            && self.holder_id == other.holder_id
            && self.fencing_token == other.fencing_token
            && unix_millis(self.expires_at) == unix_millis(other.expires_at)
            && ceil_millis(self.ttl) == ceil_millis(other.ttl)
    }
}

impl Eq for Token {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("work_id", &self.work_id)
            .field("holder_id", &self.holder_id)
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The lease `token` names, as a store call takes it.
pub(crate) fn lease_ref(token: &Token) -> LeaseRef<'_> {
    LeaseRef {
        work_id: &token.work_id,
        holder_id: &token.holder_id,
        fencing_token: token.fencing_token,
    }
}

pub(crate) fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TEXT_VERSION};work={};holder={};fencing_token={};expires_at_ms={};ttl_ms={}",
            utf8_percent_encode(self.work_id.as_str(), TEXT_ESCAPE),
            utf8_percent_encode(self.holder_id.as_str(), TEXT_ESCAPE),
            self.fencing_token,
            unix_millis(self.expires_at),
            ceil_millis(self.ttl)
        )
    }
}

impl FromStr for Token {
    type Err = InvalidInput;

    /// Parses the text form written by [`Display`](fmt::Display).
    ///
    /// # Errors
    /// [`InvalidInput::MalformedToken`] naming the missing or bad field, or
    /// the ID or TTL error when a field breaks a limit.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| InvalidInput::MalformedToken(why.to_string());
        let mut parts = s.trim().split(';');
        if parts.next() != Some(TEXT_VERSION) {
            return Err(bad("it must start with \"wl1;\""));
        }
        let (mut work, mut holder, mut fence, mut expires, mut ttl) =
            (None, None, None, None, None);
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("a field lacks '='"))?;
            let text = || {
                percent_decode_str(v)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| bad("a field is not UTF-8"))
            };
            let num = |name: &str| {
                let digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
                v.parse::<u64>()
                    .ok()
                    .filter(|_| digits)
                    .ok_or_else(|| bad(&format!("{name} is not a whole number")))
            };
            match k {
                "work" => work = Some(WorkId::new(text()?)?),
                "holder" => holder = Some(HolderId::new(text()?)?),
                "fencing_token" => fence = Some(num("fencing_token")?),
                "expires_at_ms" => expires = Some(num("expires_at_ms")?),
                "ttl_ms" => ttl = Some(num("ttl_ms")?),
                _ => {} // later versions may add fields: ignore them
            }
        }
        Ok(Token {
            work_id: work.ok_or_else(|| bad("the work field is missing"))?,
            holder_id: holder.ok_or_else(|| bad("the holder field is missing"))?,
            fencing_token: fence.ok_or_else(|| bad("the fencing_token field is missing"))?,
            expires_at: UNIX_EPOCH
                + Duration::from_millis(
                    expires.ok_or_else(|| bad("the expires_at_ms field is missing"))?,
                ),
            ttl: check_ttl(Duration::from_millis(
                ttl.ok_or_else(|| bad("the ttl_ms field is missing"))?,
            ))?,
            deadline: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_awkward_ids() {
        let t = Token {
            work_id: WorkId::new("jobs/a b;c=d%e:{ü}").unwrap(),
            holder_id: HolderId::new("host 1;x").unwrap(),
            fencing_token: 42,
            expires_at: UNIX_EPOCH + Duration::from_millis(1_767_225_600_123),
            ttl: Duration::from_micros(1_500_300),
            deadline: None,
        };
        let text = t.to_string();
        assert!(!text.contains(' '), "{text}");
        let back: Token = text.parse().unwrap();
        assert_eq!(back, t);
        assert_eq!(
            back.ttl(),
            Duration::from_millis(1501),
            "TTLs round up to the millisecond"
        );
    }

    #[test]
    fn malformed_text_is_rejected_with_the_reason() {
        let e = "nope".parse::<Token>().unwrap_err().to_string();
        assert!(e.contains("wl1"), "{e}");
        let e = "wl1;work=a;holder=b;fencing_token=x;expires_at_ms=1;ttl_ms=1"
            .parse::<Token>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("fencing_token"), "{e}");
        assert!(
            "wl1;work=;holder=b;fencing_token=1;expires_at_ms=1;ttl_ms=1"
                .parse::<Token>()
                .is_err()
        );
    }

    proptest::proptest! {
        /// The text form round-trips every valid work ID and holder ID,
        /// every fencing token and millisecond expiry, and every TTL (to
        /// its whole milliseconds, rounded up).
        #[test]
        fn text_form_round_trips(
            work_id in crate::limits::arbitrary::work_id(),
            holder_id in crate::limits::arbitrary::holder_id(),
            fencing_token in proptest::prelude::any::<u64>(),
            expires_ms in 0u64..=253_402_300_799_999,
            ttl_us in 1_000u64..=crate::limits::MAX_TTL.as_micros() as u64,
        ) {
            let t = Token {
                work_id,
                holder_id,
                fencing_token,
                expires_at: UNIX_EPOCH + Duration::from_millis(expires_ms),
                ttl: Duration::from_micros(ttl_us),
                deadline: None,
            };
            let back: Token = t.to_string().parse().expect("its own text form parses");
            proptest::prop_assert_eq!(&back.work_id, &t.work_id);
            proptest::prop_assert_eq!(&back.holder_id, &t.holder_id);
            proptest::prop_assert_eq!(back.fencing_token, t.fencing_token);
            proptest::prop_assert_eq!(back.expires_at, t.expires_at);
            proptest::prop_assert_eq!(back.ttl, Duration::from_millis(ceil_millis(t.ttl)));
        }
    }
}
