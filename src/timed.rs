//! Per-key time-window batching: a key's values come out together, due at most `window`
//! after the first of them entered the channel (in an acknowledging channel, not before
//! the key's delivery in flight is decided, nor before a `retry_after` delay that holds
//! the key ends).
//!
//! A value sent with [`Sender::send`] is due `window` after it enters the channel. A key is
//! due at the smallest deadline among its pending values, so the first value of a quiet key
//! sets the pace and later values ride along. [`Sender::send_by`] gives one value a tighter
//! deadline of its own, and [`Builder::max_values_per_key`] makes a busy key due at once.
//! *Due* is when a key may be taken; a receiver takes it then if it is waiting, or when it
//! next asks.
//!
//! A waiting [`Receiver`] sleeps on a tokio timer until the earliest deadline; it does not
//! poll.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use keyed_batch::timed;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (tx, mut rx) = timed::channel(Duration::from_millis(100));
//! tx.send("alice", 1).await.unwrap();
//! tx.send("bob", 2).await.unwrap();
//! tx.send("alice", 3).await.unwrap();
//!
//! // 100 ms later both keys are due, in the order they first arrived.
//! let batch = rx.recv().await.unwrap();
//! assert_eq!(batch, vec![("alice", vec![1, 3]), ("bob", vec![2])]);
//! # }
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::{FusedStream, Stream};
use futures_sink::Sink;
use tokio::time::Instant;

use crate::ack::{DeadLetters, Delivery};
use crate::builder;
use crate::chan;
use crate::config::{Config, Weigher};
use crate::error::{SendError, TryRecvError, TrySendError};
use crate::flavor::{self, Flavor, Joining, Reason};
use crate::stats::Stats;
use crate::Batch;

/// The `timed` flavour: ranks are deadlines.
pub(crate) enum Deadlines {}

/// A key's deadline, and why it is what it is. Only the deadline orders them.
///
/// A rank is copied into every slot and every ticket, so it is packed into 8 bytes (an
/// `Instant` alone takes 16): the deadline in nanoseconds from the channel's epoch in the low
/// 62 bits, and the reason in the top two. The largest deadline, about 146 years on, is
/// [`NEVER`](Deadline::NEVER): a later deadline cannot be told apart from it, so it is due
/// only at a flush or a close, never early. A key made due at once (a flush, a full key, a
/// requeue, a retry) is due by [`Deadline::at_once`], which stays below it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(u64);

impl Deadline {
    const NEVER: u64 = (1 << 62) - 1;

    fn new(at: u64, reason: Reason) -> Self {
        let reason = match reason {
            Reason::Deadline => 0,
            Reason::FullKey => 1,
            Reason::Flush => 2,
        };
        Deadline(at.min(Self::NEVER) | reason << 62)
    }

    /// Due at once, `at` being at or before now: in a channel so old that now is past the
    /// range, one below [`NEVER`](Self::NEVER), so that a flush, a full key, a requeue or a
    /// retry still takes values out there.
    fn at_once(at: u64, reason: Reason) -> Self {
        Self::new(at.min(Self::NEVER - 1), reason)
    }

    fn at(self) -> u64 {
        self.0 & Self::NEVER
    }

    fn reason(self) -> Reason {
        match self.0 >> 62 {
            0 => Reason::Deadline,
            1 => Reason::FullKey,
            _ => Reason::Flush,
        }
    }
}

impl Ord for Deadline {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at().cmp(&other.at())
    }
}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        self.at() == other.at()
    }
}

impl Eq for Deadline {}

/// When a value wants its key to be due.
pub(crate) enum Due {
    /// `window` after it enters the channel.
    Window,
    /// At this instant, or `window` after it enters the channel if that is sooner.
    By(Instant),
    /// At once, for this reason.
    Now(Reason),
}

impl Flavor for Deadlines {
    type Rank = Deadline;
    type Input = Due;
    const USER_ORD: bool = false;

    fn rank(due: Due, joining: Joining<'_, '_, Deadline>) -> Option<Deadline> {
        let Joining {
            current,
            values,
            weight,
            config,
            clock,
        } = joining;
        let window = window_nanos(config);
        let full = config.is_full(values, weight);
        if let (Some(current), false) = (current, full) {
            // Most values join a key that is already due sooner than they would make it:
            // tell so without reading the clock, from a reading at or before now.
            let at_least = match due {
                Due::Window => clock.floor().map(|floor| floor.saturating_add(window)),
                Due::By(at) => clock
                    .floor()
                    .map(|floor| clock.since(at).min(floor.saturating_add(window))),
                Due::Now(_) => None,
            };
            if at_least.is_some_and(|at| at.min(Deadline::NEVER) >= current.at()) {
                return None;
            }
        }
        let now = clock.now();
        // Only a deadline can be out of reach; a full key, a flush and a requeue are due now.
        let at_once = full || matches!(due, Due::Now(_));
        let (at, reason) = due_at(&due, now, window, |at| clock.since(at));
        let (at, reason) = match full && at > now {
            true => (now, Reason::FullKey),
            false => (at, reason),
        };
        // A key that is due already keeps the reason it came due for (`Deliveries`: the
        // first reason counts), though an earlier deadline still moves it up.
        let reason = match current {
            // (A deadline out of reach is not due, in a channel however old.)
            Some(current) if Self::is_due(current, now) => current.reason(),
            _ => reason,
        };
        Some(match at_once {
            true => Deadline::at_once(at, reason),
            false => Deadline::new(at, reason),
        })
    }

