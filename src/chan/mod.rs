//! The state every flavour shares, and the internal handles [`Tx`] and [`Rx`] that the
//! public handles in `timed` and `ordered` wrap.
//!
//! The state lives under one mutex. Outside it are each receiver's own timer, the
//! `Notify` that `closed()` waits on, which is notified once, on close, and, in a channel
//! without per-key or room limits, the [`inbox`] that sends go through while another thread
//! holds the lock. Whoever takes the lock takes the inbox in first (see [`Chan::lock`]), so
//! every locked operation sees every value whose send returned. Wakers, and keys and
//! ranks whose `Drop` is user code, are collected while the lock is held and released after
//! it is: see [`Guard`].

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};
use std::future::{poll_fn, Future};
use std::hash::{BuildHasher, Hash};
use std::mem;
use std::ops::{Deref, DerefMut};
use std::panic::{self, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{ready, Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use hashbrown::{DefaultHashBuilder, HashMap};
use tokio::runtime::{self, Handle};
use tokio::sync::Notify;
use tokio::task::coop;
use tokio::time::{Instant, Sleep};

use crate::config::{self, Config, Weigh, Weigher};
use crate::error::{SendError, TryRecvError, TrySendError};
use crate::flavor::{self, Clock, Flavor, Joining, Reason};
use crate::queue::{mostly_unused, Inserted, Items, Returned, Run, SortedQueue};

use self::acked::Acked;
use self::inbox::{Closed, Entry, Inbox};

mod acked;
#[cfg(feature = "durable")]
mod durable;
mod inbox;
use crate::stats::{Deliveries, Stats};
use crate::Batch;

/// A refused send or requeue, with what was handed in.
pub(crate) type Refused<F, K, V> = SendError<(<F as Flavor>::Input, K, V)>;

/// What the `Sink` impls return when a value cannot go in: the value, if there was one.
pub(crate) type SinkRefused<F, K, V> = SendError<Option<(<F as Flavor>::Input, K, V)>>;

pub(crate) struct Chan<F: Flavor, K, V> {
    state: Mutex<State<F, K, V>>,
    config: Config,
    /// Where the [`Clock`] counts from.
    epoch: Instant,
    /// A copy of the queue's hasher, so that keys are hashed before the lock is taken.
    hasher: DefaultHashBuilder,
    weigh: Weigh<V>,
    /// Wakes `closed()` calls.
    closed: Notify,
    /// A durable channel's log.
    #[cfg(feature = "durable")]
    log: Option<crate::durable::Attached<F, K, V>>,
    /// Where sends go while another thread holds the lock, in a channel whose sends need
    /// nothing from the locked state; with the function that takes it in under the lock.
    ///
    /// Boxed: the queue's cache-padded ends would otherwise align the whole channel to 128
    /// bytes, and move the fields every send touches.
    inbox: Option<Box<WithInbox<F, K, V>>>,
    /// Every send goes through the inbox, even with the lock free: for this crate's tests
    /// (`KEYED_BATCH_INBOX=always`, with the `fault-injection` feature), so that one thread
    /// can drive the inbox path.
    #[cfg(feature = "fault-injection")]
    always_inbox: bool,
}

thread_local! {
    /// The channel (its address) whose lock this thread took last and holds still, if it
    /// has an inbox; 0 if none. With [`OWED`] set, a send made by user code under that
    /// lock had to wake the receivers: the holder does it before it lets go (see
    /// `Chan::wake_after_inbox`). Kept per thread, not in the channel, where every lock
    /// would write to a cache line that every send reads.
    static HOLDING: Cell<usize> = const { Cell::new(0) };
}

/// The bit of [`HOLDING`] that says a wake is owed: a channel's address is even.
const OWED: usize = 1;

/// Takes the inbox in under the lock: [`Chan::take_in`], made where its bounds are known.
/// It is handed the state, not a [`Guard`]: a guard whose address went to a call when the
/// lock is taken, made or not, cost every send a third of its time on one thread.
type TakeIn<F, K, V> = fn(&Chan<F, K, V>, &mut State<F, K, V>);

/// An inbox, and how to take it in.
type WithInbox<F, K, V> = (Inbox<F, K, V>, TakeIn<F, K, V>);

struct State<F: Flavor, K, V> {
    queue: SortedQueue<F::Rank, K, V>,
    /// When sends stopped (see [`Clock`]): every sender went, a receiver called `close`, or
    /// every receiver went. Pending keys are then all due.
    closed_at: Option<u64>,
    /// A receiver has seen the end of the stream; a later `requeue` is refused.
    terminated: bool,
    senders: usize,
    receivers: usize,
    /// Receivers waiting for a batch. Each sleeps on a timer of its own, and each is woken
    /// when a key may be due: a receiver that is not polled again cannot hold up the others.
    receiving: Waiters,
    /// Sends waiting for room (capacity, weight), first come first served.
    room_line: Line,
    /// Sends of a new key waiting for a key slot (`max_keys`), and sends of a key that has
    /// an earlier send waiting here. They wait apart from the room line, so that values for
    /// pending keys still go in.
    key_line: Line,
    /// Sinks waiting for room. They hold no place in line (see [`Tx::poll_flush`]).
    sinks: Waiters,
    /// The last clock reading under the lock: see [`Clock`].
    last_now: Option<u64>,
    /// When each pending run started, oldest first; runs that ended are dropped lazily.
    arrivals: VecDeque<(Run, u64)>,
    counts: Counts,
    next_id: u64,
    /// Values outside the queue that still count toward `capacity` and `max_weight`:
    /// deliveries in flight and dead letters, in an acknowledging channel.
    held_values: usize,
    /// Their weight.
    held_weight: usize,
    /// Key slots (`max_keys`) held by durable sends of new keys while their records become
    /// durable, before their values go in (see [`Tx::send_durably`]).
    held_keys: usize,
    /// Durable sends let in for a pending key, by key hash, while their records become
    /// durable (with `max_keys` only). Should the key leave the queue meanwhile (taken and
    /// decided), its slot stays taken for them: see [`Chan::slots_taken`].
    #[cfg(feature = "durable")]
    riding: HashMap<u64, usize>,
    /// An acknowledging channel's bookkeeping; `None` for a plain one.
    acked: Option<Box<Acked<F, K, V>>>,
    /// Keys and ranks to drop once the lock is released: those that values taken in from
    /// the inbox did not need, and the keys of holds that ended with nothing pending. Here
    /// rather than in [`Guard`], which every call moves: one more `Vec` there made it too
    /// big to move without a `memcpy` call.
    spares: Vec<Spare<F, K>>,
    /// Values sent through the inbox after the last receiver went, to drop once the lock
    /// is released.
    inbox_lost: Vec<Entry<F, K, V>>,
    /// A value taken in from the inbox leads the queue: the receivers must look again.
    inbox_leads: bool,
    /// In a channel with an inbox, the channel whose lock the thread that holds this one
    /// held before it (see [`HOLDING`]).
    held_before: usize,
}

/// A key or rank that a value going in did not need: it is dropped once the lock is
/// released, since its `Drop` is user code.
type Spare<F, K> = (Option<K>, Option<<F as Flavor>::Rank>);

/// Puts `key` among the spares to drop after the lock, its `Drop` being user code that may
/// use the channel; a key whose drop does nothing is dropped here, since the list allocates.
fn set_aside<F: Flavor, K>(spares: &mut Vec<Spare<F, K>>, key: K) {
    if mem::needs_drop::<K>() {
        spares.push((Some(key), None));
    }
}

/// Running totals for [`Stats`].
#[derive(Default)]
struct Counts {
    sent: u64,
    delivered: u64,
    batches: u64,
    requeued: u64,
    by: Deliveries,
    lost: u64,
    /// Values a durable channel's log gave back when it opened.
    recovered: u64,
}

/// Tasks waiting, in the order they came: each is named by an id, and ids only grow, so
/// the list is sorted by id.
#[derive(Default)]
struct Waiters(Vec<(u64, Waker)>);

/// A line of waiting sends, first come first served. Ids only grow, so it is sorted by id.
#[derive(Default)]
struct Line {
    waiting: VecDeque<Waiting>,
    /// How many sends wait per key hash.
    hashes: HashMap<u64, usize>,
}

/// A send waiting in a [`Line`].
struct Waiting {
    id: u64,
    /// Its key's hash: later sends of the same key wait behind it.
    hash: u64,
    /// Its value's weight, to tell whether it fits.
    weight: usize,
    waker: Waker,
}

/// Which line a waiting send is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LineName {
    Room,
    Key,
}

/// A waiting send's place in a line.
#[derive(Clone, Copy)]
struct Place {
    id: u64,
    line: LineName,
}

/// Why a send could not go in now.
enum Blocked {
    Closed,
    /// It must wait in this line.
    Wait(LineName),
}

/// What a receive takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    /// Due keys.
    Due,
    /// Every key, due or not (`drain_now`).
    All,
}

/// A value on its way in, hashed and weighed before the lock is taken.
pub(crate) struct Item<F: Flavor, K, V> {
    input: F::Input,
    hash: u64,
    key: K,
    value: V,
    weight: usize,
    /// Its sequence number in a durable channel's log, once its record is appended.
    seq: Option<u64>,
    /// Its record, encoded before the lock is taken, in a durable channel.
    #[cfg(feature = "durable")]
    encoded: Option<crate::durable::Encoded>,
    /// What it holds of `max_keys` while its record becomes durable.
    #[cfg(feature = "durable")]
    key_hold: KeyHold,
}

