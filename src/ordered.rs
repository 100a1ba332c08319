//! Keyed batches ordered by any `Ord` sort key: priority, weight, age, and so on.
//!
//! Each value is sent with a sort key. A key ranks by the smallest sort key among its
//! pending values, and every key is due at once: a batch holds the best-ranked keys, up to
//! [`Builder::max_batch`] values. The rest of a key that a batch split keeps the rank the
//! key had, lowered by any smaller sort key sent for it since. Order is ascending; wrap the
//! sort key in [`std::cmp::Reverse`] for descending.
//!
//! # Examples
//!
//! ```
//! use keyed_batch::ordered;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (tx, mut rx) = ordered::channel();
//! tx.send(5, "low", 'a').await.unwrap();
//! tx.send(1, "urgent", 'b').await.unwrap();
//! tx.send(9, "low", 'c').await.unwrap();
//! assert_eq!(
//!     rx.recv().await,
//!     Some(vec![("urgent", vec!['b']), ("low", vec!['a', 'c'])]),
//! );
//! # }
//! ```

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::{FusedStream, Stream};
use futures_sink::Sink;

use crate::ack::{DeadLetters, Delivery};
use crate::builder;
use crate::chan;
use crate::config::{Config, Weigher};
use crate::error::{SendError, TryRecvError, TrySendError};
use crate::flavor::{Flavor, Joining, Reason};
use crate::stats::Stats;
use crate::Batch;

/// The `ordered` flavour: ranks are the senders' sort keys, and every key is due at once.
pub(crate) struct SortKeys<S>(PhantomData<fn() -> S>);

impl<S> Flavor for SortKeys<S> {
    type Rank = S;
    type Input = S;
    const USER_ORD: bool = true;

    fn rank(sort_key: S, _: Joining<'_, '_, S>) -> Option<S> {
        Some(sort_key)
    }

    fn is_due(_: &S, _: u64) -> bool {
        true
    }

    fn reason(_: &S) -> Reason {
        Reason::Deadline
    }

    fn deadline(_: &S) -> Option<u64> {
        None
    }

    // Due as soon as it is pending, with no deadline.
    fn comes_due(_: &S) -> bool {
        true
    }

    fn retried(sort_key: S, _: u64) -> S {
        sort_key
    }
}

/// In the log an `ordered` value keeps its sort key, encoded with the log's codec.
#[cfg(feature = "durable")]
impl<S> crate::durable::DurableFlavor for SortKeys<S>
where
    S: serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    fn encode_input(sort_key: &S, _: &crate::durable::Clocks) -> Vec<u8> {
        crate::durable::encode("sort key", sort_key)
    }

    fn decode_input(
        bytes: &[u8],
        _: u64,
        _: &crate::durable::Clocks,
        _: &Config,
    ) -> Result<S, String> {
        crate::durable::decode(bytes)
    }
}

#[cfg(feature = "durable")]
impl<W> crate::durable::DurableBuilder<builder::Ordered, W> {
    /// Opens the durable channel: locks the directory, reads its log back, and returns the
    /// channel with every value that was sent and not acknowledged, given up or taken as a
    /// dead letter pending again, under its sort key. See [`durable`](crate::durable).
    ///
    /// # Errors
    ///
    /// An [`OpenError`](crate::durable::OpenError): the directory is locked, the log is
    /// corrupt or does not decode as `S`, `K` and `V`, or a file could not be read or
    /// written.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the log is read on a blocking thread, which an `open` dropped before
    /// it resolves does not stop. It keeps the directory locked, and may cut a torn tail (or
    /// salvage), until its read ends; an `open` meanwhile fails with `OpenError::Locked`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("kb-doc-oo-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// let (tx, mut rx) = ordered::Builder::new().durable(&dir).open::<u8, String, u32>().await?;
    /// tx.send(1, "k".to_string(), 7).await?;
    /// let batch = rx.recv().await.unwrap();
    /// keyed_batch::ack::ack_all(batch).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
    pub async fn open<S, K, V>(
        self,
    ) -> Result<(Sender<S, K, V>, AckReceiver<S, K, V>), crate::durable::OpenError>
    where
        S: serde::Serialize + serde::de::DeserializeOwned + Ord + Clone + Send + 'static,
        K: serde::Serialize + serde::de::DeserializeOwned + Hash + Eq + Clone + Send + 'static,
        V: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        W: Weigher<V>,
    {
        let (tx, rx) = crate::durable::open::<SortKeys<S>, K, V, _, W>(self).await?;
        Ok((Sender { inner: tx }, AckReceiver { inner: rx }))
    }
}

