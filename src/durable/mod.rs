//! Durable channels: every value a `send` call sends is written to a log in a directory
//! before it returns (`try_send` and the `Sink` write theirs a moment later), and reopening
//! the directory after a crash hands back everything that was sent and not yet
//! acknowledged, given up or taken as a dead letter.
//!
//! A durable channel is an acknowledging channel (see [`ack`](crate::ack)) whose decisions
//! are written to the log too. Open one from a builder:
//!
//! ```
//! use std::time::Duration;
//! use keyed_batch::durable::FsyncPolicy;
//! use keyed_batch::timed;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempdir();
//! let (tx, mut rx) = timed::Builder::new(Duration::from_millis(10))
//!     .durable(&dir)
//!     .fsync(FsyncPolicy::Always)
//!     .open::<String, u64>()
//!     .await?;
//! tx.send("customer-1".to_string(), 7).await?; // on disk when this returns
//! drop(tx);
//! let batch = rx.recv().await.unwrap();
//! keyed_batch::ack::ack_all(batch).await?; // its record is written: it never comes back
//! # Ok(())
//! # }
//! # fn tempdir() -> std::path::PathBuf {
//! #     let dir = std::env::temp_dir().join(format!("kb-doc-{}", std::process::id()));
//! #     let _ = std::fs::remove_dir_all(&dir);
//! #     dir
//! # }
//! ```
//!
//! # What survives what
//!
//! | | `kill -9`, a crash, an OOM kill | a power cut or an OS crash |
//! |---|---|---|
//! | `send` returned, with `FsyncPolicy::Always` | kept | kept |
//! | `send` returned, with `FsyncPolicy::Interval(d)` | kept | kept if synced: lost at most from the last `d` |
//! | `send` returned, with `FsyncPolicy::Never` | kept | lost if the OS had not written it |
//! | `try_send` or the `Sink` returned | kept once the log's thread wrote it, a moment later (records are written in the order they are made, so a later `send` of the channel that resolved shows it was) | as for `send`, once written |
//! | a decision (`ack`, `ack_all`, `give_up`) resolved | never comes back | may come back once, if not yet synced: at-least-once |
//! | a dead letter taken | never comes back once its record is written, a moment later; before that, comes back once | as for a decision |
//! | a retry | comes back, with its attempts counted once the retry's record is written | as for `kill -9`, once synced |
//!
//! Records that no caller waits for (a dead letter taken, the done record of a `send`
//! dropped before it resolved, a decision whose future was dropped, the retry of a delivery
//! dropped undecided) are written a moment later, by the log's thread: a crash before then
//! brings the value back once.
//!
//! `send` resolves once its record is written, and, under `Always`, synced (`fdatasync`).
//! Waiting sends are committed together: one write and one sync for every batch of sends
//! that waited, with no linger. Acknowledgements resolve once written: a `kill -9` never
//! brings an acknowledged delivery back, and a power cut at worst redelivers it.
//!
//! A send is encoded before the channel's lock is taken. One whose key, value or input
//! cannot be encoded (its `Serialize` fails), or whose record would be over 1 GiB, panics
//! there, before anything is written, and its value is dropped.
//!
//! # Recovery
//!
//! Reopening the directory rebuilds the channel: every value sent and not acknowledged,
//! given up or taken as a dead letter is pending again, under its key, in the order its
//! record was first written to the log (a record copied forward keeps its place), with the
//! attempts it had been handed out (counted as of its last retry: a delivery in flight at a
//! crash is not counted, one dropped undecided before the handles went is). Records are
//! written in the order values get room, which is the order of the `send` calls but where a
//! limit lets a later one past (with `max_keys`, a value for a pending key goes past sends
//! that wait for a key slot); the live channel puts a value in when its `send` resolves, so
//! values of one key whose sends were in flight at once (from different tasks, or a `send`
//! still waiting for its record beside a `try_send` of the same key) may have gone out in
//! another order before the restart. A `timed` value's deadline is rebuilt from its
//! wall-clock arrival and the window of the builder that reopens the log (a `send_by`
//! deadline is kept, but no later than that): one whose deadline passed while the process
//! was down is due at once; a `retry_after` delay is not kept. Values dropped with the last
//! receiver (pending ones, dead letters not taken, and deliveries retried or dropped after
//! it) were never acknowledged, so they come back too: a dead letter that was not taken
//! comes back pending, not as a dead letter, and a delivery that starts with it has attempt
//! one more than the letter's `attempts` (`max_attempts + 1` for a letter made on its last
//! attempt; one whose record was written after an older value's of its key comes back
//! behind that value, and a delivery's attempt is its first value's).
//!
//! - The directory is locked: a second `open` fails with [`OpenError::Locked`] until the
//!   channel's every handle is gone (senders, receivers, deliveries, decision futures and
//!   dead-letter streams), or until its log fails: a failed log lets go of the directory
//!   at once, so that it can be reopened. An `open` dropped before it resolves holds the
//!   lock until its read of the log ends.
//! - Keys, values and inputs are decoded as the types `open` names; the log does not
//!   record types, so another type with a compatible encoding opens without error. They
//!   must come back through postcard, which does not describe what it encodes: a type
//!   whose `Deserialize` needs a format that does (`serde_json::Value`, enums with
//!   `#[serde(untagged)]` or `#[serde(tag = "…")]`) is written without error, and then
//!   fails to open with [`OpenError::Decode`]. A struct with `#[serde(flatten)]` does not
//!   even encode (postcard needs a map's length first): its `send` panics, before anything
//!   is written.
//! - A bad record at the end of the newest segment is taken for a torn one (a write cut
//!   short by a crash), whatever damaged it, and cut off;
//!   [`Stats::log_truncated_bytes`](crate::stats::Stats::log_truncated_bytes) says how
//!   many bytes went. A bad record is taken for a torn tail only if no whole record follows
//!   it: should the torn record's own value hold the bytes of one (a value that is itself
//!   a log record, say), it is [`OpenError::Corrupt`], as below.
//! - A bad record anywhere else is [`OpenError::Corrupt`], naming the segment and the
//!   offset; [`DurableBuilder::salvage`] opens with what comes before it instead. A power
//!   cut under `Interval` or `Never` can leave such a record behind (an unsynced write
//!   in an older segment).
//! - A segment of another format, or with a damaged header, is [`OpenError::Header`], with
//!   or without `salvage`, and nothing is cut or deleted. The one exception is a newest
//!   segment shorter than a header that holds the start of this format's own (a crash as
//!   the segment was made): it is cut to nothing, as a torn tail is.
//! - A pending value whose key, value or input (deadline or sort key) does not decode is
//!   [`OpenError::Decode`], not a skip. Values are decoded after the cuts above: an open
//!   that fails so has made them already (and, with `salvage`, deleted what it cut).
//!
//! # Failures
//!
//! A failed write or sync (a full disk, an I/O error) poisons the log, and it stays
//! poisoned: an fsync is never retried, since the pages it failed to write may already be
//! gone. Every waiting and later `send` fails and hands the value back; decisions resolve
//! with [`DeliveryError::Io`](crate::error::DeliveryError::Io), and
//! `Sender::log_error` returns the error. What was durable stays so. A failed send's record
//! may have been written before the failure, so its value may come back at the next open
//! (at-least-once): a caller that sends it again may deliver it twice.
//!
//! # The log
//!
//! The log is a directory of segments, each a header (format version, codec) and framed
//! records: sends (sequence number, wall-clock arrival, input, key and value, encoded with
//! postcard), and done and retry records that name sequence numbers. Every record carries
//! its length and a CRC-32C. One thread owns the files. Segments are deleted by prefix
//! only, once none of their values is live; values held a long time are copied forward
//! first. So the log's size stays within about twice its live records plus two segments
//! (the newest may run past `segment_size` by one commit's records, and, while a copy
//! forward runs, by what it copies): one to four segments when little is pending, however
//! long one delivery is held.