    fn is_due(deadline: &Deadline, now: u64) -> bool {
        deadline.at() != Deadline::NEVER && deadline.at() <= now
    }

    fn reason(deadline: &Deadline) -> Reason {
        deadline.reason()
    }

    fn deadline(deadline: &Deadline) -> Option<u64> {
        (deadline.at() != Deadline::NEVER).then_some(deadline.at())
    }

    fn retried(deadline: Deadline, now: u64) -> Deadline {
        // Due now, and counted again by why it first came due (`Deliveries`), whether or not
        // values came for the key while it was out.
        Deadline::at_once(now, deadline.reason())
    }

    fn due_alone(due: &Due, arrival: u64, epoch: Instant, config: &Config) -> u64 {
        // As `rank` computes it for a key alone; `is_full` is never true on a channel that
        // has an inbox (it has no per-key limits).
        let since = |at| flavor::since(epoch, at);
        let at = due_at(due, arrival, window_nanos(config), since).0;
        // A deadline past the range is never reached: it is no deadline (`u64::MAX`), what a
        // receiver whose keys all have such deadlines publishes, so such sends wake no one.
        match at >= Deadline::NEVER {
            true => u64::MAX,
            false => at,
        }
    }
}

/// The window in nanoseconds. A window too long to add is "never": saturating keeps
/// deadlines monotonic in arrival, so the FIFO order holds.
fn window_nanos(config: &Config) -> u64 {
    u64::try_from(config.window.as_nanos()).unwrap_or(u64::MAX)
}

/// When a value that enters at `now` makes its key due, by itself, and why; `since` puts an
/// instant on the channel's clock. The rule of `rank`, which `due_alone` shares.
fn due_at(due: &Due, now: u64, window: u64, since: impl FnOnce(Instant) -> u64) -> (u64, Reason) {
    let by_window = now.saturating_add(window);
    match *due {
        Due::Window => (by_window, Reason::Deadline),
        // "By" is "at the latest": no deadline is later than a window after arrival.
        Due::By(at) => (since(at).min(by_window), Reason::Deadline),
        Due::Now(reason) => (now, reason),
    }
}

/// In the log a `timed` value keeps its deadline in wall-clock terms: `window` after its
/// arrival, or by a wall-clock time. Reopened, it is rebuilt on the monotonic clock.
#[cfg(feature = "durable")]
impl crate::durable::DurableFlavor for Deadlines {
    fn encode_input(due: &Due, clocks: &crate::durable::Clocks) -> Vec<u8> {
        match due {
            Due::Window => vec![0],
            Due::By(at) => {
                let mut bytes = vec![1];
                bytes.extend_from_slice(&clocks.wall_of(*at).to_le_bytes());
                bytes
            }
            // A flush or a requeue is not a send, and is never logged.
            Due::Now(_) => vec![2],
        }
    }

    fn decode_input(
        bytes: &[u8],
        arrival: u64,
        clocks: &crate::durable::Clocks,
        config: &Config,
    ) -> Result<Due, String> {
        let window = u64::try_from(config.window.as_nanos()).unwrap_or(u64::MAX);
        let by = match bytes {
            [0] => arrival.saturating_add(window),
            [1, at @ ..] if at.len() == 8 => {
                let at = u64::from_le_bytes(at.try_into().expect("8 bytes"));
                at.min(arrival.saturating_add(window))
            }
            [2] => arrival,
            _ => return Err(format!("not a timed deadline: {bytes:?}")),
        };
        Ok(match by.checked_sub(arrival) {
            // A deadline past what an instant holds stays "never".
            Some(after) if after >= Deadline::NEVER => Due::Window,
            _ => Due::By(clocks.instant_of(by)),
        })
    }
}

