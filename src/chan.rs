//! The state every flavour shares: one lock around the sorted queue, the wakers, the counts
//! and the close flag. The public handles in `timed` and `ordered` are thin fronts over the
//! generic `Sender` and `Receiver` here.
//!
//! Everything lives under one mutex; the only waker list outside it is the `Notify` behind
//! `Sender::closed()`, which is written once, on close. Wakers are collected under the lock
//! and woken after it is released.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::hash::Hash;
use std::mem;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use tokio::runtime::{self, Handle};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use crate::error::{SendError, TryRecvError, TrySendError};
use crate::queue::{Items, Run, SortedQueue};
use crate::stats::{Deliveries, Stats};
use crate::Batch;

/// A refused send or requeue, with what was handed in.
type Refused<F, K, V> = SendError<(<F as Flavor>::Input, K, V)>;

/// What makes one flavour differ from another: how a value is ranked and when a rank is due.
pub(crate) trait Flavor {
    /// The order keys come out in. Its `Ord + Clone` bound sits on the impls that need it,
    /// so that the handle types carry no bounds.
    type Rank;
    /// What a sender supplies to rank a value. A refused send hands it back.
    type Input;

    /// The rank of a value entering now, once its key holds `values` values of total weight
    /// `weight`. `current` is the key's rank if it is pending; `None` may then be returned
    /// when the value cannot lower it.
    fn rank(
        input: Self::Input,
        clock: &mut Clock<'_>,
        current: Option<&Self::Rank>,
        values: usize,
        weight: usize,
        config: &Config,
    ) -> Option<Self::Rank>;

    /// Whether a key of this rank may be delivered at `now`.
    fn is_due(rank: &Self::Rank, now: Instant, config: &Config) -> bool;

    /// Why a key of this rank came due, once it has.
    fn why(rank: &Self::Rank) -> Why;

    /// The time at which a key of this rank becomes due, if that is a time.
    fn deadline(rank: &Self::Rank, config: &Config) -> Option<Instant>;
}

/// The clock, read at most once per call, and only when needed: the last reading under the
/// lock is a floor for now, and that is often enough to know that a value cannot move its
/// key's deadline. Reading the clock was a fifth of a send's time.
pub(crate) struct Clock<'a> {
    last: &'a mut Option<Instant>,
    now: Option<Instant>,
}

impl Clock<'_> {
    pub(crate) fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(|| {
            let now = Instant::now();
            *self.last = Some(now);
            now
        })
    }

    /// An instant at or before now, if the clock was ever read.
    pub(crate) fn floor(&self) -> Option<Instant> {
        self.now.or(*self.last)
    }
}

/// Why a key came due, for [`Deliveries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// Its deadline passed (`timed`), or it was simply pending (`ordered`).
    Due,
    /// It reached `max_values_per_key` or `max_key_weight`.
    FullKey,
    /// `flush`, `flush_all` or `drain_now`.
    Flush,
}

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
    /// Where deadlines and arrival times count from.
    pub(crate) epoch: Instant,
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
            epoch: Instant::now(),
        }
    }

    /// Sets a limit, which must be at least 1.
    #[track_caller]
    pub(crate) fn set(limit: &mut usize, n: usize, name: &str) {
        assert!(n > 0, "{name} must be at least 1");
        *limit = n;
    }

    /// `t` as nanoseconds from the epoch: half the size of an `Instant`, for what is kept
    /// per key. An instant before the epoch counts as the epoch.
    pub(crate) fn nanos(&self, t: Instant) -> u64 {
        let since = t.saturating_duration_since(self.epoch);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
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

mod sealed {
    use std::sync::Arc;

    /// A shared weigher.
    pub(crate) type Weigh<V> = Arc<dyn Fn(&V) -> usize + Send + Sync>;

    pub trait Sealed<V> {
        fn into_weigh(self) -> Option<Weigh<V>>;
    }
}

impl<V> Weigher<V> for () {}

impl<V> sealed::Sealed<V> for () {
    fn into_weigh(self) -> Option<sealed::Weigh<V>> {
        None
    }
}

impl<V, F: Fn(&V) -> usize + Send + Sync + 'static> Weigher<V> for F {}

impl<V, F: Fn(&V) -> usize + Send + Sync + 'static> sealed::Sealed<V> for F {
    fn into_weigh(self) -> Option<sealed::Weigh<V>> {
        Some(Arc::new(self))
    }
}