/// What a durable send holds of `max_keys` while its record becomes durable.
#[cfg(feature = "durable")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyHold {
    /// Nothing: the channel has no `max_keys`, or the send holds no record.
    None,
    /// A key slot of its own (`State::held_keys`): its key was not pending.
    Slot,
    /// Its key's slot (`State::riding`): its key was pending.
    Rides,
}

impl<F: Flavor, K, V> Item<F, K, V> {
    /// An item with no log record yet.
    fn new(input: F::Input, hash: u64, key: K, value: V, weight: usize) -> Self {
        Item {
            input,
            hash,
            key,
            value,
            weight,
            seq: None,
            #[cfg(feature = "durable")]
            key_hold: KeyHold::None,
            #[cfg(feature = "durable")]
            encoded: None,
        }
    }

    /// What the caller handed in: a refused send gives it back.
    fn into_parts(self) -> (F::Input, K, V) {
        (self.input, self.key, self.value)
    }
}

/// How a send that may go in goes in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Push {
    /// Now.
    Now,
    /// In a durable channel, once its record is durable: its room is held meanwhile (see
    /// [`Tx::send`]). In other channels, now.
    Durably,
}

/// What became of a send that was let in.
enum Pushed {
    /// It went in.
    In,
    /// Its room is held until its log record, this one, is durable.
    #[cfg_attr(not(feature = "durable"), allow(dead_code))]
    Held(u64),
}

/// The locked state. Wakers to wake, and keys and ranks to drop, are gathered while it is
/// held, and released when it drops, after the lock: a waker or a `Drop` may be user code,
/// and user code that touched the channel under its lock would deadlock.
struct Guard<'a, F: Flavor, K, V> {
    chan: &'a Chan<F, K, V>,
    state: Option<MutexGuard<'a, State<F, K, V>>>,
    wakes: Vec<Waker>,
    /// A key or rank that a send did not need.
    spare: Spare<F, K>,
    /// Values no one can receive any more.
    spare_values: Vec<V>,
    /// Whether to notify `closed()` calls.
    notify_closed: bool,
    /// Whether the waiting receivers are to be woken once the lock is released: once is
    /// enough for everything done under it, since they look only after.
    receivers_woken: bool,
}

impl<F: Flavor, K, V> Guard<'_, F, K, V> {
    /// Wakes every waiting receiver once the lock is released (once per lock).
    fn wake_receivers(&mut self) {
        if !mem::replace(&mut self.receivers_woken, true) {
            let state = self.state.as_ref().expect("the guard holds the lock");
            state.receiving.wake_all(&mut self.wakes);
            if let Some((inbox, _)) = self.chan.inbox.as_deref() {
                inbox.woken();
            }
        }
    }
}

impl<F: Flavor, K, V> Deref for Guard<'_, F, K, V> {
    type Target = State<F, K, V>;

    fn deref(&self) -> &Self::Target {
        self.state.as_ref().expect("the guard holds the lock")
    }
}

impl<F: Flavor, K, V> DerefMut for Guard<'_, F, K, V> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.state.as_mut().expect("the guard holds the lock")
    }
}

impl<F: Flavor, K, V> Drop for Guard<'_, F, K, V> {
    fn drop(&mut self) {
        let Some(state) = self.state.as_mut() else {
            return;
        };
        if let Some((_, take_in)) = self.chan.inbox.as_deref() {
            if HOLDING.get() & OWED != 0 {
                pay_owed(self.chan, state, *take_in);
                state.inbox_leads = true;
            }
            // Guards are dropped in the reverse of the order they were made.
            HOLDING.set(state.held_before);
        }
        if mem::take(&mut state.inbox_leads) {
            self.wake_receivers();
        }
        let mut state = self.state.take().expect("the guard holds the lock");
        let trash = match mem::needs_drop::<F::Rank>() {
            true => state.queue.take_trash(),
            false => Vec::new(),
        };
        let spares = mem::take(&mut state.spares);
        let lost = mem::take(&mut state.inbox_lost);
        drop(state);
        drop(trash);
        drop(spares);
        drop(lost);
        self.spare = (None, None);
        self.spare_values = Vec::new();
        self.wakes.drain(..).for_each(Waker::wake);
        if self.notify_closed {
            self.chan.closed.notify_waiters();
        }
    }
}

/// Takes the inbox in, for a send made on this thread by user code under the lock: see
/// [`Chan::wake_after_inbox`]. Taking its value in may run user code that sends again. The
/// caller then wakes the receivers.
#[cold]
fn pay_owed<F: Flavor, K, V>(
    chan: &Chan<F, K, V>,
    state: &mut State<F, K, V>,
    take_in: TakeIn<F, K, V>,
) {
    while HOLDING.get() & OWED != 0 {
        HOLDING.set(chan.addr());
        take_in(chan, state);
    }
}

impl Waiters {
    /// Adds a task under a new id, or updates the waker of the task with id `id`.
    fn enter(&mut self, id: &mut Option<u64>, next_id: &mut u64, waker: &Waker) {
        if let Some(at) = id.and_then(|id| self.find(id)) {
            update_waker(&mut self.0[at].1, waker);
            return;
        }
        *next_id += 1;
        self.0.push((*next_id, waker.clone()));
        *id = Some(*next_id);
    }

    /// Removes the task with id `id`, if it is listed.
    fn leave(&mut self, id: &mut Option<u64>) {
        if let Some(at) = id.take().and_then(|id| self.find(id)) {
            self.0.remove(at);
        }
    }

    fn find(&self, id: u64) -> Option<usize> {
        self.0.binary_search_by_key(&id, |(id, _)| *id).ok()
    }

    fn wake_all(&self, wakes: &mut Vec<Waker>) {
        wakes.extend(self.0.iter().map(|(_, waker)| waker.clone()));
    }

    /// Wakes every task but the one with id `id`.
    fn wake_others(&self, id: Option<u64>, wakes: &mut Vec<Waker>) {
        let others = self.0.iter().filter(|(other, _)| Some(*other) != id);
        wakes.extend(others.map(|(_, waker)| waker.clone()));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Line {
    fn find(&self, id: u64) -> Option<usize> {
        self.waiting.binary_search_by_key(&id, |w| w.id).ok()
    }

    fn is_first(&self, place: Option<Place>) -> bool {
        match self.waiting.front() {
            None => true,
            Some(front) => place.is_some_and(|p| p.id == front.id),
        }
    }

    fn push(&mut self, waiting: Waiting) {
        *self.hashes.entry(waiting.hash).or_default() += 1;
        self.waiting.push_back(waiting);
    }

    /// Removes the send with id `id`; returns whether it was there.
    fn remove(&mut self, id: u64) -> bool {
        let gone = match self.waiting.front() {
            Some(front) if front.id == id => self.waiting.pop_front(),
            _ => self.find(id).and_then(|at| self.waiting.remove(at)),
        };
        let Some(gone) = gone else { return false };
        if let hashbrown::hash_map::Entry::Occupied(mut count) = self.hashes.entry(gone.hash) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
        true
    }

    /// Whether a send for a key of this hash waits here ahead of `place` (or at all, for a
    /// send not in this line).
    fn has_earlier(&self, hash: u64, place: Option<Place>) -> bool {
        if !self.hashes.contains_key(&hash) {
            return false;
        }
        let mine = place.map_or(u64::MAX, |p| p.id);
        self.waiting
            .iter()
            .take_while(|w| w.id < mine)
            .any(|w| w.hash == hash)
    }
}

/// Stores `waker` in `slot` unless it would wake the same task already.
fn update_waker(slot: &mut Waker, waker: &Waker) {
    if !slot.will_wake(waker) {
        slot.clone_from(waker);
    }
}

impl<F: Flavor, K, V> State<F, K, V> {
    fn line(&mut self, line: LineName) -> &mut Line {
        match line {
            LineName::Room => &mut self.room_line,
            LineName::Key => &mut self.key_line,
        }
    }

    /// Notes when `run` began, unless it is noted already: for values that come back to a
    /// key with none pending. The list is in run order, which is the order of their starts,
    /// so the oldest run stays first as long as `at` is the start the run was noted with
    /// before; a run that comes back is most often among the oldest, near the front, where
    /// inserting moves few entries.
    fn note_run(&mut self, run: Run, at: u64) {
        if let Err(place) = self
            .arrivals
            .binary_search_by_key(&run.seq, |(run, _)| run.seq)
        {
            self.arrivals.insert(place, (run, at));
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
        if mostly_unused(arrivals.len(), arrivals.capacity(), 4096) {
            arrivals.shrink_to(arrivals.len() * 2);
        }
    }
}

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Locks the state. A panic in user code (`Hash`, `Eq`, `Ord`, `Clone`) poisons the
    /// lock, but the queue is whole at every point where such code runs, so the state is
    /// still good and the lock is recovered: a panicking key must not wedge the channel.
    ///
    /// In a channel with an inbox, the values in it are taken in first.
    fn lock(&self) -> Guard<'_, F, K, V> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.guard(state)
    }

    /// Locks the state if no one holds the lock, taking the inbox in.
    fn try_lock(&self) -> Option<Guard<'_, F, K, V>> {
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(self.guard(state))
    }

