//! An acknowledging channel's bookkeeping: the deliveries in flight, the retries held for a
//! delay, and the dead letters; and the [`Link`] through which deliveries are decided.
//!
//! A delivered key's slot stays in the queue, held (see `SortedQueue::take_held`): newer
//! values join it but are not due, so each key has at most one delivery in flight. A
//! decision ends the hold, or puts the values back in front and ends it, now or after a
//! delay.

use std::any::Any;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{set_aside, Chan, Guard, Rx, State, Take, Waiters};
use crate::ack::{DeadLetter, DeadLetters, Decided, Decision, Delivery, Link};
use crate::error::TryRecvError;
use crate::flavor::{self, Flavor};
use crate::queue::{Hold, Items, Release, Returned};
use crate::stats::Stats;

pub(super) struct Acked<F: Flavor, K, V> {
    /// Deliveries in flight, by id.
    flights: Flights<F::Rank>,
    in_flight_values: usize,
    in_flight_weight: usize,
    /// Held retries, soonest first.
    delayed: BinaryHeap<Reverse<Delayed<F::Rank>>>,
    delayed_seq: u64,
    /// Dead letters not yet taken.
    dead: Dead<K, V>,
    dead_values: usize,
    dead_weight: usize,
    dead_waiting: Waiters,
    max_attempts: u32,
    acked: u64,
    retried: u64,
    given_up: u64,
    dead_lettered: u64,
    attempts: [u64; 8],
}

/// Dead letters, each with its weight and, in a durable channel, its values' sequence
/// numbers in the log.
type Dead<K, V> = VecDeque<(DeadLetter<K, V>, usize, Vec<u64>)>;

/// What decisions leave to record in a durable channel's log, once the lock is released:
/// values done, and how many times values that came back were handed out. Both stay empty
/// in other channels, whose values have no sequence numbers.
///
/// Written after the lock, the records may reach the log in another order than the
/// decisions were made; that is harmless: a value's send record always comes first (it is
/// written when the value goes in), a done value is never decided again, and recovery keeps
/// the highest count of a value's retry records.
#[derive(Default)]
struct Notes {
    done: Vec<u64>,
    retried: Vec<(u64, u32)>,
}

/// A delivery in flight.
struct Flight<R> {
    /// Its key's hold: `None` for a key that cannot be held (its `Clone` panicked).
    hold: Option<Hold>,
    count: usize,
    weight: usize,
    /// The key's rank when it went out: a retry ranks by it in `ordered`.
    rank: R,
    /// How many times the first values were handed out before (see `Front::handed`).
    handed: Vec<u32>,
    attempt: u32,
    /// A time at or before which its first value entered.
    entered: u64,
    /// When the run it went out in began, as `arrivals` had it: a retry notes it again.
    started: u64,
    /// Its key's hash, and its values' weights (`None`: all 1), for a retry: kept from the
    /// take, so that a decision runs no user code.
    hash: u64,
    weights: Option<Vec<usize>>,
    /// The values' sequence numbers in a durable channel's log; empty in other channels.
    seqs: Vec<u64>,
    /// It went out for the close: taken after it, and not due by then (`Deliveries::close`).
    for_close: bool,
}

/// The deliveries in flight, in a slab: an id is a slot's index and its generation, so a
/// flight is found without hashing.
struct Flights<R> {
    slots: Vec<(u32, Option<Flight<R>>)>,
    free: Vec<u32>,
    live: usize,
}

/// The end of a delay too long for the clock: it never comes.
const NEVER: u64 = u64::MAX;

/// A retry held until `at`.
struct Delayed<R> {
    at: u64,
    /// Breaks ties: first held, first released.
    seq: u64,
    hold: Hold,
    rank: R,
}

impl<R> Flights<R> {
    fn insert(&mut self, flight: Flight<R>) -> u64 {
        self.live += 1;
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push((0, None));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 deliveries in flight")
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.1 = Some(flight);
        u64::from(slot.0) << 32 | u64::from(index)
    }