struct Chan<F: Flavor, K, V> {
    state: Mutex<State<F::Rank, K, V>>,
    config: Config,
    weigh: Option<sealed::Weigh<V>>,
    /// Wakes `closed()` calls.
    closed: Notify,
}

struct State<R, K, V> {
    queue: SortedQueue<R, K, V>,
    /// When sends stopped: every sender went, a receiver called `close`, or every receiver
    /// went. Pending keys are then all due.
    closed_at: Option<Instant>,
    /// A receiver has seen the end of the stream; a later `requeue` is refused.
    terminated: bool,
    senders: usize,
    receivers: usize,
    /// Receivers waiting for a batch, oldest first. Only the first one sleeps on its timer,
    /// so that a deadline wakes one receiver, not all of them.
    recv_waiters: Vec<(u64, Waker)>,
    /// Sends waiting for room (capacity, weight), first come first served.
    room_waiters: VecDeque<(u64, Waker)>,
    /// Sends of a new key waiting for a key slot (`max_keys`). They wait apart, so that
    /// values for pending keys still go in.
    key_waiters: VecDeque<(u64, Waker)>,
    /// The last clock reading under the lock: see [`Clock`].
    last_now: Option<Instant>,
    /// When each pending run started (see [`Config::nanos`]), oldest first; runs that ended
    /// are dropped lazily.
    arrivals: VecDeque<(Run, u64)>,
    counts: Counts,
    next_id: u64,
}

/// Running totals for [`Stats`].
#[derive(Default)]
struct Counts {
    sent: u64,
    delivered: u64,
    batches: u64,
    requeued: u64,
    by: Deliveries,
}

/// Which wait queue a waiting send is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Line {
    Room,
    Key,
}

/// A waiting send's place in one of the wait queues.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    id: u64,
    line: Line,
}

/// Why a send could not go in now.
enum Blocked {
    Closed,
    /// It must wait in this line.
    Wait(Line),
}

/// A value on its way in, weighed before the lock is taken.
pub(crate) struct Item<F: Flavor, K, V> {
    input: F::Input,
    key: K,
    value: V,
    weight: usize,
}

/// Wakers to wake once the lock is released: a receiver, a send waiting for room, and a
/// send waiting for a key slot.
type Wakes = [Option<Waker>; 3];

fn wake(wakers: impl IntoIterator<Item = Option<Waker>>) {
    wakers.into_iter().flatten().for_each(Waker::wake);
}

/// Stores `waker` in `slot` unless it would wake the same task already.
fn update_waker(slot: &mut Waker, waker: &Waker) {
    if !slot.will_wake(waker) {
        slot.clone_from(waker);
    }
}

impl<R, K, V> State<R, K, V> {
    /// The sends waiting in `line`.
    fn line(&mut self, line: Line) -> &mut VecDeque<(u64, Waker)> {
        match line {
            Line::Room => &mut self.room_waiters,
            Line::Key => &mut self.key_waiters,
        }
    }

