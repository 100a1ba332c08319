//! The journal: one thread owns the log's files, and commits in groups what the channel
//! appends.
//!
//! Appending encodes a record into a shared buffer and wakes the committer. The committer
//! takes everything buffered, writes it in one go, syncs it if the policy asks, and then
//! raises the *written* and *synced* marks that senders and acknowledgements wait on. While
//! it writes and syncs, new records pile up in the buffer: batches grow by themselves under
//! load, with no linger.
//!
//! The committer also keeps track of where each value that is not done lives, and deletes
//! segments by prefix only: the oldest goes once none of its values is live. When values
//! held for long pin old segments, their records are copied forward into the newest segment
//! first, so the log stays within about twice its live records plus two segments.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use tokio::sync::watch;

use super::log::{self, Send};
use super::FsyncPolicy;

/// The journal's handle, shared by a channel's senders and receivers.
pub(crate) struct Journal {
    shared: Arc<Shared>,
    marks: watch::Receiver<Marks>,
    policy: FsyncPolicy,
    committer: Mutex<Option<JoinHandle<()>>>,
    #[cfg(feature = "fault-injection")]
    acks_early: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    work: Condvar,
    /// The number of the last record appended, read without the lock by a committer that
    /// waits a moment for more work before it sleeps.
    appended: AtomicU64,
    marks: watch::Sender<Marks>,
    /// What to do when the log fails: close its channel.
    on_failure: Mutex<Option<OnFailure>>,
}

type OnFailure = Box<dyn FnOnce() + std::marker::Send>;

/// What is appended and not yet written.
struct Pending {
    buf: Vec<u8>,
    /// The sends in `buf`: sequence number, offset in `buf`, length.
    sends: Vec<(u64, usize, usize)>,
    /// The values marked done in `buf`.
    done: Vec<u64>,
    /// The handed-out counts recorded in `buf`.
    retried: Vec<(u64, u32)>,
    /// The number of the last record appended.
    last: u64,
    next_seq: u64,
    closing: bool,
    poisoned: Option<Arc<io::Error>>,
}

/// How far the log has gone: every record up to `written` is written, up to `synced` synced;
/// and its size.
#[derive(Clone, Debug, Default)]
struct Marks {
    written: u64,
    synced: u64,
    poisoned: Option<Arc<io::Error>>,
    stats: LogStats,
}

/// Where a value's send record lives.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// How many times it was handed out, as its latest retry record says: copied forward
    /// with it, since that record may be in a segment that goes.
    pub(crate) handed: u32,
}

/// A segment, as the committer keeps it.
pub(crate) struct Segment {
    pub(crate) index: u64,
    /// Values in it that are not done.
    pub(crate) live: usize,
}

/// What the committer owns.
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
    pub(crate) segments: VecDeque<Segment>,
    /// The newest segment, open for appending, and its length.
    pub(crate) current: File,
    pub(crate) current_len: u64,
    /// Where each value that is not done lives. Ordered, not hashed: sequence numbers
    /// come in rising order, which a B-tree appends at its right edge, and a recovered
    /// log builds it from a sorted list in one pass, where a million random inserts into
    /// a hash table would each miss the cache.
    pub(crate) live: BTreeMap<u64, Place>,
    /// The bytes of their records.
    pub(crate) live_bytes: u64,
    pub(crate) segment_size: u64,
    /// Bytes in the segments, for the stats.
    pub(crate) bytes: u64,
    /// The directory's lock, held while the log is open: never read, released on drop.
    pub(crate) _lock: File,
    #[cfg(feature = "fault-injection")]
    pub(crate) faults: Faults,
}

/// Faults injected for this crate's tests (the `fault-injection` feature): writes and syncs
/// that fail, and mutants of the log's rules that the crash loop must catch.
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    /// Bytes written before a write fails as on a full disk.
    pub(crate) write_budget: Option<u64>,
    /// Syncs that succeed before one fails.
    pub(crate) sync_budget: Option<u64>,
    pub(crate) mutant: Option<Mutant>,
}

/// A broken rule, named by `KEYED_BATCH_MUTANT` when a log is opened.
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// `ack-before-durable`: a decision resolves before its record is written.
    AckBeforeDurable,
    /// `non-prefix-delete`: any segment with no live value is deleted, prefix or not.
    NonPrefixDelete,
}