use std::fmt;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::builder;
use crate::chan;
use crate::config::Config;
use crate::flavor::Flavor;

pub(crate) use self::journal::Journal;

mod journal;
mod log;
pub(crate) mod recover;

pub use crate::error::OpenError;

/// When the log syncs its writes to disk, which sets what a `send` survives (see the table
/// in the [module docs](self#what-survives-what)).
///
/// Under every policy, `Never` included, the log also syncs when it copies the records of
/// values still pending forward out of its oldest segment, before that segment is deleted,
/// so that no value is left only in a file that is gone; a failed sync there fails the log
/// as any other does (see *Failures* in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every `send` waits for an `fdatasync` of its record. Sends that wait together share
    /// one: the committer syncs each batch of sends it writes, and the next batch grows
    /// meanwhile. Decisions are not synced on their own: the next sync, or the close, takes
    /// them.
    Always,
    /// Sends wait for their record to be written, and the log syncs at most this long after
    /// a write.
    Interval(Duration),
    /// Sends wait for their record to be written; the OS writes it to disk when it will.
    Never,
}

/// Opens a durable channel in a directory: made by `durable(dir)` on a
/// [`timed::Builder`](crate::timed::Builder) or an [`ordered::Builder`](crate::ordered::Builder),
/// with the limits set on it.
///
/// # Examples
///
/// ```
/// use keyed_batch::durable::FsyncPolicy;
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("kb-doc-b-{}", std::process::id()));
/// # let _ = std::fs::remove_dir_all(&dir);
/// let (tx, rx) = ordered::Builder::new()
///     .capacity(10_000)
///     .durable(&dir)
///     .fsync(FsyncPolicy::Interval(std::time::Duration::from_millis(5)))
///     .open::<u8, String, Vec<u8>>()
///     .await?;
/// # drop((tx, rx));
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `open` opens the channel"]
pub struct DurableBuilder<F, W = ()> {
    pub(crate) builder: builder::Builder<F, W>,
    pub(crate) dir: PathBuf,
    pub(crate) fsync: FsyncPolicy,
    pub(crate) salvage: bool,
    pub(crate) segment_size: u64,
    #[cfg(feature = "fault-injection")]
    pub(crate) faults: journal::Faults,
}