    /// Drops the arrivals of runs that ended, from the oldest on.
    fn drop_ended_runs(&mut self) {
        let queue = &self.queue;
        let arrivals = &mut self.arrivals;
        while arrivals
            .front()
            .is_some_and(|(run, _)| !queue.is_pending(*run))
        {
            arrivals.pop_front();
        }
        // Runs that end out of order linger behind live ones: sweep them once they could
        // outnumber the live runs, so the list stays O(keys) at O(1) amortized.
        if arrivals.len() > 2 * queue.key_count() + 64 {
            arrivals.retain(|(run, _)| queue.is_pending(*run));
        }
        if arrivals.capacity() > 4096 && arrivals.len() * 8 < arrivals.capacity() {
            arrivals.shrink_to(arrivals.len() * 2);
        }
    }
}

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Locks the state. A panic in user code (`Hash`, `Eq`, `Ord`, `Clone`) can poison the
    /// lock, but the queue is whole at every point where such code runs, so the state is
    /// still good and the lock is taken anyway: a panicking key must not wedge the channel.
    fn lock(&self) -> MutexGuard<'_, State<F::Rank, K, V>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn weigh(&self, value: &V) -> usize {
        self.weigh.as_ref().map_or(1, |weigh| weigh(value))
    }

    /// The first send waiting for room, if there is room now.
    fn room_waiter(&self, state: &State<F::Rank, K, V>) -> Option<Waker> {
        let (_, waiter) = state.room_waiters.front()?;
        // At exactly `max_weight`, a weightless value still fits.
        let room = state.queue.len() < self.config.capacity
            && state.queue.weight() <= self.config.max_weight;
        room.then(|| waiter.clone())
    }

    /// The first send waiting for a key slot, if there is one now.
    fn key_waiter(&self, state: &State<F::Rank, K, V>) -> Option<Waker> {
        let (_, waiter) = state.key_waiters.front()?;
        let room = state.queue.key_count() < self.config.max_keys;
        room.then(|| waiter.clone())
    }

    /// Gives up a waiting send's place. If it was first in line, the next in line gets the
    /// turn it may have been woken for.
    fn leave(&self, state: &mut State<F::Rank, K, V>, place: Place) -> Option<Waker> {
        let line = state.line(place.line);
        let at = line.iter().position(|(id, _)| *id == place.id)?;
        line.remove(at);
        if at > 0 {
            return None;
        }
        match place.line {
            Line::Room => self.room_waiter(state),
            Line::Key => self.key_waiter(state),
        }
    }

    /// Closes the channel. Returns the wakers of every waiting task, to be woken by
    /// [`wake_closed`](Self::wake_closed) once the lock is released; `None` if the channel
    /// was closed already.
    fn close(&self, state: &mut State<F::Rank, K, V>) -> Option<Vec<Waker>> {
        if state.closed_at.is_some() {
            return None;
        }
        state.closed_at = Some(Instant::now());
        // Waiting receivers now have the whole queue due; waiting senders now fail.
        let receivers = state.recv_waiters.iter().map(|(_, w)| w.clone());
        let senders = state.room_waiters.iter().chain(&state.key_waiters);
        Some(receivers.chain(senders.map(|(_, w)| w.clone())).collect())
    }

    /// Wakes what [`close`](Self::close) returned, and every `closed()` call.
    fn wake_closed(&self, wakers: Option<Vec<Waker>>) {
        if let Some(wakers) = wakers {
            wakers.into_iter().for_each(Waker::wake);
            self.closed.notify_waiters();
        }
    }
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Chan<F, K, V>
where
    F::Rank: Ord + Clone,
{
    /// Adds `item` if the limits let it in now; `place` is the send's place in line, if it
    /// has one. On success the item is taken and the place given up.
    fn try_push(
        &self,
        state: &mut State<F::Rank, K, V>,
        item: &mut Option<Item<F, K, V>>,
        place: &mut Option<Place>,
    ) -> Result<Wakes, Blocked> {
        if state.closed_at.is_some() {
            return Err(Blocked::Closed);
        }
        let config = &self.config;
        let queued = item.as_ref().expect("an item to send");
        let my_turn = |line: Line, waiters: &VecDeque<(u64, Waker)>| match waiters.front() {
            None => true,
            Some(&(id, _)) => place.is_some_and(|p| p.line == line && p.id == id),
        };
        // A value heavier than the whole budget still goes into an empty channel.
        let weight = state.queue.weight();
        let fits =
            state.queue.is_empty() || weight.saturating_add(queued.weight) <= config.max_weight;
        let room = state.queue.len() < config.capacity && fits;
        // A send waits for room first, in turn; then, for a new key, for a key slot, in turn.
        // Once in the key line it has had its turn for room, so it does not queue for room
        // again: two lines that each waited on the other would hand turns back and forth
        // for ever.
        let in_key_line = place.is_some_and(|p| p.line == Line::Key);
        if !room || (!in_key_line && !my_turn(Line::Room, &state.room_waiters)) {
            let line = if in_key_line { Line::Key } else { Line::Room };
            return Err(Blocked::Wait(line));
        }
        if config.max_keys != usize::MAX && !state.queue.contains_key(&queued.key) {
            let free = state.queue.key_count() < config.max_keys;
            if !free || !my_turn(Line::Key, &state.key_waiters) {
                return Err(Blocked::Wait(Line::Key));
            }
        }

        let Item {
            input,
            key,
            value,
            weight,
        } = item.take().expect("an item to send");
        // Read the clock under the lock, so ranks go in in the order values do.
        let mut clock = Clock {
            last: &mut state.last_now,
            now: None,
        };
        let inserted =
            state
                .queue
                .insert(key, Items::One(value, weight), |current, values, weight| {
                    F::rank(input, &mut clock, current, values, weight, config)
                });
        let arrival = inserted.new_run.map(|run| (run, config.nanos(clock.now())));
        state.counts.sent += 1;
        // When the run started, for the oldest-age figure.
        state.arrivals.extend(arrival);
        if let Some(place) = place.take() {
            // Usually first in its line, but a send waiting for a key slot goes in as soon
            // as its key turns up pending, wherever it stands.
            state.line(place.line).retain(|(id, _)| *id != place.id);
        }
        let receiver = match inserted.leads {
            true => state.recv_waiters.first().map(|(_, w)| w.clone()),
            false => None,
        };
        // Room may be left for the next in line.
        Ok([receiver, self.room_waiter(state), self.key_waiter(state)])
    }

    /// Sends `item`, waiting for room; the core of `send` and of the `Sink`.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        item: &mut Option<Item<F, K, V>>,
        place: &mut Option<Place>,
    ) -> Poll<Result<(), Refused<F, K, V>>> {
        let mut state = self.lock();
        let blocked = match self.try_push(&mut state, item, place) {
            Ok(wakes) => {
                drop(state);
                wake(wakes);
                return Poll::Ready(Ok(()));
            }
            Err(blocked) => blocked,
        };
        let line = match blocked {
            Blocked::Wait(line) => line,
            Blocked::Closed => {
                let next = place.take().and_then(|p| self.leave(&mut state, p));
                drop(state);
                wake([next]);
                let Item {
                    input, key, value, ..
                } = item.take().expect("an item to send");
                return Poll::Ready(Err(SendError((input, key, value))));
            }
        };
        // Wait in the right line, moving over if the send now waits for something else.
        let mut handed_on = None;
        if let Some(p) = *place {
            if p.line != line {
                handed_on = self.leave(&mut state, p);
                *place = None;
            }
        }
        match *place {
            Some(p) => {
                let entry = state.line(line).iter_mut().find(|(id, _)| *id == p.id);
                update_waker(&mut entry.expect("a waiting send is in line").1, cx.waker());
            }
            None => {
                state.next_id += 1;
                let id = state.next_id;
                state.line(line).push_back((id, cx.waker().clone()));
                *place = Some(Place { id, line });
            }
        }
        drop(state);
        wake([handed_on]);
        Poll::Pending
    }

    /// Takes the next batch under the lock, counting why each key came due. `flush` counts
    /// keys that were not due as flushed (`drain_now`); otherwise they are not taken.
    fn pop(&self, state: &mut State<F::Rank, K, V>, now: Instant, flush: bool) -> Batch<K, V> {
        let config = &self.config;
        let closed_at = state.closed_at;
        let by = &mut state.counts.by;
        let batch =
            state
                .queue
                .pop_batch_weighted(config.max_batch, config.max_batch_weight, |rank| {
                    // Count the first reason the key came due: a key that was due before the
                    // close counts by its own reason, even when taken after it.
                    let counter = match closed_at {
                        Some(at) if !F::is_due(rank, at, config) => &mut by.close,
                        _ if F::is_due(rank, now, config) || closed_at.is_some() => {
                            match F::why(rank) {
                                Why::Due => &mut by.due,
                                Why::FullKey => &mut by.full_key,
                                Why::Flush => &mut by.flush,
                            }
                        }
                        _ if flush => &mut by.flush,
                        _ => return false,
                    };
                    *counter += 1;
                    true
                });
        // The runs just delivered are mostly the oldest: drop them now, while their slots'
        // buckets are still in cache.
        state.drop_ended_runs();
        if !batch.is_empty() {
            state.counts.batches += 1;
            state.counts.delivered += batch.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
        }
        batch
    }

    fn stats(&self) -> Stats {
        let mut state = self.lock();
        state.drop_ended_runs();
        let queue = &state.queue;
        let epoch = self.config.epoch;
        let oldest = state.arrivals.front().map(|(_, since)| {
            let since = epoch + Duration::from_nanos(*since);
            since.elapsed()
        });
        let counts = &state.counts;
        Stats {
            pending_values: queue.len(),
            pending_keys: queue.key_count(),
            pending_weight: queue.weight(),
            oldest_pending: oldest,
            sent: counts.sent,
            delivered: counts.delivered,
            batches: counts.batches,
            delivered_by: counts.by,
            requeued: counts.requeued,
            senders: state.senders,
            receivers: state.receivers,
        }
    }
}

