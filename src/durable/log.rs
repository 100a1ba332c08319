//! The log's file format: segment files with a header, and framed records in them.
//!
//! A segment is `<index>.kblog`, 20 digits, in the log's directory. It starts with a header:
//! the magic bytes, the format version (u16), and the codec's name (a length byte and the
//! name). Records follow, each framed as `len: u32, crc: u32, body` (little endian), where
//! `crc` is the CRC-32C of the body and `len` its length. A body is a kind byte and fields:
//!
//! - `Send` (1): `seq: u64`, `arrival: u64` (nanoseconds since the Unix epoch), then the
//!   flavour's input, the key and the value, each as `len: u32` and bytes (the codec's);
//! - `Done` (2): `count: u32`, then `count` sequence numbers: values acknowledged, given up,
//!   or taken as dead letters, which never come back;
//! - `Retry` (3): `count: u32`, then `count` pairs of `seq: u64, handed: u32`: how many times
//!   each value has been handed out, once it came back.

use std::fmt;
use std::path::{Path, PathBuf};

/// The first bytes of every segment.
pub(crate) const MAGIC: &[u8; 8] = b"KBATCHLG";
/// The format version this code writes and reads.
pub(crate) const VERSION: u16 = 1;
/// The codec that encodes inputs, keys and values.
pub(crate) const CODEC: &str = "postcard";
/// The size of a record's frame before its body.
pub(crate) const FRAME: usize = 8;
/// No record body is larger than this: a length beyond it is a torn or corrupt frame.
pub(crate) const MAX_BODY: usize = 1 << 30;

const SEND: u8 = 1;
const DONE: u8 = 2;
const RETRY: u8 = 3;

/// A record, as read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Send(Send<'a>),
    Done(Vec<u64>),
    Retry(Vec<(u64, u32)>),
}

/// A sent value, as read back: its fields still encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Send<'a> {
    pub(crate) seq: u64,
    pub(crate) arrival: u64,
    pub(crate) input: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// Why a segment could not be read to its end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// The header is not this format's (the text says what is wrong).
    Header(String),
    /// A record at this offset is torn or corrupt.
    Record(usize),
}

/// The file name of segment `index`.
pub(crate) fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:020}.kblog"))
}

/// The index of a segment file name, if it is one.
pub(crate) fn segment_index(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".kblog")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A segment's header.
pub(crate) fn header() -> Vec<u8> {
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.push(CODEC.len() as u8);
    header.extend_from_slice(CODEC.as_bytes());
    header
}

/// Appends a framed record with `body` to `out`.
fn frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME]);
    body(out);
    let len = out.len() - start - FRAME;
    let crc = crc32c::crc32c(&out[start + FRAME..]);
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Whether a `Send` record of these encoded parts fits in [`MAX_BODY`], which the reader
/// holds every record to.
pub(crate) fn send_fits(input: &[u8], key: &[u8], value: &[u8]) -> bool {
    // Its kind, sequence number and arrival, then each part behind its length.
    let fixed = 1 + 8 + 8 + 3 * 4;
    (input.len().saturating_add(key.len()))
        .saturating_add(value.len())
        .saturating_add(fixed)
        <= MAX_BODY
}

/// Appends a `Send` record.
pub(crate) fn put_send(out: &mut Vec<u8>, send: &Send<'_>) {
    frame(out, |out| {
        out.push(SEND);
        out.extend_from_slice(&send.seq.to_le_bytes());
        out.extend_from_slice(&send.arrival.to_le_bytes());
        put_bytes(out, send.input);
        put_bytes(out, send.key);
        put_bytes(out, send.value);
    });
}

/// Appends a `Done` record.
pub(crate) fn put_done(out: &mut Vec<u8>, seqs: &[u64]) {
    frame(out, |out| {
        out.push(DONE);
        out.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
        seqs.iter()
            .for_each(|s| out.extend_from_slice(&s.to_le_bytes()));
    });
}

/// Appends a `Retry` record.
pub(crate) fn put_retry(out: &mut Vec<u8>, handed: &[(u64, u32)]) {
    frame(out, |out| {
        out.push(RETRY);
        out.extend_from_slice(&(handed.len() as u32).to_le_bytes());
        for (seq, count) in handed {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
    });
}

/// Reads fields off a record body.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

/// Decodes a record body whose CRC matched; `None` if its fields do not parse.
fn record(body: &[u8]) -> Option<Record<'_>> {
    let mut f = Fields(body);
    let record = match f.u8()? {
        SEND => Record::Send(Send {
            seq: f.u64()?,
            arrival: f.u64()?,
            input: f.bytes()?,
            key: f.bytes()?,
            value: f.bytes()?,
        }),
        DONE => {
            let count = f.u32()? as usize;
            Record::Done((0..count).map(|_| f.u64()).collect::<Option<_>>()?)
        }
        RETRY => {
            let count = f.u32()? as usize;
            let pairs = (0..count).map(|_| Some((f.u64()?, f.u32()?)));
            Record::Retry(pairs.collect::<Option<_>>()?)
        }
        _ => return None,
    };
    f.0.is_empty().then_some(record)
}