    /// The guard of the locked `state`, with the inbox taken in.
    #[inline(always)]
    fn guard<'a>(&'a self, mut state: MutexGuard<'a, State<F, K, V>>) -> Guard<'a, F, K, V> {
        if let Some((inbox, take_in)) = self.inbox.as_deref() {
            state.held_before = HOLDING.replace(self.addr());
            if !inbox.is_empty() {
                take_in(self, &mut state);
            }
        }
        Guard {
            chan: self,
            state: Some(state),
            wakes: Vec::new(),
            spare: (None, None),
            spare_values: Vec::new(),
            notify_closed: false,
            receivers_woken: false,
        }
    }

    /// The lock for a send that holds no place in a line, or `None` if it is to go through
    /// the inbox instead: the channel has one, the inbox is not full, and either another
    /// thread holds the lock or the inbox holds values already.
    fn lock_to_send(&self) -> Option<Guard<'_, F, K, V>> {
        let Some((inbox, _)) = self.inbox.as_deref() else {
            return Some(self.lock());
        };
        // A send that finds values in the inbox joins them rather than taking them in
        // (`inbox`, "How a send goes in").
        #[cfg(feature = "fault-injection")]
        let try_lock = !self.always_inbox && inbox.is_empty();
        #[cfg(not(feature = "fault-injection"))]
        let try_lock = inbox.is_empty();
        if let Some(guard) = try_lock.then(|| self.try_lock()).flatten() {
            return Some(guard);
        }
        // A send from user code under the lock goes in past the bound: its thread holds the
        // lock, and would wait for ever.
        (inbox.is_full() && !self.holds_lock()).then(|| self.lock())
    }

    /// Whether this thread holds the lock, in a channel with an inbox: a send made by user
    /// code that runs under it.
    fn holds_lock(&self) -> bool {
        HOLDING.get() & !OWED == self.addr()
    }

    fn addr(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    fn now(&self) -> u64 {
        flavor::since(self.epoch, Instant::now())
    }

    /// Whether a value of `weight` fits now, by `capacity` and `max_weight`. A value
    /// heavier than the whole budget still goes into an empty channel.
    fn has_room(&self, state: &State<F, K, V>, weight: usize) -> bool {
        let queue = &state.queue;
        let len = queue.len() + state.held_values;
        let held = queue.weight().saturating_add(state.held_weight);
        let fits = len == 0 || held.saturating_add(weight) <= self.config.max_weight;
        len < self.config.capacity && fits
    }

    /// Key slots taken, for `max_keys`: keys pending or in flight, slots held by durable
    /// sends of new keys, and, in a durable channel, the slot of each key that left the
    /// queue while sends let in for it wait for their records: their values go in as a new
    /// key's. (Counted by hash: a rider's key that left counts as pending while another key
    /// of the same hash is, which 64-bit hashes make too rare to matter.)
    fn slots_taken(&self, state: &State<F, K, V>) -> usize {
        let taken = state.queue.slot_count() + state.held_keys;
        #[cfg(feature = "durable")]
        let taken = taken
            + (state.riding.keys())
                .filter(|&&hash| !state.queue.has_hash(hash))
                .count();
        taken
    }

    /// Whether a send in the key line waits for room alone: the first of the line once a key
    /// slot is free, or the first send of a key that is pending, which needs no slot. Such a
    /// send had its turn for room before any send now in the room line came (a send joins the
    /// key line only from the front of the room line, or while it is empty), so those, and
    /// new sends, go in after it, as in one line.
    fn key_line_waits_for_room(&self, state: &State<F, K, V>) -> bool {
        let line = &state.key_line.waiting;
        if line.is_empty() {
            return false;
        }
        if self.slots_taken(state) < self.config.max_keys {
            return true;
        }
        // No slot is free: only sends of pending keys may go in. A hash shared with a pending
        // key counts too, which at worst holds others back while that send waits.
        line.iter()
            .any(|waiting| state.queue.has_hash(waiting.hash))
    }

    /// Wakes every send that may go in now:
    ///
    /// - the first of the room line, if there is room for it and no send in the key line
    ///   waits for room alone (see [`key_line_waits_for_room`](Self::key_line_waits_for_room));
    /// - the first of the key line, if there is room and a key slot;
    /// - in the key line, the first send of each key that is pending, if there is room: it
    ///   needs no key slot (a key's values go in in order, so only its first send may);
    /// - the sinks, if no send waits for room (in either line) and there is room.
    ///
    /// Call it after anything that can change who may go in: room coming back, a key
    /// becoming pending, the first of a line moving on.
    fn serve(&self, guard: &mut Guard<'_, F, K, V>) {
        let state = guard.state.as_ref().expect("the guard holds the lock");
        let wakes = &mut guard.wakes;
        let key_line_first = self.key_line_waits_for_room(state);
        if let Some(front) = state.room_line.waiting.front() {
            if !key_line_first && self.has_room(state, front.weight) {
                wakes.push(front.waker.clone());
            }
        }
        let key_line = &state.key_line.waiting;
        if let Some(front) = key_line.front() {
            let slot = self.slots_taken(state) < self.config.max_keys;
            if slot && self.has_room(state, front.weight) {
                wakes.push(front.waker.clone());
            }
            // The key line is short (it holds sends for new keys, beyond `max_keys`), and
            // this runs only while it is not empty.
            let mut seen = HashSet::with_capacity(state.key_line.hashes.len());
            for waiting in key_line {
                let first_of_key = seen.insert(waiting.hash);
                if first_of_key
                    && state.queue.has_hash(waiting.hash)
                    && self.has_room(state, waiting.weight)
                {
                    wakes.push(waiting.waker.clone());
                }
            }
        }
        let no_one_waits = state.room_line.waiting.is_empty() && !key_line_first;
        if !state.sinks.is_empty() && no_one_waits && self.has_room(state, 0) {
            state.sinks.wake_all(wakes);
        }
    }

    /// Gives up a waiting send's place: whoever it held back may now go in.
    fn leave(&self, guard: &mut Guard<'_, F, K, V>, place: Place) {
        if guard.line(place.line).remove(place.id) {
            self.serve(guard);
        }
    }

    /// Closes the channel, waking every waiting task; `false` if it was closed already.
    fn close(&self, guard: &mut Guard<'_, F, K, V>) -> bool {
        if guard.closed_at.is_some() {
            return false;
        }
        guard.closed_at = Some(self.now());
        if let Some((inbox, _)) = self.inbox.as_deref() {
            inbox.close();
        }
        // Waiting receivers now have the whole queue due; waiting senders now fail.
        let state = guard.state.as_ref().expect("the guard holds the lock");
        let wakes = &mut guard.wakes;
        state.receiving.wake_all(wakes);
        state.sinks.wake_all(wakes);
        if let Some(acked) = &state.acked {
            acked.wake_dead(wakes);
        }
        let lines = state
            .room_line
            .waiting
            .iter()
            .chain(&state.key_line.waiting);
        wakes.extend(lines.map(|w| w.waker.clone()));
        guard.notify_closed = true;
        true
    }

    /// Puts `items` under `key` in `queue`, ranked by the flavour from `input` as they join
    /// the key's pending values; `clock` reads the time, under the lock.
    fn insert_ranked(
        &self,
        queue: &mut SortedQueue<F::Rank, K, V>,
        clock: &mut Clock<'_>,
        (hash, key, input): (u64, K, F::Input),
        items: Items<V>,
    ) -> Inserted<F::Rank, K>
    where
        K: Hash + Eq + Clone,
        F::Rank: Ord + Clone,
    {
        // A key that leads with a deadline never reached wakes no one: it moves no deadline
        // a receiver could sleep until. Whenever the key leads, its rank is the one made here.
        let mut comes_due = true;
        let rank = |current: Option<&F::Rank>, values, weight| {
            let joining = Joining {
                current,
                values,
                weight,
                config: &self.config,
                clock,
            };
            let rank = F::rank(input, joining);
            comes_due = rank.as_ref().is_none_or(F::comes_due);
            rank
        };
        let mut inserted = queue.insert(hash, key, items, rank, F::USER_ORD);
        inserted.leads &= comes_due;
        inserted
    }

    /// The rank `input` gives a key on its own (a flush, a requeue), and the time now;
    /// `last_now` is the state's last clock reading.
    fn rank_alone(&self, last_now: &mut Option<u64>, input: F::Input) -> (F::Rank, u64) {
        let mut clock = Clock::new(self.epoch, last_now);
        let joining = Joining {
            current: None,
            values: 0,
            weight: 0,
            config: &self.config,
            clock: &mut clock,
        };
        let rank = F::rank(input, joining).expect("a key on its own has a rank");
        (rank, clock.now())
    }

    fn item(&self, input: F::Input, key: K, value: V) -> Item<F, K, V>
    where
        K: Hash,
    {
        // User code (the weigher, `Hash`) runs here, before the lock is taken.
        let weight = self.weigh.as_ref().map_or(1, |weigh| weigh(&value));
        let hash = self.hasher.hash_one(&key);
        // And `Serialize`, in a durable channel.
        #[cfg(feature = "durable")]
        let encoded = self
            .log
            .as_ref()
            .map(|log| log.encode(&input, &key, &value));
        Item {
            #[cfg(feature = "durable")]
            encoded,
            ..Item::new(input, hash, key, value, weight)
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
        guard: &mut Guard<'_, F, K, V>,
        item: &mut Option<Item<F, K, V>>,
        place: &mut Option<Place>,
        push: Push,
    ) -> Result<Pushed, Blocked> {
        let state = &mut **guard;
        if state.closed_at.is_some() {
            return Err(Blocked::Closed);
        }
        let config = &self.config;
        let queued = item.as_ref().expect("an item to send");
        // A send waits for room first, in turn; then, for a new key, for a key slot, in
        // turn. Once in the key line it has had its turn for room, so it does not queue for
        // room again: two lines that each waited on the other would hand turns back and
        // forth for ever.
        let in_key_line = place.is_some_and(|p| p.line == LineName::Key);
        let room = self.has_room(state, queued.weight);
        let behind = !in_key_line
            && (!state.room_line.is_first(*place)
                || (config.max_keys != usize::MAX && self.key_line_waits_for_room(state)));
        if !room || behind {
            let line = match in_key_line {
                true => LineName::Key,
                false => LineName::Room,
            };
            return Err(Blocked::Wait(line));
        }
        // Values of a key go in in the order they were sent: not past an earlier send of
        // the same key that waits for a key slot.
        let key_place = place.filter(|p| p.line == LineName::Key);
        let mut new_key = false;
        if config.max_keys != usize::MAX {
            let pending = state.queue.contains_hashed(queued.hash, &queued.key);
            let turn = match pending {
                true => !state.key_line.has_earlier(queued.hash, key_place),
                false => {
                    let slots = self.slots_taken(state);
                    slots < config.max_keys && state.key_line.is_first(key_place)
                }
            };
            if !turn {
                return Err(Blocked::Wait(LineName::Key));
            }
            new_key = !pending;
        }
        // The total weight must fit, with what is held outside the queue (in flight, in dead
        // letters, waiting for its record): the queue checks only its own, and a batch that
        // moved an overflowing weight out of it would wrap. Checked before anything changes,
        // a log record included, and while the value is still the caller's, so that it is
        // dropped after the lock.
        let total = (state.queue.weight().checked_add(state.held_weight))
            .and_then(|held| held.checked_add(queued.weight));
        assert!(total.is_some(), "the total pending weight overflows usize");
        // It goes in. In a durable channel its record goes first, under the lock, so that
        // any record of its delivery comes after it in the log.
        #[cfg(feature = "durable")]
        if let Some(log) = &self.log {
            let queued = item.as_mut().expect("an item to send");
            let mut encoded = queued.encoded.take().expect("encoded when the log is on");
            // Its arrival is now, when it goes in, not when it was encoded: the window starts
            // after any wait for room.
            encoded.arrival = crate::durable::Clocks::wall_now();
            let Ok((seq, record)) = log.journal.send(&encoded) else {
                // A failed log takes no more values: it closes the channel, so that every
                // waiting send fails too, and receivers drain what is pending.
                self.close(guard);
                return Err(Blocked::Closed);
            };
            queued.seq = Some(seq);
            if push == Push::Durably {
                state.held_values += 1;
                state.held_weight += queued.weight;
                // A new key's slot is taken now, or other new keys would go in beside it
                // while its record is written, past `max_keys`. A second send of the key
                // meanwhile takes one too, since the key is not pending yet: it waits. A
                // pending key's slot is kept for the send, should the key leave meanwhile.
                if new_key {
                    state.held_keys += 1;
                    queued.key_hold = KeyHold::Slot;
                } else if config.max_keys != usize::MAX {
                    *state.riding.entry(queued.hash).or_default() += 1;
                    queued.key_hold = KeyHold::Rides;
                }
                self.moved_on(guard, place);
                return Ok(Pushed::Held(record));
            }
        }
        let _ = (push, new_key); // read only by a durable channel
        self.insert_item(guard, item.take().expect("an item to send"));
        self.moved_on(guard, place);
        Ok(Pushed::In)
    }

    /// A send that was in line went in: whoever it held back may go in now.
    fn moved_on(&self, guard: &mut Guard<'_, F, K, V>, place: &mut Option<Place>) {
        if let Some(place) = place.take() {
            // The line moved on, and the key is pending: room may be left for the next in
            // line, or for the next send of this key. A send that was in no line held no
            // one back, and its key had no earlier send waiting, so it has no one to wake.
            guard.line(place.line).remove(place.id);
            self.serve(guard);
        }
    }

    /// Puts a value that was let in into the queue.
    fn insert_item(&self, guard: &mut Guard<'_, F, K, V>, item: Item<F, K, V>) {
        let (spare, leads) = self.insert_at(guard, item, None);
        guard.spare = spare;
        if leads {
            guard.wake_receivers();
        }
    }

    /// Puts a value into the queue, ranked as of `arrival` if given (a value from the
    /// inbox), else as of now. Returns the key or rank it did not need, and whether it
    /// leads the queue now.
    #[inline(always)]
    fn insert_at(
        &self,
        state: &mut State<F, K, V>,
        item: Item<F, K, V>,
        arrival: Option<u64>,
    ) -> (Spare<F, K>, bool) {
        let Item {
            input,
            hash,
            key,
            value,
            weight,
            seq,
            ..
        } = item;
        let items = match seq {
            Some(seq) => Items::AppendLogged(value, weight, seq, 0),
            None => Items::Append(value, weight),
        };
        // Read the clock under the lock, so ranks go in in the order values do. A value
        // from the inbox is due a window after it was sent, not after it was taken in.
        let mut clock = match arrival {
            Some(at) => Clock::at(self.epoch, &mut state.last_now, at),
            None => Clock::new(self.epoch, &mut state.last_now),
        };
        let mut inserted =
            self.insert_ranked(&mut state.queue, &mut clock, (hash, key, input), items);
        // When the run started, for the oldest-age figure.
        let arrival = inserted.new_run.map(|run| (run, clock.now()));
        state.arrivals.extend(arrival);
        state.counts.sent += 1;
        let spare = (inserted.spare_key.take(), inserted.spare_rank.take());
        if let Some(panic) = inserted.panic.take() {
            // Another sort key's `Ord` panicked after the value went in: it is pending and
            // counted, and the spare key and rank drop after the lock.
            state.spares.push(spare);
            panic::resume_unwind(panic);
        }
        (spare, inserted.leads)
    }

    /// Takes the inbox in: puts its values into the queue, in the order they were sent.
    ///
    /// `Eq` and `Ord` run here for values sent through the inbox. A value whose key panics
    /// in them is dropped and counted as lost, and the panic goes no further: the call that
    /// takes the inbox in (any call that takes the lock) did not send it. Every other value
    /// goes in, and nothing deadlocks, since the lock is not poisoned.
    fn take_in(&self, state: &mut State<F, K, V>) {
        let Some((inbox, _)) = self.inbox.as_deref() else {
            return;
        };
        if state.receivers == 0 {
            // Sent as the last receiver went: no one can receive them. They are lost, as
            // the values pending then were, and dropped after the lock.
            let lost = inbox.take();
            let before = state.inbox_lost.len();
            state.inbox_lost.extend(lost);
            state.counts.lost += (state.inbox_lost.len() - before) as u64;
            return;
        }
        for entry in inbox.take() {
            let arrival = entry.arrival;
            let item = entry.into_item();
            let values = state.queue.len();
            let put = panic::catch_unwind(AssertUnwindSafe(|| {
                self.insert_at(state, item, Some(arrival))
            }));
            match put {
                Ok((spare, leads)) => {
                    state.inbox_leads |= leads;
                    if spare.0.is_some() || spare.1.is_some() {
                        state.spares.push(spare);
                    }
                }
                // `Ord` of another sort key panicked as the index settled, after the value
                // went in: it is pending, and `insert_at` counted it.
                Err(_) if state.queue.len() > values => state.inbox_leads = true,
                Err(_) => state.counts.lost += 1,
            }
        }
    }

    /// Sends `item` through the inbox, ranked as of now. Hands it back if the channel is
    /// closed.
    #[inline(never)]
    fn through_inbox(&self, item: Item<F, K, V>) -> Result<(), Item<F, K, V>> {
        let (inbox, _) = self.inbox.as_deref().expect("a channel with an inbox");
        // The arrival is now: the value is due a window after this, whenever it is taken in.
        let arrival = self.now();
        let due = F::due_alone(&item.input, arrival, self.epoch, &self.config);
        let pushed = match inbox.push(Entry::new(item, arrival), due) {
            Ok(pushed) => pushed,
            Err(Closed { entry, seen }) => {
                if seen {
                    // A receiver may have found it in flight, and wait for it to finish.
                    self.wake_after_inbox();
                }
                return Err(entry.into_item());
            }
        };
        if pushed.earlier || pushed.closed {
            self.wake_after_inbox();
        }
        Ok(())
    }

    /// Wakes the receivers after a send through the inbox: taking the lock takes the value
    /// in, and the receivers then look again. A send from user code under the lock leaves
    /// that to the lock's holder, its own caller, which does it before it lets go.
    fn wake_after_inbox(&self) {
        match self.holds_lock() {
            true => HOLDING.set(self.addr() | OWED),
            false => self.lock().wake_receivers(),
        }
    }

    /// Sends `item`, waiting for room: the core of `send`.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        item: &mut Option<Item<F, K, V>>,
        place: &mut Option<Place>,
        push: Push,
    ) -> Poll<Result<Pushed, Refused<F, K, V>>> {
        // Take part in tokio's cooperative scheduling, as its channels do: a producer whose
        // sends are always ready must still yield now and then, or on a runtime whose
        // workers all produce, the timer that wakes receivers is never driven.
        let coop = ready!(coop::poll_proceed(cx));
        let guard = match place {
            Some(_) => Some(self.lock()),
            None => self.lock_to_send(),
        };
        let Some(mut guard) = guard else {
            coop.made_progress();
            let item = item.take().expect("an item to send");
            return Poll::Ready(match self.through_inbox(item) {
                Ok(()) => Ok(Pushed::In),
                Err(item) => Err(SendError(item.into_parts())),
            });
        };
        let line = match self.try_push(&mut guard, item, place, push) {
            Ok(pushed) => {
                coop.made_progress();
                return Poll::Ready(Ok(pushed));
            }
            Err(Blocked::Closed) => {
                if let Some(p) = place.take() {
                    self.leave(&mut guard, p);
                }
                coop.made_progress();
                let item = item.take().expect("an item to send");
                return Poll::Ready(Err(SendError(item.into_parts())));
            }
            Err(Blocked::Wait(line)) => line,
        };
        // Wait in the right line, moving over if the send now waits for something else.
        if let Some(p) = *place {
            if p.line != line {
                self.leave(&mut guard, p);
                *place = None;
            }
        }
        let queued = item.as_ref().expect("an item to send");
        match *place {
            Some(p) => {
                let waiting = guard.line(line);
                let at = waiting.find(p.id).expect("a waiting send is in line");
                update_waker(&mut waiting.waiting[at].waker, cx.waker());
            }
            None => {
                guard.next_id += 1;
                let id = guard.next_id;
                let (hash, weight) = (queued.hash, queued.weight);
                guard.line(line).push(Waiting {
                    id,
                    hash,
                    weight,
                    waker: cx.waker().clone(),
                });
                *place = Some(Place { id, line });
            }
        }
        Poll::Pending
    }

    /// Takes the next batch under the lock, counting why each key came due.
    fn pop(&self, state: &mut State<F, K, V>, now: u64, take: Take) -> Batch<K, V> {
        let (max_values, max_weight) = (self.config.max_batch, self.config.max_batch_weight);
        self.pop_with(state, now, take, |state, is_due| {
            let batch = state
                .queue
                .pop_batch_weighted(max_values, max_weight, is_due);
            let values = batch.iter().map(|(_, values)| values.len()).sum();
            (batch, values)
        })
    }

    /// Takes the next batch with `from`, which takes from the queue what `is_due` allows
    /// and says how many values it took; counts why each key came due, and the batch.
    fn pop_with<T>(
        &self,
        state: &mut State<F, K, V>,
        now: u64,
        take: Take,
        from: impl FnOnce(&mut State<F, K, V>, &mut dyn FnMut(&F::Rank) -> bool) -> (Vec<T>, usize),
    ) -> Vec<T> {
        let closed_at = state.closed_at;
        // Counted apart, and added only once the batch is made: a panic in user code while
        // it is made delivers nothing, and must count nothing.
        let mut by = Deliveries::default();
        let mut is_due = |rank: &F::Rank| {
            // Count the first reason the key came due: a key that was due before the close
            // counts by its own reason, even when taken after it.
            let counter = match closed_at {
                Some(at) if !F::is_due(rank, at) => &mut by.close,
                _ if F::is_due(rank, now) || closed_at.is_some() => match F::reason(rank) {
                    Reason::Deadline => &mut by.due,
                    Reason::FullKey => &mut by.full_key,
                    Reason::Flush => &mut by.flush,
                },
                _ if take == Take::All => &mut by.flush,
                _ => return false,
            };
            *counter += 1;
            true
        };
        let (batch, values) = from(state, &mut is_due);
        // The runs just delivered are mostly the oldest: drop them now, while their slots'
        // buckets are still in cache.
        state.drop_ended_runs();
        if !batch.is_empty() {
            state.counts.by.add(by);
            state.counts.batches += 1;
            state.counts.delivered += values as u64;
        }
        batch
    }

    /// Who to wake after a batch was taken: every waiting receiver if due work is left
    /// behind, and the sends that now have room.
    fn after_batch(&self, guard: &mut Guard<'_, F, K, V>, now: u64) {
        let closed = guard.closed_at.is_some();
        // Each front on its own, so that no user `Ord` runs after the batch was taken: a
        // panic here would lose the batch.
        let due_left = guard
            .queue
            .fronts()
            .any(|rank| closed || F::is_due(rank, now));
        if due_left {
            guard.wake_receivers();
        }
        self.serve(guard);
    }
}

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Whether the stream has ended: the channel is closed, nothing is pending, and no
    /// delivery is in flight.
    fn is_drained(&self, state: &State<F, K, V>) -> bool {
        let in_flight = state.acked.as_ref().is_some_and(|a| a.in_flight() > 0);
        let settled = self.inbox.as_ref().is_none_or(|with| with.0.is_settled());
        state.closed_at.is_some() && state.queue.is_empty() && !in_flight && settled
    }

    /// When a waiting receiver must look again: the earliest deadline, or the end of the
    /// earliest held retry.
    fn next_wake(&self, state: &State<F, K, V>) -> Option<u64>
    where
        F::Rank: Ord,
    {
        // The earlier of the fronts' deadlines, compared as times: no user `Ord` runs.
        let deadline = state.queue.fronts().filter_map(F::deadline).min();
        let retry = state.acked.as_ref().and_then(|a| a.next_release());
        match (deadline, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn stats(&self) -> Stats {
        let mut state = self.lock();
        state.drop_ended_runs();
        let now = self.now();
        let oldest = state
            .arrivals
            .front()
            .map(|(_, since)| std::time::Duration::from_nanos(now.saturating_sub(*since)));
        let queue = &state.queue;
        let counts = &state.counts;
        let mut stats = Stats {
            pending_values: queue.len(),
            pending_keys: queue.key_count(),
            pending_weight: queue.weight(),
            oldest_pending: oldest,
            sent: counts.sent,
            delivered: counts.delivered,
            batches: counts.batches,
            delivered_by: counts.by,
            requeued: counts.requeued,
            lost: counts.lost,
            senders: state.senders,
            receivers: state.receivers,
            ..Stats::default()
        };
        if let Some(acked) = &state.acked {
            acked.add_stats(&mut stats);
        }
        stats.log_recovered = counts.recovered;
        #[cfg(feature = "durable")]
        self.add_log_stats(&mut stats);
        stats
    }
}

/// Makes a channel; an acknowledging one if `acked`.
pub(crate) fn channel<F: Flavor, K: Hash + Eq + Clone, V>(
    config: Config,
    weigher: impl Weigher<V>,
    acked: bool,
) -> (Tx<F, K, V>, Rx<F, K, V>)
where
    F::Rank: Ord + Clone,
{
    // Sends go through an inbox only where they need nothing from the locked state: no
    // limit that counts what is pending, and no deliveries to hold (see `inbox`).
    let unlimited = [
        config.capacity,
        config.max_weight,
        config.max_keys,
        config.max_values_per_key,
        config.max_key_weight,
    ]
    .iter()
    .all(|limit| *limit == usize::MAX);
    let take_in: TakeIn<F, K, V> = |chan, state| chan.take_in(state);
    // Deadlines before the epoch count as the epoch (they are all due), so take it as late
    // as we can: now, not when the builder was made.
    let parts = Parts {
        acked,
        epoch: Instant::now(),
        log: Log::default(),
        take_in: (unlimited && !acked).then_some(take_in),
    };
    make(config, config::weigh(weigher), parts)
}

/// Makes a durable channel: an acknowledging one with a log, whose clock starts at `epoch`.
#[cfg(feature = "durable")]
pub(crate) fn durable<F: Flavor + 'static, K: Send + 'static, V: Send + 'static>(
    config: Config,
    weigher: impl Weigher<V>,
    log: crate::durable::Attached<F, K, V>,
    epoch: Instant,
) -> (Tx<F, K, V>, Rx<F, K, V>)
where
    F::Rank: Ord + Send,
    F::Input: Send,
{
    let parts = Parts {
        acked: true,
        epoch,
        log: Some(log),
        take_in: None,
    };
    let (tx, rx) = make(config, config::weigh(weigher), parts);
    tx.chan.close_on_log_failure();
    (tx, rx)
}

