//! Acknowledged deliveries: the [`Delivery`] an acknowledging receiver hands out for each key
//! of a batch, the [`Decided`] future its decisions return, and the [`DeadLetters`] stream
//! that takes values retried too often.
//!
//! Every mode that acknowledges hands out these same types, so code written against one
//! moves to another.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use keyed_batch::timed;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (tx, mut rx) = timed::Builder::new(Duration::from_millis(100)).acked();
//! tx.send("customer-1", "order placed").await.unwrap();
//!
//! let mut batch = rx.recv().await.unwrap();
//! let delivery = batch.remove(0);
//! assert_eq!(delivery.key(), &"customer-1");
//! assert_eq!(delivery.attempt(), 1);
//! // The push failed: try again in a second. The key's newer values wait behind it.
//! delivery.retry_after(Duration::from_secs(1)).await.unwrap();
//!
//! let delivery = rx.recv().await.unwrap().remove(0);
//! assert_eq!(delivery.attempt(), 2);
//! delivery.ack().await.unwrap();
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::{FusedStream, Stream};
use tokio::time::Instant;

use crate::error::{DeliveryError, TryRecvError};

/// One key's share of a batch from an acknowledging receiver: the key, its values in the
/// order they were sent, and a decision to make about them.
///
/// While a key has a delivery that is not decided, its newer values wait: no receiver gets
/// them (in Redis, while the delivery's lease holds; in memory, unless the key cannot be
/// held: see *Panics in user code* in the crate docs). Decide each delivery with exactly
/// one of [`ack`](Self::ack) (done), [`retry`](Self::retry) or
/// [`retry_after`](Self::retry_after) (the values go back in front of the key's newer
/// values), or [`give_up`](Self::give_up) (the values leave the channel and come back to
/// you). Each takes the delivery, so the types allow only one.
///
/// Dropping a delivery undecided retries it at once, as [`retry`](Self::retry) does: a
/// consumer task that panics or is cancelled halfway loses nothing, and the values come
/// back with the next attempt (or, past `max_attempts`, go to the dead letters; in memory,
/// once every receiver is gone, they are dropped:
/// [rule 5](crate::timed::AckReceiver#rules)). In Redis the retry, as any decision, is
/// sent by a task on the runtime (see [`Decided`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut rx) = ordered::Builder::new().acked();
/// tx.send(1, "k", 'a').await.unwrap();
/// let delivery = rx.recv().await.unwrap().remove(0);
/// assert_eq!(delivery.values(), &['a']);
/// drop(delivery); // undecided: retried at once
/// let delivery = rx.recv().await.unwrap().remove(0);
/// assert_eq!((delivery.attempt(), delivery.values()), (2, &['a'][..]));
/// let (key, values) = delivery.give_up().await.unwrap();
/// assert_eq!((key, values), ("k", vec!['a']));
/// # }
/// ```
pub struct Delivery<K, V> {
    /// The key and values, until a decision takes them.
    body: Option<(K, Vec<V>)>,
    attempt: u32,
    entered: Instant,
    id: u64,
    link: Arc<dyn Link<K, V>>,
}

/// What happens to a delivery: the argument of [`Link::decide`].
pub(crate) enum Decision<K, V> {
    Ack,
    GiveUp,
    /// The values go back in front of the key's, which is held for `after`.
    Retry {
        after: Duration,
        key: K,
        values: Vec<V>,
    },
}

/// Where a delivery's decisions go, and where dead letters come from: the channel that
/// made it. A mode that acknowledges implements it.
pub(crate) trait Link<K, V>: Send + Sync {
    /// Makes the decision about the delivery `id`.
    fn decide(&self, id: u64, decision: Decision<K, V>) -> Decided<()>;

    /// Acknowledges the deliveries `ids` at once.
    fn ack_all(&self, ids: &[u64]) -> Decided<()>;

    /// Polls for the next dead letter; `waiting` is the caller's place among those waiting.
    fn poll_dead(
        &self,
        waiting: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<DeadLetter<K, V>>>;

    /// Takes the next dead letter if there is one.
    fn try_dead(&self) -> Result<DeadLetter<K, V>, TryRecvError>;

    /// Gives up a place among those waiting for dead letters.
    fn stop_dead(&self, waiting: &mut Option<u64>);
}

impl<K, V> Delivery<K, V> {
    pub(crate) fn new(
        key: K,
        values: Vec<V>,
        attempt: u32,
        entered: Instant,
        id: u64,
        link: Arc<dyn Link<K, V>>,
    ) -> Self {
        Delivery {
            body: Some((key, values)),
            attempt,
            entered,
            id,
            link,
        }
    }

