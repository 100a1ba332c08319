//! The `timed` and `ordered` channels behind one shape, for tests that run the same
//! operations on both: [`Flavour`], implemented by [`Timed`] and [`Ordered`], and the
//! [`Limits`] they are built with.
//!
//! A send carries an `Arg`, what its value ranks by: a [`Due`] in `timed`, a sort key in
//! `ordered`. Errors hand back what the flavour hands back, sort key included.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use keyed_batch::builder::Builder;
use keyed_batch::error::{SendError, TryRecvError, TrySendError};
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
    type Rx: Clone + Send + 'static;

    /// A channel with `limits`, weighing values with `weigher` if there is one.
    ///
    /// # Panics
    ///
    /// If a limit is set that the flavour does not have.
    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx);
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
    fn recv(rx: &mut Self::Rx) -> impl Future<Output = Option<Batch<K, V>>> + Send + '_;
    fn try_recv(rx: &mut Self::Rx) -> Result<Batch<K, V>, TryRecvError>;
    fn close(rx: &Self::Rx);
    /// `len`, `key_count` and `is_closed` of a receiver.
    fn rx_state(rx: &Self::Rx) -> (usize, usize, bool);
    /// `len` and `is_closed` of a sender.
    fn tx_state(tx: &Self::Tx) -> (usize, bool);
}

/// The methods that read the same in both flavours, whose handles have these methods by the
/// same names.
macro_rules! same_in_both_flavours {
    () => {
        fn recv(rx: &mut Self::Rx) -> impl Future<Output = Option<Batch<K, V>>> + Send + '_ {
            rx.recv()
        }

        fn try_recv(rx: &mut Self::Rx) -> Result<Batch<K, V>, TryRecvError> {
            rx.try_recv()
        }

        fn close(rx: &Self::Rx) {
            rx.close();
        }

        fn rx_state(rx: &Self::Rx) -> (usize, usize, bool) {
            (rx.len(), rx.key_count(), rx.is_closed())
        }

        fn tx_state(tx: &Self::Tx) -> (usize, bool) {
            (tx.len(), tx.is_closed())
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

    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx) {
        let mut builder = limits.apply(timed::Builder::new(self.window));
        if let Some(n) = limits.per_key {
            builder = builder.max_values_per_key(n);
        }
        if let Some(n) = limits.key_weight {
            builder = builder.max_key_weight(n);
        }
        match weigher {
            None => builder.build(),
            Some(weigher) => builder.weigher(weigher).build(),
        }
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

    fn build(&self, limits: &Limits, weigher: Option<Weigher<V>>) -> (Self::Tx, Self::Rx) {
        assert!(
            limits.per_key.is_none() && limits.key_weight.is_none(),
            "`ordered` has no per-key limits"
        );
        let builder = limits.apply(ordered::Builder::new());
        match weigher {
            None => builder.build(),
            Some(weigher) => builder.weigher(weigher).build(),
        }
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