    fn remove(&mut self, id: u64) -> Option<Flight<R>> {
        let (generation, index) = ((id >> 32) as u32, id as u32);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.0 != generation {
            return None;
        }
        let flight = slot.1.take()?;
        slot.0 = slot.0.wrapping_add(1);
        self.free.push(index);
        self.live -= 1;
        if self.live == 0 && self.slots.capacity() > 4096 {
            // A burst of deliveries is over: give its memory back. Generations restart,
            // but no id is out to be confused by it.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        Some(flight)
    }
}

impl<R> PartialEq for Delayed<R> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<R> Eq for Delayed<R> {}

impl<R> PartialOrd for Delayed<R> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<R> Ord for Delayed<R> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<F: Flavor, K, V> Acked<F, K, V> {
    pub(super) fn new(max_attempts: u32) -> Self {
        Acked {
            flights: Flights {
                slots: Vec::new(),
                free: Vec::new(),
                live: 0,
            },
            in_flight_values: 0,
            in_flight_weight: 0,
            delayed: BinaryHeap::new(),
            delayed_seq: 0,
            dead: VecDeque::new(),
            dead_values: 0,
            dead_weight: 0,
            dead_waiting: Waiters::default(),
            max_attempts,
            acked: 0,
            retried: 0,
            given_up: 0,
            dead_lettered: 0,
            attempts: [0; 8],
        }
    }

    /// Deliveries in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.flights.live
    }

    /// When the soonest held retry ends, if it ever does.
    pub(super) fn next_release(&self) -> Option<u64> {
        let at = self.delayed.peek().map(|Reverse(d)| d.at);
        at.filter(|&at| at != NEVER)
    }

    /// Whether a `retry_after` holds a key, its delay ended or not.
    pub(super) fn holds_delayed(&self) -> bool {
        !self.delayed.is_empty()
    }

    pub(super) fn add_stats(&self, stats: &mut Stats) {
        stats.in_flight_keys = self.flights.live;
        stats.in_flight_values = self.in_flight_values;
        stats.acked = self.acked;
        stats.retried = self.retried;
        stats.given_up = self.given_up;
        stats.dead_lettered = self.dead_lettered;
        stats.dead_letters = self.dead_values;
        stats.attempts = self.attempts;
    }

    /// Wakes whoever waits for dead letters, once the lock is released.
    pub(super) fn wake_dead(&self, wakes: &mut Vec<std::task::Waker>) {
        self.dead_waiting.wake_all(wakes);
    }

    /// Empties the dead letters, for when no receiver is left: returns them, to be dropped
    /// after the lock, with their count and weight.
    pub(super) fn drop_dead_letters(&mut self) -> (Dead<K, V>, usize, usize) {
        let (values, weight) = (self.dead_values, self.dead_weight);
        (self.dead_values, self.dead_weight) = (0, 0);
        (std::mem::take(&mut self.dead), values, weight)
    }
}