    /// The key.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// assert_eq!(rx.try_recv().unwrap()[0].key(), &"k");
    /// ```
    pub fn key(&self) -> &K {
        &self.body.as_ref().expect("undecided").0
    }

    /// The values, in the order they were sent: those that came back from a retry first
    /// (for a key that cannot be held, see *Panics in user code* in the crate docs).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// tx.try_send(0, "k", 2).unwrap();
    /// assert_eq!(rx.try_recv().unwrap()[0].values(), &[1, 2]);
    /// ```
    pub fn values(&self) -> &[V] {
        &self.body.as_ref().expect("undecided").1
    }

    /// How many times the first of these values has been handed out, this time included.
    /// Values that come back go in front of newer ones, so this is most often the most
    /// among them; not always for a key that cannot be held (see *Panics in user code* in
    /// the crate docs), whose retries go back in the order they are made, nor in a reopened
    /// durable channel.
    ///
    /// It is 1 on a first delivery. A value that comes back never has attempt 1 again, not
    /// even in the part of a key that a batch cap split off (but for a durable channel
    /// reopened after a crash, which hands a delivery that was in flight out again as the
    /// same attempt: see `durable`, *Recovery*). Values sent while their key's
    /// values were retried go out with those and share this count: with `max_attempts`,
    /// they may reach the dead letters after fewer attempts of their own.
    ///
    /// Read it before deciding, since the decisions take the delivery:
    /// `let attempt = delivery.attempt(); delivery.retry_after(backoff(attempt))`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// let first = rx.try_recv().unwrap().remove(0);
    /// assert_eq!(first.attempt(), 1);
    /// first.retry().await.unwrap();
    /// assert_eq!(rx.try_recv().unwrap()[0].attempt(), 2);
    /// # }
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the oldest of these values entered the channel. It is exact unless a batch cap
    /// split the key: the rest of a split key may report when the part that went before it
    /// entered, which is earlier, even when the rest holds only values that came while that
    /// part was out.
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
    /// let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    /// let start = Instant::now();
    /// tx.send("k", 1).await.unwrap();
    /// let delivery = rx.recv().await.unwrap().remove(0);
    /// assert_eq!(delivery.entered(), start);
    /// assert_eq!(delivery.entered().elapsed(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn entered(&self) -> Instant {
        self.entered
    }

    /// Acknowledges the delivery: the values are done and leave the channel. Room for them
    /// comes back, and the key's newer values may go out.
    ///
    /// The decision is made when this is called; the future tells whether it took effect.
    ///
    /// # Errors
    ///
    /// A [`DeliveryError`] if the decision did not take effect, or (an I/O error) may not
    /// have. A channel without a log (`acked()`, not `durable`) never returns one.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().capacity(1).acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// let delivery = rx.try_recv().unwrap().remove(0);
    /// assert!(tx.try_send(0, "k", 2).is_err(), "room comes back on ack, not on take");
    /// delivery.ack().await.unwrap();
    /// tx.try_send(0, "k", 2).unwrap();
    /// # }
    /// ```
    pub fn ack(mut self) -> Decided<()> {
        self.body = None;
        self.link.decide(self.id, Decision::Ack)
    }

    /// Retries at once: the values go back in front of the key's newer values, and the key
    /// is due again now, with every value that came meanwhile, as [`retry_after`] with a
    /// zero delay does.
    ///
    /// # Errors
    ///
    /// As for [`ack`](Self::ack).
    ///
    /// [`retry_after`]: Self::retry_after
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// let delivery = rx.try_recv().unwrap().remove(0);
    /// tx.try_send(0, "k", 2).unwrap(); // waits: "k" is in flight
    /// assert!(rx.try_recv().is_err());
    /// delivery.retry().await.unwrap();
    /// assert_eq!(rx.try_recv().unwrap()[0].values(), &[1, 2]);
    /// # }
    /// ```
    pub fn retry(self) -> Decided<()> {
        self.retry_after(Duration::ZERO)
    }

