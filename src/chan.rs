//! The state every flavour shares: one lock around the sorted queue, the wakers, the counts
//! and the close flag. The public handles in `timed` and `ordered` are thin fronts over the
//! generic `Sender` and `Receiver` here.
//!
//! Everything lives under one mutex; there are no atomics or wakers outside it. Wakers are
//! collected under the lock and woken after it is released.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::hash::Hash;
use std::mem;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::error::{SendError, TryRecvError, TrySendError};
use crate::queue::SortedQueue;
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

    /// The rank of a value sent at `now`, once its key holds `key_len` values.
    fn rank(input: Self::Input, now: Instant, key_len: usize, config: &Config) -> Self::Rank;

    /// Whether a key of this rank may be delivered at `now`.
    fn is_due(rank: &Self::Rank, now: Instant) -> bool;

    /// The time at which a key of this rank becomes due, if that is a time.
    fn deadline(rank: &Self::Rank) -> Option<Instant>;
}

/// Limits set by a builder.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Most values in one batch.
    pub(crate) max_batch: usize,
    /// Most pending values that `send` and `try_send` fill up to.
    pub(crate) capacity: usize,
    /// The batching window (`timed` only).
    pub(crate) window: Duration,
    /// A key holding this many values is due at once (`timed` only).
    pub(crate) max_values_per_key: usize,
}

impl Config {
    pub(crate) fn new(window: Duration) -> Self {
        Config {
            max_batch: usize::MAX,
            capacity: usize::MAX,
            window,
            max_values_per_key: usize::MAX,
        }
    }

    #[track_caller]
    pub(crate) fn max_batch(&mut self, n: usize) {
        assert!(
            n > 0,
            "max_batch must be at least 1: a batch is never empty"
        );
        self.max_batch = n;
    }

    #[track_caller]
    pub(crate) fn capacity(&mut self, n: usize) {
        assert!(
            n > 0,
            "capacity must be at least 1: a channel that holds nothing cannot send"
        );
        self.capacity = n;
    }

    #[track_caller]
    pub(crate) fn max_values_per_key(&mut self, n: usize) {
        assert!(n > 0, "max_values_per_key must be at least 1");
        self.max_values_per_key = n;
    }
}

struct Chan<F: Flavor, K, V> {
    state: Mutex<State<F::Rank, K, V>>,
    config: Config,
}

struct State<R, K, V> {
    queue: SortedQueue<R, K, V>,
    /// No more sends: every sender is gone, a receiver called `close`, or every receiver is
    /// gone. Pending keys are then all due.
    closed: bool,
    /// A receiver has seen the end of the stream; a later `requeue` is refused.
    terminated: bool,
    senders: usize,
    receivers: usize,
    /// Receivers waiting for a batch, oldest first. Only the first one sleeps on its timer,
    /// so that a deadline wakes one receiver, not all of them.
    recv_waiters: Vec<(u64, Waker)>,
    /// `send` calls waiting for room, first come first served.
    send_waiters: VecDeque<(u64, Waker)>,
    next_id: u64,
}

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Locks the state. A panic in user code (`Hash`, `Eq`, `Ord`, `Clone`) can poison the
    /// lock, but the queue is whole at every point where such code runs, so the state is
    /// still good and the lock is taken anyway: a panicking key must not wedge the channel.
    fn lock(&self) -> MutexGuard<'_, State<F::Rank, K, V>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<R, K, V> State<R, K, V> {
    fn first_recv_waiter(&self) -> Option<Waker> {
        self.recv_waiters.first().map(|(_, w)| w.clone())
    }

    fn first_send_waiter(&self) -> Option<Waker> {
        self.send_waiters.front().map(|(_, w)| w.clone())
    }

    fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

fn wake(wakers: impl IntoIterator<Item = Waker>) {
    wakers.into_iter().for_each(Waker::wake);
}

/// Stores `waker` in `slot` unless it would wake the same task already.
fn update_waker(slot: &mut Waker, waker: &Waker) {
    if !slot.will_wake(waker) {
        slot.clone_from(waker);
    }
}

pub(crate) fn channel<F: Flavor, K, V>(config: Config) -> (Sender<F, K, V>, Receiver<F, K, V>)
where
    F::Rank: Ord,
{
    let chan = Arc::new(Chan {
        state: Mutex::new(State {
            queue: SortedQueue::new(),
            closed: false,
            terminated: false,
            senders: 1,
            receivers: 1,
            recv_waiters: Vec::new(),
            send_waiters: VecDeque::new(),
            next_id: 1,
        }),
        config,
    });
    let rx = Receiver {
        chan: Arc::clone(&chan),
        waiter: Waiter {
            id: 0,
            waiting: false,
        },
        sleep: None,
        armed: false,
    };
    (Sender { chan }, rx)
}