/// Checks a segment's header; returns where its records start.
pub(crate) fn check_header(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() < MAGIC.len() + 3 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a keyed-batch log segment (bad magic bytes)".into());
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != VERSION {
        return Err(format!(
            "format version {version}, this code reads {VERSION}"
        ));
    }
    let len = bytes[10] as usize;
    let codec = bytes.get(11..11 + len).ok_or("the header is cut short")?;
    if codec != CODEC.as_bytes() {
        let codec = String::from_utf8_lossy(codec);
        return Err(format!("codec {codec:?}, this code reads {CODEC:?}"));
    }
    Ok(11 + len)
}

/// The frame at `at`, if it is whole and its CRC matches: its body and the next offset.
pub(crate) fn frame_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = bytes.get(at..at + FRAME)?;
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    if len > MAX_BODY {
        return None;
    }
    let body = bytes.get(at + FRAME..at + FRAME + len)?;
    (crc32c::crc32c(body) == crc).then_some((body, at + FRAME + len))
}

/// Reads a segment's records as far as they are good, handing each to `each` with its
/// offset; says where and why reading stopped short, if it did. (A callback, not a list:
/// recovery reads millions of records, and a list of them all would be memory to fault in.)
pub(crate) fn scan<'a>(bytes: &'a [u8], mut each: impl FnMut(usize, Record<'a>)) -> Option<Bad> {
    let mut at = match check_header(bytes) {
        Ok(at) => at,
        Err(why) => return Some(Bad::Header(why)),
    };
    while at < bytes.len() {
        match frame_at(bytes, at).and_then(|(body, next)| Some((record(body)?, next))) {
            Some((rec, next)) => {
                each(at, rec);
                at = next;
            }
            None => return Some(Bad::Record(at)),
        }
    }
    None
}

/// Whether any whole, valid record starts after `from`: if so, the bad record at `from` is
/// corruption in the middle of the log, not a torn tail.
pub(crate) fn valid_after(bytes: &[u8], from: usize) -> bool {
    (from + 1..bytes.len())
        .any(|at| frame_at(bytes, at).is_some_and(|(body, _)| record(body).is_some()))
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bad::Header(why) => write!(f, "bad header: {why}"),
            Bad::Record(at) => write!(f, "torn or corrupt record at offset {at}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(records: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut bytes = header();
        records(&mut bytes);
        bytes
    }

    const SEND_A: Send<'static> = Send {
        seq: 7,
        arrival: 1_700_000_000_000_000_000,
        input: b"w",
        key: b"key",
        value: b"value",
    };

    /// Every record `scan` hands out, with its offset, and where it stopped.
    fn scan_all(bytes: &[u8]) -> (Vec<(usize, Record<'_>)>, Option<Bad>) {
        let mut records = Vec::new();
        let bad = scan(bytes, |at, record| records.push((at, record)));
        (records, bad)
    }

    #[test]
    fn records_read_back() {
        let bytes = segment(|out| {
            put_send(out, &SEND_A);
            put_done(out, &[7, 9]);
            put_retry(out, &[(7, 2)]);
        });
        let (records, bad) = scan_all(&bytes);
        assert_eq!(bad, None);
        let records: Vec<_> = records.into_iter().map(|(_, r)| r).collect();
        assert_eq!(
            records,
            vec![
                Record::Send(SEND_A.clone()),
                Record::Done(vec![7, 9]),
                Record::Retry(vec![(7, 2)])
            ]
        );
    }

    #[test]
    fn a_cut_record_stops_the_scan_where_it_starts() {
        let whole = segment(|out| {
            put_send(out, &SEND_A);
            put_done(out, &[7]);
        });
        let first_end = header().len() + FRAME + 1 + 16 + 4 + 1 + 4 + 3 + 4 + 5;
        for cut in first_end + 1..whole.len() {
            let (records, bad) = scan_all(&whole[..cut]);
            assert_eq!(records.len(), 1, "cut at {cut}");
            assert_eq!(bad, Some(Bad::Record(first_end)));
            assert!(!valid_after(&whole[..cut], first_end));
        }
    }

    #[test]
    fn a_flipped_byte_is_caught_and_later_records_are_found() {
        let mut bytes = segment(|out| {
            put_send(out, &SEND_A);
            put_done(out, &[7]);
        });
        let at = header().len() + FRAME + 3;
        bytes[at] ^= 0x40;
        let (_, bad) = scan_all(&bytes);
        assert_eq!(bad, Some(Bad::Record(header().len())));
        assert!(
            valid_after(&bytes, header().len()),
            "the Done record after it is whole"
        );
    }

    #[test]
    fn headers_are_checked() {
        let mut bytes = segment(|_| {});
        bytes[8] = 9;
        assert!(matches!(scan_all(&bytes).1, Some(Bad::Header(why)) if why.contains("version 9")));
        let mut bytes = segment(|_| {});
        bytes[11] = b'x';
        assert!(matches!(scan_all(&bytes).1, Some(Bad::Header(why)) if why.contains("codec")));
        assert!(matches!(scan_all(b"junk").1, Some(Bad::Header(_))));
    }

    #[test]
    fn segment_names_round_trip() {
        let path = segment_path(Path::new("/x"), 42);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "00000000000000000042.kblog");
        assert_eq!(segment_index(name), Some(42));
        assert_eq!(segment_index("42.kblog"), None);
        assert_eq!(segment_index("00000000000000000042.log"), None);
    }
}