/// Creates an unbounded `ordered` channel.
///
/// Use a [`Builder`] to cap batches or bound the channel.
///
/// # Examples
///
/// ```
/// use keyed_batch::ordered;
///
/// let (tx, mut rx) = ordered::channel();
/// tx.try_send(2, "b", ()).unwrap();
/// tx.try_send(1, "a", ()).unwrap();
/// assert_eq!(rx.try_recv(), Ok(vec![("a", vec![()]), ("b", vec![()])]));
/// ```
pub fn channel<S: Ord + Clone, K: Hash + Eq + Clone, V>() -> (Sender<S, K, V>, Receiver<S, K, V>) {
    Builder::new().build()
}

/// Builds an `ordered` channel with limits.
///
/// Every limit is off by default. The crate docs have a table of all of them. The limits
/// both flavours share are documented on [`builder::Builder`].
///
/// # Examples
///
/// ```
/// use keyed_batch::ordered;
///
/// let (tx, rx) = ordered::Builder::new()
///     .max_batch(100)
///     .capacity(10_000)
///     .build::<u32, u64, String>();
/// # drop((tx, rx));
/// ```
pub type Builder<W = ()> = builder::Builder<builder::Ordered, W>;

impl Builder {
    /// Starts a builder with every limit off.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered::Builder;
    ///
    /// let (tx, rx) = Builder::new().build::<u8, &str, ()>();
    /// # drop((tx, rx));
    /// ```
    pub fn new() -> Self {
        Builder::with(Config::new(Duration::ZERO))
    }
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl<W> Builder<W> {
    /// Creates the channel.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::cmp::Reverse;
    /// use keyed_batch::ordered::Builder;
    ///
    /// // Highest weight first.
    /// let (tx, rx) = Builder::new().build::<Reverse<u32>, String, Vec<u8>>();
    /// # drop((tx, rx));
    /// ```
    pub fn build<S: Ord + Clone, K: Hash + Eq + Clone, V>(
        self,
    ) -> (Sender<S, K, V>, Receiver<S, K, V>)
    where
        W: Weigher<V>,
    {
        let (tx, rx) = chan::channel(self.config, self.weigher, false);
        (Sender { inner: tx }, Receiver { inner: rx })
    }

    /// Creates an acknowledging channel: its receiver hands out a [`Delivery`] per key,
    /// and a key's newer values wait until that delivery is decided. See [`AckReceiver`].
    ///
    /// Sort keys, keys and values must be `Send + 'static`: a delivery can be decided from
    /// any task.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered::Builder;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = Builder::new().acked();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// for delivery in rx.recv().await.unwrap() {
    ///     delivery.ack().await.unwrap();
    /// }
    /// # }
    /// ```
    pub fn acked<S, K, V>(self) -> (Sender<S, K, V>, AckReceiver<S, K, V>)
    where
        S: Ord + Clone + Send + 'static,
        K: Hash + Eq + Clone + Send + 'static,
        V: Send + 'static,
        W: Weigher<V>,
    {
        let (tx, rx) = chan::channel(self.config, self.weigher, true);
        (Sender { inner: tx }, AckReceiver { inner: rx })
    }
}

/// Sends values into an `ordered` channel.
///
/// Clone it to send from many tasks. The channel closes when the last sender is dropped.
///
/// # Examples
///
/// ```
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut rx) = ordered::channel();
/// let tx2 = tx.clone();
/// tokio::spawn(async move { tx2.send(1, "k", "first").await.unwrap() })
///     .await
///     .unwrap();
/// drop(tx);
/// assert_eq!(rx.recv().await, Some(vec![("k", vec!["first"])]));
/// assert_eq!(rx.recv().await, None);
/// # }
/// ```
pub struct Sender<S, K, V> {
    inner: chan::Tx<SortKeys<S>, K, V>,
}