// ===== impl Sender =====

pub(crate) struct Sender<F: Flavor, K, V> {
    chan: Arc<Chan<F, K, V>>,
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Sender<F, K, V>
where
    F::Rank: Ord + Clone,
{
    pub(crate) fn try_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), TrySendError<(F::Input, K, V)>> {
        let mut state = self.chan.lock();
        if state.closed {
            return Err(TrySendError::Closed((input, key, value)));
        }
        // First come, first served: earlier `send` calls that wait for room go first.
        if state.queue.len() >= self.chan.config.capacity || !state.send_waiters.is_empty() {
            return Err(TrySendError::Full((input, key, value)));
        }
        let waker = self.push(&mut state, input, key, value);
        drop(state);
        wake(waker);
        Ok(())
    }

    pub(crate) async fn send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        let mut item = Some((input, key, value));
        // Our place in the wait queue; dropping the future gives it up.
        let mut place = SendPlace {
            chan: &*self.chan,
            id: None,
        };
        poll_fn(|cx| {
            let mut state = self.chan.lock();
            if state.closed {
                let item = item.take().expect("polled after completion");
                return Poll::Ready(Err(SendError(item)));
            }
            let my_turn = match state.send_waiters.front() {
                None => true,
                Some(&(id, _)) => place.id == Some(id),
            };
            if my_turn && state.queue.len() < self.chan.config.capacity {
                let (input, key, value) = item.take().expect("polled after completion");
                let receiver = self.push(&mut state, input, key, value);
                if place.id.take().is_some() {
                    state.send_waiters.pop_front();
                }
                // Room may be left for the next waiting sender.
                let sender = if state.queue.len() < self.chan.config.capacity {
                    state.first_send_waiter()
                } else {
                    None
                };
                drop(state);
                wake(receiver.into_iter().chain(sender));
                return Poll::Ready(Ok(()));
            }
            match place.id {
                Some(id) => {
                    let entry = state.send_waiters.iter_mut().find(|(i, _)| *i == id);
                    update_waker(&mut entry.expect("waiting sender is queued").1, cx.waker());
                }
                None => {
                    let id = state.take_id();
                    state.send_waiters.push_back((id, cx.waker().clone()));
                    place.id = Some(id);
                }
            }
            Poll::Pending
        })
        .await
    }

    pub(crate) fn blocking_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        block_on(self.send(input, key, value))
    }

    /// Adds a value under the lock, once it is admitted. Returns the waker of the receiver
    /// to wake: the first waiting one, and only if the earliest rank moved down.
    fn push(
        &self,
        state: &mut State<F::Rank, K, V>,
        input: F::Input,
        key: K,
        value: V,
    ) -> Option<Waker> {
        // Read the clock under the lock, so ranks go in in the order values do.
        let now = Instant::now();
        let config = &self.chan.config;
        let leads = state
            .queue
            .push_with(key, value, |len| F::rank(input, now, len, config));
        if leads {
            state.first_recv_waiter()
        } else {
            None
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.chan.lock().queue.len()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.chan.lock().closed
    }
}

impl<F: Flavor, K, V> Clone for Sender<F, K, V> {
    fn clone(&self) -> Self {
        let mut state = self.chan.lock();
        state.senders += 1;
        drop(state);
        Sender {
            chan: Arc::clone(&self.chan),
        }
    }
}

impl<F: Flavor, K, V> Drop for Sender<F, K, V> {
    fn drop(&mut self) {
        let mut state = self.chan.lock();
        state.senders -= 1;
        if state.senders == 0 {
            let wakers = close_state(&mut state);
            drop(state);
            wake(wakers);
        }
    }
}

/// A `send` call's place in the queue of senders waiting for room.
struct SendPlace<'a, F: Flavor, K, V> {
    chan: &'a Chan<F, K, V>,
    id: Option<u64>,
}

