//! A snapshot of a channel's state and totals: [`Stats`].

use std::time::Duration;

/// A snapshot of a channel: what is pending now, and totals since it was made.
///
/// `stats()` on any sender or receiver takes one. It costs one lock; it does not look at
/// every pending key, only (amortized O(1)) drops its records of runs that were delivered.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::timed;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let (tx, mut rx) = timed::channel(Duration::from_secs(1));
/// tx.send("a", 1).await.unwrap();
/// tx.send("a", 2).await.unwrap();
/// tokio::time::sleep(Duration::from_millis(300)).await;
///
/// let stats = rx.stats();
/// assert_eq!((stats.pending_values, stats.pending_keys), (2, 1));
/// assert_eq!(stats.oldest_pending, Some(Duration::from_millis(300)));
///
/// rx.recv().await.unwrap();
/// let stats = tx.stats();
/// assert_eq!((stats.sent, stats.delivered, stats.batches), (2, 2, 1));
/// assert_eq!(stats.delivered_by.due, 1);
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Values pending now, over all keys.
    pub pending_values: usize,
    /// Keys with at least one pending value.
    pub pending_keys: usize,
    /// The total weight of the pending values: their count when there is no weigher.
    pub pending_weight: usize,
    /// How long ago the oldest pending run of values began: the time since the first value
    /// of the longest-waiting key went in (or was requeued into an empty key; for a value
    /// sent through the inbox, since it was sent: see *Panics in user code* in the crate
    /// docs). `None` when nothing is pending. In an acknowledging channel, values in flight
    /// are not pending; values a retry brings back count from when the run they went out in
    /// began, or, if nothing of the key was left pending and values came for it while they
    /// were in flight, from when the first of those came (the rest of a key that a batch
    /// split stays pending, with the run); those of a key whose `Clone` panicked, which
    /// cannot be held, from the retry.
    pub oldest_pending: Option<Duration>,
    /// Values that went in from `send`, `try_send` and their kin; requeues are not counted
    /// here, nor a value sent through the inbox that was lost before it went in (see
    /// `lost`), nor values a durable log gave back at open (see `log_recovered`).
    pub sent: u64,
    /// Values handed out in batches (including `drain_now`), requeued or retried ones again
    /// each time.
    pub delivered: u64,
    /// Batches handed out.
    pub batches: u64,
    /// Why each delivered key-batch (one `(key, values)` entry) came due.
    pub delivered_by: Deliveries,
    /// Values handed back with `requeue`.
    pub requeued: u64,
    /// Acknowledging channels: deliveries (key-batches) handed out and not yet decided: one
    /// a key, but for a key that cannot be held (see *Panics in user code* in the crate
    /// docs), which may have several out.
    pub in_flight_keys: usize,
    /// Acknowledging channels: values delivered and not yet decided. They count toward
    /// `capacity` and `max_weight` until decided.
    pub in_flight_values: usize,
    /// Acknowledging channels: values acknowledged.
    pub acked: u64,
    /// Acknowledging channels: values retried, by `retry`, `retry_after` or a delivery
    /// dropped undecided, and put back in the queue. A retry that made dead letters counts
    /// in `dead_lettered` instead, and one with no receiver left in `lost`.
    pub retried: u64,
    /// Acknowledging channels: values given up with `give_up`.
    pub given_up: u64,
    /// Acknowledging channels: values sent to the dead letters, retried (or dropped
    /// undecided) on their last attempt (`max_attempts`).
    pub dead_lettered: u64,
    /// Acknowledging channels: dead-lettered values not yet taken. They count toward
    /// `capacity` and `max_weight`.
    pub dead_letters: usize,
    /// Acknowledging channels: deliveries by attempt; index `i` counts attempt `i + 1`, and
    /// the last counts that attempt and every later one.
    pub attempts: [u64; 8],
    /// Values dropped because every receiver was gone: those pending when the last one
    /// went (values waiting in the inbox then go in first, and count in `sent`; a send that
    /// races the last receiver's drop may return `Ok` with its value lost from the inbox,
    /// before it went in, and `sent` does not count that one), dead letters not taken, and,
    /// in an acknowledging channel, values retried or dropped undecided after that. A
    /// durable channel's log still has them: they come back when its directory is opened
    /// again. Also values sent through the inbox that user code
    /// panicked on before they went in (their key's `Eq`, or `Ord` or `Clone` of any sort
    /// key compared), or whose weight would overflow the total pending weight (see the crate
    /// docs, *Panics in user code*).
    pub lost: u64,
    /// Durable channels: values the log gave back when the channel opened.
    pub log_recovered: u64,
    /// Durable channels: the log's segments, as of the log thread's last write (records it
    /// writes with no caller waiting, as after `open`, may be appended and not yet counted).
    pub log_segments: usize,
    /// Durable channels: the bytes in the log's segments, as `log_segments` counts them.
    pub log_bytes: u64,
    /// Durable channels: bytes cut off the log when it opened: a torn record at its end,
    /// or, with `salvage`, everything from the first bad record on.
    pub log_truncated_bytes: u64,
    /// Live sender handles, except those closed as a `Sink` and the clones made from them
    /// after; counted even once the channel is closed.
    pub senders: usize,
    /// Live receivers (`Receiver` and `AckReceiver` handles; dead-letter streams and
    /// deliveries are not counted).
    pub receivers: usize,
}

/// Delivered key-batches (the `(key, values)` entries of batches) by why the key came due:
/// the first reason counts.
///
/// # Examples
///
/// ```
/// use keyed_batch::stats::Deliveries;
///
/// let by = Deliveries::default();
/// assert_eq!(by.due + by.full_key + by.flush + by.close, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deliveries {
    /// `timed`: the key's deadline passed (a requeued key is due at once, so it counts here,
    /// unless it was pending and due already for another reason: the first reason counts;
    /// a retried one is due when its retry delay ends, and counts by the reason it went out
    /// with, as does one that a `retry_after` holds when the channel closes, unless, before
    /// it came due again (while its delivery was in flight, or a `retry_after` held it),
    /// values sent for it or a flush made it due sooner: by their deadline, at or before
    /// the retry's time that `timed::AckReceiver` gives, or as a full key, or by the flush;
    /// that reason counts then. One that `drain_now` took before it was due counts by its
    /// deadline's reason, `due` unless a full key or a flush gave it another).
    /// `ordered`: every delivery, since a key is due as soon as it is pending.
    pub due: u64,
    /// `timed`: the key reached `max_values_per_key` or `max_key_weight` before its deadline.
    pub full_key: u64,
    /// `timed`: `flush`, `flush_all` or `drain_now` made the key due before its deadline.
    pub flush: u64,
    /// The channel closed before the key's deadline: `timed` keys only, whenever they are
    /// taken. A key that was already due when the channel closed counts by its own reason,
    /// as does a retried key (the reason it went out with, or the one the values sent while
    /// it was in flight gave it: see `due`) and a key requeued after the close that had
    /// nothing pending then (`due`).
    pub close: u64,
}

impl Deliveries {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: Deliveries) {
        self.due += other.due;
        self.full_key += other.full_key;
        self.flush += other.flush;
        self.close += other.close;
    }
}