impl<S: Ord + Clone, K: Hash + Eq + Clone, V> Sender<S, K, V> {
    /// Sends a value with its sort key, waiting for room if the channel is bounded and full.
    ///
    /// The key ranks by the smallest sort key among its pending values (the rest of a key
    /// that a batch split keeps the key's rank, lowered by any smaller sort key sent since).
    ///
    /// In a durable channel (the `durable` feature), `send` resolves once the value's
    /// record is durable under the channel's `FsyncPolicy`, and the value goes in then. If
    /// the log has failed, the value comes back in the error, and `log_error` says why. If
    /// the channel closes (or its last receiver goes) while the record is made durable, the
    /// value comes back in the error too, and the record is marked done, so that it does not
    /// come back after a restart (but for a crash before that mark is written).
    ///
    /// # Errors
    ///
    /// If the channel is closed, the sort key, key and value come back in the error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before it completes, the value is dropped with it and was
    /// not sent, and the call gives up its place in the line of waiting senders. In a
    /// durable channel, its record, if written, is marked done a moment later, by the
    /// log's thread; once that is written, the value does not come back after a restart. A
    /// crash before then, or a failed log, may bring it back once.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, rx) = ordered::channel();
    /// tx.send(3, "k", 'a').await.unwrap();
    /// rx.close();
    /// assert_eq!(tx.send(1, "k", 'b').await.unwrap_err().into_inner(), (1, "k", 'b'));
    /// # }
    /// ```
    pub async fn send(&self, sort_key: S, key: K, value: V) -> Result<(), SendError<(S, K, V)>> {
        self.inner.send(sort_key, key, value).await
    }

    /// Sends a value now, if the channel has room.
    ///
    /// In a durable channel (the `durable` feature), the value goes in at once and its
    /// record is written a moment later, by the log's own thread: a crash before that loses
    /// it. Use `send` to know that it is on disk.
    ///
    /// # Errors
    ///
    /// [`TrySendError::Closed`] if the channel is closed, and [`TrySendError::Full`] if a
    /// limit (`capacity`, `max_weight`, `max_keys`) leaves no room for it now, or earlier
    /// `send` or `blocking_send` calls are waiting for room, or (with `max_keys`) an earlier
    /// send of the same key waits for a key slot: a value for a pending key goes past sends
    /// of other keys that wait for one. A closed channel reports `Closed` even when full.
    /// The sort key, key and value come back either way.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel();
    /// tx.try_send(0, "k", 1).unwrap();
    /// assert_eq!(rx.len(), 1);
    /// ```
    pub fn try_send(&self, sort_key: S, key: K, value: V) -> Result<(), TrySendError<(S, K, V)>> {
        self.inner.try_send(sort_key, key, value)
    }

    /// Sends a value from a plain thread, blocking it while it waits for room or a key slot,
    /// as `send` does.
    ///
    /// It needs no runtime, and works on `spawn_blocking` threads.
    ///
    /// # Errors
    ///
    /// If the channel is closed, the sort key, key and value come back in the error.
    ///
    /// # Panics
    ///
    /// Panics if called from async code, on a thread that drives a tokio runtime's tasks:
    /// blocking it there could stall the very tasks that would make room.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::channel();
    /// std::thread::spawn(move || tx.blocking_send(1, "k", 'v').unwrap())
    ///     .join()
    ///     .unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!['v'])]));
    /// ```
    pub fn blocking_send(&self, sort_key: S, key: K, value: V) -> Result<(), SendError<(S, K, V)>> {
        self.inner.blocking_send(sort_key, key, value)
    }
}

