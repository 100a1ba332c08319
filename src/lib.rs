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
//!
//! tokio::spawn(async move {
//!     for i in 0..3 {
//!         tx.send("customer-1", i).await.unwrap();
//!         tx.send("customer-2", i * 10).await.unwrap();
//!     }
//! });
//!
//! // One second after each customer's first record, all of its records arrive together.
//! let batch = rx.recv().await.unwrap();
//! assert_eq!(
//!     batch,
//!     vec![("customer-1", vec![0, 1, 2]), ("customer-2", vec![0, 10, 20])],
//! );
//! # }
//! ```
//!
//! # When a key is due
//!
//! - **`timed`**: a key's deadline is the smallest deadline among its pending values. `send`
//!   gives a value the deadline `now + window`, taken when the value enters the channel (after
//!   any wait for room); `send_by` gives it the deadline passed in. A key is due when its
//!   deadline is at or before now. A key holding `max_values_per_key` values is due at once.
//!   Time is [`tokio::time::Instant`]: monotonic, and paused in tests.
//! - **`ordered`**: every key is due at once; a key ranks by the smallest sort key among its
//!   pending values.
//!
//! # What a batch holds
//!
//! - Due keys in rank order (earliest deadline, or smallest sort key). Ties go to the key
//!   whose current run of pending values started first. A key that empties and fills again
//!   counts as a new arrival.
//! - Each key with all of its pending values, in the order they were sent.
//! - At most `max_batch` values in all. A key with more values than the room left is split:
//!   the rest keep its rank and lead the next batch, unless a key of smaller rank has come
//!   due meanwhile.
//! - Never nothing: a batch is never empty.
//!
//! Every value is delivered exactly once. Cloned receivers share the work: each batch goes
//! to one of them.
//!
//! # No polling
//!
//! A waiting receiver sleeps on one tokio timer, reset to the earliest deadline. A sender
//! wakes it only when the earliest deadline moves earlier, or when the channel closes, so a
//! receiver waiting on a quiet channel is not woken at all. A receiver that leaves due work
//! behind wakes another waiting receiver.
//!
//! # Limits
//!
//! Every limit is set on a builder ([`timed::Builder`], [`ordered::Builder`]) and is off by
//! default. Whichever limit is reached first applies. Weight is what the builder's
//! `weigher` says a value weighs (say, its size in bytes), or 1 per value without one.
//!
//! | limit | flavour | counts | when reached |
//! |---|---|---|---|
//! | `max_batch(n)` | both | values in one batch | the batch ends; a key that does not fit is split, and its remainder leads the next batch |
//! | `max_batch_weight(n)` | both | weight of one batch | likewise; a single value heavier than `n` goes out alone |
//! | `max_values_per_key(n)` | `timed` | a key's pending values | the key is due at once |
//! | `max_key_weight(n)` | `timed` | a key's pending weight | the key is due at once |
//! | `capacity(n)` | both | pending values | `send` waits, `try_send` returns `Full` |
//! | `max_weight(n)` | both | pending weight, with the new value | `send` waits, `try_send` returns `Full`; a value heavier than `n` waits for an empty channel |
//! | `max_keys(n)` | both | pending keys | a value for a new key waits (`send`) or is refused (`try_send`); values for pending keys still go in |
//!
//! Waiting sends go in first come, first served, and `try_send` returns
//! [`TrySendError::Full`](error::TrySendError::Full) while earlier sends wait. Room returns as
//! soon as a batch is taken. Values handed back with `requeue` always go in, past any of these
//! limits.
//!
//! # Flushing, draining and watching
//!
//! - `timed::Sender::flush(&key)` makes one key due at once; `flush_all()` every pending key.
//! - `Receiver::drain_now()` takes everything pending at once, split by the caps: for
//!   shutdown paths that cannot wait.
//! - `stats()` on any handle returns a [`stats::Stats`] snapshot: what is pending, totals
//!   sent and delivered, deliveries by why they came due, and how long the oldest pending
//!   run of values has waited.
//! - Senders are [`Sink`]s too, so `stream.map(Ok).forward(tx)` works, and
//!   `Sender::closed()` resolves once the channel is closed for sending: every receiver is
//!   gone, or one called `close`.
//!
//! [`Sink`]: futures_sink::Sink
//!
//! # Failed deliveries
//!
//! A consumer whose delivery failed hands the batch back with `requeue`. The values go in
//! front of the key's newer values; in `timed` the key is due at once, in `ordered` it ranks
//! by the smaller of its sort key and the one given.
//!
//! # Disconnection
//!
//! The channel closes when every sender is dropped or a receiver calls `close`. Sends then
//! fail and hand the value back. Every pending key is due at once, batches still respect
//! `max_batch`, and the stream ends once everything is delivered. A `requeue` before the end
//! joins the flush.
//!
//! When every receiver is dropped, sends fail and hand the value back, and the pending
//! values are dropped.
//!
//! # Panics in user code
//!
//! A key whose `Hash`, `Eq` or `Clone` panics (or a sort key whose `Ord` or `Clone` does)
//! makes that call panic. The channel stays usable: the lock is not left poisoned, and no
//! other key's values are lost.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod builder;
mod chan;
pub mod error;
pub mod ordered;
pub mod queue;
pub mod stats;
pub mod timed;

pub use chan::Weigher;

/// A batch: due keys in rank order, each with its pending values in the order they were sent.
pub type Batch<K, V> = Vec<(K, Vec<V>)>;