/// What sets channels apart beside their limits.
struct Parts<F: Flavor, K, V> {
    acked: bool,
    epoch: Instant,
    log: Log<F, K, V>,
    /// For a channel with an inbox, how it is taken in.
    take_in: Option<TakeIn<F, K, V>>,
}

/// A durable channel's log, in a channel's parts; nothing without the feature.
#[cfg(feature = "durable")]
type Log<F, K, V> = Option<crate::durable::Attached<F, K, V>>;
#[cfg(not(feature = "durable"))]
type Log<F, K, V> = std::marker::PhantomData<fn() -> (F, K, V)>;

fn make<F: Flavor, K, V>(
    config: Config,
    weigh: Weigh<V>,
    parts: Parts<F, K, V>,
) -> (Tx<F, K, V>, Rx<F, K, V>)
where
    F::Rank: Ord,
{
    let mut queue = SortedQueue::new();
    // Ranks the queue drops may be user types: the guard drops them after the lock.
    queue.defer_drops();
    let hasher = queue.hasher().clone();
    let chan = Arc::new(Chan {
        state: Mutex::new(State {
            queue,
            closed_at: None,
            terminated: false,
            senders: 1,
            receivers: 1,
            receiving: Waiters::default(),
            room_line: Line::default(),
            key_line: Line::default(),
            sinks: Waiters::default(),
            last_now: None,
            arrivals: VecDeque::new(),
            counts: Counts::default(),
            next_id: 0,
            held_values: 0,
            held_weight: 0,
            held_keys: 0,
            #[cfg(feature = "durable")]
            riding: HashMap::new(),
            acked: parts
                .acked
                .then(|| Box::new(Acked::new(config.max_attempts))),
            spares: Vec::new(),
            inbox_lost: Vec::new(),
            inbox_leads: false,
            held_before: 0,
        }),
        config,
        epoch: parts.epoch,
        hasher,
        weigh,
        closed: Notify::new(),
        #[cfg(feature = "durable")]
        log: parts.log,
        inbox: parts
            .take_in
            .map(|take_in| Box::new((Inbox::new(), take_in))),
        #[cfg(feature = "fault-injection")]
        always_inbox: std::env::var_os("KEYED_BATCH_INBOX").is_some_and(|v| v == "always"),
    });
    let rx = Rx {
        chan: Arc::clone(&chan),
        waiting: None,
        timer: Timer::default(),
        ended: false,
    };
    let tx = Tx {
        chan,
        sink: Mutex::new(None),
        sink_waiting: None,
        connected: true,
    };
    (tx, rx)
}

