//! The limits a builder sets ([`Config`]), and the [`Weigher`] that weighs values for them.

use std::time::Duration;

/// Limits set by a builder. `usize::MAX` means no limit.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Most values in one batch.
    pub(crate) max_batch: usize,
    /// Most weight in one batch.
    pub(crate) max_batch_weight: usize,
    /// Most pending values that `send` and `try_send` fill up to.
    pub(crate) capacity: usize,
    /// Most pending weight that `send` and `try_send` fill up to.
    pub(crate) max_weight: usize,
    /// Most pending keys that `send` and `try_send` open.
    pub(crate) max_keys: usize,
    /// The batching window (`timed` only).
    pub(crate) window: Duration,
    /// A key holding this many values is due at once (`timed` only).
    pub(crate) max_values_per_key: usize,
    /// A key of this weight is due at once (`timed` only).
    pub(crate) max_key_weight: usize,
    /// Acknowledging channels: the most times values are handed out before a retry sends
    /// them to the dead letters. `u32::MAX` means no limit.
    pub(crate) max_attempts: u32,
}

impl Config {
    pub(crate) fn new(window: Duration) -> Self {
        Config {
            max_batch: usize::MAX,
            max_batch_weight: usize::MAX,
            capacity: usize::MAX,
            max_weight: usize::MAX,
            max_keys: usize::MAX,
            window,
            max_values_per_key: usize::MAX,
            max_key_weight: usize::MAX,
            max_attempts: u32::MAX,
        }
    }

    /// Sets a limit, which must be at least 1.
    #[track_caller]
    pub(crate) fn set(limit: &mut usize, n: usize, name: &str) {
        assert!(n > 0, "{name} must be at least 1");
        *limit = n;
    }

    /// Whether a key of `values` values and total `weight` is full: due at once.
    pub(crate) fn is_full(&self, values: usize, weight: usize) -> bool {
        values >= self.max_values_per_key || weight >= self.max_key_weight
    }
}

/// Weighs values for the weight limits: [`timed::Builder::weigher`](crate::timed::Builder::weigher)
/// and [`ordered::Builder::weigher`](crate::ordered::Builder::weigher) take one.
///
/// It is implemented for `Fn(&V) -> usize + Send + Sync + 'static` closures, and for `()`,
/// which weighs every value 1.
pub trait Weigher<V>: sealed::Sealed<V> {}

/// A shared weigher, or `None` for weight 1 each.
pub(crate) type Weigh<V> = Option<std::sync::Arc<dyn Fn(&V) -> usize + Send + Sync>>;

/// Turns a [`Weigher`] into a [`Weigh`].
pub(crate) fn weigh<V>(weigher: impl Weigher<V>) -> Weigh<V> {
    sealed::Sealed::into_weigh(weigher)
}

mod sealed {
    pub trait Sealed<V> {
        fn into_weigh(self) -> super::Weigh<V>;
    }
}

impl<V> Weigher<V> for () {}

impl<V> sealed::Sealed<V> for () {
    fn into_weigh(self) -> Weigh<V> {
        None
    }
}

impl<V, F: Fn(&V) -> usize + Send + Sync + 'static> Weigher<V> for F {}

impl<V, F: Fn(&V) -> usize + Send + Sync + 'static> sealed::Sealed<V> for F {
    fn into_weigh(self) -> Weigh<V> {
        Some(std::sync::Arc::new(self))
    }
}