#[cfg(feature = "durable")]
impl<W> crate::durable::DurableBuilder<builder::Timed, W> {
    /// Opens the durable channel: locks the directory, reads its log back, and returns the
    /// channel with every value that was sent and not acknowledged, given up or taken as a
    /// dead letter pending again. See [`durable`](crate::durable).
    ///
    /// # Errors
    ///
    /// An [`OpenError`](crate::durable::OpenError): the directory is locked, the log is
    /// corrupt or does not decode as `K` and `V`, or a file could not be read or written.
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("kb-doc-o-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// let builder = || timed::Builder::new(Duration::from_secs(1)).durable(&dir);
    /// let (tx, rx) = builder().open::<String, u32>().await?;
    /// tx.send("k".to_string(), 1).await?;
    /// drop((tx, rx)); // as a crash would, with the value pending
    /// let (_tx, rx) = builder().open::<String, u32>().await?;
    /// assert_eq!(rx.len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
    pub async fn open<K, V>(
        self,
    ) -> Result<(Sender<K, V>, AckReceiver<K, V>), crate::durable::OpenError>
    where
        K: serde::Serialize + serde::de::DeserializeOwned + Hash + Eq + Clone + Send + 'static,
        V: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        W: Weigher<V>,
    {
        let (tx, rx) = crate::durable::open::<Deadlines, K, V, _, W>(self).await?;
        Ok((Sender { inner: tx }, AckReceiver { inner: rx }))
    }
}

/// Creates an unbounded `timed` channel whose keys are due `window` after their first
/// pending value was sent.
///
/// A zero `window` is valid: every value is due as soon as it is sent, and batches hold what
/// piled up while the receiver was busy. Use a [`Builder`] to set limits.
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
/// tx.send(7, "hello").await.unwrap();
/// assert_eq!(rx.recv().await, Some(vec![(7, vec!["hello"])]));
/// # }
/// ```
pub fn channel<K: Hash + Eq + Clone, V>(window: Duration) -> (Sender<K, V>, Receiver<K, V>) {
    Builder::new(window).build()
}

/// Builds a `timed` channel with limits.
///
/// Every limit is off by default. The crate docs have a table of all of them. The limits
/// both flavours share are documented on [`builder::Builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::timed;
///
/// let (tx, rx) = timed::Builder::new(Duration::from_secs(1))
///     .max_batch(100)
///     .max_values_per_key(10)
///     .capacity(10_000)
///     .build::<u64, String>();
/// # drop((tx, rx));
/// ```
pub type Builder<W = ()> = builder::Builder<builder::Timed, W>;

impl Builder {
    /// Starts a builder for keys that are due `window` after their first pending value.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// let (tx, rx) = Builder::new(Duration::ZERO).build::<&str, u8>();
    /// # drop((tx, rx));
    /// ```
    pub fn new(window: Duration) -> Self {
        Builder::with(Config::new(window))
    }
}

impl<W> Builder<W> {
    /// Makes a key due at once when it holds `n` pending values, whatever its deadline (in
    /// an acknowledging channel, a key with a delivery in flight, or held by a `retry_after`
    /// delay, still waits for it, as its deadline would).
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = Builder::new(Duration::from_secs(60))
    ///     .max_values_per_key(2)
    ///     .build();
    /// tx.send("k", 1).await.unwrap();
    /// tx.send("k", 2).await.unwrap(); // full: due now, not in a minute
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 2])]));
    /// # }
    /// ```
    #[track_caller]
    pub fn max_values_per_key(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_values_per_key, n, "max_values_per_key");
        self
    }

    /// Makes a key due at once when its pending values weigh `n` or more, whatever its
    /// deadline (in an acknowledging channel, a key with a delivery in flight, or held by a
    /// `retry_after` delay, still waits for it, as its deadline would).
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// let (tx, mut rx) = Builder::new(Duration::from_secs(60))
    ///     .weigher(|body: &&str| body.len())
    ///     .max_key_weight(10)
    ///     .build();
    /// tx.try_send("k", "hello").unwrap();
    /// assert!(rx.try_recv().is_err());
    /// tx.try_send("k", "world").unwrap(); // 10 bytes: due now
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!["hello", "world"])]));
    /// ```
    #[track_caller]
    pub fn max_key_weight(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_key_weight, n, "max_key_weight");
        self
    }

    /// Creates the channel.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// let (tx, rx) = Builder::new(Duration::from_secs(1)).build::<String, Vec<u8>>();
    /// # drop((tx, rx));
    /// ```
    pub fn build<K: Hash + Eq + Clone, V>(self) -> (Sender<K, V>, Receiver<K, V>)
    where
        W: Weigher<V>,
    {
        let (tx, rx) = chan::channel(self.config, self.weigher, false);
        (Sender { inner: tx }, Receiver { inner: rx })
    }

    /// Creates an acknowledging channel: its receiver hands out a [`Delivery`] per key,
    /// and a key's newer values wait until that delivery is decided. See
    /// [`AckReceiver`].
    ///
    /// Keys and values must be `Send + 'static`: a delivery can be decided from any task.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = Builder::new(Duration::from_secs(1)).max_attempts(5).acked();
    /// tx.send("k", 1).await.unwrap();
    /// for delivery in rx.recv().await.unwrap() {
    ///     delivery.ack().await.unwrap();
    /// }
    /// # }
    /// ```
    pub fn acked<K, V>(self) -> (Sender<K, V>, AckReceiver<K, V>)
    where
        K: Hash + Eq + Clone + Send + 'static,
        V: Send + 'static,
        W: Weigher<V>,
    {
        let (tx, rx) = chan::channel(self.config, self.weigher, true);
        (Sender { inner: tx }, AckReceiver { inner: rx })
    }
}

/// Sends values into a `timed` channel.
///
/// Clone it to send from many tasks. The channel closes when the last sender is dropped;
/// what is pending is then all due at once.
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
/// let tx2 = tx.clone();
/// tokio::spawn(async move { tx2.send("k", 2).await.unwrap() });
/// tx.send("k", 1).await.unwrap();
/// drop(tx);
/// let mut values = rx.recv().await.unwrap().remove(0).1;
/// values.sort();
/// assert_eq!(values, vec![1, 2]);
/// # }
/// ```
pub struct Sender<K, V> {
    inner: chan::Tx<Deadlines, K, V>,
}