impl<F: Flavor, K, V> Drop for SendPlace<'_, F, K, V> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let mut state = self.chan.lock();
        let Some(at) = state.send_waiters.iter().position(|(i, _)| *i == id) else {
            return;
        };
        state.send_waiters.remove(at);
        // A cancelled sender at the head may have been woken for room it will not use:
        // pass the turn on.
        let next = if at == 0 && state.queue.len() < self.chan.config.capacity {
            state.first_send_waiter()
        } else {
            None
        };
        drop(state);
        wake(next);
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
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Receiver<F, K, V>
where
    F::Rank: Ord + Clone,
{
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch<K, V>>> {
        loop {
            let mut state = self.chan.lock();
            let now = Instant::now();
            let closed = state.closed;
            let due = |rank: &F::Rank| closed || F::is_due(rank, now);
            let batch = state.queue.pop_batch(self.chan.config.max_batch, due);
            if !batch.is_empty() {
                let was_first = self.waiter.leave(&mut state);
                // Room returned: let the next waiting sender in.
                let sender = if state.queue.len() < self.chan.config.capacity {
                    state.first_send_waiter()
                } else {
                    None
                };
                // Due work left behind goes to another receiver; so does the timer, if this
                // receiver was the one sleeping on it.
                let hand_off = state.queue.front_is(due) || (was_first && !state.queue.is_empty());
                let receiver = if hand_off {
                    state.first_recv_waiter()
                } else {
                    None
                };
                drop(state);
                wake(sender.into_iter().chain(receiver));
                return Poll::Ready(Some(batch));
            }
            if closed {
                // Closed and nothing came out: the queue is empty, and it stays so.
                self.waiter.leave(&mut state);
                state.terminated = true;
                return Poll::Ready(None);
            }

            let first = self.waiter.enter(&mut state, cx.waker());
            let deadline = match first {
                true => state.queue.peek_rank().and_then(F::deadline),
                false => None,
            };
            drop(state);
            let Some(deadline) = deadline else {
                self.disarm(now);
                return Poll::Pending;
            };
            // One timer per receiver, reset rather than made anew.
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
            sleep.as_mut().reset(far_future(now));
            self.armed = false;
        }
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
        let closed = state.closed;
        let due = |rank: &F::Rank| closed || F::is_due(rank, now);
        let batch = state.queue.pop_batch(self.chan.config.max_batch, due);
        if batch.is_empty() {
            if closed {
                state.terminated = true;
                return Err(TryRecvError::Disconnected);
            }
            return Err(TryRecvError::Empty);
        }
        let sender = if state.queue.len() < self.chan.config.capacity {
            state.first_send_waiter()
        } else {
            None
        };
        let receiver = if state.queue.front_is(due) {
            state.first_recv_waiter()
        } else {
            None
        };
        drop(state);
        wake(sender.into_iter().chain(receiver));
        Ok(batch)
    }

    pub(crate) fn requeue(
        &self,
        input: F::Input,
        key: K,
        values: Vec<V>,
    ) -> Result<(), Refused<F, K, Vec<V>>> {
        let mut state = self.chan.lock();
        if state.terminated {
            return Err(SendError((input, key, values)));
        }
        let rank = F::rank(input, Instant::now(), 0, &self.chan.config);
        let receiver = match state.queue.requeue(key, values, rank) {
            true => state.first_recv_waiter(),
            false => None,
        };
        drop(state);
        wake(receiver);
        Ok(())
    }

    pub(crate) fn close(&self) {
        let wakers = close_state(&mut self.chan.lock());
        wake(wakers);
    }

    pub(crate) fn len(&self) -> usize {
        self.chan.lock().queue.len()
    }

    pub(crate) fn key_count(&self) -> usize {
        self.chan.lock().queue.key_count()
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.chan.lock().queue.peek_rank().and_then(F::deadline)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.chan.lock().closed
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
            state.first_recv_waiter()
        } else {
            None
        };
        drop(state);
        wake(next);
    }
}

impl<F: Flavor, K, V> Clone for Receiver<F, K, V> {
    fn clone(&self) -> Self {
        let mut state = self.chan.lock();
        state.receivers += 1;
        let id = state.take_id();
        drop(state);
        Receiver {
            chan: Arc::clone(&self.chan),
            waiter: Waiter { id, waiting: false },
            sleep: None,
            armed: false,
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
        let wakers = close_state(&mut state);
        let pending = state.queue.take_all();
        drop(state);
        wake(wakers);
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

/// Closes the channel and returns the wakers of every waiting task.
fn close_state<R, K, V>(state: &mut State<R, K, V>) -> Vec<Waker> {
    if state.closed {
        return Vec::new();
    }
    state.closed = true;
    // Waiting receivers now have the whole queue due; waiting senders now fail.
    let receivers = state.recv_waiters.iter().map(|(_, w)| w.clone());
    let senders = state.send_waiters.iter().map(|(_, w)| w.clone());
    receivers.chain(senders).collect()
}

/// An instant later than any program waits: about 30 years on.
pub(crate) fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(30 * 365 * 24 * 60 * 60)
}

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
