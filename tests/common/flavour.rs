//! The `timed` and `ordered` channels behind one shape, for tests that run the same
//! operations on both: [`Flavour`], implemented by [`Timed`] and [`Ordered`], and the
//! [`Limits`] they are built with. Each builds a plain channel or an acknowledging one, and
//! their four receivers have one shape too: [`Receiving`].
//!
//! A send carries an `Arg`, what its value ranks by: a [`Due`] in `timed`, a sort key in
//! `ordered`. Errors hand back what the flavour hands back, sort key included.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use keyed_batch::ack::{DeadLetters, Delivery};
use keyed_batch::builder::Builder;
use keyed_batch::error::{SendError, TryRecvError, TrySendError};
use keyed_batch::stats::Stats;
use keyed_batch::{ordered, timed, Batch};
use tokio::time::Instant;

/// Builder limits; `None` leaves a limit off.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limits {
    pub(crate) max_batch: Option<usize>,
    pub(crate) capacity: Option<usize>,
    /// `max_values_per_key`: `timed` only.
    pub(crate) per_key: Option<usize>,
    pub(crate) max_batch_weight: Option<usize>,
    pub(crate) max_weight: Option<usize>,
    pub(crate) max_keys: Option<usize>,
    /// `max_key_weight`: `timed` only.
    pub(crate) key_weight: Option<usize>,
    /// `max_attempts`: acknowledging channels only.
    pub(crate) max_attempts: Option<u32>,
}

impl Limits {
    pub(crate) fn max_batch(&self) -> usize {
        self.max_batch.unwrap_or(usize::MAX)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity.unwrap_or(usize::MAX)
    }

    pub(crate) fn per_key(&self) -> usize {
        self.per_key.unwrap_or(usize::MAX)
    }

    pub(crate) fn max_batch_weight(&self) -> usize {
        self.max_batch_weight.unwrap_or(usize::MAX)
    }

    pub(crate) fn max_weight(&self) -> usize {
        self.max_weight.unwrap_or(usize::MAX)
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys.unwrap_or(usize::MAX)
    }

    pub(crate) fn key_weight(&self) -> usize {
        self.key_weight.unwrap_or(usize::MAX)
    }

    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts.unwrap_or(u32::MAX)
    }

    /// Sets the limits both flavours have.
    fn apply<F, W>(&self, mut builder: Builder<F, W>) -> Builder<F, W> {
        if let Some(n) = self.max_batch {
            builder = builder.max_batch(n);
        }
        if let Some(n) = self.capacity {
            builder = builder.capacity(n);
        }
        if let Some(n) = self.max_batch_weight {
            builder = builder.max_batch_weight(n);
        }
        if let Some(n) = self.max_weight {
            builder = builder.max_weight(n);
        }
        if let Some(n) = self.max_keys {
            builder = builder.max_keys(n);
        }
        if let Some(n) = self.max_attempts {
            builder = builder.max_attempts(n);
        }
        builder
    }
}

/// A builder's `weigher`.
pub(crate) type Weigher<V> = Box<dyn Fn(&V) -> usize + Send + Sync>;

/// A channel flavour, with keys `K` and values `V`, behind one shape.
pub(crate) trait Flavour<K, V> {
    /// What a send ranks its value by.
    type Arg: Copy + Debug + Send + 'static;
    /// What a refused send hands back.
    type Item: PartialEq + Debug;
    /// What a refused requeue hands back.
    type Back: PartialEq + Debug;
    type Tx: Clone + Send + Sync + 'static;
    /// The plain receiver.
    type Rx: Receiving<K, V, Batch = Batch<K, V>>;
    /// The acknowledging receiver.
    type AckRx: Receiving<K, V, Batch = Vec<Delivery<K, V>>>;