impl<K: Hash + Eq + Clone, V> Sender<K, V> {
    /// Sends a value that wants its key due `window` after it enters the channel, waiting
    /// for room if the channel is bounded and full.
    ///
    /// The window starts when the value goes in, after any wait for room.
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
    /// If the channel is closed, the key and value come back in the error.
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// tx.send("k", 1).await.unwrap();
    /// drop(rx);
    /// assert_eq!(tx.send("k", 2).await.unwrap_err().into_inner(), ("k", 2));
    /// # }
    /// ```
    pub async fn send(&self, key: K, value: V) -> Result<(), SendError<(K, V)>> {
        let sent = self.inner.send(Due::Window, key, value).await;
        sent.map_err(|err| err.map(without_due))
    }

    /// Sends a value that wants its key due no later than `deadline`, waiting for room if
    /// the channel is bounded and full.
    ///
    /// This is a latency budget for one value: "by" means "at the latest". The value's
    /// deadline is the earlier of `deadline` and `window` after it enters the channel, so
    /// no value's deadline is later than `window` after it went in, and the key is due at
    /// the earliest of its values' deadlines. A deadline in the past makes the key due at
    /// once; one before the channel was made counts as the moment it was made. (In a
    /// channel older than about 146 years no deadline is reached, a past one included:
    /// see the crate docs, *When a key is due*.)
    ///
    /// # Errors
    ///
    /// If the channel is closed, the key and value come back in the error.
    ///
    /// # Cancel safety
    ///
    /// As for [`send`](Self::send).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, rx) = timed::channel(Duration::from_secs(10));
    /// let soon = Instant::now() + Duration::from_millis(5);
    /// tx.send("k", 1).await.unwrap();
    /// tx.send_by("k", 2, soon).await.unwrap();
    /// assert_eq!(rx.next_deadline(), Some(soon));
    ///
    /// // A deadline past the window does not hold a value back.
    /// let (tx, rx) = timed::channel(Duration::from_secs(10));
    /// tx.send_by("k", 1, Instant::now() + Duration::from_secs(60)).await.unwrap();
    /// assert_eq!(rx.next_deadline(), Some(Instant::now() + Duration::from_secs(10)));
    /// # }
    /// ```
    pub async fn send_by(
        &self,
        key: K,
        value: V,
        deadline: Instant,
    ) -> Result<(), SendError<(K, V)>> {
        let sent = self.inner.send(Due::By(deadline), key, value).await;
        sent.map_err(|err| err.map(without_due))
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
    /// The key and value come back either way.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("k", 1).unwrap();
    /// assert_eq!(rx.len(), 1);
    /// ```
    pub fn try_send(&self, key: K, value: V) -> Result<(), TrySendError<(K, V)>> {
        let sent = self.inner.try_send(Due::Window, key, value);
        sent.map_err(|err| err.map(without_due))
    }

    /// Sends a value that wants its key due no later than `deadline`, if the channel has
    /// room. The deadline is as for [`send_by`](Self::send_by).
    ///
    /// # Errors
    ///
    /// As for [`try_send`](Self::try_send).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::channel(Duration::from_secs(10));
    /// tx.try_send_by("k", 1, Instant::now()).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
    /// # }
    /// ```
    pub fn try_send_by(
        &self,
        key: K,
        value: V,
        deadline: Instant,
    ) -> Result<(), TrySendError<(K, V)>> {
        let sent = self.inner.try_send(Due::By(deadline), key, value);
        sent.map_err(|err| err.map(without_due))
    }

    /// Sends a value from a plain thread, blocking it while it waits for room or a key slot,
    /// as `send` does.
    ///
    /// It needs no runtime, and works on `spawn_blocking` threads.
    ///
    /// # Errors
    ///
    /// If the channel is closed, the key and value come back in the error.
    ///
    /// # Panics
    ///
    /// Panics if called from async code, on a thread that drives a tokio runtime's tasks:
    /// blocking it there could stall the very tasks that would make room.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::channel(Duration::ZERO);
    /// std::thread::spawn(move || tx.blocking_send("k", 1).unwrap())
    ///     .join()
    ///     .unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
    /// ```
    pub fn blocking_send(&self, key: K, value: V) -> Result<(), SendError<(K, V)>> {
        let sent = self.inner.blocking_send(Due::Window, key, value);
        sent.map_err(|err| err.map(without_due))
    }

    /// Makes `key` due at once, if it has pending values. A key held by
    /// [`Delivery::retry_after`](crate::ack::Delivery::retry_after) still waits out its
    /// delay, and a key in flight in an acknowledging channel waits for its decision (its
    /// newer values are due at once after it). Either way, with or without pending values,
    /// the flush then counts among the deadlines a retried key is due by (see
    /// [`AckReceiver`]): such a key ranks as of the flush at the latest.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::channel(Duration::from_secs(60));
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("b", 2).unwrap();
    /// tx.flush(&"b");
    /// assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
    /// ```
    pub fn flush(&self, key: &K) {
        self.inner.flush(Some(key), Due::Now(Reason::Flush));
    }

    /// Makes every pending key due at once. Keys that come later are not affected. Keys
    /// held by [`Delivery::retry_after`](crate::ack::Delivery::retry_after) still wait out
    /// their delay, and keys in flight in an acknowledging channel wait for their decision;
    /// as for [`flush`](Self::flush), each then ranks as of the flush at the latest.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::channel(Duration::from_secs(60));
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("b", 2).unwrap();
    /// tx.flush_all();
    /// assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![2])]));
    /// ```
    pub fn flush_all(&self) {
        self.inner.flush(None, Due::Now(Reason::Flush));
    }
}

impl<K, V> Sender<K, V> {
    /// Whether this sender can no longer send: the channel is closed (by
    /// [`Receiver::close`], every receiver going, the last sender going, which only a
    /// handle closed as a `Sink` outlives, or a durable channel's log failing), or this
    /// handle was closed as a `Sink` with
    /// `poll_close`. Sends then fail.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel::<u8, u8>(Duration::from_secs(1));
    /// assert!(!tx.is_closed());
    /// drop(rx);
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, _rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("a", 2).unwrap();
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, _rx) = timed::channel::<u8, u8>(Duration::from_secs(1));
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, rx) = timed::channel::<u8, u8>(Duration::from_secs(1));
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, _rx) = timed::channel::<u8, u8>(Duration::from_secs(1));
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, _rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("a", 1).unwrap();
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
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (mut tx, _rx) = timed::Builder::new(Duration::from_secs(1)).capacity(1).build();
    /// tx.try_send("a", 1).unwrap();
    /// // The channel is full: give up after a while.
    /// let sent = tokio::time::timeout(Duration::from_millis(10), SinkExt::send(&mut tx, ("b", 2)));
    /// assert!(sent.await.is_err());
    /// assert_eq!(tx.abort_send(), Some(("b", 2)));
    /// # }
    /// ```
    pub fn abort_send(&mut self) -> Option<(K, V)> {
        self.inner.abort_send().map(without_due)
    }
}