pub(crate) fn channel<F: Flavor, K, V>(
    mut config: Config,
    weigher: impl Weigher<V>,
) -> (Sender<F, K, V>, Receiver<F, K, V>)
where
    F::Rank: Ord,
{
    // Deadlines before the epoch count as the epoch (they are all due), so take it as late
    // as we can: now, not when the builder was made.
    config.epoch = Instant::now();
    let chan = Arc::new(Chan {
        state: Mutex::new(State {
            queue: SortedQueue::new(),
            closed_at: None,
            terminated: false,
            senders: 1,
            receivers: 1,
            recv_waiters: Vec::new(),
            room_waiters: VecDeque::new(),
            key_waiters: VecDeque::new(),
            last_now: None,
            arrivals: VecDeque::new(),
            counts: Counts::default(),
            next_id: 1,
        }),
        config,
        weigh: sealed::Sealed::into_weigh(weigher),
        closed: Notify::new(),
    });
    let rx = Receiver {
        chan: Arc::clone(&chan),
        waiter: Waiter {
            id: 0,
            waiting: false,
        },
        sleep: None,
        armed: false,
        runtime: None,
    };
    let tx = Sender {
        chan,
        sink: Mutex::new(None),
        place: None,
    };
    (tx, rx)
}

// ===== impl Sender =====