impl<F: Flavor, K, V> Guard<'_, F, K, V> {
    fn acked(&mut self) -> &mut Acked<F, K, V> {
        self.acked.as_deref_mut().expect("an acknowledging channel")
    }
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Chan<F, K, V>
where
    F::Rank: Ord + Clone,
{
    /// Takes the next batch for an acknowledging receiver: held retries whose delay is over
    /// come back first, then due keys go out held, each a delivery in flight that decides
    /// through `link`.
    fn take_deliveries(
        &self,
        state: &mut State<F, K, V>,
        now: u64,
        take: Take,
        link: &Arc<dyn Link<K, V>>,
    ) -> Vec<Delivery<K, V>> {
        self.release_retries(state, now);
        let (max_values, max_weight) = (self.config.max_batch, self.config.max_batch_weight);
        let epoch = self.epoch;
        let closed_at = state.closed_at;
        self.pop_with(state, now, take, |state, is_due| {
            let State {
                queue,
                arrivals,
                acked,
                held_values,
                held_weight,
                ..
            } = state;
            let acked = acked.as_deref_mut().expect("an acknowledging channel");
            let mut batch = Vec::new();
            let mut count = 0;
            // Keys mostly go in the order their runs started, so the next run is most often
            // the next arrival: look there before searching.
            let mut next = 0;
            queue.take_held(max_values, max_weight, is_due, |taken| {
                let values = taken.front.values.len();
                count += values;
                let seq = taken.run.seq;
                let at = match arrivals.get(next) {
                    Some((run, _)) if run.seq == seq => Some(next),
                    _ => arrivals.binary_search_by_key(&seq, |(run, _)| run.seq).ok(),
                };
                next = at.map_or(next, |at| at + 1);
                let started = at.map_or(now, |at| arrivals[at].1);
                // A value that came back knows when it entered; otherwise the run's start
                // is a time at or before the first value entered.
                let entered = taken.front.entered.unwrap_or(started);
                // The first value's count: it is the model's rule (`tests/model.rs`), and what
                // `Delivery::attempt` says.
                let attempt = taken.front.handed.first().copied().unwrap_or(0) + 1;
                *held_values += values;
                *held_weight += taken.weight;
                acked.in_flight_values += values;
                acked.in_flight_weight += taken.weight;
                acked.attempts[(attempt as usize - 1).min(7)] += 1;
                let rank = taken.rank.expect("a held or whole key keeps its rank");
                let for_close = closed_at.is_some_and(|closed| !F::is_due(&rank, closed));
                let id = acked.flights.insert(Flight {
                    hold: taken.hold,
                    count: values,
                    weight: taken.weight,
                    rank,
                    handed: taken.front.handed,
                    attempt,
                    entered,
                    started,
                    hash: taken.run.hash,
                    weights: taken.front.weights,
                    seqs: taken.front.seqs,
                    for_close,
                });
                let entered = flavor::instant(epoch, entered).unwrap_or(epoch);
                let link = Arc::clone(link);
                let delivery =
                    Delivery::new(taken.key, taken.front.values, attempt, entered, id, link);
                batch.push(delivery);
            });
            (batch, count)
        })
    }

    /// Ends the holds of retries whose delay is over, or of every one once the channel is
    /// closed: they are due at once.
    /// `drain_now` does not end them early: a delay asked for by `retry_after` is a
    /// backoff from a failing destination, not a deadline to flush.
    fn release_retries(&self, state: &mut State<F, K, V>, now: u64) {
        let closed_at = state.closed_at;
        let closed = closed_at.is_some();
        let State {
            acked,
            queue,
            spares,
            ..
        } = state;
        let Some(acked) = acked.as_deref_mut() else {
            return;
        };
        while let Some(Reverse(delayed)) = acked.delayed.peek() {
            if !closed && (delayed.at > now || delayed.at == NEVER) {
                break;
            }
            let Some(Reverse(delayed)) = acked.delayed.pop() else {
                break;
            };
            // Due when its delay ended, however late a receiver looks (or at the close, in a
            // channel that closed before the delay was over).
            let at = delayed.at.min(now).min(closed_at.unwrap_or(u64::MAX));
            let rank = F::retried(delayed.rank, at);
            // A retried key has values, so it stays; should it not, its key is dropped
            // after the lock.
            if let (_, Some(key)) = queue.release(delayed.hold, Release::Lower(rank)) {
                set_aside::<F, K>(spares, key);
            }
        }
    }

    /// Makes a decision about the delivery `id`.
    fn decide_now(&self, id: u64, decision: Decision<K, V>) -> Decided<()> {
        let given_up = matches!(decision, Decision::GiveUp);
        // No user code runs: the key's hash and the values' weights were kept when the
        // delivery was taken. A weigher or `Hash` that panicked here would leave the key
        // held for good.
        let retry = match decision {
            Decision::Retry { after, key, values } => Some((after, key, values)),
            Decision::Ack | Decision::GiveUp => None,
        };
        let mut notes = Notes::default();
        let mut guard = self.lock();
        let panicked = caught(&mut guard, |guard| {
            self.decide_locked(guard, id, given_up, retry, &mut notes);
        });
        self.conclude(guard, notes, panicked)
    }

    /// Acknowledges the deliveries `ids`, under one lock, with one record in a durable
    /// channel.
    fn ack_many(&self, ids: &[u64]) -> Decided<()> {
        let mut notes = Notes::default();
        let mut guard = self.lock();
        let mut panicked = None;
        for &id in ids {
            let panic = caught(&mut guard, |guard| {
                self.decide_locked(guard, id, false, None, &mut notes);
            });
            panicked = panicked.or(panic);
        }
        self.conclude(guard, notes, panicked)
    }

    /// After decisions: what [`after_decisions`](Self::after_decisions) does, then the
    /// lock's release and the record; then the first panic [`caught`] in them goes on.
    fn conclude(
        &self,
        mut guard: Guard<'_, F, K, V>,
        notes: Notes,
        panicked: Option<Box<dyn Any + Send>>,
    ) -> Decided<()> {
        self.after_decisions(&mut guard);
        drop(guard);
        let decided = self.record(notes);
        if let Some(panic) = panicked {
            panic::resume_unwind(panic);
        }
        decided
    }

    /// Makes a decision under the lock: `retry` holds what a retry hands back.
    fn decide_locked(
        &self,
        guard: &mut Guard<'_, F, K, V>,
        id: u64,
        given_up: bool,
        retry: Option<(Duration, K, Vec<V>)>,
        notes: &mut Notes,
    ) {
        let closed = guard.closed_at.is_some();
        let receivers = guard.receivers;
        let acked = guard.acked();
        let Some(flight) = acked.flights.remove(id) else {
            // Each delivery is decided once: its `Delivery` is gone after that.
            unreachable!("a delivery decided twice");
        };
        // The rank may be user code: it goes back into the queue with a retry, or is dropped
        // after the lock.
        let mut rank = Some(flight.rank);
        acked.in_flight_values -= flight.count;
        acked.in_flight_weight -= flight.weight;
        let max_attempts = acked.max_attempts;
        guard.held_values -= flight.count;
        guard.held_weight -= flight.weight;
        let mut release = Some(Release::Keep);
        // How many times each value has now been handed out.
        let handed = |i: usize| flight.handed.get(i).copied().unwrap_or(0) + 1;
        match retry {
            None => {
                notes.done.extend_from_slice(&flight.seqs);
                let acked = guard.acked();
                match given_up {
                    true => acked.given_up += flight.count as u64,
                    false => acked.acked += flight.count as u64,
                }
            }
            Some((_, key, values)) if receivers == 0 => {
                // No one will receive them: they are lost, and dropped after the lock. (A
                // durable channel's log still has them: they come back at the next open,
                // with this attempt counted.)
                notes
                    .retried
                    .extend((flight.seqs.iter().enumerate()).map(|(i, &seq)| (seq, handed(i))));
                guard.counts.lost += flight.count as u64;
                guard.spare.0 = Some(key);
                guard.spare_values = values;
            }
            Some((_, key, values)) if flight.attempt >= max_attempts => {
                let weight = flight.weight;
                let letter = DeadLetter {
                    key,
                    values,
                    attempts: flight.attempt,
                };
                guard.held_values += flight.count;
                guard.held_weight += weight;
                let seqs = flight.seqs;
                notes
                    .retried
                    .extend(seqs.iter().enumerate().map(|(i, &seq)| (seq, handed(i))));
                let acked = guard.acked();
                acked.dead.push_back((letter, weight, seqs));
                acked.dead_values += flight.count;
                acked.dead_weight += weight;
                acked.dead_lettered += flight.count as u64;
                let state = guard.state.as_ref().expect("the guard holds the lock");
                let acked = state.acked.as_deref().expect("an acknowledging channel");
                acked.wake_dead(&mut guard.wakes);
            }
            Some((after, key, values)) => {
                let (hash, weights) = (flight.hash, flight.weights);
                guard.acked().retried += flight.count as u64;
                let handed: Vec<u32> = (0..values.len()).map(handed).collect();
                notes
                    .retried
                    .extend(flight.seqs.iter().copied().zip(handed.iter().copied()));
                let back = Returned {
                    values,
                    weights,
                    handed,
                    entered: Some(flight.entered),
                    seqs: flight.seqs,
                };
                // Only a retry needs the time: an ack is cheaper without it.
                let now = self.now();
                // After the close, due as of the close (the close held nothing back), so that
                // it counts by its own reason in `Deliveries`, as a requeue then does; but one
                // that went out for the close keeps its rank, after it: `close` again.
                let went_out = rank.take().expect("not yet used");
                let rank = match guard.closed_at {
                    Some(_) if flight.for_close => went_out,
                    Some(closed) => F::retried(went_out, now.min(closed)),
                    None => F::retried(went_out, now),
                };
                match flight.hold {
                    Some(hold) => {
                        // The slot keeps its own key: this one drops after the lock.
                        guard.spare.0 = Some(key);
                        let state = &mut **guard;
                        let given = state.queue.give_back(hold, back);
                        debug_assert!(given.is_ok(), "a hold lasts while its delivery flies");
                        if let Ok(run) = given {
                            // Its run's start was forgotten if nothing else was pending.
                            state.note_run(run, flight.started);
                        }
                        let delay = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
                        if delay == 0 || closed {
                            release = Some(Release::Lower(rank));
                        } else {
                            let acked = guard.acked();
                            acked.delayed_seq += 1;
                            let seq = acked.delayed_seq;
                            acked.delayed.push(Reverse(Delayed {
                                // A delay whose end the clock cannot hold never ends: the
                                // key waits for the close (`NEVER`, as no timer is set).
                                at: now.checked_add(delay).unwrap_or(NEVER),
                                seq,
                                hold,
                                rank,
                            }));
                            release = None;
                            // Their timers may need to ring sooner.
                            guard.wake_receivers();
                        }
                    }
                    None => {
                        // A key that cannot be held goes back in as new values would.
                        let state = &mut **guard;
                        let mut inserted = state.queue.insert(
                            hash,
                            key,
                            Items::Prepend(back),
                            |_, _, _| Some(rank),
                            F::USER_ORD,
                        );
                        // A new run, from now: noting an older start at the back would
                        // leave the oldest run behind a newer one.
                        if let Some(run) = inserted.new_run {
                            state.note_run(run, now);
                        }
                        guard.spare = (inserted.spare_key.take(), inserted.spare_rank.take());
                        if inserted.leads {
                            guard.wake_receivers();
                        }
                        inserted.resume();
                    }
                }
            }
        }
        if let Some(rank) = rank {
            guard.queue.discard(rank);
        }
        if let (Some(hold), Some(release)) = (flight.hold, release) {
            let (leads, key) = guard.queue.release(hold, release);
            // Dropped after the lock: in the guard's own spare where that is free (a single
            // decision), since the list allocates.
            match (key, &guard.spare.0) {
                (Some(key), None) => guard.spare.0 = Some(key),
                (Some(key), Some(_)) => set_aside::<F, K>(&mut guard.spares, key),
                (None, _) => {}
            }
            if leads {
                guard.wake_receivers();
            }
        }
    }

    /// After decisions: room may be back, or a key slot, or the stream may have ended.
    fn after_decisions(&self, guard: &mut Guard<'_, F, K, V>) {
        self.serve(guard);
        if self.is_drained(guard) {
            guard.wake_receivers();
            let state = guard.state.as_ref().expect("the guard holds the lock");
            let acked = state.acked.as_deref().expect("an acknowledging channel");
            acked.wake_dead(&mut guard.wakes);
        }
    }
}