    /// Retries after `delay`: the values go back in front of the key's newer values, and
    /// the key is held until `delay` has passed (a key that cannot be held goes back at once:
    /// see *Panics in user code* in the crate docs). Values sent for it meanwhile join it, and
    /// when the delay ends all of them go out in one delivery, still bounded by the batch
    /// caps, with the failed values first.
    ///
    /// A retry beyond the builder's `max_attempts` sends the values to the dead letters
    /// instead. Once the channel is closed, the delay is not waited for. In memory, a delay
    /// whose end is past what the channel's clock can hold (about 584 years after it was
    /// made) never ends: the key waits for the close.
    ///
    /// # Errors
    ///
    /// As for [`ack`](Self::ack).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    /// tx.send("k", 1).await.unwrap();
    /// let delivery = rx.recv().await.unwrap().remove(0);
    /// delivery.retry_after(Duration::from_secs(5)).await.unwrap();
    /// tx.send("k", 2).await.unwrap();
    /// let start = tokio::time::Instant::now();
    /// let delivery = rx.recv().await.unwrap().remove(0);
    /// assert_eq!(delivery.values(), &[1, 2]);
    /// assert_eq!(start.elapsed(), Duration::from_secs(5));
    /// # }
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Decided<()> {
        let (key, values) = self.body.take().expect("undecided");
        let retry = Decision::Retry {
            after: delay,
            key,
            values,
        };
        self.link.decide(self.id, retry)
    }

    /// Gives up on the values: they leave the channel and come back to the caller with
    /// the key. Room for them comes back, and the key's newer values may go out.
    ///
    /// # Errors
    ///
    /// As for [`ack`](Self::ack); the values do not come back then.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = ordered::Builder::new().acked();
    /// tx.try_send(0, "k", 1).unwrap();
    /// let delivery = rx.try_recv().unwrap().remove(0);
    /// assert_eq!(delivery.give_up().await.unwrap(), ("k", vec![1]));
    /// assert_eq!(rx.stats().given_up, 1);
    /// # }
    /// ```
    pub fn give_up(mut self) -> Decided<(K, Vec<V>)>
    where
        K: Send + 'static,
        V: Send + 'static,
    {
        let body = self.body.take().expect("undecided");
        self.link.decide(self.id, Decision::GiveUp).map(body)
    }
}

/// Acknowledges every delivery in `deliveries` at once, as [`Delivery::ack`] does for each:
/// each run of consecutive deliveries from one channel is decided under one lock, which is
/// cheaper than one lock each when a consumer has pushed a whole batch.
///
/// # Errors
///
/// As for [`Delivery::ack`]: the first error, if any decision did not take effect.
///
/// # Examples
///
/// ```
/// use keyed_batch::{ack, ordered};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut rx) = ordered::Builder::new().acked();
/// for key in ["a", "b", "c"] {
///     tx.try_send(0, key, ()).unwrap();
/// }
/// let batch = rx.try_recv().unwrap();
/// ack::ack_all(batch).await.unwrap();
/// assert_eq!(rx.stats().acked, 3);
/// # }
/// ```
pub fn ack_all<K, V>(deliveries: impl IntoIterator<Item = Delivery<K, V>>) -> Decided<()> {
    // Collected first: should the caller's iterator panic, the deliveries it already gave
    // are dropped undecided, and so retried, not lost.
    let deliveries: Vec<_> = deliveries.into_iter().collect();
    let mut decided = Vec::new();
    // A panic of user code in one channel's decisions (they all take effect even so) waits
    // until the other channels' are made.
    let mut panicked = None;
    let mut ack = |link: Arc<dyn Link<K, V>>, ids: &[u64]| {
        let one = panic::catch_unwind(AssertUnwindSafe(|| link.ack_all(ids)));
        match one {
            Ok(one) => decided.push(one),
            Err(panic) => {
                panicked.get_or_insert(panic);
            }
        }
    };
    let mut ids = Vec::new();
    let mut link: Option<Arc<dyn Link<K, V>>> = None;
    for mut delivery in deliveries {
        // Decided here: the drop below must not retry it.
        delivery.body = None;
        let same = link
            .as_ref()
            .is_some_and(|l| Arc::as_ptr(l).cast::<()>() == Arc::as_ptr(&delivery.link).cast());
        if !same {
            if let Some(link) = link.take() {
                ack(link, &ids);
                ids.clear();
            }
            link = Some(Arc::clone(&delivery.link));
        }
        ids.push(delivery.id);
    }
    if let Some(link) = link {
        ack(link, &ids);
    }
    if let Some(panic) = panicked {
        panic::resume_unwind(panic);
    }
    Decided::<()>::all(decided)
}