/// Sends `(key, value)` pairs, so that `stream.map(Ok).forward(tx)` works.
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
/// use std::time::Duration;
/// use futures::{stream, StreamExt};
/// use keyed_batch::timed;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let (tx, rx) = timed::channel(Duration::from_millis(10));
/// let records = stream::iter(vec![("a", 1), ("b", 2), ("a", 3)]);
/// records.map(Ok).forward(tx).await.unwrap();
/// let batches: Vec<_> = rx.collect().await;
/// assert_eq!(batches, vec![vec![("a", vec![1, 3]), ("b", vec![2])]]);
/// # }
/// ```
impl<K: Hash + Eq + Clone, V> Sink<(K, V)> for Sender<K, V> {
    type Error = SendError<Option<(K, V)>>;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let ready = self.get_mut().inner.poll_ready(cx);
        ready.map_err(|err| err.map(|item| item.map(without_due)))
    }

    fn start_send(self: Pin<&mut Self>, (key, value): (K, V)) -> Result<(), Self::Error> {
        self.get_mut().inner.start_send(Due::Window, key, value);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let flushed = self.get_mut().inner.poll_flush(cx);
        flushed.map_err(|err| err.map(|item| item.map(without_due)))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let closed = self.get_mut().inner.poll_close(cx);
        closed.map_err(|err| err.map(|item| item.map(without_due)))
    }
}

fn without_due<K, V>((_, key, value): (Due, K, V)) -> (K, V) {
    (key, value)
}

impl<K, V> Clone for Sender<K, V> {
    fn clone(&self) -> Self {
        Sender {
            inner: self.inner.clone(),
        }
    }
}

impl<K, V> fmt::Debug for Sender<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// Receives batches from a `timed` channel.
///
/// It is a [`Stream`] of batches. Each batch holds due keys in deadline order (ties go to
/// the key whose pending values started first), each with its values in the order they were
/// sent. When the channel is closed, everything pending is due at once, and the stream ends
/// once it is delivered. The stream is fused: after it ended, it stays ended.
///
/// Waiting for a deadline needs tokio's timer: poll a receiver inside a tokio runtime with
/// time enabled. `try_recv` and `drain_now` work anywhere.
///
/// # Cloned receivers
///
/// Clones share the work: each batch goes to exactly one of them. Each waiting receiver
/// sleeps on a timer of its own, and whatever may make a key due (its deadline, or a send,
/// flush or close) wakes every waiting receiver: one takes the batch, and the others find
/// nothing and sleep again. So with `n` receivers waiting, a batch costs up to `n` wakes,
/// and a receiver that waits and is then not polled (a `next()` left behind in a
/// `select!`, say) holds up no other: they are woken as if it were not there.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use futures::StreamExt;
/// use keyed_batch::timed;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let (tx, rx) = timed::channel(Duration::from_millis(10));
/// tx.send("a", 1).await.unwrap();
/// drop(tx);
/// let batches: Vec<_> = rx.collect().await;
/// assert_eq!(batches, vec![vec![("a", vec![1])]]);
/// # }
/// ```
pub struct Receiver<K, V> {
    inner: chan::Rx<Deadlines, K, V>,
}

impl<K: Hash + Eq + Clone, V> Receiver<K, V> {
    /// Waits for the next batch; `None` once the channel is closed and drained.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: if it is dropped before it completes, no value has left
    /// the channel, and the receiver stops waiting (its timer is dropped).
    ///
    /// # Panics
    ///
    /// Panics if it has to wait for a deadline outside a tokio runtime with time enabled.
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
    /// tx.send("k", 1).await.unwrap();
    /// drop(tx);
    /// assert_eq!(rx.recv().await, Some(vec![("k", vec![1])]));
    /// assert_eq!(rx.recv().await, None);
    /// # }
    /// ```
    pub async fn recv(&mut self) -> Option<Batch<K, V>> {
        self.inner.recv().await
    }