impl<S, K, V> Sender<S, K, V> {
    /// Whether this sender can no longer send: the channel is closed (by
    /// [`Receiver::close`], every receiver going, the last sender going, which only a
    /// handle closed as a `Sink` outlives, or a durable channel's log failing), or this
    /// handle was closed as a `Sink` with
    /// `poll_close`. Sends then fail.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel::<u8, u8, u8>();
    /// rx.close();
    /// assert!(tx.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Pending values, over all keys: the same count as [`Receiver::len`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, _rx) = ordered::channel();
    /// tx.try_send(1, "a", ()).unwrap();
    /// tx.try_send(2, "b", ()).unwrap();
    /// assert_eq!(tx.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, _rx) = ordered::channel::<u8, u8, u8>();
    /// assert!(tx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until this sender can no longer send: every receiver is gone, one called
    /// [`Receiver::close`], a durable channel's log failed, or this handle was closed as a
    /// `Sink` with `poll_close`.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, rx) = ordered::channel::<u8, u8, u8>();
    /// tokio::spawn(async move { drop(rx) });
    /// tx.closed().await;
    /// assert!(tx.is_closed());
    /// # }
    /// ```
    pub async fn closed(&self) {
        self.inner.closed().await
    }

    /// The error that failed a durable channel's log, if one did. A failed write or sync
    /// poisons the log for good and closes the channel: every send since has handed its
    /// value back (though a record written before the failure may bring it back at the
    /// next open), and this says why. `None` in other channels.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, _rx) = ordered::channel::<u8, u8, u8>();
    /// assert!(tx.log_error().is_none());
    /// ```
    #[cfg(feature = "durable")]
    #[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
    pub fn log_error(&self) -> Option<std::sync::Arc<std::io::Error>> {
        self.inner.log_error()
    }

    /// A snapshot of the channel's state and totals.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, _rx) = ordered::channel();
    /// tx.try_send(1, "a", ()).unwrap();
    /// assert_eq!(tx.stats().sent, 1);
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Takes back the value the [`Sink`] impl holds, if it has not gone in yet, and stops
    /// waiting for room for it (a value held by the `Sink` holds no place in the line of
    /// waiting senders).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::SinkExt;
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (mut tx, _rx) = ordered::Builder::new().capacity(1).build();
    /// tx.try_send(0, "a", 1).unwrap();
    /// // The channel is full: give up after a while.
    /// let sent = tokio::time::timeout(Duration::from_millis(10), SinkExt::send(&mut tx, (0, "b", 2)));
    /// assert!(sent.await.is_err());
    /// assert_eq!(tx.abort_send(), Some((0, "b", 2)));
    /// # }
    /// ```
    pub fn abort_send(&mut self) -> Option<(S, K, V)> {
        self.inner.abort_send()
    }
}