    /// A channel with `limits`, weighing values with `weigher` if there is one.
    ///
    /// # Panics
    ///
    /// If a limit is set that the flavour does not have.
    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx);
    /// As `build`, an acknowledging channel.
    fn build_acked(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::AckRx);
    /// What a refused send hands back.
    fn item(arg: Self::Arg, key: K, value: V) -> Self::Item;
    /// What a refused requeue hands back.
    fn back(arg: Self::Arg, key: K, values: Vec<V>) -> Self::Back;
    /// The key and values of what a refused requeue handed back.
    fn entry(back: Self::Back) -> (K, Vec<V>);
    fn try_send(
        tx: &Self::Tx,
        arg: Self::Arg,
        key: K,
        value: V,
    ) -> Result<(), TrySendError<Self::Item>>;
    fn send(
        tx: &Self::Tx,
        arg: Self::Arg,
        key: K,
        value: V,
    ) -> impl Future<Output = Result<(), SendError<Self::Item>>> + Send + '_;
    /// `requeue`; `timed` ignores `arg` (a requeued key is due at once).
    fn requeue(
        rx: &Self::Rx,
        arg: Self::Arg,
        key: K,
        values: Vec<V>,
    ) -> Result<(), SendError<Self::Back>>;
    fn dead_letters(rx: &Self::AckRx) -> DeadLetters<K, V>;
    /// `len` and `is_closed` of a sender.
    fn tx_state(tx: &Self::Tx) -> (usize, bool);
    fn tx_stats(tx: &Self::Tx) -> Stats;
}

/// A receiver, plain or acknowledging, of either flavour, behind one shape: what it hands
/// out is its `Batch`.
pub(crate) trait Receiving<K, V>: Clone + Send + 'static {
    /// A plain `Batch`, or the deliveries of an acknowledging receiver.
    type Batch: Send;

    fn recv(&mut self) -> impl Future<Output = Option<Self::Batch>> + Send + '_;
    fn try_recv(&mut self) -> Result<Self::Batch, TryRecvError>;
    fn drain_now(&mut self) -> Vec<Self::Batch>;
    fn close(&self);
    /// `len`, `key_count` and `is_closed`.
    fn state(&self) -> (usize, usize, bool);
    fn stats(&self) -> Stats;
    /// `next_deadline`; `ordered` receivers have none.
    fn next_deadline(&self) -> Option<Instant>;
}

/// Implements [`Receiving`] for a receiver type whose methods have these names; `$deadline`
/// is its `next_deadline`, given the receiver.
macro_rules! receiving {
    ($rx:ty, $batch:ty, $deadline:expr) => {
        impl<K, V> Receiving<K, V> for $rx
        where
            K: Hash + Eq + Clone + Send + 'static,
            V: Send + 'static,
        {
            type Batch = $batch;

            fn recv(&mut self) -> impl Future<Output = Option<$batch>> + Send + '_ {
                <$rx>::recv(self)
            }

            fn try_recv(&mut self) -> Result<$batch, TryRecvError> {
                <$rx>::try_recv(self)
            }

            fn drain_now(&mut self) -> Vec<$batch> {
                <$rx>::drain_now(self)
            }

            fn close(&self) {
                <$rx>::close(self);
            }

            fn state(&self) -> (usize, usize, bool) {
                (self.len(), self.key_count(), self.is_closed())
            }

            fn stats(&self) -> Stats {
                <$rx>::stats(self)
            }

            fn next_deadline(&self) -> Option<Instant> {
                let deadline: fn(&Self) -> Option<Instant> = $deadline;
                deadline(self)
            }
        }
    };
}

receiving!(timed::Receiver<K, V>, Batch<K, V>, |rx| rx.next_deadline());
receiving!(timed::AckReceiver<K, V>, Vec<Delivery<K, V>>, |rx| rx.next_deadline());
receiving!(ordered::Receiver<u8, K, V>, Batch<K, V>, |_| None);
receiving!(ordered::AckReceiver<u8, K, V>, Vec<Delivery<K, V>>, |_| None);

/// The methods that read the same in both flavours, whose handles have these methods by the
/// same names.
macro_rules! same_in_both_flavours {
    () => {
        fn dead_letters(rx: &Self::AckRx) -> DeadLetters<K, V> {
            rx.dead_letters()
        }

        fn tx_state(tx: &Self::Tx) -> (usize, bool) {
            (tx.len(), tx.is_closed())
        }

        fn tx_stats(tx: &Self::Tx) -> Stats {
            tx.stats()
        }
    };
}

/// Ends a builder of either flavour, with `weigher` if there is one: `$build` is `build` or
/// `acked`.
macro_rules! finish {
    ($builder:expr, $weigher:expr, $build:ident) => {
        match $weigher {
            None => $builder.$build(),
            Some(weigher) => $builder.weigher(weigher).$build(),
        }
    };
}

// ===== timed =====

/// `timed`, with its window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    pub(crate) window: Duration,
}

/// When a `timed` value is due: a window after it goes in (`send`), or by a deadline
/// (`send_by`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Due {
    Window,
    By(Instant),
}