pub(crate) struct Sender<F: Flavor, K, V> {
    chan: Arc<Chan<F, K, V>>,
    /// The value `start_send` handed over, until it goes in. Only `&mut self` methods touch
    /// it, through `get_mut`, so the mutex is never locked: it is there to keep a sender
    /// `Sync` when `K` and `V` are only `Send`.
    sink: Mutex<Option<Item<F, K, V>>>,
    /// Its place in line.
    place: Option<Place>,
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Sender<F, K, V>
where
    F::Rank: Ord + Clone,
{
    fn item(&self, input: F::Input, key: K, value: V) -> Option<Item<F, K, V>> {
        let weight = self.chan.weigh(&value);
        Some(Item {
            input,
            key,
            value,
            weight,
        })
    }

    pub(crate) fn try_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), TrySendError<(F::Input, K, V)>> {
        let mut item = self.item(input, key, value);
        let mut state = self.chan.lock();
        let pushed = self.chan.try_push(&mut state, &mut item, &mut None);
        drop(state);
        let full = match pushed {
            Ok(wakes) => {
                wake(wakes);
                return Ok(());
            }
            Err(Blocked::Closed) => false,
            Err(Blocked::Wait(_)) => true,
        };
        let Item {
            input, key, value, ..
        } = item.expect("a refused item");
        match full {
            true => Err(TrySendError::Full((input, key, value))),
            false => Err(TrySendError::Closed((input, key, value))),
        }
    }