#[cfg(feature = "fault-injection")]
impl Mutant {
    /// The mutant `KEYED_BATCH_MUTANT` names, if any.
    ///
    /// # Panics
    ///
    /// Panics on a name it does not know, so that a typo does not pass as a clean run.
    pub(crate) fn from_env() -> Option<Mutant> {
        match std::env::var("KEYED_BATCH_MUTANT").ok()?.as_str() {
            "" => None,
            "ack-before-durable" => Some(Mutant::AckBeforeDurable),
            "non-prefix-delete" => Some(Mutant::NonPrefixDelete),
            other => panic!("KEYED_BATCH_MUTANT={other}: no such mutant"),
        }
    }
}

/// Figures the channel's stats report.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LogStats {
    pub(crate) segments: usize,
    pub(crate) bytes: u64,
}

impl Files {
    fn stats(&self) -> LogStats {
        LogStats {
            segments: self.segments.len(),
            bytes: self.bytes,
        }
    }
}

impl Journal {
    /// Starts the committer over `files`; `next_seq` continues the log's numbering.
    pub(crate) fn start(files: Files, policy: FsyncPolicy, next_seq: u64) -> io::Result<Journal> {
        let stats = files.stats();
        let (marks_tx, marks) = watch::channel(Marks {
            stats,
            ..Marks::default()
        });
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                sends: Vec::new(),
                done: Vec::new(),
                retried: Vec::new(),
                last: 0,
                next_seq,
                closing: false,
                poisoned: None,
            }),
            work: Condvar::new(),
            marks: marks_tx,
            on_failure: Mutex::new(None),
            appended: AtomicU64::new(0),
        });
        #[cfg(feature = "fault-injection")]
        let acks_early = files.faults.mutant == Some(Mutant::AckBeforeDurable);
        let committer = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("keyed-batch-log".into())
                .spawn(move || Committer::new(shared, files, policy).run())?
        };
        Ok(Journal {
            shared,
            marks,
            policy,
            committer: Mutex::new(Some(committer)),
            #[cfg(feature = "fault-injection")]
            acks_early,
        })
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a record to the buffer, if the log is not poisoned; returns its number.
    fn append(&self, put: impl FnOnce(&mut Pending)) -> Result<u64, Arc<io::Error>> {
        let mut pending = self.pending();
        if let Some(err) = &pending.poisoned {
            return Err(Arc::clone(err));
        }
        put(&mut pending);
        pending.last += 1;
        let last = pending.last;
        self.shared.appended.store(last, Ordering::Release);
        drop(pending);
        self.shared.work.notify_one();
        Ok(last)
    }

    /// Appends a value's send record; returns its sequence number and the record's number.
    pub(crate) fn send(&self, encoded: &super::Encoded) -> Result<(u64, u64), Arc<io::Error>> {
        let mut seq = 0;
        let record = self.append(|p| {
            seq = p.next_seq;
            p.next_seq += 1;
            let at = p.buf.len();
            let send = Send {
                seq,
                arrival: encoded.arrival,
                input: &encoded.input,
                key: &encoded.key,
                value: &encoded.value,
            };
            log::put_send(&mut p.buf, &send);
            p.sends.push((seq, at, p.buf.len() - at));
        })?;
        Ok((seq, record))
    }

    /// Appends a record that the values `seqs` are done; returns its number.
    pub(crate) fn done(&self, seqs: &[u64]) -> Result<u64, Arc<io::Error>> {
        self.append(|p| {
            log::put_done(&mut p.buf, seqs);
            p.done.extend_from_slice(seqs);
        })
    }

    /// Appends a record of how often values were handed out; returns its number.
    pub(crate) fn retried(&self, handed: &[(u64, u32)]) -> Result<u64, Arc<io::Error>> {
        self.append(|p| {
            log::put_retry(&mut p.buf, handed);
            p.retried.extend_from_slice(handed);
        })
    }

    /// Waits until record `record` is durable under the policy: synced for `Always`,
    /// written otherwise.
    pub(crate) async fn durable(&self, record: u64) -> Result<(), Arc<io::Error>> {
        match self.policy {
            FsyncPolicy::Always => self.wait(|m| m.synced >= record).await,
            _ => self.wait(|m| m.written >= record).await,
        }
    }

    /// Waits until record `record` is written.
    pub(crate) async fn written(&self, record: u64) -> Result<(), Arc<io::Error>> {
        self.wait(|m| m.written >= record).await
    }

    async fn wait(&self, reached: impl Fn(&Marks) -> bool) -> Result<(), Arc<io::Error>> {
        let mut marks = self.marks.clone();
        let marks = marks
            .wait_for(|m| reached(m) || m.poisoned.is_some())
            .await
            .expect("the committer outlives the journal");
        match reached(&marks) {
            true => Ok(()),
            false => Err(Arc::clone(marks.poisoned.as_ref().expect("poisoned"))),
        }
    }

    /// Calls `f` when the log fails, on the committer's thread; at once if it has failed.
    pub(crate) fn on_failure(&self, f: OnFailure) {
        let mut slot = self
            .shared
            .on_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.pending().poisoned.is_none() {
            *slot = Some(f);
            return;
        }
        drop(slot);
        f();
    }

    /// Whether decisions resolve before their records are written: the `ack-before-durable`
    /// mutant.
    pub(crate) fn acks_early(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        return self.acks_early;
        #[cfg(not(feature = "fault-injection"))]
        false
    }

    /// The error that poisoned the log, if one did.
    pub(crate) fn poisoned(&self) -> Option<Arc<io::Error>> {
        self.pending().poisoned.clone()
    }

    /// The log's size, as of the last commit.
    pub(crate) fn stats(&self) -> LogStats {
        self.marks.borrow().stats
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.pending().closing = true;
        self.shared.work.notify_one();
        let committer = self
            .committer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(committer) = committer.take() {
            // It writes and syncs what is buffered, then stops. (Unless this is the committer
            // itself, dropping the channel's last handle as it closes it after a failure: it
            // stops as soon as that returns.)
            if committer.thread().id() != thread::current().id() {
                let _ = committer.join();
            }
        }
    }
}

