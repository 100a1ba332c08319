//! Opening a log: the directory's lock, then every segment read back, a torn tail cut off,
//! and what is not done decoded, to be pending again.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use hashbrown::{HashMap, HashSet};
use serde::de::DeserializeOwned;

use super::journal::{self, Files, Place, Segment};
use super::log::{self, Bad, Record};
use super::{decode, Clocks, DurableFlavor, FsyncPolicy};
use crate::config::Config;
use crate::error::OpenError;

/// A log read back.
pub(crate) struct Recovered<I, K, V> {
    pub(crate) files: Files,
    pub(crate) next_seq: u64,
    /// Bytes of a torn tail that were cut off.
    pub(crate) truncated: u64,
    /// The values not done, in the order they were sent.
    pub(crate) values: Vec<Pending<I, K, V>>,
}

/// A value that is pending again.
pub(crate) struct Pending<I, K, V> {
    pub(crate) seq: u64,
    /// Nanoseconds since the Unix epoch.
    pub(crate) arrival: u64,
    pub(crate) input: I,
    pub(crate) key: K,
    pub(crate) value: V,
    /// How many times it was handed out, as of its last retry.
    pub(crate) handed: u32,
}

/// What opening needs to know.
pub(crate) struct Opening<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) salvage: bool,
    pub(crate) segment_size: u64,
    pub(crate) policy: FsyncPolicy,
    pub(crate) config: &'a Config,
    pub(crate) clocks: Clocks,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Locks the directory, reads its log back, and readies the files for appending.
