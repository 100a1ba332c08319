//! What makes a flavour: how a value is ranked, when a rank is due and why, and the clock
//! that times it.

use tokio::time::Instant;

use crate::config::Config;

/// What makes one flavour differ from another: how a value is ranked and when a rank is due.
pub(crate) trait Flavor {
    /// The order keys come out in. Its `Ord + Clone` bound sits on the impls that need it,
    /// so that the handle types carry no bounds.
    type Rank;
    /// What a sender supplies to rank a value. A refused send hands it back.
    type Input;
    /// Whether comparing ranks runs user code, which may panic: `SortedQueue::insert` then
    /// catches a panic that comes after the values went in.
    const USER_ORD: bool;

    /// The rank of a value joining its key. May return `None` when the key is pending and
    /// the value cannot lower its rank.
    fn rank(input: Self::Input, joining: Joining<'_, '_, Self::Rank>) -> Option<Self::Rank>;

    /// Whether a key of this rank may be delivered at `now` (see [`Clock`]).
    fn is_due(rank: &Self::Rank, now: u64) -> bool;

    /// Why a key of this rank came due, once it has.
    fn reason(rank: &Self::Rank) -> Reason;

    /// When a key of this rank becomes due (see [`Clock`]), if that is a time at all.
    fn deadline(rank: &Self::Rank) -> Option<u64>;

    /// Whether a key of this rank ever comes due by itself, without a flush or a close: by
    /// default, whether it has a deadline.
    fn comes_due(rank: &Self::Rank) -> bool {
        Self::deadline(rank).is_some()
    }

    /// The rank of values that were delivered at `rank` and are retried at `now`: a
    /// retried key is due as soon as its retry delay is over.
    fn retried(rank: Self::Rank, now: u64) -> Self::Rank;

    /// When a value that arrived at `arrival` would make a key of its own due, at the
    /// latest: what a send through the inbox compares with the deadline the receivers sleep
    /// on, without the lock (see `chan::inbox`); `u64::MAX` if never. Early is safe (a wake
    /// for nothing); late is not. The default, `arrival`, is due at once.
    fn due_alone(_input: &Self::Input, arrival: u64, _epoch: Instant, _config: &Config) -> u64 {
        arrival
    }
}

/// A value joining its key, as [`Flavor::rank`] sees it.
pub(crate) struct Joining<'a, 'c, R> {
    /// The key's rank, if it is pending.
    pub(crate) current: Option<&'a R>,
    /// The key's values, this one included.
    pub(crate) values: usize,
    /// The key's weight, this value's included.
    pub(crate) weight: usize,
    pub(crate) config: &'a Config,
    pub(crate) clock: &'a mut Clock<'c>,
}

/// Why a key came due, for [`Deliveries`](crate::stats::Deliveries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its deadline passed (`timed`), or it was simply pending (`ordered`).
    Deadline,
    /// It reached `max_values_per_key` or `max_key_weight`.
    FullKey,
    /// `flush`, `flush_all` or `drain_now`.
    Flush,
}

/// The channel's clock: nanoseconds since the channel was made (its *epoch*), half the size
/// of an `Instant` for what is kept per key.
///
/// It reads [`Instant::now`] at most once per call, and only when needed: the last reading
/// under the lock is a floor for now, and that is often enough to know that a value cannot
/// move its key's deadline. Reading the clock was a fifth of a send's time.
pub(crate) struct Clock<'a> {
    epoch: Instant,
    last: &'a mut Option<u64>,
    now: Option<u64>,
}

impl<'a> Clock<'a> {
    /// A clock for one call; `last` is the last reading under the lock.
    pub(crate) fn new(epoch: Instant, last: &'a mut Option<u64>) -> Self {
        Clock {
            epoch,
            last,
            now: None,
        }
    }

    /// A clock that reads `now` whatever the time: a value taken in from the inbox is
    /// ranked as of when it was sent. `last` is left as it is.
    pub(crate) fn at(epoch: Instant, last: &'a mut Option<u64>, now: u64) -> Self {
        Clock {
            epoch,
            last,
            now: Some(now),
        }
    }

    pub(crate) fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(|| {
            let now = since(self.epoch, Instant::now());
            *self.last = Some(now);
            now
        })
    }

    /// `t` on this clock.
    pub(crate) fn since(&self, t: Instant) -> u64 {
        since(self.epoch, t)
    }

    /// A time at or before now, if the clock was ever read.
    pub(crate) fn floor(&self) -> Option<u64> {
        self.now.or(*self.last)
    }
}

/// `t` in nanoseconds since `epoch`: 0 before it, and `u64::MAX` past what fits.
pub(crate) fn since(epoch: Instant, t: Instant) -> u64 {
    let since = t.saturating_duration_since(epoch);
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `nanos` after `epoch`, if it can be represented.
pub(crate) fn instant(epoch: Instant, nanos: u64) -> Option<Instant> {
    epoch.checked_add(std::time::Duration::from_nanos(nanos))
}