/// How long the committer stays awake for more work after a commit.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// What the committer took from the buffer in one go.
struct Batch<'a> {
    buf: &'a [u8],
    sends: &'a [(u64, usize, usize)],
    done: &'a [u64],
    retried: &'a [(u64, u32)],
    /// The number of the last record in `buf`.
    last: u64,
}

/// The committer thread's state.
struct Committer {
    shared: Arc<Shared>,
    files: Files,
    policy: FsyncPolicy,
    written: u64,
    synced: u64,
    last_sync: Instant,
}

impl Committer {
    fn new(shared: Arc<Shared>, files: Files, policy: FsyncPolicy) -> Self {
        Committer {
            shared,
            files,
            policy,
            written: 0,
            synced: 0,
            last_sync: Instant::now(),
        }
    }

    fn run(mut self) {
        loop {
            // A sender that awaits each record sends the next one a few microseconds after
            // its wake: waiting that long for it, awake, spares a sleep and a wake-up each.
            // One sender under `Never` went from about 60k to 110k sends/s, under
            // `Interval` from 21k to 130k (benches/durable). The price: up to `SPIN` of CPU
            // after each commit when no more work comes.
            let spin_until = Instant::now() + SPIN;
            while self.shared.appended.load(Ordering::Acquire) <= self.written
                && Instant::now() < spin_until
            {
                std::hint::spin_loop();
            }
            let (buf, sends, done, retried, last, closing) = {
                let mut pending = self
                    .shared
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                loop {
                    let unsynced = self.synced < self.written;
                    if !pending.buf.is_empty() || pending.closing {
                        break;
                    }
                    let work = &self.shared.work;
                    pending = match (self.policy, unsynced) {
                        (FsyncPolicy::Interval(every), true) => {
                            let left = every.saturating_sub(self.last_sync.elapsed());
                            if left.is_zero() {
                                break;
                            }
                            let waited = work.wait_timeout(pending, left);
                            waited.unwrap_or_else(PoisonError::into_inner).0
                        }
                        _ => work.wait(pending).unwrap_or_else(PoisonError::into_inner),
                    };
                }
                let p = &mut *pending;
                (
                    std::mem::take(&mut p.buf),
                    std::mem::take(&mut p.sends),
                    std::mem::take(&mut p.done),
                    std::mem::take(&mut p.retried),
                    p.last,
                    p.closing,
                )
            };
            let batch = Batch {
                buf: &buf,
                sends: &sends,
                done: &done,
                retried: &retried,
                last,
            };
            if let Err(err) = self.commit(batch, closing) {
                self.poison(err);
                return;
            }
            if closing && buf.is_empty() {
                return;
            }
        }
    }