impl Timed {
    /// A builder with `limits`, the per-key ones included.
    fn builder(&self, limits: &Limits) -> timed::Builder {
        let mut builder = limits.apply(timed::Builder::new(self.window));
        if let Some(n) = limits.per_key {
            builder = builder.max_values_per_key(n);
        }
        if let Some(n) = limits.key_weight {
            builder = builder.max_key_weight(n);
        }
        builder
    }
}

impl<K, V> Flavour<K, V> for Timed
where
    K: Hash + Eq + Clone + Debug + Send + 'static,
    V: PartialEq + Debug + Send + 'static,
{
    type Arg = Due;
    type Item = (K, V);
    type Back = (K, Vec<V>);
    type Tx = timed::Sender<K, V>;
    type Rx = timed::Receiver<K, V>;
    type AckRx = timed::AckReceiver<K, V>;

    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx) {
        finish!(self.builder(limits), weigher, build)
    }

    fn build_acked(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::AckRx) {
        finish!(self.builder(limits), weigher, acked)
    }

    fn item(_: Due, key: K, value: V) -> (K, V) {
        (key, value)
    }

    fn back(_: Due, key: K, values: Vec<V>) -> (K, Vec<V>) {
        (key, values)
    }

    fn entry(back: (K, Vec<V>)) -> (K, Vec<V>) {
        back
    }

    fn try_send(tx: &Self::Tx, due: Due, key: K, value: V) -> Result<(), TrySendError<(K, V)>> {
        match due {
            Due::Window => tx.try_send(key, value),
            Due::By(at) => tx.try_send_by(key, value, at),
        }
    }

    async fn send(tx: &Self::Tx, due: Due, key: K, value: V) -> Result<(), SendError<(K, V)>> {
        match due {
            Due::Window => tx.send(key, value).await,
            Due::By(at) => tx.send_by(key, value, at).await,
        }
    }

    fn requeue(
        rx: &Self::Rx,
        _: Due,
        key: K,
        values: Vec<V>,
    ) -> Result<(), SendError<(K, Vec<V>)>> {
        rx.requeue(key, values)
    }

    same_in_both_flavours!();
}

// ===== ordered =====

/// `ordered`, with `u8` sort keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ordered;

impl Ordered {
    /// A builder with `limits`.
    ///
    /// # Panics
    ///
    /// If a per-key limit is set: `ordered` has none.
    fn builder(limits: &Limits) -> ordered::Builder {
        assert!(
            limits.per_key.is_none() && limits.key_weight.is_none(),
            "`ordered` has no per-key limits"
        );
        limits.apply(ordered::Builder::new())
    }
}

impl<K, V> Flavour<K, V> for Ordered
where
    K: Hash + Eq + Clone + Debug + Send + 'static,
    V: PartialEq + Debug + Send + 'static,
{
    type Arg = u8;
    type Item = (u8, K, V);
    type Back = (u8, K, Vec<V>);
    type Tx = ordered::Sender<u8, K, V>;
    type Rx = ordered::Receiver<u8, K, V>;
    type AckRx = ordered::AckReceiver<u8, K, V>;

    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx) {
        finish!(Self::builder(limits), weigher, build)
    }

    fn build_acked(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::AckRx) {
        finish!(Self::builder(limits), weigher, acked)
    }

    fn item(sort_key: u8, key: K, value: V) -> (u8, K, V) {
        (sort_key, key, value)
    }

    fn back(sort_key: u8, key: K, values: Vec<V>) -> (u8, K, Vec<V>) {
        (sort_key, key, values)
    }

    fn entry((_, key, values): (u8, K, Vec<V>)) -> (K, Vec<V>) {
        (key, values)
    }

    fn try_send(
        tx: &Self::Tx,
        sort_key: u8,
        key: K,
        value: V,
    ) -> Result<(), TrySendError<(u8, K, V)>> {
        tx.try_send(sort_key, key, value)
    }

    fn send(
        tx: &Self::Tx,
        sort_key: u8,
        key: K,
        value: V,
    ) -> impl Future<Output = Result<(), SendError<(u8, K, V)>>> + Send + '_ {
        tx.send(sort_key, key, value)
    }

    fn requeue(
        rx: &Self::Rx,
        sort_key: u8,
        key: K,
        values: Vec<V>,
    ) -> Result<(), SendError<(u8, K, Vec<V>)>> {
        rx.requeue(sort_key, key, values)
    }

    same_in_both_flavours!();
}