impl<K, V> Drop for Delivery<K, V> {
    fn drop(&mut self) {
        // Undecided: retried at once, so nothing is lost.
        if let Some((key, values)) = self.body.take() {
            let retry = Decision::Retry {
                after: Duration::ZERO,
                key,
                values,
            };
            // The in-memory decision is made here; an I/O one runs on its own. A panic of
            // user code in it (the decision takes effect even so) goes on, unless this drop
            // is part of another panic's unwinding, which a second panic would abort.
            let decide = || drop(self.link.decide(self.id, retry));
            if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(decide)) {
                if !std::thread::panicking() {
                    panic::resume_unwind(panic);
                }
            }
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Delivery<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Delivery");
        if let Some((key, values)) = &self.body {
            d.field("key", key).field("values", values);
        }
        d.field("attempt", &self.attempt)
            .field("entered", &self.entered)
            .finish_non_exhaustive()
    }
}

/// The future a decision on a [`Delivery`] returns: it resolves once the decision has
/// taken effect, or with the reason it did not.
///
/// The decision is made when the method is called, not when the future is polled:
/// dropping the future does not undo it (in a durable channel, its record is still written,
/// by the log's thread, a moment later). For `give_up`, the values come back only through
/// the future: dropping it drops them. A channel without a log resolves it at once, and a
/// durable one once the decision is written to its log (see the `durable` module). In Redis
/// the decision is sent by a task on the tokio runtime: should the runtime stop before
/// that task runs (a `main` that returns at once), the decision never reaches the server,
/// and the values go out again once their lease runs out, as for a process that dies.
#[must_use = "the decision is made; await the future to learn whether it took effect"]
pub struct Decided<T> {
    state: DecidedState<T>,
}

enum DecidedState<T> {
    Done(Option<Result<T, DeliveryError>>),
    Waiting(Pin<Box<dyn Future<Output = Result<T, DeliveryError>> + Send>>),
}

impl<T> Decided<T> {
    /// A decision that has taken effect, or failed, already.
    pub(crate) fn done(result: Result<T, DeliveryError>) -> Self {
        Decided {
            state: DecidedState::Done(Some(result)),
        }
    }

    /// A decision that takes effect when `future` resolves.
    #[allow(dead_code)] // for modes whose decisions are I/O
    pub(crate) fn waiting(
        future: impl Future<Output = Result<T, DeliveryError>> + Send + 'static,
    ) -> Self {
        Decided {
            state: DecidedState::Waiting(Box::pin(future)),
        }
    }

    /// The decisions in `all`: the first error, once every one is resolved.
    fn all(all: Vec<Decided<()>>) -> Decided<()> {
        let ready = all.iter().all(|d| matches!(d.state, DecidedState::Done(_)));
        if ready {
            let mut outcome = Ok(());
            for decided in all {
                if let DecidedState::Done(Some(Err(err))) = decided.state {
                    outcome = outcome.and(Err(err));
                }
            }
            return Decided::done(outcome);
        }
        Decided::waiting(async move {
            let mut outcome = Ok(());
            for decided in all {
                outcome = outcome.and(decided.await);
            }
            outcome
        })
    }

    /// Replaces what a successful decision resolves to.
    fn map<U: Send + 'static>(self, value: U) -> Decided<U>
    where
        T: 'static,
    {
        match self.state {
            DecidedState::Done(result) => {
                let result = result.expect("not yet resolved");
                Decided::done(result.map(|_| value))
            }
            DecidedState::Waiting(future) => Decided {
                state: DecidedState::Waiting(Box::pin(async move { future.await.map(|_| value) })),
            },
        }
    }
}

impl<T> Future for Decided<T> {
    type Output = Result<T, DeliveryError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            DecidedState::Done(result) => {
                Poll::Ready(result.take().expect("Decided polled after it resolved"))
            }
            DecidedState::Waiting(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> Unpin for Decided<T> {}

impl<T> fmt::Debug for Decided<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decided").finish_non_exhaustive()
    }
}

/// Values whose delivery was retried, or dropped undecided, on its last attempt (the
/// builder's `max_attempts`; in Redis, also values whose lease ran out on it): they left the
/// queue and wait in the [`DeadLetters`] stream.
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
/// tx.try_send(0, "k", 1).unwrap();
/// rx.try_recv().unwrap().remove(0).retry().await.unwrap();
/// let letter = dead.try_recv().unwrap();
/// assert_eq!((letter.key, letter.values, letter.attempts), ("k", vec![1], 1));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter<K, V> {
    /// The key.
    pub key: K,
    /// Its values, in the order they were sent.
    pub values: Vec<V>,
    /// How many times the first of them was handed out: the last delivery's
    /// [`attempt`](Delivery::attempt), which values that joined the key while it was out
    /// share.
    pub attempts: u32,
}