impl<F, W> DurableBuilder<F, W> {
    pub(crate) fn new(builder: builder::Builder<F, W>, dir: &Path) -> Self {
        DurableBuilder {
            builder,
            dir: dir.to_path_buf(),
            fsync: FsyncPolicy::Always,
            salvage: false,
            segment_size: 64 << 20,
            #[cfg(feature = "fault-injection")]
            faults: journal::Faults::default(),
        }
    }

    /// Sets when writes are synced to disk; [`FsyncPolicy::Always`] by default.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::durable::FsyncPolicy;
    /// use keyed_batch::timed;
    ///
    /// let builder = timed::Builder::new(Duration::from_secs(1))
    ///     .durable("/var/lib/app/queue")
    ///     .fsync(FsyncPolicy::Never);
    /// # drop(builder);
    /// ```
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }

    /// Opens even if a segment is corrupt before its end: what comes before the first bad
    /// record is kept, and the rest of the log is deleted. Off by default, when corruption
    /// is an [`OpenError::Corrupt`]. A segment whose header is not this format's (another
    /// format, or a damaged header) stays an [`OpenError::Header`], and nothing is deleted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let builder = timed::Builder::new(Duration::from_secs(1))
    ///     .durable("/var/lib/app/queue")
    ///     .salvage();
    /// # drop(builder);
    /// ```
    pub fn salvage(mut self) -> Self {
        self.salvage = true;
        self
    }

    /// Starts a new segment once the newest has this many bytes; 64 MiB by default. The log
    /// stays within about twice its live records plus two segments, whatever its traffic.
    ///
    /// # Panics
    ///
    /// Panics if `bytes` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let builder = timed::Builder::new(Duration::from_secs(1))
    ///     .durable("/var/lib/app/queue")
    ///     .segment_size(8 << 20);
    /// # drop(builder);
    /// ```
    #[track_caller]
    pub fn segment_size(mut self, bytes: u64) -> Self {
        assert!(bytes > 0, "segment_size must be at least 1");
        self.segment_size = bytes;
        self
    }
}