// ===== impl Tx =====

/// The sending half every flavour's `Sender` wraps.
pub(crate) struct Tx<F: Flavor, K, V> {
    chan: Arc<Chan<F, K, V>>,
    /// The value `start_send` handed over, until it goes in. Only `&mut self` methods touch
    /// it, through `get_mut`, so the mutex is never locked: it is there to keep a sender
    /// `Sync` when `K` and `V` are only `Send`.
    sink: Mutex<Option<Item<F, K, V>>>,
    /// The sink's id among the sinks waiting for room.
    sink_waiting: Option<u64>,
    /// Whether this handle counts as a sender: `Sink::poll_close` disconnects it.
    connected: bool,
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Tx<F, K, V>
where
    F::Rank: Ord + Clone,
{
    pub(crate) fn try_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), TrySendError<(F::Input, K, V)>> {
        if !self.connected {
            return Err(TrySendError::Closed((input, key, value)));
        }
        let mut item = Some(self.chan.item(input, key, value));
        let Some(mut guard) = self.chan.lock_to_send() else {
            let item = item.take().expect("an item to send");
            let refused = self.chan.through_inbox(item);
            return refused.map_err(|item| TrySendError::Closed(item.into_parts()));
        };
        let pushed = self
            .chan
            .try_push(&mut guard, &mut item, &mut None, Push::Now);
        drop(guard);
        let full = match pushed {
            Ok(_) => return Ok(()),
            Err(Blocked::Closed) => false,
            Err(Blocked::Wait(_)) => true,
        };
        let parts = item.expect("a refused item").into_parts();
        match full {
            true => Err(TrySendError::Full(parts)),
            false => Err(TrySendError::Closed(parts)),
        }
    }