/// Runs `decide`, a decision under the lock, with a panic of user code (a rank's `Ord` or
/// `Clone` as the key goes back in rank order) caught and returned, for the caller to go on
/// with once the lock is released. The decision has taken effect by then, and the queue is
/// whole; what the panic skipped is done here and by the caller: the waiting receivers
/// look again (where the key now ranks is not known), the other decisions of an `ack_all`
/// are made, and waiting sends get the room that came back.
fn caught<F: Flavor, K, V>(
    guard: &mut Guard<'_, F, K, V>,
    decide: impl FnOnce(&mut Guard<'_, F, K, V>),
) -> Option<Box<dyn Any + Send>> {
    let panic = panic::catch_unwind(AssertUnwindSafe(|| decide(guard))).err()?;
    guard.wake_receivers();
    Some(panic)
}

impl<F, K, V> Link<K, V> for Chan<F, K, V>
where
    F: Flavor,
    F::Rank: Ord + Clone + Send,
    F::Input: Send,
    K: Hash + Eq + Clone + Send,
    V: Send,
{
    fn decide(&self, id: u64, decision: Decision<K, V>) -> Decided<()> {
        self.decide_now(id, decision)
    }

    fn ack_all(&self, ids: &[u64]) -> Decided<()> {
        self.ack_many(ids)
    }

    fn poll_dead(
        &self,
        waiting: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<DeadLetter<K, V>>> {
        let mut guard = self.lock();
        match self.take_dead(&mut guard) {
            Ok((letter, seqs)) => {
                guard.acked().dead_waiting.leave(waiting);
                drop(guard);
                self.record_taken(&seqs);
                Poll::Ready(Some(letter))
            }
            Err(TryRecvError::Disconnected) => {
                guard.acked().dead_waiting.leave(waiting);
                Poll::Ready(None)
            }
            Err(TryRecvError::Empty) => {
                let state = &mut *guard;
                let acked = state
                    .acked
                    .as_deref_mut()
                    .expect("an acknowledging channel");
                acked
                    .dead_waiting
                    .enter(waiting, &mut state.next_id, cx.waker());
                Poll::Pending
            }
        }
    }

    fn try_dead(&self) -> Result<DeadLetter<K, V>, TryRecvError> {
        let (letter, seqs) = self.take_dead(&mut self.lock())?;
        self.record_taken(&seqs);
        Ok(letter)
    }

    fn stop_dead(&self, waiting: &mut Option<u64>) {
        self.lock().acked().dead_waiting.leave(waiting);
    }
}

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Takes the next dead letter, with its values' sequence numbers: room comes back for it.
    fn take_dead(
        &self,
        guard: &mut Guard<'_, F, K, V>,
    ) -> Result<(DeadLetter<K, V>, Vec<u64>), TryRecvError> {
        let receivers = guard.receivers;
        let drained = self.is_drained(guard);
        let acked = guard.acked();
        let Some((letter, weight, seqs)) = acked.dead.pop_front() else {
            // No receiver left, or nothing that could still die: no more dead letters.
            return match receivers == 0 || drained {
                true => Err(TryRecvError::Disconnected),
                false => Err(TryRecvError::Empty),
            };
        };
        acked.dead_values -= letter.values.len();
        acked.dead_weight -= weight;
        guard.held_values -= letter.values.len();
        guard.held_weight -= weight;
        self.serve(guard);
        Ok((letter, seqs))
    }

    /// Records decisions in a durable channel's log: what they resolve to.
    fn record(&self, notes: Notes) -> Decided<()> {
        #[cfg(feature = "durable")]
        {
            let retried = self.log_retried(&notes.retried);
            // Records are written in order: waiting for the later one waits for both.
            self.decided(self.log_done(&notes.done).or(retried))
        }
        #[cfg(not(feature = "durable"))]
        {
            let _ = notes;
            Decided::done(Ok(()))
        }
    }

    /// Records that a dead letter was taken, in a durable channel's log. Nothing waits for
    /// the record: a dead letter taken just before a crash may come back once.
    fn record_taken(&self, seqs: &[u64]) {
        #[cfg(feature = "durable")]
        let _ = self.log_done(seqs);
        #[cfg(not(feature = "durable"))]
        let _ = seqs;
    }
}

impl<F, K, V> Rx<F, K, V>
where
    F: Flavor + 'static,
    F::Rank: Ord + Clone + Send + 'static,
    F::Input: Send,
    K: Hash + Eq + Clone + Send + 'static,
    V: Send + 'static,
{
    /// The link every delivery of this channel decides through.
    fn link(&self) -> Arc<dyn Link<K, V>> {
        Arc::clone(&self.chan) as Arc<dyn Link<K, V>>
    }

    pub(crate) fn poll_deliveries(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Vec<Delivery<K, V>>>> {
        let link = self.link();
        self.poll_batch(cx, |chan, state, now, take| {
            chan.take_deliveries(state, now, take, &link)
        })
    }

    pub(crate) async fn recv_deliveries(&mut self) -> Option<Vec<Delivery<K, V>>> {
        self.recv_with(Self::poll_deliveries).await
    }

    pub(crate) fn try_recv_deliveries(&mut self) -> Result<Vec<Delivery<K, V>>, TryRecvError> {
        let link = self.link();
        self.try_batch(|chan, state, now, take| chan.take_deliveries(state, now, take, &link))
    }

    pub(crate) fn drain_deliveries(&mut self) -> Vec<Vec<Delivery<K, V>>> {
        let link = self.link();
        self.drain_batches(|chan, state, now, take| chan.take_deliveries(state, now, take, &link))
    }

    pub(crate) fn dead_letters(&self) -> DeadLetters<K, V> {
        DeadLetters::new(self.link())
    }
}