    /// Polls for the next batch, for code that implements futures or streams by hand.
    ///
    /// Returns `Poll::Pending` until a key is due, and `Poll::Ready(None)` once the channel is
    /// closed and drained. When pending, the waker in `cx` is woken when a key may be due.
    /// It takes part in tokio's cooperative scheduling: once the task's budget is spent it
    /// returns `Poll::Pending` with keys due, and the task is woken to go on.
    ///
    /// A receiver that returned `Pending` stays registered, with its timer set, until it is
    /// polled again, calls `try_recv` or `drain_now`, or is dropped; the `Stream` impl works
    /// the same way. Other clones do not depend on it (see
    /// [Cloned receivers](Receiver#cloned-receivers)).
    ///
    /// # Panics
    ///
    /// Panics if it has to wait for a deadline outside a tokio runtime with time enabled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::channel(Duration::ZERO);
    /// tx.send("k", 1).await.unwrap();
    /// let batch = poll_fn(|cx| rx.poll_recv(cx)).await;
    /// assert_eq!(batch, Some(vec![("k", vec![1])]));
    /// # }
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch<K, V>>> {
        self.inner.poll_recv(cx)
    }

    /// Takes the next batch if a key is due now.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] if no key is due yet, and [`TryRecvError::Disconnected`] once
    /// the channel is closed and drained.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::{error::TryRecvError, timed};
    ///
    /// let (tx, mut rx) = timed::channel(Duration::ZERO);
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    /// tx.try_send("k", 1).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
    /// ```
    pub fn try_recv(&mut self) -> Result<Batch<K, V>, TryRecvError> {
        self.inner.try_recv()
    }

    /// Hands back values whose delivery failed, so they are delivered again.
    ///
    /// The values go in front of every pending value of the key, those handed back before
    /// included (to keep several failed parts of a key in order, hand them back newest
    /// first), and the key is due at once. After a close, a key that had nothing pending is
    /// due as of the close: it goes out after the keys that were due by then, and before
    /// those the close made due. A requeue always has room: it may take the pending count
    /// past the capacity. An empty `values` changes nothing.
    ///
    /// # Errors
    ///
    /// Once a receiver (this one or any clone) has seen the end of the stream (`recv` or the
    /// stream returned `None`, or `try_recv` returned `Disconnected`), nothing will be
    /// delivered again, and the key and values come back in the error.
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
    /// tx.send("k", 1).await.unwrap();
    /// let (key, values) = rx.recv().await.unwrap().remove(0);
    /// tx.send("k", 2).await.unwrap();
    /// // Delivery failed: put the values back.
    /// rx.requeue(key, values).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 2])]));
    /// # }
    /// ```
    pub fn requeue(&self, key: K, values: Vec<V>) -> Result<(), SendError<(K, Vec<V>)>> {
        let requeued = self.inner.requeue(Due::Now(Reason::Deadline), key, values);
        requeued.map_err(|err| err.map(without_due))
    }

    /// When the next batch is due: the earliest deadline among pending keys, or, once the
    /// channel is closed, the earlier of that and the time it closed, since everything is
    /// then due at once. A deadline before the channel was made counts as the moment it was
    /// made.
    ///
    /// `None` when nothing is pending, or, before the channel closes, when no pending key
    /// has a deadline it can reach: a deadline more than about 146 years after the channel
    /// was made cannot be represented, and waits for a flush or a close.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// assert_eq!(rx.next_deadline(), None);
    /// tx.send("a", 1).await.unwrap();
    /// assert_eq!(rx.next_deadline(), Some(Instant::now() + Duration::from_secs(1)));
    /// rx.close();
    /// assert_eq!(rx.next_deadline(), Some(Instant::now()));
    /// # }
    /// ```
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }

    /// Takes everything pending now, deadlines ignored, as batches split by the caps.
    ///
    /// It is for shutdown paths that cannot wait. The channel stays open.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::Builder::new(Duration::from_secs(60)).max_batch(2).build();
    /// for v in 0..3 {
    ///     tx.try_send("k", v).unwrap();
    /// }
    /// assert_eq!(rx.drain_now(), vec![vec![("k", vec![0, 1])], vec![("k", vec![2])]]);
    /// assert!(rx.is_empty());
    /// ```
    pub fn drain_now(&mut self) -> Vec<Batch<K, V>> {
        self.inner.drain_now()
    }
}

impl<K, V> Receiver<K, V> {
    /// Closes the channel for sending, without dropping what is pending.
    ///
    /// Sends then fail and hand their value back. Every pending key becomes due at once, and
    /// the stream ends once they are delivered. Waiting senders and receivers are woken.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::channel(Duration::from_secs(3600));
    /// tx.send("k", 1).await.unwrap();
    /// rx.close();
    /// assert!(tx.send("k", 2).await.is_err());
    /// assert_eq!(rx.recv().await, Some(vec![("k", vec![1])])); // no hour-long wait
    /// assert_eq!(rx.recv().await, None);
    /// # }
    /// ```
    pub fn close(&self) {
        self.inner.close()
    }

