//! The `WLR1` encoding of a lease record (module docs, "Value encoding").

use bytes::{BufMut, Bytes, BytesMut};

use crate::store::record::{Phase, Record};
use crate::store::{LeaseEnd, PreviousHolder};

/// A lease record as stored: the record, a write counter (every write
/// changes the bytes) and the writer's wall clock at the write, in ms since
/// the Unix epoch (informational: `inspect` shows it for released leases;
/// never used to judge expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) writes: u64,
    pub(super) written_at_ms: u64,
    pub(super) record: Record,
}

/// Magic and version of the encoding.
const MAGIC: &[u8; 4] = b"WLR1";

/// Encodes a record in the `WLR1` format of the module docs. Fails only for
/// a field longer than 4 GiB, which the limits rule out.
pub(super) fn encode_record(s: &Stored) -> std::result::Result<Bytes, String> {
    fn put_bytes(buf: &mut BytesMut, b: &[u8]) -> std::result::Result<(), String> {
        let len = u32::try_from(b.len())
            .map_err(|_| format!("a field of {} bytes is too long to store", b.len()))?;
        buf.put_u32(len);
        buf.put_slice(b);
        Ok(())
    }
    let r = &s.record;
    let checkpoint_len = r.checkpoint.as_ref().map_or(0, Bytes::len);
    let mut buf = BytesMut::with_capacity(128 + r.holder_id.len() + checkpoint_len);
    buf.put_slice(MAGIC);
    buf.put_u64(s.writes);
    buf.put_u64(s.written_at_ms);
    buf.put_u64(r.fencing_token);
    buf.put_u64(r.ttl_ms);
    put_bytes(&mut buf, r.phase.as_str().as_bytes())?;
    put_bytes(&mut buf, r.holder_id.as_bytes())?;
    match &r.checkpoint {
        None => buf.put_u8(0),
        Some(data) => {
            buf.put_u8(1);
            put_bytes(&mut buf, data)?;
        }
    }
    match &r.previous {
        None => buf.put_u8(0),
        Some(p) => {
            buf.put_u8(1);
            put_bytes(&mut buf, p.holder_id.as_bytes())?;
            buf.put_u64(p.fencing_token);
            put_bytes(&mut buf, p.ended.as_str().as_bytes())?;
        }
    }
    Ok(buf.freeze())
}

/// A reader over an encoded record; every error says what was malformed.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated at {what}"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn bytes(&mut self, what: &str) -> std::result::Result<&'a [u8], String> {
        let b = self.take(4, what)?;
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let len = usize::try_from(len).map_err(|_| format!("{what} too long"))?;
        self.take(len, what)
    }
    fn str(&mut self, what: &str) -> std::result::Result<&'a str, String> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| format!("{what} is not UTF-8"))
    }
    fn present(&mut self, what: &str) -> std::result::Result<bool, String> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(format!("bad presence flag {n} for {what}")),
        }
    }
}

/// Decodes [`encode_record`]'s format; the error says what is wrong.
pub(super) fn decode_record(bytes: &[u8]) -> std::result::Result<Stored, String> {
    let mut rd = Reader(bytes);
    if rd.take(4, "the header")? != MAGIC {
        return Err("not a WLR1 lease record (unknown header or version)".into());
    }
    let writes = rd.u64("the write counter")?;
    let written_at_ms = rd.u64("the write time")?;
    let fencing_token = rd.u64("the fencing token")?;
    let ttl_ms = rd.u64("the TTL")?;
    let phase = rd.str("the phase")?;
    let phase = Phase::parse(phase).ok_or_else(|| format!("unknown phase {phase:?}"))?;
    let holder_id = rd.str("the holder ID")?.to_owned();
    let checkpoint = match rd.present("the checkpoint")? {
        false => None,
        true => Some(Bytes::copy_from_slice(rd.bytes("the checkpoint")?)),
    };
    let previous = match rd.present("the previous holder")? {
        false => None,
        true => {
            let holder_id = rd.str("the previous holder ID")?.to_owned();
            let fencing_token = rd.u64("the previous fencing token")?;
            let ended = rd.str("the previous lease's end")?;
            let ended =
                LeaseEnd::from_str(ended).ok_or_else(|| format!("unknown lease end {ended:?}"))?;
            Some(PreviousHolder {
                holder_id,
                fencing_token,
                ended,
            })
        }
    };
    if !rd.0.is_empty() {
        return Err(format!("{} unexpected bytes after the record", rd.0.len()));
    }
    Ok(Stored {
        writes,
        written_at_ms,
        record: Record {
            holder_id,
            fencing_token,
            ttl_ms,
            phase,
            checkpoint,
            previous,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let ids = [
            "a".to_owned(),
            "jobs/a b:{ü}".into(),
            "WLR1".into(),
            "日本".into(),
            "x".repeat(256),
        ];
        let checkpoints = [
            None,
            Some(Bytes::new()),
            Some(Bytes::from_static(b"\0\x01WLR1\xff")),
        ];
        let ends = [
            None,
            Some(LeaseEnd::Released),
            Some(LeaseEnd::Expired),
            Some(LeaseEnd::Revoked),
        ];
        for id in &ids {
            for cp in &checkpoints {
                for (i, end) in ends.iter().enumerate() {
                    let stored = Stored {
                        writes: u64::MAX - i as u64,
                        written_at_ms: 1_700_000_000_000,
                        record: Record {
                            holder_id: id.clone(),
                            fencing_token: 7 + i as u64,
                            ttl_ms: 15_000,
                            phase: [Phase::Held, Phase::Released, Phase::Revoked][i % 3],
                            checkpoint: cp.clone(),
                            previous: end.map(|ended| PreviousHolder {
                                holder_id: format!("before {id}"),
                                fencing_token: 6,
                                ended,
                            }),
                        },
                    };
                    let bytes = encode_record(&stored).unwrap();
                    assert!(bytes.starts_with(b"WLR1"));
                    assert_eq!(decode_record(&bytes).unwrap(), stored);
                    // Every proper prefix and any trailing byte are rejected.
                    for n in 0..bytes.len() {
                        assert!(
                            decode_record(&bytes[..n]).is_err(),
                            "prefix of {n} bytes decoded"
                        );
                    }
                    let mut long = bytes.to_vec();
                    long.push(0);
                    assert!(decode_record(&long)
                        .unwrap_err()
                        .contains("unexpected bytes"));
                }
            }
        }
        assert!(decode_record(b"WLR2\0\0\0\0").unwrap_err().contains("WLR1"));
    }
}