/// Sends `(sort_key, key, value)` triples, so that `stream.map(Ok).forward(tx)` works.
///
/// `start_send` takes a value, and `poll_ready` or `poll_flush` sends it, waiting for room
/// without busy-looping, but with no place in the line of waiting sends (see below). `poll_close` sends it too, then disconnects
/// this handle: the handle stops counting as a sender (if it was the last one, the channel
/// closes and the stream ends), and it refuses later sends. A clone made from a handle
/// after it was closed this way is closed too, and does not count as a sender either;
/// clones made before are senders of their own.
///
/// # Errors
///
/// A value that cannot go in because the channel is closed, or this handle was closed,
/// comes back in the error as `Some`. `poll_ready` on a closed channel with no value taken
/// returns the error with `None`.
///
/// # Cancel safety
///
/// A value taken by `start_send` stays in this sender until a later `poll_ready`,
/// `poll_flush` or `poll_close` sends it. While it waits for room it holds no place in the
/// line of waiting sends: it goes in once there is room and no `send` call waits for room
/// (a value for a pending key goes in past sends that wait for a key slot: see *Limits* in
/// the crate docs), so a sink left unpolled (after a timeout, say) holds up no one. To
/// take the value back, call [`Sender::abort_send`]; dropping the sender drops it (it was
/// never sent, and is not counted in `Stats::lost`). A `poll_close` that returned `Pending`
/// and was then abandoned has not disconnected the handle: it still counts as a sender.
///
/// # Panics
///
/// `start_send` panics if the previous value has not gone in: call `poll_ready` first, as the
/// `Sink` contract asks.
///
/// # Examples
///
/// ```
/// use futures::{stream, StreamExt};
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = ordered::channel();
/// let jobs = stream::iter(vec![(2, "b", 'x'), (1, "a", 'y')]);
/// jobs.map(Ok).forward(tx).await.unwrap();
/// let batches: Vec<_> = rx.collect().await;
/// assert_eq!(batches, vec![vec![("a", vec!['y']), ("b", vec!['x'])]]);
/// # }
/// ```
impl<S: Ord + Clone, K: Hash + Eq + Clone, V> Sink<(S, K, V)> for Sender<S, K, V> {
    type Error = SendError<Option<(S, K, V)>>;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().inner.poll_ready(cx)
    }

    fn start_send(
        self: Pin<&mut Self>,
        (sort_key, key, value): (S, K, V),
    ) -> Result<(), Self::Error> {
        self.get_mut().inner.start_send(sort_key, key, value);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().inner.poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().inner.poll_close(cx)
    }
}

impl<S, K, V> Clone for Sender<S, K, V> {
    fn clone(&self) -> Self {
        Sender {
            inner: self.inner.clone(),
        }
    }
}

impl<S, K, V> fmt::Debug for Sender<S, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// Receives batches from an `ordered` channel.
///
/// It is a [`Stream`] of batches, each holding the best-ranked keys (ties go to the key whose
/// current run of pending values started first: see *What a batch holds* in the crate
/// docs), each with its values in the order they were sent. The
/// stream ends once the channel is closed and drained, and is fused: it then stays ended.
///
/// # Cloned receivers
///
/// Clones share the work: each batch goes to exactly one of them. A send into an empty
/// channel (or one that ranks first) wakes every waiting receiver: one takes the batch, and
/// the others find nothing and wait again. So with `n` receivers waiting, a batch costs up to
/// `n` wakes, and a receiver that waits and is then not polled (a `next()` left behind in a
/// `select!`, say) holds up no other.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = ordered::Builder::new().max_batch(1).build();
/// tx.send(2, "b", ()).await.unwrap();
/// tx.send(1, "a", ()).await.unwrap();
/// drop(tx);
/// let keys: Vec<_> = rx.map(|batch| batch[0].0).collect().await;
/// assert_eq!(keys, vec!["a", "b"]);
/// # }
/// ```
pub struct Receiver<S, K, V> {
    inner: chan::Rx<SortKeys<S>, K, V>,
}

impl<S: Ord + Clone, K: Hash + Eq + Clone, V> Receiver<S, K, V> {
    /// Waits for the next batch; `None` once the channel is closed and drained.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: if it is dropped before it completes, no value has left
    /// the channel, and the receiver stops waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::channel();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// drop(tx);
    /// assert_eq!(rx.recv().await, Some(vec![("k", vec!['v'])]));
    /// assert_eq!(rx.recv().await, None);
    /// # }
    /// ```
    pub async fn recv(&mut self) -> Option<Batch<K, V>> {
        self.inner.recv().await
    }

