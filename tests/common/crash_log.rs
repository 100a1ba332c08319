//! The crash loop's own reading of the log's segments, from the format the library
//! documents (`src/durable/log.rs`): where each record starts and ends, what it names, and
//! where a segment's whole records end. The parent uses it to cut a segment where it may,
//! to know what a cut took, and to foresee what the next open must report.

use std::fs;
use std::path::{Path, PathBuf};

/// The bytes every segment starts with.
const MAGIC: &[u8; 8] = b"KBATCHLG";
/// A record's frame before its body: length and CRC.
const FRAME: usize = 8;

/// A record, as far as the loop needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// A sent value: its sequence number and the id in its value.
    Send { seq: u64, id: u64 },
    /// Sequence numbers that are done.
    Done(Vec<u64>),
    /// Sequence numbers with how many times each was handed out.
    Retry(Vec<(u64, u32)>),
}

impl Body {
    /// The highest sequence number the record names.
    pub(crate) fn highest(&self) -> Option<u64> {
        match self {
            Body::Send { seq, .. } => Some(*seq),
            Body::Done(seqs) => seqs.iter().copied().max(),
            Body::Retry(pairs) => pairs.iter().map(|p| p.0).max(),
        }
    }
}

/// A whole record and where it ends in its segment.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) end: u64,
    pub(crate) body: Body,
}

/// A segment read as far as its records are whole.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) index: u64,
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    pub(crate) records: Vec<Record>,
    /// Where the whole records end (0 if the header is cut short): the rest is a torn
    /// tail, which the next open cuts off if this is the newest segment.
    pub(crate) whole: u64,
    /// A whole record that does not parse, or a bad header: the library never writes one.
    pub(crate) bad: Option<String>,
}

/// The log's segments, oldest first.
pub(crate) fn read(dir: &Path) -> Vec<Segment> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut segments: Vec<Segment> = entries
        .map(|e| e.expect("a directory entry").file_name())
        .filter_map(|name| {
            let digits = name.to_str()?.strip_suffix(".kblog")?;
            let ok = digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit());
            ok.then(|| digits.parse().expect("20 digits"))
        })
        .map(|index: u64| {
            let path = dir.join(format!("{index:020}.kblog"));
            let bytes = fs::read(&path).expect("a segment reads");
            segment(index, path, &bytes)
        })
        .collect();
    segments.sort_by_key(|s| s.index);
    segments
}

fn segment(index: u64, path: PathBuf, bytes: &[u8]) -> Segment {
    let mut seg = Segment {
        index,
        path,
        len: bytes.len() as u64,
        records: Vec::new(),
        whole: 0,
        bad: None,
    };
    let header = match bytes.get(10) {
        Some(&codec_len) => 11 + codec_len as usize,
        None => 11,
    };
    if bytes.len() < header {
        return seg; // cut short as it was made
    }
    if &bytes[..8] != MAGIC {
        seg.bad = Some("bad magic bytes".into());
        return seg;
    }
    let mut at = header;
    while let Some(head) = bytes.get(at..at + FRAME) {
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let Some(body) = bytes.get(at + FRAME..at + FRAME + len) else {
            break; // torn
        };
        let Some(parsed) = parse(body) else {
            seg.bad = Some(format!("a whole record at {at} does not parse"));
            break;
        };
        let end = at + FRAME + len;
        seg.records.push(Record {
            end: end as u64,
            body: parsed,
        });
        at = end;
    }
    seg.whole = at as u64;
    seg
}

/// Reads fields off a record body, little endian.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let head = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

fn parse(body: &[u8]) -> Option<Body> {
    let mut f = Fields(body);
    let parsed = match f.take(1)?[0] {
        1 => {
            let seq = f.u64()?;
            let _arrival = f.u64()?;
            let (_input, _key, value) = (f.bytes()?, f.bytes()?, f.bytes()?);
            // The value is postcard's `(u64, Vec<u8>)`: the id comes first, as a varint.
            Body::Send {
                seq,
                id: varint(value)?,
            }
        }
        2 => {
            let count = f.u32()?;
            Body::Done((0..count).map(|_| f.u64()).collect::<Option<_>>()?)
        }
        3 => {
            let count = f.u32()?;
            let pairs = (0..count).map(|_| Some((f.u64()?, f.u32()?)));
            Body::Retry(pairs.collect::<Option<_>>()?)
        }
        _ => return None,
    };
    f.0.is_empty().then_some(parsed)
}

/// A LEB128 varint at the start of `bytes`, as postcard writes integers.
fn varint(bytes: &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}
