//! The parsers of the command line's values (durations, work IDs,
//! holder IDs, election names, permits) and of the work-ID file. Each
//! takes text as a person or a file gives it and answers a value or a
//! message for clap (or the pool's usage error); none panics.

use std::time::Duration;

use worklease::limits::{check_ttl, HolderId, WorkId};

/// A duration as humantime writes it (`500ms`, `15s`, `1m`), surrounding
/// whitespace ignored. Errors: a negative duration (its options take
/// values starting with `-`, so that `--ttl -3s` reaches this check), text
/// humantime refuses, or a duration past what it represents.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: a duration is 0 or more (write for example 500ms, 15s or 1m)"
        ));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (write for example 500ms, 15s or 1m)"))
}

/// A lease TTL: a duration within the library's TTL limits
/// ([`check_ttl`]), whose message names the limit otherwise.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    check_ttl(parse_duration(s)?).map_err(|e| e.to_string())
}

/// A poll or backoff interval: a duration of at least 1 ms.
pub fn parse_poll(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) {
        // Shared by --poll and --backoff: clap's message names the option.
        return Err(format!(
            "{} is too short: it must be at least 1ms",
            fmt_secs(d)
        ));
    }
    Ok(d)
}

/// A work ID within [`WorkId`]'s limits, kept byte for byte.
pub fn parse_work_id(s: &str) -> Result<WorkId, String> {
    WorkId::new(s).map_err(|e| e.to_string())
}

/// A work ID to hold: not one worklease keeps for itself (refused before
/// any store is opened).
pub fn parse_user_work_id(s: &str) -> Result<WorkId, String> {
    worklease::user_work_id(s).map_err(|e| e.to_string())
}

/// An election's name, refused before any store is opened (`elect` would
/// otherwise create the SQLite file first).
pub fn parse_election(s: &str) -> Result<WorkId, String> {
    // clap already says "invalid value": the limit alone, without the
    // library's "invalid input: " in front of it.
    worklease::election::check_name(s).map_err(|e| match e {
        worklease::Error::Invalid(limit) => limit.to_string(),
        other => other.to_string(),
    })
}

/// A semaphore's permits: 1 to [`worklease::semaphore::MAX_PERMITS`].
pub fn parse_permits(s: &str) -> Result<usize, String> {
    let max = worklease::semaphore::MAX_PERMITS;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("a semaphore has 1 to {max} permits, not {s:?}")),
    }
}

/// A holder ID within [`HolderId`]'s limits.
pub fn parse_holder_id(s: &str) -> Result<HolderId, String> {
    HolderId::new(s).map_err(|e| e.to_string())
}

/// The work IDs of a work-ID file's text (`pool --work-ids-file`): one
/// per line, surrounding whitespace trimmed, blank lines and lines
/// starting with `#` skipped. Each is checked later, with the others
/// (`Pool::new`: limits, duplicates).
pub fn work_id_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A duration for people, as every message of the CLI writes it: `750ms`
/// under 0.1s, `4.2s` under a minute, else whole seconds in units (`2m 5s`,
/// `1h 3m`).
pub fn fmt_secs(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    if d < Duration::from_millis(100) {
        return match (d.as_millis(), d.as_micros()) {
            (0, 0) => format!("{}ns", d.as_nanos()),
            (0, us) => format!("{us}µs"),
            (ms, _) => format!("{ms}ms"),
        };
    }
    let tenths = (d.as_millis() + 50) / 100;
    if tenths < 600 {
        format!("{}.{}s", tenths / 10, tenths % 10)
    } else {
        let secs = u64::try_from((d.as_millis() + 500) / 1000).unwrap_or(u64::MAX);
        humantime::format_duration(Duration::from_secs(secs)).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let ms = Duration::from_millis;
        assert_eq!(fmt_secs(Duration::ZERO), "0s");
        assert_eq!(fmt_secs(Duration::from_nanos(1)), "1ns");
        assert_eq!(fmt_secs(Duration::from_micros(750)), "750µs");
        assert_eq!(fmt_secs(ms(50)), "50ms");
        assert_eq!(fmt_secs(ms(4200)), "4.2s");
        assert_eq!(fmt_secs(ms(3750)), "3.8s");
        assert_eq!(fmt_secs(ms(59_960)), "1m");
        assert_eq!(fmt_secs(ms(125_400)), "2m 5s");
        assert_eq!(fmt_secs(Duration::from_secs(3780)), "1h 3m");
    }
}
