//! Keyed batching channels for tokio.
//!
//! Values go in under a key. They come out grouped per key, in batches of
//! `Vec<(K, Vec<V>)>`, when the key is due. The receiver is a [`Stream`] of batches.
//!
//! Two flavours share one core:
//!
//! - [`timed`]: a key is due a fixed *window* after its first pending value arrived. This
//!   is for pushing many tiny records to many customers: each customer gets one request per
//!   window instead of one per record.
//! - [`ordered`]: every key is due at once, and keys come out by any `Ord` sort key
//!   (priority, weight, age).
//!
//! Both wrap [`queue::SortedQueue`], a synchronous sorted keyed queue you can also use on
//! its own.
//!
//! [`Stream`]: futures_core::Stream
//!
//! # Hello, batches
//!
//! ```
//! use std::time::Duration;
//! use keyed_batch::timed;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (tx, mut rx) = timed::channel(Duration::from_secs(1));
//! let start = tokio::time::Instant::now();
//!
//! // A clone for the task: `tx` stays here, since the last sender's drop closes the
//! // channel, and a closed channel hands out everything pending at once.
//! let producer = tx.clone();
//! tokio::spawn(async move {
//!     for i in 0..3 {
//!         producer.send("customer-1", i).await.unwrap();
//!         producer.send("customer-2", i * 10).await.unwrap();
//!     }
//! });
//!
//! // One second after each customer's first record, all of its records arrive together.
//! let batch = rx.recv().await.unwrap();
//! assert_eq!(start.elapsed(), Duration::from_secs(1));
//! assert_eq!(
//!     batch,
//!     vec![("customer-1", vec![0, 1, 2]), ("customer-2", vec![0, 10, 20])],
//! );
//! # }
//! ```
//!
//! # When a key is due
//!
//! - **`timed`**: a key's deadline is the smallest deadline among its pending values (but
//!   for the rest of a key that a batch split, which keeps the key's deadline, lowered by
//!   any earlier one sent for it since: below). `send` gives a value the deadline
//!   `now + window`, taken when the value enters the channel (after any wait for room).
//!   `send_by(key, value, by)` gives it the earlier of `by` and `now + window`: "by" means
//!   "at the latest", so no value's deadline is later than `window` after it went in. A
//!   `by` before the channel was made counts as the moment it was made. A key is due when
//!   its deadline is at or before now. A key holding
//!   `max_values_per_key` values (or `max_key_weight` weight) is due at once. A deadline too
//!   far off to represent (more than about 146 years after the channel was made) is never
//!   reached, and never comes early: such a key waits for a flush, a close, or (by
//!   `max_values_per_key` or `max_key_weight`) to be full. So, in a channel older than that,
//!   a sent value waits for one of those, or for `drain_now`; a requeue and a retry are due
//!   at once there too. Time is
//!   [`tokio::time::Instant`]: monotonic, and paused in tests.
//! - **`ordered`**: every key is due at once; a key ranks by the smallest sort key among its
//!   pending values, except the rest of a key that a batch split (below).
//!
//! # What a batch holds
//!
//! - Due keys in rank order (earliest deadline, or smallest sort key). Ties go to the key
//!   whose current run of pending values started first. A run starts when a key with
//!   nothing pending gets a value, by a send or a `requeue`, so a key that empties and
//!   fills again counts as a new arrival; values put back in front of a pending key join
//!   its run. In an acknowledging channel a retried key's run is the one it went out in,
//!   unless nothing of the key was left pending and values came for it while it was out:
//!   then it is theirs. (The rest of a key that a batch split stays pending, keeping the
//!   run, and values that come join it.)
//! - Each key with all of its pending values, in the order they were sent: the order they
//!   went in (in a durable channel, the order their `send` calls resolved; a value held by
//!   a `Sink` goes in when the sink next sends it), but for values handed back with
//!   `requeue`, which go in front.
//! - At most `max_batch` values in all. A key with more values than the room left is split:
//!   the rest keep its rank (lowered by any earlier deadline, or smaller sort key, sent for
//!   it since) and its run, and lead the next batch unless a key that ranks before them (one
//!   of smaller rank, or of equal rank whose run started earlier) has come due meanwhile.
//!   In an acknowledging channel the rest wait until the first part's delivery is decided.
//! - Never nothing: a batch is never empty.
//!
//! *Due* is when a key may be taken. A waiting receiver takes it then (about one timer tick
//! later: tokio rounds a deadline up to its 1 ms tick, and the OS adds its own latency);
//! otherwise it is taken when a receiver next asks. Every value is delivered exactly once.
//! Cloned receivers share the work: each batch goes to one of them, so the parts of a key
//! that a batch split may be in the hands of two clones at once.
//!
//! # No polling
//!
//! A waiting receiver sleeps on a tokio timer of its own, set to the earliest deadline; a
//! receiver that is not waiting holds no timer. A sender wakes the waiting receivers only
//! when a key comes to the front of the queue (its deadline moves earlier than the
//! earliest, as when a key is due at once, or level with it for a key whose run is older),
//! or when the channel closes, so a receiver waiting on a quiet channel is not woken at
//! all. A key whose deadline is never reached (see *When a key is due*) wakes no one.
//!
//! A channel with an inbox (see *Panics in user code*) adds one wake: after a waiting
//! receiver stops waiting without taking a batch (its `recv` dropped, say), the next send
//! that goes through the inbox wakes the other waiting receivers once, whatever its
//! deadline, if it can be reached (and, until they look again, a later send that is due
//! earlier still wakes them again, by the rule above).
//!
//! With cloned receivers, each of these events, and each deadline, wakes every waiting
//! receiver, and one of them takes the batch: with `n` receivers waiting, a batch costs up
//! to `n` wakes. In return no receiver depends on another: one that waits and is then never
//! polled again (a `next()` left behind in a `select!`, a `take_until` that ended) holds up
//! no other. A receiver that leaves due work behind wakes the others.
//!
//! `send`, `recv` and the `Sink` take part in tokio's cooperative scheduling, as tokio's
//! own channels do: a task that sends in a tight loop yields to the runtime now and then,
//! so it cannot starve the timer that wakes the receivers. `try_send` does not, as
//! tokio's `UnboundedSender::send` does not. On a channel with no limit, where it never
//! returns `Full`, it is the cheaper call in a hot loop whose task yields by itself now
//! and then (README, Performance).
//!
//! # Limits
//!
//! Every limit is set on a builder ([`timed::Builder`], [`ordered::Builder`]) and is off by
//! default. Whichever limit is reached first applies. Weight is what the builder's
//! `weigher` says a value weighs (say, its size in bytes), or 1 per value without one.
//!
//! | limit | flavour | counts | when reached |
//! |---|---|---|---|
//! | `max_batch(n)` | both | values in one batch | the batch ends; a key that does not fit is split, and its remainder keeps the key's rank (see *What a batch holds*) |
//! | `max_batch_weight(n)` | both | weight of one batch | likewise, once the next value would go over `n` (values of weight 0 still join); a single value heavier than `n` goes out alone |
//! | `max_values_per_key(n)` | `timed` | a key's pending values | the key is due at once |
//! | `max_key_weight(n)` | `timed` | a key's pending weight | the key is due at once |
//! | `capacity(n)` | both | pending values (and, acknowledging, those in flight and dead letters not taken) | `send` waits, `try_send` returns `Full` |
//! | `max_weight(n)` | both | pending weight, with the new value (and, acknowledging, the weight in flight and in dead letters) | `send` waits, `try_send` returns `Full`; a value heavier than `n` waits for a channel that holds nothing, in flight and in dead letters included |
//! | `max_keys(n)` | both | pending keys (and, acknowledging, keys in flight, but for one delivered unheld: see *Panics in user code*) | a value for a new key waits (`send`) or is refused (`try_send`); values for pending keys still go in, after any earlier send of the same key and any send that waits for room |
//!
//! Waiting sends go in first come, first served, and `try_send` returns
//! [`TrySendError::Full`](error::TrySendError::Full) while earlier sends wait for room
//! (with `max_keys`, a value for a pending key goes in past sends that wait for a key slot,
//! unless one of them is of the same key). A send waits for room first, in turn, and only
//! then, if its key is new and no slot is free, for a key slot: so a new key's send that
//! lacks room holds back what comes after it, values for pending keys included, as any send
//! that waits for room does. A send that waited for a key slot waits for room alone once it
//! has one (the first of them takes a slot that comes free, and one whose key has become
//! pending needs none), and from then on nothing sent after it goes past it. The values of
//! one key go in in the order they were sent, so a value for a pending key waits behind an
//! earlier send of that key that waits for a key slot. Room returns as soon as a batch is
//! taken (in an acknowledging channel, when a delivery is decided). Values handed back with
//! `requeue` always go in, past any of these limits. A value held by a sender's `Sink` impl
//! holds no place in line: it goes in at the sink's next `poll_ready`, `poll_flush` or
//! `poll_close` once there is room and no `send` waits for room (a value for a pending key
//! goes in past sends that wait for a key slot, as above), so a sink that is no longer
//! polled holds up no one.
//!
//! # Flushing, draining and watching
//!
//! - `timed::Sender::flush(&key)` makes one key due at once; `flush_all()` every pending key.
//!   Keys not yet due then tie at now, and come out in the order their runs started (a
//!   close, by contrast, keeps each key's deadline order).
//! - `Receiver::drain_now()` takes everything pending at once, split by the caps: for
//!   shutdown paths that cannot wait.
//! - `stats()` on any sender or receiver of an in-memory or durable channel returns a
//!   [`stats::Stats`] snapshot: what is pending, totals sent and delivered, deliveries by
//!   why they came due, and how long the oldest pending run of values has waited.
//! - Senders are [`Sink`]s too, so `stream.map(Ok).forward(tx)` works, and
//!   `Sender::closed()` resolves once that sender can no longer send: every receiver is
//!   gone, one called `close`, a durable channel's log failed, or the sender was closed as
//!   a `Sink`.
//! - Receivers are [`FusedStream`]s, so `futures::select!` with `select_next_some()` works.
//!
//! [`Sink`]: futures_sink::Sink
//! [`FusedStream`]: futures_core::stream::FusedStream
//!
//! # Failed deliveries
//!
//! A consumer whose delivery failed hands the batch back with `requeue`. The values go in
//! front of every pending value of the key, those handed back before included (hand several
//! failed parts of a key back newest first); in `timed` the key is due at once, in
//! `ordered` it ranks by the smaller of its sort key and the one given.
//!
//! # Acknowledged deliveries
//!
//! A plain receiver hands a batch over for good. An *acknowledging* receiver, made with the
//! builder's `acked()`, hands out each key of a batch as an [`ack::Delivery`] to decide:
//! [`ack`](ack::Delivery::ack) when the values were pushed,
//! [`retry_after`](ack::Delivery::retry_after) when the push failed (the values go back in
//! front of the key's newer values, and the key waits out the delay),
//! [`give_up`](ack::Delivery::give_up) to take them out. A delivery dropped undecided is
//! retried at once. While a key has a delivery in flight its newer values wait, so each
//! customer gets at most one request at a time, in order, across retries. Values in flight
//! count toward `capacity`, `max_weight` and `max_keys` until decided, and a retry past
//! `max_attempts` goes to the [`dead letters`](ack::DeadLetters). [`timed::AckReceiver`]
//! lists the rules.
//!
//! ```
//! use std::time::Duration;
//! use keyed_batch::timed;
//!
//! # async fn post(_customer: &str, _events: &[u32]) -> Result<(), ()> { Ok(()) }
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1))
//!     .max_attempts(5)
//!     .acked();
//! tx.send("customer-1", 1).await.unwrap();
//! drop(tx);
//!
//! while let Some(batch) = rx.recv().await {
//!     for delivery in batch {
//!         match post(delivery.key(), delivery.values()).await {
//!             Ok(()) => delivery.ack().await.unwrap(),
//!             Err(()) => {
//!                 let backoff = Duration::from_millis(100) * 2u32.pow(delivery.attempt());
//!                 delivery.retry_after(backoff).await.unwrap();
//!             }
//!         }
//!     }
//! }
//! assert_eq!(rx.stats().acked, 1);
//! # }
//! ```
//!
//! # Durable channels
//!
//! With the `durable` feature, `durable(dir)` on a builder, then `open().await`, makes an
//! acknowledging channel whose values survive a crash: `send` resolves once the value is
//! written to a log in `dir` (and synced, under the default `FsyncPolicy`), decisions are
//! written there too, and reopening the directory hands back every value sent and not yet
//! acknowledged, given up or taken as a dead letter. Keys and values are serde types. The
//! [`durable`](durable/index.html) module (built with the feature) has a table of what
//! survives a `kill -9` and a power cut under each policy, and the errors `open` returns.
//! The feature needs Rust 1.89.
//!
//! # Many processes: Redis
//!
//! With the `redis` feature, [`redis::Builder`](redis/index.html) opens one `timed` queue,
//! kept in a Redis server, that producers and consumers in many processes on many machines
//! share. Its receivers hand out the same [`ack::Delivery`]; the module has a table of how
//! it differs from the in-memory channel. The feature needs Rust 1.88.
//!
//! # Disconnection
//!
//! The channel closes when every sender is dropped (or closed as a `Sink`, with
//! `poll_close`), or a receiver calls `close`. Sends then fail and hand the value back. Every
//! pending key is due at once, batches still respect `max_batch`, and the stream ends once
//! everything is delivered. A `requeue` before the end joins the flush (in `timed`, a key that
//! had nothing pending is due as of the close).
//!
//! When every receiver is dropped, sends fail and hand the value back, and the pending
//! values are dropped (a durable channel's log keeps them for the next open). A send on
//! another thread that races the last receiver's drop may still return `Ok`: its value is
//! then dropped too, and counted in [`Stats::lost`](stats::Stats::lost).
//!
//! # Panics in user code
//!
//! A key whose `Hash`, `Eq` or `Clone` panics (or a sort key whose `Ord` or `Clone` does,
//! or a weigher) makes that call panic; a send that panics so drops its value, unless the
//! panic came after the value went in (another sort key's `Ord`, as the queue's index
//! settles), when the value is pending, and counted in `Stats::sent`. The channel stays
//! usable and no other key's pending values are lost (for values still in the inbox, see
//! below): such a panic under the channel's lock poisons the lock, and the channel recovers
//! it, since its state is whole at every point where user code runs. A decision on a
//! delivery that panics so (a sort key's `Ord` or `Clone`, as a held key goes back in rank
//! order) has taken effect all the same, and woken whoever waits for it; `ack_all` makes
//! every other decision first, and a delivery dropped undecided while another panic unwinds
//! does not panic again. A key whose `Clone` panics when a batch has to split it is not
//! split again for the rest of its current run: its values go out together, whole, beside
//! other keys when they fit and alone, even past `max_batch` and `max_batch_weight`, when
//! they do not. `drain_now` hands over the batches it took before such a panic, and panics
//! only if it took none.
//!
//! The exception is a send that finds the lock held, or values already waiting in the
//! inbox. In a channel with none of `capacity`, `max_weight`, `max_keys`,
//! `max_values_per_key` and `max_key_weight`, and that does not acknowledge, such a send
//! does not wait to put its value in: it leaves it, with the time it arrived, in an inbox
//! of about 4,096 values, behind the values waiting there, and the next call that takes the
//! lock, on any handle (`len`, `stats`, cloning or dropping a handle among them), puts the
//! inbox's values in first. (The send still waits for the lock when the inbox is full, and
//! takes it to wake the receivers when its value may be due before the deadline they sleep
//! until: when it is, and when that deadline is not known (in a new channel, after a
//! receiver stopped waiting without taking a batch, or while one waits with nothing due),
//! unless the value's own deadline is past the range and never reached. A send made by user
//! code under the lock, on the thread that holds it, never waits: its value goes in even
//! past the bound, and the call that holds the lock wakes the receivers before it lets go.)
//! The user code that putting a value in runs, `Eq` of its key and, in `ordered`, `Ord` and
//! `Clone` of sort keys, then runs in that call. If it panics, that call does not panic,
//! and every other value goes in: the value is dropped and counted in
//! [`Stats::lost`](stats::Stats::lost) if the panic came before it went in, and stays
//! pending, to be delivered, if it came after (another sort key's `Ord`, as the queue's
//! index settles). A value whose weight would overflow the total pending weight is dropped
//! and counted so too, whereas a send that puts its value in itself panics. A send finds
//! the lock held, or values in the inbox, only while another thread holds the lock or has
//! left values there, or once user code that runs under the lock (an `Eq`, say) has sent on
//! the same channel: handles used on one thread, by code that does not, never see the
//! inbox. A value's window counts from when it was sent, but it goes in when it is taken
//! in, and a run it starts takes its place among runs then: among keys of equal rank it can
//! come behind a run that another thread started a moment after it was sent, and
//! [`Stats::oldest_pending`](stats::Stats::oldest_pending) can look past it, to that later
//! run, when that run comes first.
//!
//! User code that runs under the lock is exactly this: `Eq` of keys (when a value goes in,
//! or a key is flushed), `Clone` of a key that a batch splits (in an acknowledging channel,
//! of every key delivered, since its slot stays), `Ord` and `Clone` of sort keys in
//! `ordered`, and `Clone` and `Drop` of the wakers it keeps for waiting tasks. Such code
//! may send on the same channel if the channel has an inbox, as above; any other use of the
//! channel there (a send in a channel without an inbox, a flush, a handle dropped, and in a
//! custom waker anything at all) may wait for the lock, which never comes free: a custom
//! waker that owns a handle of the channel must not be the handle's last owner, since the
//! channel may drop its copy of the waker under the lock. In an acknowledging channel, a
//! key whose `Clone` panicked cannot be held: that delivery goes out whole, and values sent
//! for the key while it is in flight are not held back, so the key may have more than one
//! delivery out at once. Nor does such a delivery hold a `max_keys` slot: while it is out,
//! a value sent for its key needs a slot, as a new key's does (its values still count
//! toward `capacity` and `max_weight`). A later delivery of the key whose `Clone` does not
//! panic is held as usual: newer values then wait for its decision. Each retry of a
//! delivery that was not held puts its values back at once (`retry_after` does not wait out
//! the delay), in front of the key's pending values (which wait for a held delivery of the
//! key, if one is out): the values retried last come first, whatever order they were sent
//! in. `Hash`, the weigher and, in a durable channel, `Serialize` run before the lock is
//! taken, and never when a delivery is decided. Keys, values and sort keys are dropped, and
//! wakers woken, after it is released, so their `Drop`, or a wake, may use the channel; the
//! one exception is the key, value and sort key of a value whose putting-in panics under
//! the lock before the value goes in (its key's `Eq`, or `Ord` or `Clone` of a sort key it
//! is ranked against; or a receiver's `requeue` that hands values back with a weight that
//! overflows the total), which are dropped as the panic unwinds, before the lock is
//! released.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod ack;
pub mod builder;
mod chan;
mod config;
#[cfg(feature = "durable")]
#[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
pub mod durable;
pub mod error;
mod flavor;
pub mod ordered;
pub mod queue;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub mod stats;
pub mod timed;

pub use config::Weigher;

/// A batch: due keys in rank order, each with its pending values in the order they were sent.
pub type Batch<K, V> = Vec<(K, Vec<V>)>;

// The README's Rust examples run as doc tests, so that they stay true as the crate changes.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