    /// Polls for the next batch, for code that implements futures or streams by hand.
    ///
    /// Returns `Poll::Pending` while nothing is pending, and `Poll::Ready(None)` once the
    /// channel is closed and drained. It takes part in tokio's cooperative scheduling: once
    /// the task's budget is spent it returns `Poll::Pending` with keys pending, and the task
    /// is woken to go on.
    ///
    /// A receiver that returned `Pending` stays registered until it is polled again, calls
    /// `try_recv` or `drain_now`, or is dropped; the `Stream` impl works the same way. Other
    /// clones do not depend on it (see [Cloned receivers](Receiver#cloned-receivers)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::channel();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// let batch = poll_fn(|cx| rx.poll_recv(cx)).await;
    /// assert_eq!(batch, Some(vec![("k", vec!['v'])]));
    /// # }
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch<K, V>>> {
        self.inner.poll_recv(cx)
    }

    /// Takes the next batch if anything is pending.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] if nothing is pending, and [`TryRecvError::Disconnected`] once
    /// the channel is closed and drained.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::{error::TryRecvError, ordered};
    ///
    /// let (tx, mut rx) = ordered::channel();
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    /// tx.try_send(1, "k", 'v').unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!['v'])]));
    /// ```
    pub fn try_recv(&mut self) -> Result<Batch<K, V>, TryRecvError> {
        self.inner.try_recv()
    }

    /// Hands back values whose delivery failed, so they are delivered again.
    ///
    /// The values go in front of every pending value of the key, those handed back before
    /// included (to keep several failed parts of a key in order, hand them back newest
    /// first), and the key's rank becomes the smaller of its rank and `sort_key`. A requeue
    /// always has room: it may take the pending count past the capacity. An empty `values`
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// Once a receiver (this one or any clone) has seen the end of the stream (`recv` or the
    /// stream returned `None`, or `try_recv` returned `Disconnected`), nothing will be
    /// delivered again, and the sort key, key and values come back in the error.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::channel();
    /// tx.try_send(5, "k", 1).unwrap();
    /// let (key, values) = rx.try_recv().unwrap().remove(0);
    /// tx.try_send(5, "k", 2).unwrap();
    /// rx.requeue(5, key, values).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 2])]));
    /// ```
    pub fn requeue(
        &self,
        sort_key: S,
        key: K,
        values: Vec<V>,
    ) -> Result<(), SendError<(S, K, Vec<V>)>> {
        self.inner.requeue(sort_key, key, values)
    }

    /// Takes everything pending now, as batches split by the caps.
    ///
    /// It is for shutdown paths that cannot wait. The channel stays open.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::Builder::new().max_batch(1).build();
    /// tx.try_send(2, "b", ()).unwrap();
    /// tx.try_send(1, "a", ()).unwrap();
    /// assert_eq!(rx.drain_now(), vec![vec![("a", vec![()])], vec![("b", vec![()])]]);
    /// ```
    pub fn drain_now(&mut self) -> Vec<Batch<K, V>> {
        self.inner.drain_now()
    }
}

impl<S, K, V> Receiver<S, K, V> {
    /// Closes the channel for sending, without dropping what is pending.
    ///
    /// Sends then fail and hand their value back; the stream ends once what is pending is
    /// delivered. Waiting senders and receivers are woken.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::channel();
    /// tx.try_send(1, "k", 'v').unwrap();
    /// rx.close();
    /// assert!(tx.try_send(1, "k", 'w').unwrap_err().is_closed());
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!['v'])]));
    /// ```
    pub fn close(&self) {
        self.inner.close()
    }

    /// Pending values, over all keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel();
    /// tx.try_send(1, "a", ()).unwrap();
    /// tx.try_send(1, "a", ()).unwrap();
    /// assert_eq!(rx.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Pending keys: keys with at least one pending value.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel();
    /// tx.try_send(1, "a", ()).unwrap();
    /// tx.try_send(1, "a", ()).unwrap();
    /// assert_eq!(rx.key_count(), 1);
    /// ```
    pub fn key_count(&self) -> usize {
        self.inner.key_count()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel::<u8, u8, u8>();
    /// assert!(rx.is_empty());
    /// # drop(tx);
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the channel is closed for sending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel::<u8, u8, u8>();
    /// drop(tx);
    /// assert!(rx.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// A snapshot of the channel's state and totals.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::channel();
    /// tx.try_send(1, "a", ()).unwrap();
    /// assert_eq!(rx.stats().pending_keys, 1);
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl<S: Ord + Clone, K: Hash + Eq + Clone, V> Stream for Receiver<S, K, V> {
    type Item = Batch<K, V>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx)
    }
}