/// Faults for this crate's own tests: not part of the API.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
impl<F, W> DurableBuilder<F, W> {
    /// Writes fail, as on a full disk, once the log has written this many more bytes.
    pub fn fail_writes_after(mut self, bytes: u64) -> Self {
        self.faults.write_budget = Some(bytes);
        self
    }

    /// Syncs fail, as on an I/O error, after this many more have succeeded.
    pub fn fail_syncs_after(mut self, syncs: u64) -> Self {
        self.faults.sync_budget = Some(syncs);
        self
    }
}

impl<F, W> fmt::Debug for DurableBuilder<F, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableBuilder")
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .field("salvage", &self.salvage)
            .field("segment_size", &self.segment_size)
            .finish_non_exhaustive()
    }
}

/// The two clocks read at one moment: the log keeps wall-clock times, the channel monotonic
/// ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clocks {
    pub(crate) now: Instant,
    /// Nanoseconds since the Unix epoch.
    pub(crate) wall: u64,
}

impl Clocks {
    pub(crate) fn now() -> Self {
        Clocks {
            now: Instant::now(),
            wall: Self::wall_now(),
        }
    }

    /// The wall-clock time now, in nanoseconds since the Unix epoch.
    pub(crate) fn wall_now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The wall-clock time of `at`.
    pub(crate) fn wall_of(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.now) {
            Some(ahead) => self.wall.saturating_add(nanos(ahead)),
            None => self.wall.saturating_sub(nanos(self.now - at)),
        }
    }

    /// The instant of wall-clock time `wall`, as near as an instant can be.
    pub(crate) fn instant_of(&self, wall: u64) -> Instant {
        match wall.checked_sub(self.wall) {
            Some(ahead) => self.now + Duration::from_nanos(ahead),
            None => {
                let ago = Duration::from_nanos(self.wall - wall);
                self.now.checked_sub(ago).unwrap_or(self.now)
            }
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A flavour whose inputs the log can keep: in wall-clock terms, so that they mean the same
/// after a restart.
pub(crate) trait DurableFlavor: Flavor + Sized + 'static {
    /// `input` as the log keeps it.
    fn encode_input(input: &Self::Input, clocks: &Clocks) -> Vec<u8>;

    /// The input of a value that arrived at `arrival` (wall clock), rebuilt on `clocks`.
    fn decode_input(
        bytes: &[u8],
        arrival: u64,
        clocks: &Clocks,
        config: &Config,
    ) -> Result<Self::Input, String>;
}

/// Encodes a key, value or sort key with the log's codec.
///
/// # Panics
///
/// Panics if the type's `Serialize` fails.
#[track_caller]
pub(crate) fn encode<T: Serialize + ?Sized>(what: &str, item: &T) -> Vec<u8> {
    match postcard::to_stdvec(item) {
        Ok(bytes) => bytes,
        Err(err) => panic!("a {what} could not be encoded for the log: {err}"),
    }
}

/// Decodes a key, value or sort key with the log's codec. Every byte must be used: bytes
/// left over mean the log was written with another type.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match postcard::take_from_bytes(bytes) {
        Ok((item, [])) => Ok(item),
        Ok((_, rest)) => Err(format!("{} bytes left over: not this type", rest.len())),
        Err(err) => Err(err.to_string()),
    }
}