    pub(crate) async fn send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        let mut item = self.item(input, key, value);
        // Our place in line; dropping the future gives it up.
        let mut place = PlaceGuard {
            chan: &*self.chan,
            place: None,
        };
        poll_fn(|cx| self.chan.poll_send(cx, &mut item, &mut place.place)).await
    }

    pub(crate) fn blocking_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        block_on(self.send(input, key, value))
    }

    /// `Sink::poll_ready` and `poll_flush`: sends the value `start_send` took, if any.
    pub(crate) fn poll_flush(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Refused<F, K, V>>> {
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        if sink.is_none() {
            return Poll::Ready(Ok(()));
        }
        self.chan.poll_send(cx, sink, &mut self.place)
    }

    /// `Sink::start_send`: takes a value, which the next `poll_ready` or `poll_flush` sends.
    pub(crate) fn start_send(&mut self, input: F::Input, key: K, value: V) {
        let item = self.item(input, key, value);
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        assert!(
            sink.is_none(),
            "start_send called before poll_ready returned Ready(Ok(()))"
        );
        *sink = item;
    }

    /// Takes back the value `start_send` took, if it has not gone in, and gives up its place
    /// in line.
    pub(crate) fn abort_send(&mut self) -> Option<(F::Input, K, V)> {
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Item {
            input, key, value, ..
        } = sink.take()?;
        if let Some(place) = self.place.take() {
            let mut state = self.chan.lock();
            let next = self.chan.leave(&mut state, place);
            drop(state);
            wake([next]);
        }
        Some((input, key, value))
    }

    /// Lowers `key`'s rank (or every key's, for `None`) to what `input` ranks at now.
    pub(crate) fn flush(&self, key: Option<&K>, input: F::Input) {
        let mut state = self.chan.lock();
        let mut clock = Clock {
            last: &mut state.last_now,
            now: None,
        };
        let rank = F::rank(input, &mut clock, None, 0, 0, &self.chan.config);
        let rank = rank.expect("a rank for a key that may not be pending");
        let moved = match key {
            Some(key) => state.queue.promote(key, rank),
            None => state.queue.promote_all(rank),
        };
        let receiver = match moved {
            true => state.recv_waiters.first().map(|(_, w)| w.clone()),
            false => None,
        };
        drop(state);
        wake([receiver]);
    }

    pub(crate) async fn closed(&self) {
        let mut notified = pin!(self.chan.closed.notified());
        loop {
            // Register first, then look: a close in between still wakes us.
            notified.as_mut().enable();
            if self.chan.lock().closed_at.is_some() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.chan.closed.notified());
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        self.chan.stats()
    }

    pub(crate) fn len(&self) -> usize {
        self.chan.lock().queue.len()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.chan.lock().closed_at.is_some()
    }
}

// The value buffered for the `Sink` is moved, never pinned, so a sender is `Unpin` whatever
// `K` and `V` are.
impl<F: Flavor, K, V> Unpin for Sender<F, K, V> {}

impl<F: Flavor, K, V> Clone for Sender<F, K, V> {
    fn clone(&self) -> Self {
        self.chan.lock().senders += 1;
        Sender {
            chan: Arc::clone(&self.chan),
            sink: Mutex::new(None),
            place: None,
        }
    }
}

impl<F: Flavor, K, V> Drop for Sender<F, K, V> {
    fn drop(&mut self) {
        let mut state = self.chan.lock();
        let next = self.place.and_then(|p| self.chan.leave(&mut state, p));
        state.senders -= 1;
        let wakers = match state.senders {
            0 => self.chan.close(&mut state),
            _ => None,
        };
        drop(state);
        wake([next]);
        self.chan.wake_closed(wakers);
    }
}

/// A `send` call's place in line, given up if the call is dropped.
struct PlaceGuard<'a, F: Flavor, K, V> {
    chan: &'a Chan<F, K, V>,
    place: Option<Place>,
}

impl<F: Flavor, K, V> Drop for PlaceGuard<'_, F, K, V> {
    fn drop(&mut self) {
        let Some(place) = self.place else { return };
        let mut state = self.chan.lock();
        let next = self.chan.leave(&mut state, place);
        drop(state);
        wake([next]);
    }
}

// ===== impl Receiver =====