/// The stream is terminated once this receiver has returned `None` (from `recv`,
/// `poll_recv` or the stream; `try_recv` returning `Disconnected` does not count): the
/// channel is closed and drained, and stays so. A clone of a terminated receiver starts terminated.
impl<S: Ord + Clone, K: Hash + Eq + Clone, V> FusedStream for Receiver<S, K, V> {
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

impl<S, K, V> Clone for Receiver<S, K, V> {
    fn clone(&self) -> Self {
        Receiver {
            inner: self.inner.clone(),
        }
    }
}

impl<S, K, V> fmt::Debug for Receiver<S, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

/// Receives batches of [`Delivery`]s from an acknowledging `ordered` channel, made by
/// [`Builder::acked`].
///
/// Batches come out as from a [`Receiver`]: the best-ranked keys, under the same caps. But
/// each key comes as a [`Delivery`] to decide, and its newer values wait until it is: the
/// rules are those of [`timed::AckReceiver`](crate::timed::AckReceiver#rules). A retried key
/// ranks by the smaller of the rank it went out with and the sort keys of its newer values;
/// `retry_after` holds it for its delay (but for a key that cannot be held: see *Panics in
/// user code* in the crate docs).
///
/// # Examples
///
/// ```
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut rx) = ordered::Builder::new().acked();
/// tx.send(1, "urgent", 'a').await.unwrap();
/// tx.send(5, "later", 'b').await.unwrap();
/// let batch = rx.recv().await.unwrap();
/// assert_eq!(batch[0].key(), &"urgent");
/// for delivery in batch {
///     delivery.ack().await.unwrap();
/// }
/// # }
/// ```
pub struct AckReceiver<S, K, V> {
    inner: chan::Rx<SortKeys<S>, K, V>,
}

impl<S, K, V> AckReceiver<S, K, V>
where
    S: Ord + Clone + Send + 'static,
    K: Hash + Eq + Clone + Send + 'static,
    V: Send + 'static,
{
    /// Waits for the next batch of deliveries; `None` once the channel is closed, drained,
    /// and every delivery decided.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: if it is dropped before it completes, no value has left
    /// the channel and no key is in flight, and the receiver stops waiting.
    ///
    /// # Panics
    ///
    /// Panics if it has to wait out a [`retry_after`](Delivery::retry_after) delay outside
    /// a tokio runtime with time enabled: the one wait of an `ordered` receiver that needs
    /// a timer.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// drop(tx);
    /// let batch = rx.recv().await.unwrap();
    /// batch.into_iter().for_each(|d| drop(d.ack()));
    /// assert!(rx.recv().await.is_none());
    /// # }
    /// ```
    pub async fn recv(&mut self) -> Option<Vec<Delivery<K, V>>> {
        self.inner.recv_deliveries().await
    }

    /// Polls for the next batch of deliveries, for code that implements futures or streams
    /// by hand; see [`Receiver::poll_recv`].
    ///
    /// # Panics
    ///
    /// As for [`recv`](Self::recv).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// let batch = poll_fn(|cx| rx.poll_recv(cx)).await.unwrap();
    /// assert_eq!(batch[0].values(), &['v']);
    /// # }
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Vec<Delivery<K, V>>>> {
        self.inner.poll_deliveries(cx)
    }

    /// Takes the next batch of deliveries if a key is pending and not in flight.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] if nothing can go out now, and
    /// [`TryRecvError::Disconnected`] once the channel is closed, drained, and every
    /// delivery decided.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::{error::TryRecvError, ordered};
    ///
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(1, "k", 'v').unwrap();
    /// let batch = rx.try_recv().unwrap();
    /// tx.try_send(1, "k", 'w').unwrap(); // "k" is in flight: it waits
    /// assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    /// # drop(batch);
    /// ```
    pub fn try_recv(&mut self) -> Result<Vec<Delivery<K, V>>, TryRecvError> {
        self.inner.try_recv_deliveries()
    }

    /// Takes everything pending now as batches of deliveries split by the caps. Keys in
    /// flight stay in flight: their newer values are not taken, nor the rest of a key that a
    /// cap split, which waits for the first part's decision. Keys held by
    /// [`Delivery::retry_after`] wait out their delay (a close ends it), as they do for
    /// `recv`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::Builder::new().max_batch(1).acked();
    /// tx.try_send(1, "a", ()).unwrap();
    /// tx.try_send(2, "b", ()).unwrap();
    /// assert_eq!(rx.drain_now().len(), 2);
    /// ```
    pub fn drain_now(&mut self) -> Vec<Vec<Delivery<K, V>>> {
        self.inner.drain_deliveries()
    }

    /// The stream of dead letters: values retried on their last attempt (`max_attempts`).
    /// See [`DeadLetters`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().max_attempts(1).acked();
    /// let mut dead = rx.dead_letters();
    /// tx.send(1, "k", 'v').await.unwrap();
    /// rx.recv().await.unwrap().remove(0).retry().await.unwrap();
    /// assert_eq!(dead.recv().await.unwrap().values, vec!['v']);
    /// # }
    /// ```
    pub fn dead_letters(&self) -> DeadLetters<K, V> {
        self.inner.dead_letters()
    }
}