/// A send's record, encoded before the channel's lock is taken.
pub(crate) struct Encoded {
    /// Nanoseconds since the Unix epoch.
    pub(crate) arrival: u64,
    pub(crate) input: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

/// What a durable channel adds to a channel: its journal, and how it encodes a send.
pub(crate) struct Attached<F: Flavor, K, V> {
    pub(crate) journal: std::sync::Arc<Journal>,
    /// Bytes of a torn tail cut off when the log was opened.
    pub(crate) truncated: u64,
    encode: EncodeSend<F, K, V>,
}

type EncodeSend<F, K, V> =
    Box<dyn Fn(&<F as Flavor>::Input, &K, &V, &Clocks) -> Encoded + Send + Sync>;

impl<F: Flavor, K, V> Attached<F, K, V> {
    /// Encodes a send for the log.
    ///
    /// # Panics
    ///
    /// Panics if `Serialize` of the key, the value or a sort key fails.
    pub(crate) fn encode(&self, input: &F::Input, key: &K, value: &V) -> Encoded {
        (self.encode)(input, key, value, &Clocks::now())
    }
}

/// Opens a durable channel of flavour `F` from a builder of any marker: reads the log back
/// (on a blocking thread), starts its journal, and makes the channel with every value that
/// is pending again.
pub(crate) async fn open<F, K, V, M, W>(
    builder: DurableBuilder<M, W>,
) -> Result<(chan::Tx<F, K, V>, chan::Rx<F, K, V>), OpenError>
where
    F: DurableFlavor,
    F::Rank: Ord + Clone + Send + 'static,
    F::Input: Send,
    K: Serialize + DeserializeOwned + Hash + Eq + Clone + Send + 'static,
    V: Serialize + DeserializeOwned + Send + 'static,
    W: crate::config::Weigher<V>,
{
    let DurableBuilder {
        builder,
        dir,
        fsync,
        salvage,
        segment_size,
        #[cfg(feature = "fault-injection")]
        faults,
    } = builder;
    let config = builder.config.clone();
    let clocks = Clocks::now();
    let recovered = {
        let (config, dir) = (config.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            recover::recover::<F, K, V>(recover::Opening {
                dir: &dir,
                salvage,
                segment_size,
                policy: fsync,
                config: &config,
                clocks,
            })
        })
        .await
        .expect("reading the log does not panic")?
    };
    let files = recovered.files;
    #[cfg(feature = "fault-injection")]
    let files = journal::Files {
        faults: journal::Faults {
            mutant: journal::Mutant::from_env(),
            ..faults
        },
        ..files
    };
    let journal = Journal::start(files, fsync, recovered.next_seq)
        .map_err(|source| OpenError::Io { path: dir, source })?;
    let encode: EncodeSend<F, K, V> = Box::new(|input, key, value, clocks| {
        let encoded = Encoded {
            arrival: clocks.wall,
            input: F::encode_input(input, clocks),
            key: encode("key", key),
            value: encode("value", value),
        };
        // The reader takes a longer record for a damaged one: it is never written.
        let Encoded {
            input, key, value, ..
        } = &encoded;
        assert!(
            log::send_fits(input, key, value),
            "a send of {} bytes is over the log's limit of 1 GiB a record",
            input.len() + key.len() + value.len()
        );
        encoded
    });
    let attached = Attached {
        journal: std::sync::Arc::new(journal),
        truncated: recovered.truncated,
        encode,
    };
    // The channel's clock starts at the oldest arrival, so that it can tell when recovered
    // values entered.
    let oldest = recovered.values.iter().map(|v| v.arrival).min();
    let epoch = oldest.map_or(clocks.now, |wall| clocks.instant_of(wall).min(clocks.now));
    let (tx, rx) = chan::durable(config, builder.weigher, attached, epoch);
    rx.restore(recovered.values, &clocks);
    Ok((tx, rx))
}