    /// Writes `buf`, syncs it if the policy asks, raises the marks, and deletes what is done.
    fn commit(&mut self, batch: Batch<'_>, closing: bool) -> io::Result<()> {
        let Batch {
            buf,
            sends,
            done,
            retried,
            last,
        } = batch;
        if !buf.is_empty() {
            if self.files.current_len >= self.files.segment_size {
                self.rotate()?;
            }
            let base = self.files.current_len;
            self.write(buf)?;
            self.files.current_len += buf.len() as u64;
            self.files.bytes += buf.len() as u64;
            let segment = self.files.segments.back().expect("a current segment").index;
            for &(seq, at, len) in sends {
                let place = Place {
                    segment,
                    offset: base + at as u64,
                    len: len as u32,
                    handed: 0,
                };
                self.files.live.insert(seq, place);
                self.files.live_bytes += len as u64;
                self.files
                    .segments
                    .back_mut()
                    .expect("a current segment")
                    .live += 1;
            }
            for &(seq, handed) in retried {
                if let Some(place) = self.files.live.get_mut(&seq) {
                    place.handed = place.handed.max(handed);
                }
            }
            self.written = last;
        }
        let sync = match self.policy {
            // Only sends wait for a sync. Done and retry records ride along with the next
            // one (or the close): syncing them on their own would double the syncs of a
            // channel whose consumer acks as fast as values come.
            FsyncPolicy::Always => self.synced < self.written && (closing || !sends.is_empty()),
            FsyncPolicy::Interval(every) => {
                self.synced < self.written && (closing || self.last_sync.elapsed() >= every)
            }
            FsyncPolicy::Never => false,
        };
        if sync {
            // What waits for the write alone (a decision; a send, but under `Always`) sees
            // the mark before the sync runs: it does not wait for the sync, nor fail with it.
            self.publish_marks();
            // Never retried: after a failed fsync the kernel may have dropped the dirty
            // pages, and a second fsync would report success for data that is gone.
            self.sync()?;
            self.synced = self.written;
            self.last_sync = Instant::now();
        }
        self.publish_marks();
        self.forget(done);
        self.trim()?;
        let stats = self.files.stats();
        self.shared.marks.send_modify(|m| m.stats = stats);
        Ok(())
    }

    /// Publishes how far the log is written and synced. The figures go with the marks: a
    /// `send` that sees its record written sees it counted too ("as of its last write",
    /// `Stats::log_bytes`).
    fn publish_marks(&self) {
        let (written, synced) = (self.written, self.synced);
        let stats = self.files.stats();
        self.shared.marks.send_modify(|m| {
            m.written = written;
            m.synced = synced;
            m.stats = stats;
        });
    }

    /// Marks values done: their segments may go.
    fn forget(&mut self, done: &[u64]) {
        for seq in done {
            if let Some(place) = self.files.live.remove(seq) {
                self.files.live_bytes -= u64::from(place.len);
                let segments = &mut self.files.segments;
                if let Ok(at) = segments.binary_search_by_key(&place.segment, |s| s.index) {
                    segments[at].live -= 1;
                }
            }
        }
    }