impl<S, K, V> AckReceiver<S, K, V> {
    /// Closes the channel for sending, as [`Receiver::close`] does. The stream ends once
    /// everything is delivered and decided.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// rx.close();
    /// assert!(tx.try_send(1, "k", 1).is_err());
    /// ```
    pub fn close(&self) {
        self.inner.close()
    }

    /// Pending values, over all keys, those waiting out a retry delay included; values in
    /// flight are not counted (see [`Stats::in_flight_values`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::Builder::new().acked();
    /// tx.try_send(1, "k", 1).unwrap();
    /// assert_eq!(rx.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Keys with pending values; a key in flight with no newer values is not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::Builder::new().acked();
    /// tx.try_send(1, "a", 1).unwrap();
    /// assert_eq!(rx.key_count(), 1);
    /// ```
    pub fn key_count(&self) -> usize {
        self.inner.key_count()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// assert!(rx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the channel is closed for sending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// drop(tx);
    /// assert!(rx.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// A snapshot of the channel's state and totals, deliveries in flight and decisions
    /// included.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(1, "k", 1).unwrap();
    /// let batch = rx.try_recv().unwrap();
    /// assert_eq!(rx.stats().in_flight_keys, 1);
    /// # drop(batch);
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl<S, K, V> Stream for AckReceiver<S, K, V>
where
    S: Ord + Clone + Send + 'static,
    K: Hash + Eq + Clone + Send + 'static,
    V: Send + 'static,
{
    type Item = Vec<Delivery<K, V>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx)
    }
}

/// The stream is terminated once this receiver has returned `None` (from `recv`,
/// `poll_recv` or the stream; `try_recv` returning `Disconnected` does not count). A clone
/// of a terminated receiver starts terminated.
impl<S, K, V> FusedStream for AckReceiver<S, K, V>
where
    S: Ord + Clone + Send + 'static,
    K: Hash + Eq + Clone + Send + 'static,
    V: Send + 'static,
{
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

impl<S, K, V> Clone for AckReceiver<S, K, V> {
    fn clone(&self) -> Self {
        AckReceiver {
            inner: self.inner.clone(),
        }
    }
}

impl<S, K, V> fmt::Debug for AckReceiver<S, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckReceiver").finish_non_exhaustive()
    }
}