pub(crate) fn recover<F, K, V>(opening: Opening<'_>) -> Result<Recovered<F::Input, K, V>, OpenError>
where
    F: DurableFlavor,
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    let dir = opening.dir;
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let lock = lock(dir)?;

    let mut indexes = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        if let Some(index) = name.to_str().and_then(log::segment_index) {
            indexes.push(index);
        }
    }
    indexes.sort_unstable();

    // Read every segment, then decode from the bytes in place.
    let mut contents: Vec<(u64, PathBuf, Vec<u8>)> = Vec::with_capacity(indexes.len());
    for &index in &indexes {
        let path = log::segment_path(dir, index);
        let bytes = fs::read(&path).map_err(io_error(&path))?;
        contents.push((index, path, bytes));
    }

    // Every header first: a segment of another format is not this log's to cut, so while
    // any header is foreign nothing is cut or deleted, `salvage` or not. Only the newest
    // segment may hold less than a header, and only the start of this format's own: a
    // crash as the segment was made.
    for (at, (_, path, bytes)) in contents.iter().enumerate() {
        if let Err(detail) = log::check_header(bytes) {
            let torn = at + 1 == contents.len() && log::header().starts_with(bytes);
            if !torn {
                return Err(OpenError::Header {
                    segment: path.clone(),
                    detail,
                });
            }
        }
    }

    let mut truncated = 0;
    let mut sends = Vec::new();
    let mut done = HashSet::new();
    let mut handed = HashMap::new();
    let mut max_seq = None;
    let mut keep = contents.len();
    for (at, (index, path, bytes)) in contents.iter().enumerate() {
        let last = at + 1 == contents.len();
        let bad = log::scan(bytes, |offset, record| match record {
            Record::Send(send) => {
                max_seq = max_seq.max(Some(send.seq));
                let place = Place {
                    segment: *index,
                    offset: offset as u64,
                    len: (log::FRAME + frame_len(bytes, offset)) as u32,
                    handed: 0,
                };
                sends.push((send.seq, place, at, send));
            }
            Record::Done(seqs) => {
                max_seq = max_seq.max(seqs.iter().copied().max());
                done.extend(seqs.iter().copied());
            }
            Record::Retry(pairs) => {
                for &(seq, count) in &pairs {
                    max_seq = max_seq.max(Some(seq));
                    // Counts only grow; records may come in another order.
                    let known = handed.entry(seq).or_insert(0);
                    *known = count.max(*known);
                }
            }
        });
        let Some(bad) = bad else { continue };
        // Where to cut this segment, and whether the segments after it go too.
        let (cut, rest_goes) = match bad {
            // The newest segment's header, cut short by a crash as it was made (the only bad
            // header the pass above lets through): nothing in it.
            Bad::Header(_) => (0, false),
            // A torn tail: a write cut short by a crash.
            Bad::Record(offset) if last && !log::valid_after(bytes, offset) => (offset, false),
            // Keep what comes before the bad record; drop the rest of the log.
            Bad::Record(offset) if opening.salvage => (offset, true),
            Bad::Record(offset) => {
                return Err(OpenError::Corrupt {
                    segment: path.clone(),
                    offset: offset as u64,
                })
            }
        };
        truncate(path, cut)?;
        truncated += (bytes.len() - cut) as u64;
        if rest_goes {
            keep = at + 1;
            break;
        }
    }
    for (_, path, bytes) in contents.iter().skip(keep) {
        fs::remove_file(path).map_err(io_error(path))?;
        truncated += bytes.len() as u64;
    }
    if keep < contents.len() {
        // A salvage may have cut sends that later records named; they are gone either way.
        let kept: HashSet<u64> = contents.iter().take(keep).map(|(i, _, _)| *i).collect();
        sends.retain(|(_, place, ..)| kept.contains(&place.segment));
    }
    // Sequence order is send order. Sends come nearly sorted (only copies forward are out
    // of place), which a stable sort takes in about one pass; it keeps a value's places in
    // log order, and a record copied forward is the same value: its later place counts.
    sends.sort_by_key(|(seq, ..)| *seq);
    sends.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            std::mem::swap(later, earlier);
        }
        same
    });

    let mut values = Vec::with_capacity(sends.len());
    let mut live = Vec::with_capacity(sends.len());
    let mut live_bytes = 0;
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for (seq, mut place, at, send) in sends {
        let path = &contents[at].1;
        if done.contains(&seq) {
            continue;
        }
        place.handed = handed.get(&seq).copied().unwrap_or(0);
        let decode_error = |what: &'static str| {
            move |detail: String| OpenError::Decode {
                segment: path.clone(),
                offset: place.offset,
                what,
                detail,
            }
        };
        let input = F::decode_input(send.input, send.arrival, &opening.clocks, opening.config)
            .map_err(decode_error("input"))?;
        let key = decode(send.key).map_err(decode_error("key"))?;
        let value = decode(send.value).map_err(decode_error("value"))?;
        values.push(Pending {
            seq,
            arrival: send.arrival,
            input,
            key,
            value,
            handed: place.handed,
        });
        live_bytes += u64::from(place.len);
        live.push((seq, place));
        *counts.entry(place.segment).or_default() += 1;
    }

    let mut segments: VecDeque<Segment> = contents
        .iter()
        .take(keep)
        .map(|(index, _, _)| Segment {
            index: *index,
            live: counts.get(index).copied().unwrap_or(0),
        })
        .collect();
    let (current, current_len) = match segments.back() {
        Some(newest) => {
            let path = log::segment_path(dir, newest.index);
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io_error(&path))?;
            let len = file.metadata().map_err(io_error(&path))?.len();
            if len == 0 {
                // Its header was cut off: write it again.
                fs::remove_file(&path).map_err(io_error(&path))?;
                journal::create_segment(dir, newest.index).map_err(io_error(&path))?
            } else {
                (file, len)
            }
        }
        None => {
            let (file, len) = journal::create_segment(dir, 0).map_err(io_error(dir))?;
            journal::sync_dir(dir, opening.policy).map_err(io_error(dir))?;
            segments.push_back(Segment { index: 0, live: 0 });
            (file, len)
        }
    };
    let mut bytes = 0;
    for segment in &segments {
        let path = log::segment_path(dir, segment.index);
        bytes += fs::metadata(&path).map_err(io_error(&path))?.len();
    }
    let files = Files {
        dir: dir.to_path_buf(),
        segments,
        current,
        current_len,
        // Already in order: a B-tree built from it in one pass.
        live: BTreeMap::from_iter(live),
        live_bytes,
        segment_size: opening.segment_size,
        bytes,
        _lock: lock,
        #[cfg(feature = "fault-injection")]
        faults: journal::Faults::default(),
    };
    Ok(Recovered {
        files,
        next_seq: max_seq.map_or(0, |s| s + 1),
        truncated,
        values,
    })
}

/// Takes the directory's lock, so that no other process opens the log while this one has it.
fn lock(dir: &Path) -> Result<File, OpenError> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    // `File::try_lock` is Rust 1.89: the `durable` feature needs that, the core does not.
    #[allow(clippy::incompatible_msrv)]
    let locked = file.try_lock();
    match locked {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(OpenError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(TryLockError::Error(source)) => Err(OpenError::Io { path, source }),
    }
}

/// Cuts a segment off at `len` bytes, synced.
fn truncate(path: &Path, len: usize) -> Result<(), OpenError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_error(path))?;
    file.set_len(len as u64).map_err(io_error(path))?;
    file.sync_all().map_err(io_error(path))
}

/// The body length of the frame at `at`, which was read whole.
fn frame_len(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("a whole frame")) as usize
}
