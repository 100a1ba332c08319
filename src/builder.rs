//! The builder both flavours share: [`timed::Builder`](crate::timed::Builder) and
//! [`ordered::Builder`](crate::ordered::Builder) are this type, for one flavour each. The
//! limits they have in common are set here; each flavour adds its own, and `build`.

use std::fmt;
use std::marker::PhantomData;

use crate::config::Config;

/// Builds a channel with limits; see [`timed::Builder`](crate::timed::Builder) and
/// [`ordered::Builder`](crate::ordered::Builder).
///
/// Every limit is off by default. The crate docs have a table of all of them.
#[must_use = "a builder does nothing until `build` makes the channel"]
pub struct Builder<F, W = ()> {
    pub(crate) config: Config,
    pub(crate) weigher: W,
    flavor: PhantomData<fn() -> F>,
}

/// Marks a builder of `timed` channels.
#[derive(Debug)]
pub enum Timed {}

/// Marks a builder of `ordered` channels.
#[derive(Debug)]
pub enum Ordered {}

impl<F> Builder<F> {
    pub(crate) fn with(config: Config) -> Self {
        Builder {
            config,
            weigher: (),
            flavor: PhantomData,
        }
    }
}

impl<F, W> Builder<F, W> {
    /// Weighs each value when it is sent, and again when a receiver's `requeue` puts it
    /// back (a retried delivery keeps its weights): the weight limits then count weight
    /// instead of values.
    ///
    /// Typical use: `|body: &Vec<u8>| body.len()`, so that batches stay under a size. The
    /// total weight the channel holds (pending, and in an acknowledging channel in flight,
    /// in dead letters not yet taken, or waiting for its log record: more than
    /// `Stats::pending_weight` shows) must fit in a `usize`: a send that would overflow it
    /// panics, changing nothing (a value given to the `Sink` stays in it, for a later
    /// flush), but for one through the inbox, whose value is dropped and counted in
    /// `Stats::lost` instead (see the crate docs, *Panics in user code*).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed::Builder;
    ///
    /// let (tx, rx) = Builder::new(Duration::from_secs(1))
    ///     .weigher(|record: &String| record.len())
    ///     .build::<u32, String>();
    /// tx.try_send(1, "hello".to_string()).unwrap();
    /// assert_eq!(rx.stats().pending_weight, 5);
    /// ```
    pub fn weigher<V, G>(self, f: G) -> Builder<F, G>
    where
        G: Fn(&V) -> usize + Send + Sync + 'static,
    {
        Builder {
            config: self.config,
            weigher: f,
            flavor: PhantomData,
        }
    }