pub(crate) struct Receiver<F: Flavor, K, V> {
    chan: Arc<Chan<F, K, V>>,
    waiter: Waiter,
    /// The one timer this receiver sleeps on, made on first use and then reset.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether `sleep` is set for a deadline that has not fired yet.
    armed: bool,
    /// The runtime `sleep` was made in.
    runtime: Option<runtime::Id>,
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Receiver<F, K, V>
where
    F::Rank: Ord + Clone,
{
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch<K, V>>> {
        loop {
            let mut state = self.chan.lock();
            let now = Instant::now();
            let batch = self.chan.pop(&mut state, now, false);
            if !batch.is_empty() {
                let was_first = self.waiter.leave(&mut state);
                let wakes = self.after_batch(&state, now, was_first);
                drop(state);
                wake(wakes);
                // Woken before its timer fired (a full key, a flush, a close): park the timer.
                self.disarm(now);
                return Poll::Ready(Some(batch));
            }
            if state.closed_at.is_some() {
                // Closed and nothing came out: the queue is empty, and it stays so.
                self.waiter.leave(&mut state);
                state.terminated = true;
                return Poll::Ready(None);
            }

            let first = self.waiter.enter(&mut state, cx.waker());
            let deadline = match first {
                true => {
                    let config = &self.chan.config;
                    state
                        .queue
                        .peek_rank()
                        .and_then(|rank| F::deadline(rank, config))
                }
                false => None,
            };
            drop(state);
            let Some(deadline) = deadline else {
                self.disarm(now);
                return Poll::Pending;
            };
            // One timer per receiver, reset rather than made anew; but a timer belongs to the
            // runtime it was made in, so a receiver that moved to another runtime (or
            // outlived its first one) needs a new one.
            let runtime = Handle::try_current().ok().map(|handle| handle.id());
            if runtime != self.runtime {
                self.sleep = None;
                self.runtime = runtime;
            }
            self.armed = true;
            let sleep = match &mut self.sleep {
                Some(sleep) => {
                    if sleep.deadline() != deadline {
                        sleep.as_mut().reset(deadline);
                    }
                    sleep
                }
                None => self
                    .sleep
                    .insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The deadline passed while we looked: take the batch now.
            self.armed = false;
        }
    }

    /// Parks a timer this receiver no longer sleeps on: left set for an old deadline, it
    /// would wake the task for nothing. Resetting keeps the one timer for later.
    fn disarm(&mut self, now: Instant) {
        if let (Some(sleep), true) = (&mut self.sleep, self.armed) {
            sleep.as_mut().reset(now + FAR);
            self.armed = false;
        }
    }

    /// Who to wake after a batch was taken: the next send in line for room or for a key
    /// slot, and another waiting receiver if due work is left behind, or if this receiver
    /// held the timer and leaves any work.
    fn after_batch(&self, state: &State<F::Rank, K, V>, now: Instant, was_first: bool) -> Wakes {
        let closed = state.closed_at.is_some();
        let config = &self.chan.config;
        let due_left = state
            .queue
            .front_is(|rank| closed || F::is_due(rank, now, config));
        let receiver = if due_left || (was_first && !state.queue.is_empty()) {
            state.recv_waiters.first().map(|(_, w)| w.clone())
        } else {
            None
        };
        [
            receiver,
            self.chan.room_waiter(state),
            self.chan.key_waiter(state),
        ]
    }

    pub(crate) async fn recv(&mut self) -> Option<Batch<K, V>> {
        /// Gives up this receiver's place among the waiters if `recv` is cancelled.
        struct Cancel<'a, F: Flavor, K, V>(&'a mut Receiver<F, K, V>);
        impl<F: Flavor, K, V> Drop for Cancel<'_, F, K, V> {
            fn drop(&mut self) {
                self.0.stop_waiting();
            }
        }
        let cancel = Cancel(self);
        poll_fn(|cx| cancel.0.poll_recv(cx)).await
    }

    pub(crate) fn try_recv(&mut self) -> Result<Batch<K, V>, TryRecvError> {
        let mut state = self.chan.lock();
        let now = Instant::now();
        let batch = self.chan.pop(&mut state, now, false);
        if batch.is_empty() {
            if state.closed_at.is_some() {
                state.terminated = true;
                return Err(TryRecvError::Disconnected);
            }
            return Err(TryRecvError::Empty);
        }
        let wakes = self.after_batch(&state, now, false);
        drop(state);
        wake(wakes);
        Ok(batch)
    }

    pub(crate) fn drain_now(&mut self) -> Vec<Batch<K, V>> {
        let mut state = self.chan.lock();
        let now = Instant::now();
        let mut batches = Vec::new();
        loop {
            let batch = self.chan.pop(&mut state, now, true);
            if batch.is_empty() {
                break;
            }
            batches.push(batch);
        }
        let wakes = self.after_batch(&state, now, false);
        drop(state);
        wake(wakes);
        batches
    }

    pub(crate) fn requeue(
        &self,
        input: F::Input,
        key: K,
        values: Vec<V>,
    ) -> Result<(), Refused<F, K, Vec<V>>> {
        // Weigh outside the lock: the weigher is user code.
        let weights = self
            .chan
            .weigh
            .as_ref()
            .map(|weigh| values.iter().map(|v| weigh(v)).collect());
        let mut state = self.chan.lock();
        if state.terminated {
            return Err(SendError((input, key, values)));
        }
        let count = values.len() as u64;
        let mut clock = Clock {
            last: &mut state.last_now,
            now: None,
        };
        let rank = F::rank(input, &mut clock, None, 0, 0, &self.chan.config);
        let now = clock.now();
        let rank = rank.expect("a rank for a key that may not be pending");
        let inserted = state.queue.requeue_inner(key, values, weights, rank);
        state.counts.requeued += count;
        state.arrivals.extend(
            inserted
                .new_run
                .map(|run| (run, self.chan.config.nanos(now))),
        );
        let receiver = match inserted.leads {
            true => state.recv_waiters.first().map(|(_, w)| w.clone()),
            false => None,
        };
        drop(state);
        wake([receiver]);
        Ok(())
    }