    pub(crate) async fn send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        if !self.connected {
            return Err(SendError((input, key, value)));
        }
        let mut item = Some(self.chan.item(input, key, value));
        // Our place in line; dropping the future gives it up.
        let mut place = PlaceGuard {
            chan: &*self.chan,
            place: None,
        };
        let push = Push::Durably;
        let pushed = poll_fn(|cx| self.chan.poll_send(cx, &mut item, &mut place.place, push));
        match pushed.await? {
            Pushed::In => Ok(()),
            Pushed::Held(record) => self.send_durably(item.expect("held"), record).await,
        }
    }

    /// The end of a durable `send`: waits until its record is durable, then puts the value
    /// in; on a failed log, lets its room go and hands it back.
    #[cfg(feature = "durable")]
    async fn send_durably(&self, item: Item<F, K, V>, record: u64) -> Result<(), Refused<F, K, V>> {
        let chan = &*self.chan;
        let log = chan
            .log
            .as_ref()
            .expect("only a durable channel holds room");
        // If this future is dropped now, the value is not sent: its room goes, and its
        // record is marked done, so that it does not come back after a restart.
        let mut held = HeldRoom {
            chan,
            item: Some(item),
        };
        let durable = log.journal.durable(record).await;
        let mut guard = chan.lock();
        if durable.is_ok() && guard.closed_at.is_some() {
            // The channel closed while the record was written: the send fails, as a send to
            // a closed channel does, and hands the value back, unsent, as a dropped send is.
            let item = held.unsend(&mut guard);
            drop(guard);
            return Err(SendError(item.into_parts()));
        }
        let item = held.release(&mut guard);
        let held_key = item.key_hold == KeyHold::Slot;
        if durable.is_err() {
            // `Sender::log_error` says why. The record may have reached the disk even so
            // (a failed sync says nothing about what was written): the value may come back
            // after a restart, which at-least-once allows.
            chan.close(&mut guard);
            chan.serve(&mut guard);
            drop(guard);
            return Err(SendError(item.into_parts()));
        }
        chan.insert_item(&mut guard, item);
        if held_key {
            // Its key may have been pending already, so a slot may have come free.
            chan.serve(&mut guard);
        }
        Ok(())
    }

    #[cfg(not(feature = "durable"))]
    async fn send_durably(&self, _: Item<F, K, V>, _: u64) -> Result<(), Refused<F, K, V>> {
        unreachable!("only a durable channel holds room")
    }

    pub(crate) fn blocking_send(
        &self,
        input: F::Input,
        key: K,
        value: V,
    ) -> Result<(), Refused<F, K, V>> {
        // Inside a runtime, tokio's `block_on` refuses (panics, with its own message) to
        // block a thread that drives async tasks, and allows it on `spawn_blocking` threads.
        match Handle::try_current() {
            Ok(handle) => handle.block_on(self.send(input, key, value)),
            Err(_) => block_on(self.send(input, key, value)),
        }
    }

    /// `Sink::poll_flush` (and `poll_ready`): sends the value `start_send` took, if any.
    ///
    /// A sink that waits for room holds no place in the line of waiting sends: it tries
    /// again whenever room comes back and no send waits for it. A sink left unpolled with a
    /// value (after a timeout, say) then holds up nobody.
    pub(crate) fn poll_flush(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SinkRefused<F, K, V>>> {
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        if sink.is_none() {
            return Poll::Ready(Ok(()));
        }
        if !self.connected {
            let item = sink.take().expect("a value to send");
            return Poll::Ready(Err(SendError(Some(item.into_parts()))));
        }
        let coop = ready!(coop::poll_proceed(cx));
        let chan = &*self.chan;
        let Some(mut guard) = chan.lock_to_send() else {
            coop.made_progress();
            let item = sink.take().expect("a value to send");
            let refused = chan.through_inbox(item);
            return Poll::Ready(refused.map_err(|item| SendError(Some(item.into_parts()))));
        };
        let pushed = chan.try_push(&mut guard, sink, &mut None, Push::Now);
        if let Err(Blocked::Wait(_)) = pushed {
            let state = &mut *guard;
            state
                .sinks
                .enter(&mut self.sink_waiting, &mut state.next_id, cx.waker());
            return Poll::Pending;
        }
        guard.sinks.leave(&mut self.sink_waiting);
        coop.made_progress();
        match pushed {
            Ok(_) => Poll::Ready(Ok(())),
            Err(_) => {
                let item = sink.take().expect("a refused value");
                Poll::Ready(Err(SendError(Some(item.into_parts()))))
            }
        }
    }

    /// `Sink::poll_ready`: sends the value `start_send` took, if any; fails if the channel
    /// is closed to this sender.
    pub(crate) fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SinkRefused<F, K, V>>> {
        ready!(self.poll_flush(cx))?;
        match self.is_closed() {
            true => Poll::Ready(Err(SendError(None))),
            false => Poll::Ready(Ok(())),
        }
    }

    /// `Sink::poll_close`: sends the value `start_send` took, if any, then disconnects this
    /// handle. If it was the last sender, the channel closes.
    pub(crate) fn poll_close(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SinkRefused<F, K, V>>> {
        let flushed = ready!(self.poll_flush(cx));
        self.disconnect();
        Poll::Ready(flushed)
    }

    /// `Sink::start_send`: takes a value, which the next `poll_ready` or `poll_flush` sends.
    pub(crate) fn start_send(&mut self, input: F::Input, key: K, value: V) {
        let item = self.chan.item(input, key, value);
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        assert!(
            sink.is_none(),
            "start_send called before poll_ready returned Ready(Ok(()))"
        );
        *sink = Some(item);
    }
}

impl<F: Flavor, K, V> Tx<F, K, V> {
    /// Takes back the value `start_send` took, if it has not gone in.
    pub(crate) fn abort_send(&mut self) -> Option<(F::Input, K, V)> {
        let sink = self.sink.get_mut().unwrap_or_else(PoisonError::into_inner);
        let item = sink.take()?;
        if self.sink_waiting.is_some() {
            self.chan.lock().sinks.leave(&mut self.sink_waiting);
        }
        Some(item.into_parts())
    }

    /// Stops this handle counting as a sender; the last one to stop closes the channel.
    fn disconnect(&mut self) {
        if !mem::take(&mut self.connected) {
            return;
        }
        let mut guard = self.chan.lock();
        guard.sinks.leave(&mut self.sink_waiting);
        guard.senders -= 1;
        if guard.senders == 0 {
            self.chan.close(&mut guard);
        }
    }

    /// Lowers `key`'s rank (or every key's, for `None`) to what `input` ranks at now.
    pub(crate) fn flush(&self, key: Option<&K>, input: F::Input)
    where
        K: Hash + Eq + Clone,
        F::Rank: Ord + Clone,
    {
        let hash = key.map(|key| self.chan.hasher.hash_one(key));
        let chan = &*self.chan;
        let mut guard = chan.lock();
        let state = &mut *guard;
        let (rank, _) = chan.rank_alone(&mut state.last_now, input);
        let moved = match (key, hash) {
            (Some(key), Some(hash)) => state.queue.promote_hashed(hash, key, rank),
            _ => state.queue.promote_all(rank),
        };
        if moved {
            guard.wake_receivers();
        }
    }

    pub(crate) async fn closed(&self) {
        let mut notified = pin!(self.chan.closed.notified());
        loop {
            // Register first, then look: a close in between still wakes us.
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.chan.closed.notified());
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        self.chan.stats()
    }

    #[cfg(feature = "durable")]
    pub(crate) fn log_error(&self) -> Option<Arc<std::io::Error>> {
        self.chan.log_error()
    }

    pub(crate) fn len(&self) -> usize {
        self.chan.lock().queue.len()
    }

    /// Whether this handle can no longer send: the channel is closed, or `Sink::poll_close`
    /// disconnected the handle.
    pub(crate) fn is_closed(&self) -> bool {
        !self.connected || self.chan.lock().closed_at.is_some()
    }
}

// The value buffered for the `Sink` is moved, never pinned, so a sender is `Unpin` whatever
// `K` and `V` are.
impl<F: Flavor, K, V> Unpin for Tx<F, K, V> {}

impl<F: Flavor, K, V> Clone for Tx<F, K, V> {
    fn clone(&self) -> Self {
        // A clone of a disconnected handle is disconnected too: it never counted.
        if self.connected {
            self.chan.lock().senders += 1;
        }
        Tx {
            chan: Arc::clone(&self.chan),
            sink: Mutex::new(None),
            sink_waiting: None,
            connected: self.connected,
        }
    }
}

impl<F: Flavor, K, V> Drop for Tx<F, K, V> {
    fn drop(&mut self) {
        if self.connected {
            self.disconnect();
        } else if self.sink_waiting.is_some() {
            self.chan.lock().sinks.leave(&mut self.sink_waiting);
        }
    }
}

/// A `send` call's place in line, given up if the call is dropped.
struct PlaceGuard<'a, F: Flavor, K, V> {
    chan: &'a Chan<F, K, V>,
    place: Option<Place>,
}

