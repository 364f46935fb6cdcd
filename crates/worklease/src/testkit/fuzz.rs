//! Entry points for the fuzz targets in `fuzz/` and for the regression
//! test that runs their corpora on stable (feature `fuzzing`; not part of
//! the API: hidden, and free to change in any release). Each one takes
//! arbitrary bytes, as they would come from outside (a token pasted into a
//! command, a store URL, an object or checkpoint another program wrote),
//! must never panic, and checks the round trip its format promises.

use std::str::FromStr;

use crate::limits::WorkId;
use crate::token::Token;

/// Runs every input of `fuzz/corpus/TARGET` (`fuzz_dir` is `fuzz/`)
/// through `target`: the stable regression tests over the corpora (both
/// crates' `tests/fuzz_corpus.rs`). Panics, as a test does, when the
/// corpus is missing or empty, or on a broken invariant.
pub fn run_corpus(fuzz_dir: &std::path::Path, target_name: &str, target: fn(&[u8])) {
    let dir = fuzz_dir.join("corpus").join(target_name);
    let inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("an entry").path())
        .collect();
    assert!(
        !inputs.is_empty(),
        "{target_name}: no seed in {}",
        dir.display()
    );
    for input in inputs {
        target(&std::fs::read(&input).expect("a corpus file"));
    }
}

/// A structured input (a row's columns) drawn from the fuzzer's bytes.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn structured<'a, T: arbitrary::Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    arbitrary::Unstructured::new(data).arbitrary().ok()
}

/// `Token::from_str`: a parsed token prints to a text form that parses to
/// the same token.
pub fn token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = Token::from_str(text) {
        let again = Token::from_str(&t.to_string()).expect("a token's own text form parses");
        assert_eq!(again.to_string(), t.to_string(), "the text form is stable");
    }
}

/// The store URL dispatcher (`store::url::parse`, every store's own URL
/// parser behind it): a parsed URL written back parses to the same
/// settings. Nothing is opened.
pub fn store_url(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = crate::store::url::parse(text) {
        let written = spec.to_url();
        let again = crate::store::url::parse(&written)
            .unwrap_or_else(|e| panic!("{written:?}, written back from {text:?}, is refused: {e}"));
        assert_eq!(
            again, spec,
            "{written:?} parses to other settings than {text:?}"
        );
    }
}

/// The election record in an election's checkpoint: one that decodes
/// encodes to the same bytes.
pub fn election_record(data: &[u8]) {
    if let Some(record) = crate::election::record::Record::decode(data) {
        assert_eq!(&record.encode()[..], data, "a decoded record encodes back");
    }
}

/// A fair line's record in its queue lease's checkpoint: whatever it holds,
/// decoding never panics, and a line that decodes encodes to bytes that
/// decode to the same line.
pub fn fair_line(data: &[u8]) {
    let bytes = bytes::Bytes::copy_from_slice(data);
    let line = crate::fair::line::decode(Some(&bytes));
    let again = crate::fair::line::decode(Some(&crate::fair::line::encode(&line)));
    assert_eq!(again, line, "a decoded line encodes back");
}

/// A work ID, as given on the command line or in a work-ID file: a valid
/// one is kept byte for byte.
pub fn work_id(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = WorkId::new(text) {
        assert_eq!(id.as_str(), text);
    }
}

/// The register adapter's lease record (S3 and Azure objects, DynamoDB
/// items): any bytes decode or fail with a message, never panic; a record
/// that decodes encodes back to bytes that decode to the same record.
pub fn register_record(data: &[u8]) {
    crate::store::register::fuzz_record(data);
}

/// Object keys (feature `object-store`): a segment that unescapes to a
/// work ID is that work ID's own escaping.
#[cfg(feature = "object-store")]
pub fn object_key(data: &[u8]) {
    crate::store::object::fuzz_key(data);
}

/// A SQLite lease row (`store::sqlite`), from arbitrary column values:
/// it decodes to a lease that keeps `check_info`'s rules at any reading
/// of the store clock, or fails naming the corrupt column.
#[cfg(feature = "sqlite")]
pub fn sqlite_row(data: &[u8]) {
    let Some((columns, epoch, millis)) =
        structured::<(crate::store::sqlite::RowColumns, String, u64)>(data)
    else {
        return;
    };
    let now = crate::store::sqlite::ClockReading { epoch, millis };
    let work_id = WorkId::new("fuzz").expect("a valid work ID");
    match crate::store::sqlite::fuzz_row(columns, work_id, &now) {
        Ok(info) => crate::store::decode::check_info(&info),
        Err(corrupt) => assert!(!corrupt.field.is_empty()),
    }
}

/// A PostgreSQL or MySQL lease description (`store::sql_rows`, the
/// columns both select), from arbitrary column values: it decodes to a
/// lease that keeps `check_info`'s rules or is a store error.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn sql_row(data: &[u8]) {
    let Some(columns) = structured::<crate::store::sql_rows::InfoColumns>(data) else {
        return;
    };
    match columns.into_info("fuzz") {
        Ok(info) => crate::store::decode::check_info(&info),
        Err(e) => assert!(matches!(e, crate::Error::Store(_)), "{e}"),
    }
}

/// The Redis scripts' `info` reply as the server sends it (RESP bytes,
/// parsed by the redis crate): it decodes to a lease that keeps
/// `check_info`'s rules or is a store error.
#[cfg(feature = "redis")]
pub fn redis_reply(data: &[u8]) {
    match crate::store::redis::fuzz_lease_info(data) {
        Some(Ok(info)) => crate::store::decode::check_info(&info),
        Some(Err(e)) => assert!(matches!(e, crate::Error::Store(_)), "{e}"),
        None => {}
    }
}

/// The etcd store's values of `acq` and `state` (JSON) and their mod
/// revisions, as text: a line `ACQ_REV STATE_REV`, the value of `acq` on
/// the next line, the value of `state` (optional) on the one after. They
/// decode to a lease that keeps `check_info`'s rules or are a store
/// error.
#[cfg(feature = "etcd")]
pub fn etcd_values(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(3, '\n');
    let revisions = lines.next().unwrap_or_default();
    let Some((acq_rev, state_rev)) = revisions.split_once(' ') else {
        return;
    };
    let (Ok(acq_rev), Ok(state_rev)) = (acq_rev.parse::<i64>(), state_rev.parse::<i64>()) else {
        return;
    };
    let acq = lines.next().unwrap_or_default();
    let state = lines.next().map(|v| (v.as_bytes(), state_rev));
    match crate::store::etcd::fuzz_values((acq.as_bytes(), acq_rev), state) {
        Ok(Some(info)) => crate::store::decode::check_info(&info),
        Ok(None) => panic!("a decoded acquisition describes a lease"),
        Err(e) => assert!(matches!(e, crate::Error::Store(_)), "{e}"),
    }
}