    /// Pending values, over all keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("a", 2).unwrap();
    /// assert_eq!(rx.len(), 2);
    /// assert_eq!(rx.key_count(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Pending keys: keys with at least one pending value.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("b", 2).unwrap();
    /// assert_eq!(rx.key_count(), 2);
    /// ```
    pub fn key_count(&self) -> usize {
        self.inner.key_count()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// assert!(rx.is_empty());
    /// tx.try_send("a", 1).unwrap();
    /// assert!(!rx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the channel is closed for sending.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel::<u8, u8>(Duration::from_secs(1));
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::channel(Duration::from_secs(1));
    /// tx.try_send("a", 1).unwrap();
    /// assert_eq!(rx.stats().pending_keys, 1);
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl<K: Hash + Eq + Clone, V> Stream for Receiver<K, V> {
    type Item = Batch<K, V>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx)
    }
}

/// The stream is terminated once this receiver has returned `None` (from `recv`,
/// `poll_recv` or the stream; `try_recv` returning `Disconnected` does not count): the
/// channel is closed and drained, and stays so. A clone of a terminated receiver starts terminated.
impl<K: Hash + Eq + Clone, V> FusedStream for Receiver<K, V> {
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

impl<K, V> Clone for Receiver<K, V> {
    fn clone(&self) -> Self {
        Receiver {
            inner: self.inner.clone(),
        }
    }
}

impl<K, V> fmt::Debug for Receiver<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

/// Receives batches of [`Delivery`]s from an acknowledging `timed` channel, made by
/// [`Builder::acked`].
///
/// Batches come out as from a [`Receiver`]: due keys in deadline order, under the same caps.
/// But each key comes as a [`Delivery`] to decide: [`ack`](Delivery::ack),
/// [`retry`](Delivery::retry), [`retry_after`](Delivery::retry_after) or
/// [`give_up`](Delivery::give_up); dropped undecided, it is retried at once.
///
/// A retried key is due by the earlier of its retry's time (the decision, or the end of a
/// `retry_after` delay; after the close, the close, or, for a key that went out for the
/// close, taken after it and not due by then, its deadline) and the deadline it had until
/// then. That is the one it went out with, which the rest of a key
/// that a batch split keeps; or, if nothing of the key was left pending and values were
/// sent for it while it was out, the earliest of theirs; in either case lowered by any
/// earlier one that values sent for it, or a flush (as of its time), or filling the key (as
/// of then) gave it while it was out or held. So once due again it comes before keys whose
/// deadlines are later than that, even keys that came due while it was out.
///
/// # Rules
///
/// 1. **One delivery per key in flight.** While a key has an undecided delivery, its other
///    values wait (newer ones, and the rest of a key that a batch split), and no receiver
///    gets them.
/// 2. **A retry joins the new values.** The failed values go back in front of the key's
///    newer values; while the key is held by `retry_after`, values sent for it join it, and
///    when the delay ends all of them go out in one delivery, bounded by the batch caps.
/// 3. **Capacity until the decision.** Values in flight count toward `capacity`,
///    `max_weight` and `max_keys` (toward `max_keys`, not those of a delivery that went
///    out unheld: see *Panics in user code* in the crate docs) until they are
///    acknowledged, given up or dead-lettered: room returns on the decision, not when the
///    batch is taken. Dead letters not yet taken count toward `capacity` and `max_weight`
///    too, but not toward `max_keys`: a key counts there only while it has values pending
///    or in flight.
/// 4. **Closing.** When the channel closes, everything is due at once, held retries
///    included. The stream ends only when nothing is pending and no delivery is
///    undecided, so a retry after the close still goes out.
/// 5. **Dropping every receiver.** Pending values and dead letters are dropped. Deliveries
///    still undecided can be decided: an acknowledgement counts as usual, and a retry, or a
///    delivery dropped undecided, drops its values. `Stats::lost` counts all of them. (A
///    durable channel's log keeps them: the next open hands them back.)
/// 6. **Exactly one decision per delivery**, which the types enforce: every value ends
///    acknowledged, given up or dead-lettered, or is pending or in flight.
///
/// A retry beyond the builder's `max_attempts` sends the values to the
/// [`dead_letters`](Self::dead_letters) stream instead of back into the queue.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::timed;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let (tx, mut rx) = timed::Builder::new(Duration::from_millis(100)).acked();
/// tx.send("customer-1", "event").await.unwrap();
/// drop(tx);
/// let mut attempts = 0;
/// while let Some(batch) = rx.recv().await {
///     for delivery in batch {
///         attempts += 1;
///         if delivery.attempt() < 3 {
///             delivery.retry_after(Duration::from_secs(1)).await.unwrap(); // the push failed
///         } else {
///             delivery.ack().await.unwrap();
///         }
///     }
/// }
/// assert_eq!(attempts, 3);
/// # }
/// ```
pub struct AckReceiver<K, V> {
    inner: chan::Rx<Deadlines, K, V>,
}

impl<K, V> AckReceiver<K, V>
where
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
    /// Panics if it has to wait for a deadline outside a tokio runtime with time enabled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    /// tx.send("k", 1).await.unwrap();
    /// drop(tx);
    /// let batch = rx.recv().await.unwrap();
    /// assert_eq!(batch[0].values(), &[1]);
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
    /// Panics if it has to wait for a deadline outside a tokio runtime with time enabled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    /// tx.send("k", 1).await.unwrap();
    /// let batch = poll_fn(|cx| rx.poll_recv(cx)).await.unwrap();
    /// assert_eq!(batch[0].key(), &"k");
    /// # }
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Vec<Delivery<K, V>>>> {
        self.inner.poll_deliveries(cx)
    }