    pub(crate) fn close(&self) {
        let wakers = self.chan.close(&mut self.chan.lock());
        self.chan.wake_closed(wakers);
    }

    pub(crate) fn stats(&self) -> Stats {
        self.chan.stats()
    }

    pub(crate) fn len(&self) -> usize {
        self.chan.lock().queue.len()
    }

    pub(crate) fn key_count(&self) -> usize {
        self.chan.lock().queue.key_count()
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let config = &self.chan.config;
        let state = self.chan.lock();
        state
            .queue
            .peek_rank()
            .and_then(|rank| F::deadline(rank, config))
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.chan.lock().closed_at.is_some()
    }
}

impl<F: Flavor, K, V> Receiver<F, K, V> {
    /// Leaves the waiting receivers for good (a cancelled `recv`, a dropped receiver). If
    /// this one held the timer, the next waiting receiver takes it over.
    fn stop_waiting(&mut self) {
        if !self.waiter.waiting {
            return;
        }
        let mut state = self.chan.lock();
        let next = if self.waiter.leave(&mut state) && !state.queue.is_empty() {
            state.recv_waiters.first().map(|(_, w)| w.clone())
        } else {
            None
        };
        drop(state);
        wake([next]);
    }
}

impl<F: Flavor, K, V> Clone for Receiver<F, K, V> {
    fn clone(&self) -> Self {
        let mut state = self.chan.lock();
        state.receivers += 1;
        state.next_id += 1;
        let id = state.next_id;
        drop(state);
        Receiver {
            chan: Arc::clone(&self.chan),
            waiter: Waiter { id, waiting: false },
            sleep: None,
            armed: false,
            runtime: None,
        }
    }
}

impl<F: Flavor, K, V> Drop for Receiver<F, K, V> {
    fn drop(&mut self) {
        self.stop_waiting();
        let mut state = self.chan.lock();
        state.receivers -= 1;
        if state.receivers > 0 {
            return;
        }
        // No one can receive any more: refuse sends and drop what is pending, outside the
        // lock, since a value's `Drop` is user code.
        let wakers = self.chan.close(&mut state);
        let pending = state.queue.take_all();
        state.arrivals = VecDeque::new();
        drop(state);
        self.chan.wake_closed(wakers);
        drop(pending);
    }
}

/// A receiver's place among the waiting receivers.
struct Waiter {
    /// Names this receiver in `recv_waiters`.
    id: u64,
    /// Whether this receiver is in `recv_waiters`.
    waiting: bool,
}

impl Waiter {
    /// Joins the waiting receivers, or updates the waker if already there. Returns whether
    /// this receiver is the first, the one that sleeps on the timer.
    fn enter<R, K, V>(&mut self, state: &mut State<R, K, V>, waker: &Waker) -> bool {
        if self.waiting {
            let entry = state.recv_waiters.iter_mut().find(|(id, _)| *id == self.id);
            update_waker(&mut entry.expect("waiting receiver is listed").1, waker);
        } else {
            state.recv_waiters.push((self.id, waker.clone()));
            self.waiting = true;
        }
        state.recv_waiters[0].0 == self.id
    }

    /// Leaves the waiting receivers. Returns whether this receiver was the first.
    fn leave<R, K, V>(&mut self, state: &mut State<R, K, V>) -> bool {
        if !mem::take(&mut self.waiting) {
            return false;
        }
        let at = state.recv_waiters.iter().position(|(id, _)| *id == self.id);
        state
            .recv_waiters
            .remove(at.expect("waiting receiver is listed"));
        at == Some(0)
    }
}

/// Longer than any program waits: about 30 years.
pub(crate) const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

// ===== blocking =====

/// Runs a future to completion on the current thread, parking it while the future waits.
/// `send` needs no runtime (it waits only for room), so a plain thread can drive it.
fn block_on<T>(future: impl Future<Output = T>) -> T {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}