    /// Deletes segments by prefix: the oldest goes once none of its values is live. Its live
    /// records are copied forward first once the log is much larger than what is live in
    /// it: more than twice the live bytes, plus two segments.
    ///
    /// Copying sooner would not pay: in a backlog, where most records are live, every
    /// record would be written again and again for nothing. Later, a few values held for
    /// long, or a slow key, would pin every segment after them, and the log would grow
    /// without bound.
    fn trim(&mut self) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if self.files.faults.mutant == Some(Mutant::NonPrefixDelete) {
            return self.trim_any();
        }
        loop {
            let segments = &self.files.segments;
            if segments.len() < 2 {
                return Ok(());
            }
            let oldest = &segments[0];
            if oldest.live > 0 {
                let files = &self.files;
                let slack = 2 * files.live_bytes + 2 * files.segment_size;
                if segments.len() < 3 || files.bytes <= slack {
                    return Ok(());
                }
                self.copy_forward(oldest.index)?;
            }
            let oldest = self
                .files
                .segments
                .pop_front()
                .expect("two segments or more");
            let path = log::segment_path(&self.files.dir, oldest.index);
            self.files.bytes -= fs::metadata(&path).map_or(0, |m| m.len());
            fs::remove_file(&path)?;
            sync_dir(&self.files.dir, self.policy)?;
        }
    }

    /// A mutant of `trim` for the crash loop to catch: deletes any older segment with no live
    /// value, prefix or not. A segment in the middle may hold the done records of values in
    /// an older one, which come back at the next open.
    #[cfg(feature = "fault-injection")]
    fn trim_any(&mut self) -> io::Result<()> {
        let newest = self.files.segments.len() - 1;
        let mut at = 0;
        while at < newest.min(self.files.segments.len() - 1) {
            if self.files.segments[at].live > 0 {
                at += 1;
                continue;
            }
            let gone = self.files.segments.remove(at).expect("in range");
            let path = log::segment_path(&self.files.dir, gone.index);
            self.files.bytes -= fs::metadata(&path).map_or(0, |m| m.len());
            fs::remove_file(&path)?;
        }
        Ok(())
    }

    /// Copies the live records of segment `index` into the newest segment, synced before
    /// the old copy can go.
    fn copy_forward(&mut self, index: u64) -> io::Result<()> {
        let mut old = File::open(log::segment_path(&self.files.dir, index))?;
        let mut moving: Vec<(u64, Place)> = self
            .files
            .live
            .iter()
            .filter(|(_, place)| place.segment == index)
            .map(|(seq, place)| (*seq, *place))
            .collect();
        moving.sort_unstable_by_key(|(_, place)| place.offset);
        // The retry records that counted them may be in the segment that goes, so their
        // counts are written again, before the copies: a write torn after a copy must not
        // leave the copy without its count, since the next open takes the copy as the
        // value's place and lets the source segment go.
        let handed: Vec<(u64, u32)> = moving
            .iter()
            .filter(|(_, place)| place.handed > 0)
            .map(|(seq, place)| (*seq, place.handed))
            .collect();
        let mut buf = Vec::new();
        if !handed.is_empty() {
            log::put_retry(&mut buf, &handed);
        }
        let mut moved = Vec::with_capacity(moving.len());
        for (seq, place) in moving {
            old.seek(SeekFrom::Start(place.offset))?;
            let at = buf.len();
            buf.resize(at + place.len as usize, 0);
            old.read_exact(&mut buf[at..])?;
            moved.push((seq, at, place.len, place.handed));
        }
        let base = self.files.current_len;
        self.write(&buf)?;
        self.sync()?;
        self.files.current_len += buf.len() as u64;
        self.files.bytes += buf.len() as u64;
        let newest = self.files.segments.back().expect("a current segment").index;
        for (seq, at, len, handed) in moved {
            let place = Place {
                segment: newest,
                offset: base + at as u64,
                len,
                handed,
            };
            self.files.live.insert(seq, place);
            self.files
                .segments
                .back_mut()
                .expect("a current segment")
                .live += 1;
            self.files.segments.front_mut().expect("the oldest").live -= 1;
        }
        Ok(())
    }

    /// Starts a new segment: the old one is synced first, under every policy but `Never`.
    fn rotate(&mut self) -> io::Result<()> {
        if self.policy != FsyncPolicy::Never {
            self.sync()?;
        }
        let index = self.files.segments.back().map_or(0, |s| s.index + 1);
        let (file, len) = create_segment(&self.files.dir, index)?;
        sync_dir(&self.files.dir, self.policy)?;
        self.files.current = file;
        self.files.current_len = len;
        self.files.bytes += len;
        self.files.segments.push_back(Segment { index, live: 0 });
        Ok(())
    }

    /// Appends `buf` to the newest segment.
    fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(left) = &mut self.files.faults.write_budget {
            if (buf.len() as u64) > *left {
                // As a full disk does: part of the write lands, then it fails.
                let part = &buf[..*left as usize];
                *left = 0;
                self.files.current.write_all(part)?;
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            *left -= buf.len() as u64;
        }
        self.files.current.write_all(buf)
    }

    /// Syncs the newest segment's data.
    fn sync(&mut self) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(left) = &mut self.files.faults.sync_budget {
            if *left == 0 {
                return Err(io::Error::from_raw_os_error(5)); // EIO
            }
            *left -= 1;
        }
        self.files.current.sync_data()
    }

    /// The log failed: every waiting and later append fails with `err`.
    /// Fails the log for good, and stops the committer. The files, and the directory's
    /// lock, go before the failure callback runs: that callback may drop the channel's last
    /// handle here, on this thread, where no one joins it, and the directory must be free
    /// to open again once every handle is gone.
    fn poison(self, err: io::Error) {
        let err = Arc::new(err);
        let mut pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pending.poisoned = Some(Arc::clone(&err));
        drop(pending);
        self.shared.marks.send_modify(|m| m.poisoned = Some(err));
        let on_failure = self
            .shared
            .on_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(self);
        if let Some(on_failure) = on_failure {
            on_failure();
        }
    }
}

/// Creates segment `index` with its header; returns it open for appending, and its length.
pub(crate) fn create_segment(dir: &Path, index: u64) -> io::Result<(File, u64)> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(log::segment_path(dir, index))?;
    let header = log::header();
    file.write_all(&header)?;
    Ok((file, header.len() as u64))
}

/// Syncs the directory, so that a new or deleted segment's name survives a power cut,
/// under every policy but `Never`.
pub(crate) fn sync_dir(dir: &Path, policy: FsyncPolicy) -> io::Result<()> {
    if policy == FsyncPolicy::Never {
        return Ok(());
    }
    File::open(dir)?.sync_all()
}