impl<F: Flavor, K, V> Drop for PlaceGuard<'_, F, K, V> {
    fn drop(&mut self) {
        if let Some(place) = self.place {
            let mut guard = self.chan.lock();
            self.chan.leave(&mut guard, place);
        }
    }
}

/// The room a durable `send` holds while its record becomes durable, given back (and the
/// record marked done) if the send is dropped meanwhile.
#[cfg(feature = "durable")]
struct HeldRoom<'a, F: Flavor, K, V> {
    chan: &'a Chan<F, K, V>,
    item: Option<Item<F, K, V>>,
}

#[cfg(feature = "durable")]
impl<F: Flavor, K, V> HeldRoom<'_, F, K, V> {
    /// Takes the value back, and lets go of the room and key slot it held.
    fn release(&mut self, guard: &mut Guard<'_, F, K, V>) -> Item<F, K, V> {
        let item = self.item.take().expect("the value is held");
        guard.held_values -= 1;
        guard.held_weight -= item.weight;
        match item.key_hold {
            KeyHold::None => {}
            KeyHold::Slot => guard.held_keys -= 1,
            KeyHold::Rides => {
                let riders = guard
                    .riding
                    .get_mut(&item.hash)
                    .expect("a rider is counted");
                *riders -= 1;
                if *riders == 0 {
                    guard.riding.remove(&item.hash);
                }
            }
        }
        item
    }

    /// Takes the value back unsent: as [`release`](Self::release), and its record is marked
    /// done, so that it does not come back after a restart either; whoever its room held
    /// back may go in.
    fn unsend(&mut self, guard: &mut Guard<'_, F, K, V>) -> Item<F, K, V> {
        let item = self.release(guard);
        if let (Some(log), Some(seq)) = (&self.chan.log, item.seq) {
            let _ = log.journal.done(&[seq]);
        }
        self.chan.serve(guard);
        item
    }
}

#[cfg(feature = "durable")]
impl<F: Flavor, K, V> Drop for HeldRoom<'_, F, K, V> {
    fn drop(&mut self) {
        if self.item.is_none() {
            return;
        }
        let mut guard = self.chan.lock();
        let item = self.unsend(&mut guard);
        drop(guard);
        drop(item);
    }
}

// ===== impl Rx =====

/// The receiving half every flavour's `Receiver` wraps.
pub(crate) struct Rx<F: Flavor, K, V> {
    chan: Arc<Chan<F, K, V>>,
    /// This receiver's id among the waiting receivers, while it waits.
    waiting: Option<u64>,
    timer: Timer,
    /// The stream has ended, for `FusedStream`.
    ended: bool,
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Rx<F, K, V>
where
    F::Rank: Ord + Clone,
{
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch<K, V>>> {
        self.poll_batch(cx, |chan, state, now, take| chan.pop(state, now, take))
    }

    /// Waits for what `take` takes under the lock: the core of every `poll_recv`. The
    /// stream ends once the channel is closed and drained.
    fn poll_batch<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut take: impl FnMut(&Chan<F, K, V>, &mut State<F, K, V>, u64, Take) -> Vec<T>,
    ) -> Poll<Option<Vec<T>>> {
        let coop = ready!(coop::poll_proceed(cx));
        loop {
            let chan = &*self.chan;
            // Declared before the guard, so that, should user code panic under the lock,
            // the batch drops after the lock is released: its drop may use the channel.
            let batch;
            let mut guard = chan.lock();
            let now = chan.now();
            batch = take(chan, &mut guard, now, Take::Due);
            if !batch.is_empty() || chan.is_drained(&guard) {
                guard.receiving.leave(&mut self.waiting);
                if batch.is_empty() {
                    // Closed and drained: it stays so.
                    guard.terminated = true;
                } else {
                    chan.after_batch(&mut guard, now);
                }
                drop(guard);
                // Woken before its timer fired (a full key, a flush, a close): drop it.
                self.timer.disarm();
                coop.made_progress();
                self.ended = batch.is_empty();
                return Poll::Ready((!batch.is_empty()).then_some(batch));
            }
            let state = &mut *guard;
            state
                .receiving
                .enter(&mut self.waiting, &mut state.next_id, cx.waker());
            let mut deadline = chan.next_wake(state);
            if let Some((inbox, _)) = chan.inbox.as_deref() {
                // Sends through the inbox wake us if their value is due before this. A send
                // that looked before we said so, at an earlier deadline we had published,
                // and did not wake us, has its value in the inbox now: take those in once.
                // Their deadlines can only lower ours, and lowering needs no second look:
                // a send that looked in between saw this deadline, or woke us itself.
                if !inbox.publish(deadline) {
                    chan.take_in(&mut guard);
                    if mem::take(&mut guard.inbox_leads) {
                        // What leads now, this receiver takes or sleeps until below; the
                        // others may sleep until later.
                        let state = guard.state.as_ref().expect("the guard holds the lock");
                        state.receiving.wake_others(self.waiting, &mut guard.wakes);
                    }
                    let closed = guard.closed_at.is_some();
                    if guard
                        .queue
                        .fronts()
                        .any(|rank| closed || F::is_due(rank, now))
                    {
                        // Due now: take it.
                        drop(guard);
                        continue;
                    }
                    deadline = chan.next_wake(&guard);
                    inbox.lower(deadline);
                }
            }
            let deadline = deadline.and_then(|at| flavor::instant(chan.epoch, at));
            drop(guard);
            let Some(deadline) = deadline else {
                // Nothing pending, or nothing with a deadline: no timer, so an idle wait in
                // paused time does not jump the clock.
                self.timer.disarm();
                return Poll::Pending;
            };
            if self.timer.poll_at(deadline, cx).is_pending() {
                return Poll::Pending;
            }
            // The deadline passed while we looked: take the batch now.
        }
    }

    pub(crate) async fn recv(&mut self) -> Option<Batch<K, V>> {
        self.recv_with(Self::poll_recv).await
    }