    /// Caps the number of values in one batch.
    ///
    /// A key with more values than the room left in a batch is split: its first values fill
    /// the batch (those a receiver's `requeue` put in front, then the oldest), and the rest
    /// keep the key's rank (lowered by any earlier deadline, or smaller sort key, sent for it
    /// since) and run, so they lead the next batch unless a key that ranks before them has
    /// come due meanwhile (a smaller rank, or an equal one whose run started earlier). In an
    /// acknowledging channel the rest wait until the first part's delivery is decided.
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
    /// let (tx, mut rx) = Builder::new(Duration::ZERO).max_batch(2).build();
    /// for v in 1..=3 {
    ///     tx.send("k", v).await.unwrap();
    /// }
    /// assert_eq!(rx.recv().await, Some(vec![("k", vec![1, 2])]));
    /// assert_eq!(rx.recv().await, Some(vec![("k", vec![3])]));
    /// # }
    /// ```
    #[track_caller]
    pub fn max_batch(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_batch, n, "max_batch");
        self
    }

    /// Caps the total weight of one batch, splitting keys as [`max_batch`](Self::max_batch)
    /// does. A single value heavier than `n` goes out alone rather than being stuck.
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
    /// let (tx, mut rx) = Builder::new(Duration::ZERO)
    ///     .weigher(|body: &&str| body.len())
    ///     .max_batch_weight(8)
    ///     .build();
    /// tx.try_send("k", "hello").unwrap();
    /// tx.try_send("k", "world").unwrap();
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!["hello"])]));
    /// assert_eq!(rx.try_recv(), Ok(vec![("k", vec!["world"])]));
    /// ```
    #[track_caller]
    pub fn max_batch_weight(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_batch_weight, n, "max_batch_weight");
        self
    }

    /// Bounds the pending values: `send` waits and `try_send` fails while `n` are pending.
    ///
    /// Room returns as soon as a batch is taken. Requeued values count as pending but are
    /// always accepted, so the pending count can exceed `n`. In an acknowledging channel,
    /// values in flight count too until their delivery is decided, and dead letters until
    /// they are taken (rule 3 of the acknowledging receivers). In a durable channel, a
    /// `send` holds its room (and weight, for `max_weight`) from when its record is written
    /// until it resolves; meanwhile its value is not in `len()` or `Stats::pending_values`.
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
    /// let (tx, rx) = Builder::new(Duration::from_secs(1)).capacity(1).build();
    /// tx.try_send("k", 1).unwrap();
    /// assert!(tx.try_send("k", 2).unwrap_err().is_full());
    /// # drop(rx);
    /// ```
    #[track_caller]
    pub fn capacity(mut self, n: usize) -> Self {
        Config::set(&mut self.config.capacity, n, "capacity");
        self
    }

    /// Bounds the pending weight, as a memory budget: a value goes in only if the pending
    /// weight stays at or under `n` with it (or nothing is pending), else `send` waits and
    /// `try_send` fails. In an acknowledging channel, values in flight count as pending here
    /// until their delivery is decided, and dead letters until they are taken (rule 3 of the
    /// acknowledging receivers). In a durable channel, a `send` whose record is being
    /// written counts as pending here too, though not in `Stats::pending_weight`.
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
    /// let (tx, rx) = Builder::new(Duration::from_secs(1))
    ///     .weigher(|body: &Vec<u8>| body.len())
    ///     .max_weight(1024)
    ///     .build();
    /// tx.try_send("k", vec![0; 1000]).unwrap();
    /// assert!(tx.try_send("k", vec![0; 100]).unwrap_err().is_full());
    /// tx.try_send("k", vec![0; 24]).unwrap();
    /// # drop(rx);
    /// ```
    #[track_caller]
    pub fn max_weight(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_weight, n, "max_weight");
        self
    }

    /// Bounds the pending keys: a value for a key that is not pending waits (`send`) or is
    /// refused (`try_send`) while `n` keys are pending. Values for pending keys still go in,
    /// though not past a send that waits for room (see *Limits* in the crate docs).
    /// In an acknowledging channel, a key in flight counts as pending here until its
    /// delivery is decided, and values for it go in (rule 3 of the acknowledging receivers),
    /// unless that delivery went out unheld, its key's `Clone` having panicked (see *Panics
    /// in user code* in the crate docs).
    /// In a durable channel, a `send` for a key that is not pending takes a key slot when its
    /// record is written, and holds it while the record becomes durable, before its value
    /// goes in; a second `send` of that key meanwhile needs a slot of its own. A durable
    /// `send` for a pending key keeps that key's slot taken until its value goes in, even if
    /// the key is delivered and decided meanwhile.
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
    /// let (tx, rx) = Builder::new(Duration::from_secs(1)).max_keys(1).build();
    /// tx.try_send("a", 1).unwrap();
    /// assert!(tx.try_send("b", 2).unwrap_err().is_full());
    /// tx.try_send("a", 3).unwrap();
    /// # drop(rx);
    /// ```
    #[track_caller]
    pub fn max_keys(mut self, n: usize) -> Self {
        Config::set(&mut self.config.max_keys, n, "max_keys");
        self
    }

    /// For an acknowledging channel (`acked()`, or durable; `build()` ignores it): the most
    /// times values are handed out. A retry after the `n`-th attempt sends them to the dead
    /// letters instead of back into the queue. The default is `u32::MAX`, as good as none:
    /// values are retried for as long as they fail, up to that many attempts.
    ///
    /// A delivery's attempt is its first value's count (see
    /// [`Delivery::attempt`](crate::ack::Delivery::attempt)), and values sent while their
    /// key was being retried join it: they go to the dead letters with it.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::ordered::Builder;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (tx, mut rx) = Builder::new().max_attempts(2).acked();
    /// let mut dead = rx.dead_letters();
    /// tx.try_send(0, "k", 1).unwrap();
    /// rx.try_recv().unwrap().remove(0).retry().await.unwrap(); // attempt 1 failed
    /// rx.try_recv().unwrap().remove(0).retry().await.unwrap(); // attempt 2 failed
    /// assert_eq!(dead.try_recv().unwrap().attempts, 2);
    /// # }
    /// ```
    #[track_caller]
    pub fn max_attempts(mut self, n: u32) -> Self {
        assert!(n > 0, "max_attempts must be at least 1");
        self.config.max_attempts = n;
        self
    }
}

#[cfg(feature = "durable")]
impl<F, W> Builder<F, W> {
    /// Makes the channel durable, with its log in `dir`: every value sent is written there
    /// before `send` returns, and the channel acknowledges its deliveries. Set the fsync
    /// policy on the [`DurableBuilder`](crate::durable::DurableBuilder) this returns, then
    /// `open` it. See [`durable`](crate::durable).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_batch::timed;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("kb-doc-d-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// let (tx, rx) = timed::Builder::new(Duration::from_secs(1))
    ///     .max_batch(500)
    ///     .durable(&dir)
    ///     .open::<u64, String>()
    ///     .await?;
    /// # drop((tx, rx));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
    pub fn durable(self, dir: impl AsRef<std::path::Path>) -> crate::durable::DurableBuilder<F, W> {
        crate::durable::DurableBuilder::new(self, dir.as_ref())
    }
}

impl<F, W: Clone> Clone for Builder<F, W> {
    fn clone(&self) -> Self {
        Builder {
            config: self.config.clone(),
            weigher: self.weigher.clone(),
            flavor: PhantomData,
        }
    }
}

impl<F, W> fmt::Debug for Builder<F, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