/// The stream of [`DeadLetter`]s: values retried on their last attempt (`max_attempts`),
/// taken from an acknowledging receiver with `dead_letters()`.
///
/// In memory, dead letters waiting to be taken count toward the channel's `capacity` and
/// `max_weight`: with either set, a dead-letter stream nobody reads shows up as
/// backpressure on the senders, not as memory that grows. Without them, dead letters not
/// taken stay in memory until every receiver is gone, when they are dropped and counted in
/// `Stats::lost`. Clones share the dead letters: each goes to one of them. The stream ends
/// once the channel is closed, nothing is pending or in flight, and every dead letter was
/// taken, or once every receiver is gone.
///
/// A Redis queue's dead letters stay in Redis, outside its `capacity`, until a stream
/// takes them; the stream ends once the queue is closed and empty and no dead letter is
/// left, whether receivers remain or not; `try_recv` sees only letters already fetched
/// into this process (a call that finds none starts a fetch). See the `redis` module's
/// `Receiver::dead_letters`, with the `redis` feature.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use keyed_batch::ordered;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, mut rx) = ordered::Builder::new().max_attempts(2).acked();
/// let dead = rx.dead_letters();
/// tx.try_send(0, "k", 1).unwrap();
/// drop(tx);
/// while let Some(batch) = rx.recv().await {
///     for delivery in batch {
///         delivery.retry().await.unwrap(); // always fails
///     }
/// }
/// let letters: Vec<_> = dead.collect().await;
/// assert_eq!(letters.len(), 1);
/// assert_eq!(letters[0].attempts, 2);
/// # }
/// ```
pub struct DeadLetters<K, V> {
    link: Arc<dyn Link<K, V>>,
    waiting: Option<u64>,
    ended: bool,
}

impl<K, V> DeadLetters<K, V> {
    pub(crate) fn new(link: Arc<dyn Link<K, V>>) -> Self {
        DeadLetters {
            link,
            waiting: None,
            ended: false,
        }
    }

    /// Waits for the next dead letter; `None` once the stream has ended.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: if it is dropped before it completes, no dead letter
    /// was taken.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// let mut dead = rx.dead_letters();
    /// drop(tx);
    /// drop(rx);
    /// assert_eq!(dead.recv().await, None);
    /// # }
    /// ```
    pub async fn recv(&mut self) -> Option<DeadLetter<K, V>> {
        /// Stops waiting if `recv` is cancelled.
        struct Cancel<'a, K, V>(&'a mut DeadLetters<K, V>);
        impl<K, V> Drop for Cancel<'_, K, V> {
            fn drop(&mut self) {
                let dead = &mut *self.0;
                if dead.waiting.is_some() {
                    dead.link.stop_dead(&mut dead.waiting);
                }
            }
        }
        let cancel = Cancel(self);
        std::future::poll_fn(|cx| cancel.0.poll_recv(cx)).await
    }

    /// Polls for the next dead letter, for code that implements futures or streams by
    /// hand. `Poll::Ready(None)` once the stream has ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use keyed_batch::ordered;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// let mut dead = rx.dead_letters();
    /// drop((tx, rx));
    /// assert_eq!(poll_fn(|cx| dead.poll_recv(cx)).await, None);
    /// # }
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<DeadLetter<K, V>>> {
        let polled = self.link.poll_dead(&mut self.waiting, cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    /// Takes the next dead letter, if there is one.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] if none waits now, and [`TryRecvError::Disconnected`] once
    /// the stream has ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::{error::TryRecvError, ordered};
    ///
    /// let (tx, rx) = ordered::Builder::new().acked::<u8, &str, u8>();
    /// let mut dead = rx.dead_letters();
    /// assert_eq!(dead.try_recv(), Err(TryRecvError::Empty));
    /// # drop(tx);
    /// ```
    pub fn try_recv(&mut self) -> Result<DeadLetter<K, V>, TryRecvError> {
        self.link.try_dead()
    }
}

impl<K, V> Stream for DeadLetters<K, V> {
    type Item = DeadLetter<K, V>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx)
    }
}

impl<K, V> FusedStream for DeadLetters<K, V> {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl<K, V> Clone for DeadLetters<K, V> {
    fn clone(&self) -> Self {
        DeadLetters::new(Arc::clone(&self.link))
    }
}

impl<K, V> Drop for DeadLetters<K, V> {
    fn drop(&mut self) {
        if self.waiting.is_some() {
            self.link.stop_dead(&mut self.waiting);
        }
    }
}

impl<K, V> fmt::Debug for DeadLetters<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetters").finish_non_exhaustive()
    }
}
