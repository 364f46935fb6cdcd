//! Entry points for the fuzz targets in `fuzz/` and for the regression
//! test that runs their corpora on stable (feature `fuzzing`; not part of
//! the API: hidden, and free to change in any release). Each one takes
//! arbitrary bytes, as they would come from outside (a token pasted into a
//! command, a store URL, an object or checkpoint another program wrote),
//! must never panic, and checks the round trip its format promises.

use std::str::FromStr;

use crate::limits::WorkId;
use crate::token::Token;

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