    /// Polls with `poll` until it is ready; if cancelled, stops waiting: the core of every
    /// `recv`.
    async fn recv_with<T>(
        &mut self,
        mut poll: impl FnMut(&mut Self, &mut Context<'_>) -> Poll<T>,
    ) -> T {
        /// Stops waiting if `recv` is cancelled.
        struct Cancel<'a, F: Flavor, K, V>(&'a mut Rx<F, K, V>);
        impl<F: Flavor, K, V> Drop for Cancel<'_, F, K, V> {
            fn drop(&mut self) {
                self.0.stop_waiting();
            }
        }
        let cancel = Cancel(self);
        poll_fn(|cx| poll(cancel.0, cx)).await
    }

    pub(crate) fn try_recv(&mut self) -> Result<Batch<K, V>, TryRecvError> {
        self.try_batch(|chan, state, now, take| chan.pop(state, now, take))
    }

    /// Takes what `take` takes under the lock, if anything is due: the core of every
    /// `try_recv`.
    fn try_batch<T>(
        &mut self,
        take: impl FnOnce(&Chan<F, K, V>, &mut State<F, K, V>, u64, Take) -> Vec<T>,
    ) -> Result<Vec<T>, TryRecvError> {
        // A receiver last polled as a stream stops waiting: it holds no timer from now on.
        self.stop_waiting();
        let chan = &*self.chan;
        // Dropped after the lock, should user code panic under it (see `poll_batch`).
        let batch;
        let mut guard = chan.lock();
        let now = chan.now();
        batch = take(chan, &mut guard, now, Take::Due);
        if batch.is_empty() {
            if chan.is_drained(&guard) {
                guard.terminated = true;
                return Err(TryRecvError::Disconnected);
            }
            return Err(TryRecvError::Empty);
        }
        chan.after_batch(&mut guard, now);
        Ok(batch)
    }

    pub(crate) fn drain_now(&mut self) -> Vec<Batch<K, V>> {
        self.drain_batches(|chan, state, now, take| chan.pop(state, now, take))
    }

    /// Takes everything pending now with `take`, in batches: the core of every
    /// `drain_now`.
    fn drain_batches<T>(
        &mut self,
        mut take: impl FnMut(&Chan<F, K, V>, &mut State<F, K, V>, u64, Take) -> Vec<T>,
    ) -> Vec<Vec<T>> {
        self.stop_waiting();
        let chan = &*self.chan;
        // Dropped after the lock, should user code panic under it (see `poll_batch`).
        let mut batches = Vec::new();
        let mut guard = chan.lock();
        let now = chan.now();
        loop {
            // A panic in user code while a batch is made (a key's `Clone`) takes nothing
            // out; but the batches taken before it are out of the queue, and must not be
            // dropped with the panic. So the first panic stops the drain, which hands over
            // what it took; only a drain that took nothing panics. The key is then not split
            // again, and the next drain takes it whole.
            let popped =
                panic::catch_unwind(AssertUnwindSafe(|| take(chan, &mut guard, now, Take::All)));
            match popped {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => batches.push(batch),
                Err(panic) if batches.is_empty() => panic::resume_unwind(panic),
                Err(_) => break,
            }
        }
        if !batches.is_empty() {
            // Keys went before their deadlines: the other waiting receivers' timers may be
            // set for deadlines that are gone.
            guard.wake_receivers();
        }
        chan.after_batch(&mut guard, now);
        batches
    }

    pub(crate) fn requeue(
        &self,
        input: F::Input,
        key: K,
        values: Vec<V>,
    ) -> Result<(), Refused<F, K, Vec<V>>> {
        let chan = &*self.chan;
        // User code (the weigher, `Hash`) runs before the lock is taken.
        let weights = chan
            .weigh
            .as_ref()
            .map(|weigh| values.iter().map(|v| weigh(v)).collect());
        let hash = chan.hasher.hash_one(&key);
        let mut guard = chan.lock();
        if guard.terminated {
            return Err(SendError((input, key, values)));
        }
        if values.is_empty() {
            return Ok(());
        }
        let state = &mut *guard;
        let count = values.len() as u64;
        let (rank, now) = chan.rank_alone(&mut state.last_now, input);
        let items = Items::Prepend(Returned::new(values, weights));
        let closed_at = state.closed_at;
        // A key requeued after the close with nothing pending was not held back by the
        // close: it is due as of the close (as if retried then), so that it counts by its
        // own reason in `Deliveries`, not as `close`, however long after the close it came.
        let rank = |current: Option<&F::Rank>, _, _| match (current, closed_at) {
            (None, Some(at)) if !F::is_due(&rank, at) => Some(F::retried(rank, at)),
            _ => Some(rank),
        };
        let mut inserted = (state.queue).insert(hash, key, items, rank, F::USER_ORD);
        state.counts.requeued += count;
        state
            .arrivals
            .extend(inserted.new_run.map(|run| (run, now)));
        guard.spare = (inserted.spare_key.take(), inserted.spare_rank.take());
        if inserted.leads {
            guard.wake_receivers();
        }
        inserted.resume();
        // Its key may be pending now: a send of it waiting for a key slot may go in.
        chan.serve(&mut guard);
        Ok(())
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let chan = &*self.chan;
        let state = chan.lock();
        // A retry held by a delay that never ends counts once the channel is closed, which
        // releases it.
        let closed = state.closed_at.is_some();
        let retrying = state.acked.as_ref().is_some_and(|a| match closed {
            true => a.holds_delayed(),
            false => a.next_release().is_some(),
        });
        if state.queue.fronts().next().is_none() && !retrying {
            return None;
        }
        // Once closed, everything is due.
        let at = match (chan.next_wake(&state), state.closed_at) {
            (Some(at), Some(closed)) => Some(at.min(closed)),
            (at, closed) => at.or(closed),
        };
        at.and_then(|at| flavor::instant(chan.epoch, at))
    }
}

impl<F: Flavor, K, V> Rx<F, K, V> {
    /// Leaves the waiting receivers (a cancelled `recv`, a dropped receiver), and drops
    /// the timer: a receiver that is not waiting holds no timer.
    fn stop_waiting(&mut self) {
        if self.waiting.is_some() {
            let mut guard = self.chan.lock();
            guard.receiving.leave(&mut self.waiting);
            if let Some((inbox, _)) = self.chan.inbox.as_deref() {
                // The deadline it published may be earlier than the others wait for.
                inbox.unpublish();
            }
        }
        self.timer.disarm();
    }

    pub(crate) fn close(&self) {
        let mut guard = self.chan.lock();
        self.chan.close(&mut guard);
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

    pub(crate) fn is_closed(&self) -> bool {
        self.chan.lock().closed_at.is_some()
    }

    /// Whether this receiver's stream has ended.
    pub(crate) fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl<F: Flavor, K, V> Clone for Rx<F, K, V> {
    fn clone(&self) -> Self {
        self.chan.lock().receivers += 1;
        Rx {
            chan: Arc::clone(&self.chan),
            waiting: None,
            timer: Timer::default(),
            ended: self.ended,
        }
    }
}

impl<F: Flavor, K, V> Drop for Rx<F, K, V> {
    fn drop(&mut self) {
        self.stop_waiting();
        let mut guard = self.chan.lock();
        guard.receivers -= 1;
        if guard.receivers > 0 {
            return;
        }
        // No one can receive any more: refuse sends and drop what is pending (and the dead
        // letters), outside the lock, since a value's `Drop` is user code.
        self.chan.close(&mut guard);
        let state = &mut *guard;
        state.counts.lost += state.queue.len() as u64;
        let pending = state.queue.take_all();
        state.arrivals = VecDeque::new();
        let dead = state.acked.as_mut().map(|acked| acked.drop_dead_letters());
        if let Some((_, values, weight)) = &dead {
            state.held_values -= values;
            state.held_weight -= weight;
            state.counts.lost += *values as u64;
        }
        // The dead-letter streams end now, even if the channel was closed before.
        let state = guard.state.as_ref().expect("the guard holds the lock");
        if let Some(acked) = &state.acked {
            acked.wake_dead(&mut guard.wakes);
        }
        drop(guard);
        drop(pending);
        drop(dead);
    }
}

/// A receiver's own timer: made on first use, then reset, and dropped when the receiver
/// stops waiting with the timer still set, since a set timer left behind wakes the task
/// for nothing and, in paused time, moves the clock.
#[derive(Default)]
struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether `sleep` was polled and left pending: set in tokio's timer.
    armed: bool,
    /// The runtime `sleep` was made in.
    runtime: Option<runtime::Id>,
}

impl Timer {
    /// Polls a timer set for `deadline`.
    fn poll_at(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        // A timer belongs to the runtime it was made in, so a receiver that moved to
        // another runtime (or outlived its first one) needs a new one.
        let runtime = Handle::try_current().ok().map(|handle| handle.id());
        if runtime != self.runtime {
            self.sleep = None;
            self.runtime = runtime;
        }
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
        let polled = sleep.as_mut().poll(cx);
        self.armed = polled.is_pending();
        polled
    }

    /// Takes the timer out of tokio's timer, if it is in it. One that fired is kept, to
    /// be reset next time.
    fn disarm(&mut self) {
        if mem::take(&mut self.armed) && self.sleep.as_ref().is_some_and(|s| !s.is_elapsed()) {
            self.sleep = None;
        }
    }
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
