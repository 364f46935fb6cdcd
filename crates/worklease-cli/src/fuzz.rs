//! Entry points for the command's fuzz targets in `fuzz/` (`cli_values`,
//! `cli_work_id_file`) and for `tests/fuzz_corpus.rs`, which runs their
//! corpora on stable. Each takes arbitrary bytes as a person or a file
//! gives them, must never panic, and checks what its parser promises.

use std::time::Duration;

use crate::values::{
    parse_duration, parse_election, parse_holder_id, parse_permits, parse_poll, parse_ttl,
    parse_user_work_id, parse_work_id, work_id_lines,
};

/// Every value parser of the command line on the same text: a duration
/// that parses prints (humantime) to text that parses to it again; a TTL
/// is within the library's limits; a poll interval is at least 1 ms;
/// permits are in range; IDs and election names are kept byte for byte,
/// and a work ID to hold is none of worklease's own.
pub fn values(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(text) {
        let written = humantime::format_duration(d).to_string();
        assert_eq!(
            parse_duration(&written),
            Ok(d),
            "{written:?}, written from {text:?}"
        );
    }
    if let Ok(ttl) = parse_ttl(text) {
        assert!(worklease::limits::check_ttl(ttl).is_ok(), "{text:?}");
    }
    if let Ok(poll) = parse_poll(text) {
        assert!(poll >= Duration::from_millis(1), "{text:?}");
    }
    if let Ok(n) = parse_permits(text) {
        assert!((1..=worklease::semaphore::MAX_PERMITS).contains(&n));
    }
    if let Ok(id) = parse_work_id(text) {
        assert_eq!(id.as_str(), text);
    }
    if let Ok(id) = parse_user_work_id(text) {
        assert_eq!(id.as_str(), text);
        assert!(
            !worklease::is_internal_work_id(text),
            "{text:?} is reserved"
        );
    }
    if let Ok(name) = parse_election(text) {
        assert_eq!(name.as_str(), text);
    }
    if let Ok(id) = parse_holder_id(text) {
        assert_eq!(id.as_str(), text);
    }
}

/// A work-ID file (`pool --work-ids-file`): every ID taken is one
/// trimmed, non-blank line that is no comment, in the file's order.
pub fn work_id_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut rest = text;
    for id in work_id_lines(text) {
        assert!(!id.is_empty() && !id.starts_with('#'), "{id:?}");
        assert_eq!(id, id.trim(), "trimmed");
        assert!(!id.contains('\n'), "one line: {id:?}");
        let at = rest.find(id).expect("the IDs come in the file's order");
        rest = &rest[at + id.len()..];
        let _ = parse_work_id(id);
    }
}