    /// Takes the next batch of deliveries if a key is due now.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] if no key is due yet, and [`TryRecvError::Disconnected`] once
    /// the channel is closed, drained, and every delivery decided.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::{error::TryRecvError, timed};
    ///
    /// let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    /// assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    /// tx.try_send("k", 1).unwrap();
    /// assert_eq!(rx.try_recv().unwrap()[0].values(), &[1]);
    /// ```
    pub fn try_recv(&mut self) -> Result<Vec<Delivery<K, V>>, TryRecvError> {
        self.inner.try_recv_deliveries()
    }

    /// Takes everything pending now, deadlines ignored, as batches of deliveries split by
    /// the caps. Keys in flight stay in flight: their newer values are not taken, nor the
    /// rest of a key that a cap split, which waits for the first part's decision. Keys held
    /// by [`Delivery::retry_after`] wait out their delay (a close ends it), as they do for
    /// `recv`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::Builder::new(Duration::from_secs(60)).acked();
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("b", 2).unwrap();
    /// let batches = rx.drain_now();
    /// assert_eq!(batches.len(), 1);
    /// assert_eq!(batches[0].len(), 2);
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_attempts(1).acked();
    /// let mut dead = rx.dead_letters();
    /// tx.send("k", 1).await.unwrap();
    /// rx.recv().await.unwrap().remove(0).retry().await.unwrap();
    /// assert_eq!(dead.recv().await.unwrap().values, vec![1]);
    /// # }
    /// ```
    pub fn dead_letters(&self) -> DeadLetters<K, V> {
        self.inner.dead_letters()
    }

    /// When the next batch is due, as [`Receiver::next_deadline`] says; a key held by
    /// `retry_after` counts from when its delay ends, and a retried key, once released, by
    /// the deadline [`AckReceiver`] says it is due by. The newer values of a key in flight
    /// have no deadline until its delivery is decided: `None` if only they are pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked::<&str, u8>();
    /// tx.send("k", 1).await.unwrap();
    /// assert_eq!(rx.next_deadline(), Some(Instant::now() + Duration::from_secs(1)));
    /// # }
    /// ```
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }
}

impl<K, V> AckReceiver<K, V> {
    /// Closes the channel for sending, as [`Receiver::close`] does. The stream ends once
    /// everything is delivered and decided.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked::<&str, u8>();
    /// rx.close();
    /// assert!(tx.try_send("k", 1).is_err());
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    /// tx.try_send("k", 1).unwrap();
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    /// tx.try_send("a", 1).unwrap();
    /// tx.try_send("b", 2).unwrap();
    /// assert_eq!(rx.key_count(), 2);
    /// ```
    pub fn key_count(&self) -> usize {
        self.inner.key_count()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked::<&str, u8>();
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1)).acked::<&str, u8>();
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
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    /// tx.try_send("k", 1).unwrap();
    /// let batch = rx.try_recv().unwrap();
    /// assert_eq!(rx.stats().in_flight_values, 1);
    /// drop(batch); // undecided: retried
    /// assert_eq!(rx.stats().retried, 1);
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl<K, V> Stream for AckReceiver<K, V>
where
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
impl<K, V> FusedStream for AckReceiver<K, V>
where
    K: Hash + Eq + Clone + Send + 'static,
    V: Send + 'static,
{
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

impl<K, V> Clone for AckReceiver<K, V> {
    fn clone(&self) -> Self {
        AckReceiver {
            inner: self.inner.clone(),
        }
    }
}

impl<K, V> fmt::Debug for AckReceiver<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckReceiver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_packs_time_and_reason() {
        for reason in [Reason::Deadline, Reason::FullKey, Reason::Flush] {
            let d = Deadline::new(123_456_789, reason);
            assert_eq!((d.at(), d.reason()), (123_456_789, reason));
        }
        // Only the time orders deadlines; the reason rides along.
        assert_eq!(
            Deadline::new(5, Reason::Flush),
            Deadline::new(5, Reason::Deadline)
        );
        assert!(Deadline::new(4, Reason::Flush) < Deadline::new(5, Reason::Deadline));
        // Times past the 62 bits saturate to never, instead of spilling into the reason.
        let far = Deadline::new(u64::MAX, Reason::Deadline);
        assert_eq!(
            (far.at(), far.reason()),
            (Deadline::NEVER, Reason::Deadline)
        );
        assert!(!Deadlines::is_due(&far, u64::MAX));
        assert_eq!(Deadlines::deadline(&far), None);
        // What is due at once stays due past the range.
        let now = Deadline::at_once(u64::MAX, Reason::Flush);
        assert_eq!(
            (now.at(), now.reason()),
            (Deadline::NEVER - 1, Reason::Flush)
        );
        assert!(Deadlines::is_due(&now, u64::MAX));
    }
}
