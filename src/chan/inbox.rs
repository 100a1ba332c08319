//! The inbox: a bounded lock-free FIFO that sends go through when another thread holds the
//! channel's lock, or has left values in the inbox, so that a send does not wait for the
//! lock while the inbox has room. Whoever takes the lock next moves its values into the
//! queue, in the order they were sent, ranked as of when they were sent.
//!
//! # When a channel has one
//!
//! Only a channel whose sends need nothing from the locked state: no `capacity`,
//! `max_weight`, `max_keys`, `max_values_per_key` or `max_key_weight`, and not
//! acknowledging (or durable). Other channels take the lock on every send, as before; the
//! choice is made once, when the channel is built.
//!
//! # How a send goes in
//!
//! A send that finds the inbox empty first tries the lock without waiting. If it gets it, it
//! puts its value in under the lock, exactly as a channel without an inbox does (so `Eq` or
//! `Ord` of its own key runs in the call, and a panic there is the call's). Only when the
//! lock is held, or values wait in the inbox already, does the value go into the inbox,
//! with the time it arrived. On one thread the inbox is therefore never used; with many
//! producers, or a receiver taking a batch, it takes the values that would have waited for
//! the lock.
//!
//! A send that finds values waiting joins them rather than taking them in: the next lock
//! (a receiver's, or a send's that finds the inbox full) takes them all in at once, on one
//! thread. When each send that won the lock took in the few values there, the queue's cache
//! lines moved to its core and back at every turn (README, Performance).
//!
//! The inbox holds [`BOUND`] values. A send that finds it full waits for the lock, as every
//! send does in a channel without an inbox: producers faster than the receivers are held
//! back, and memory stays bounded. The bound is checked before a push, not with it, so
//! producers that push at once may pass it by a few values. The FIFO is a list of small
//! blocks that are freed as they empty, so an idle inbox holds next to nothing; a ring
//! fixed at the bound was no faster, and would have held 300–700 KB for as long as the
//! channel lives.
//!
//! # Waking receivers without the lock
//!
//! `earliest` holds the deadline the waiting receivers sleep until (`u64::MAX`: none, or
//! unknown). A send through the inbox lowers it to its own value's deadline and, if that
//! was earlier, takes the lock to take the inbox in and wake the receivers: the wake rule
//! of the locked path, checked without the lock. A send made by user code under the lock,
//! on the thread that holds it, leaves that to the lock's holder instead
//! (`Chan::wake_after_inbox`), and goes in past the bound: the lock would never come free
//! for it. A receiver about to sleep publishes its deadline, then looks at the inbox again
//! (a `SeqCst` fence on both sides, Dekker-style): either it sees the value, or the sender
//! sees its deadline. What it sees there it takes in once, and lowers its deadline if need
//! be; it never loops, so producers that keep the inbox busy cannot keep a receiver awake.
//! Once a lock's holder wakes the receivers, `earliest` is 0 until one publishes again:
//! they take the inbox in when they look, so no send needs to wake them meanwhile.
//!
//! # Closing
//!
//! `gate` counts the sends between their check for a close and the end of their push, with
//! [`CLOSED`] set once the channel closes. A receiver ends its stream only once no send is in
//! flight and the inbox is empty; a send that finishes after the close takes the lock to
//! take its value in and wake the receivers. A send refused for the close is not counted
//! when it can tell before the gate; one that counted itself and then found the close wakes
//! the receivers too, since one may have seen it in flight and be waiting for it.

use std::iter;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering::SeqCst};

use crossbeam_queue::SegQueue;

use super::Item;
use crate::flavor::Flavor;

/// The bit of [`Inbox::gate`] set once the channel is closed.
pub(super) const CLOSED: usize = 1 << (usize::BITS - 1);

/// How many values the inbox holds before a send waits for the lock instead. Without a
/// bound, producers faster than the receivers filled it without end while the receivers
/// held the lock (peak memory 150–310 MB against 5–54 MB at a million keys in
/// `benches/compare`).
const BOUND: usize = 4096;

/// A value sent through the inbox, with when it arrived (on the channel's clock). It holds
/// what an [`Item`] does but a log record, which a channel with an inbox has no use for:
/// every value sent through the inbox moves from one core's cache to another's, so each
/// byte counts.
pub(super) struct Entry<F: Flavor, K, V> {
    input: F::Input,
    hash: u64,
    key: K,
    value: V,
    weight: usize,
    pub(super) arrival: u64,
}

impl<F: Flavor, K, V> Entry<F, K, V> {
    pub(super) fn new(item: Item<F, K, V>, arrival: u64) -> Self {
        debug_assert!(item.seq.is_none(), "a channel with an inbox keeps no log");
        let Item {
            input,
            hash,
            key,
            value,
            weight,
            ..
        } = item;
        Entry {
            input,
            hash,
            key,
            value,
            weight,
            arrival,
        }
    }

    pub(super) fn into_item(self) -> Item<F, K, V> {
        let Entry {
            input,
            hash,
            key,
            value,
            weight,
            ..
        } = self;
        Item::new(input, hash, key, value, weight)
    }
}

/// See the module docs.
pub(super) struct Inbox<F: Flavor, K, V> {
    queue: SegQueue<Entry<F, K, V>>,
    /// The deadline waiting receivers sleep until; `u64::MAX` for none.
    earliest: AtomicU64,
    /// Sends in flight, and [`CLOSED`].
    gate: AtomicUsize,
}

/// A value the inbox refused, since the channel is closed.
pub(super) struct Closed<F: Flavor, K, V> {
    pub(super) entry: Entry<F, K, V>,
    /// The send counted itself in flight after the close, so a receiver may be waiting for
    /// it to finish: the caller must wake them.
    pub(super) seen: bool,
}

/// What a send through the inbox must do once its value is in.
pub(super) struct Pushed {
    /// Its deadline is earlier than the one the receivers sleep until.
    pub(super) earlier: bool,
    /// The channel closed while it was in flight.
    pub(super) closed: bool,
}

impl<F: Flavor, K, V> Inbox<F, K, V> {
    pub(super) fn new() -> Self {
        Inbox {
            queue: SegQueue::new(),
            earliest: AtomicU64::new(u64::MAX),
            gate: AtomicUsize::new(0),
        }
    }

    /// Pushes `entry`, due at `due`; hands it back if the channel is closed.
    pub(super) fn push(&self, entry: Entry<F, K, V>, due: u64) -> Result<Pushed, Closed<F, K, V>> {
        // A close that can be told before the gate leaves it alone: a receiver that saw a
        // send in flight would wait for it.
        if self.gate.load(SeqCst) & CLOSED != 0 {
            return Err(Closed { entry, seen: false });
        }
        if self.gate.fetch_add(1, SeqCst) & CLOSED != 0 {
            self.gate.fetch_sub(1, SeqCst);
            return Err(Closed { entry, seen: true });
        }
        self.queue.push(entry);
        // Pairs with the fence in `publish`: either the receiver sees this value in the
        // queue, or this sees the deadline it sleeps until.
        fence(SeqCst);
        // A load first: most sends do not lower the deadline, and so need no atomic write.
        let earlier =
            self.earliest.load(SeqCst) > due && self.earliest.fetch_min(due, SeqCst) > due;
        let closed = self.gate.fetch_sub(1, SeqCst) & CLOSED != 0;
        Ok(Pushed { earlier, closed })
    }

    /// Whether a send must wait for the lock instead: see [`BOUND`].
    pub(super) fn is_full(&self) -> bool {
        self.queue.len() >= BOUND
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The values in the inbox now, oldest first. Producers that keep pushing must not keep
    /// the lock holder taking in for ever: what they push meanwhile was sent after this.
    ///
    /// All of them are popped before any goes into the queue. Each pop is an atomic
    /// read-modify-write, which waits for the stores before it; popped between inserts,
    /// whose stores miss the cache, a pop waited for each of them (at w50-p4-m1k, popping
    /// first took 0.82-0.85 of the time, medians of 8-12 alternating runs).
    pub(super) fn take(&self) -> Vec<Entry<F, K, V>> {
        let present = self.queue.len();
        let mut taken = Vec::with_capacity(present);
        taken.extend(iter::from_fn(|| self.queue.pop()).take(present));
        taken
    }

    /// Publishes the deadline a receiver is about to sleep until (`None`: no deadline);
    /// `false` if the inbox holds values, which the receiver must take in once.
    pub(super) fn publish(&self, deadline: Option<u64>) -> bool {
        self.earliest.store(deadline.unwrap_or(u64::MAX), SeqCst);
        // Pairs with the fence in `push`.
        fence(SeqCst);
        self.is_empty()
    }

    /// Lowers the published deadline to `deadline`, once the values that were in the inbox
    /// when it was published are taken in.
    pub(super) fn lower(&self, deadline: Option<u64>) {
        self.earliest
            .fetch_min(deadline.unwrap_or(u64::MAX), SeqCst);
    }

    /// Marks the waiting receivers woken: until one publishes a deadline again, no send
    /// needs to wake them, since they take the inbox in when they look. Without it, each
    /// send due before the deadline they slept until would wake them again meanwhile.
    pub(super) fn woken(&self) {
        self.earliest.store(0, SeqCst);
    }

    /// Forgets the published deadline: a receiver stopped waiting, so the next send wakes
    /// whoever waits still. The one that left may have published a deadline earlier than
    /// the others wait for; the price is one wake for nothing, at worst, for the others.
    pub(super) fn unpublish(&self) {
        self.earliest.store(u64::MAX, SeqCst);
    }

    /// Marks the channel closed: sends that have not started fail.
    pub(super) fn close(&self) {
        self.gate.fetch_or(CLOSED, SeqCst);
    }

    /// Whether no send is in flight and the inbox is empty, in that order: a send that
    /// finished before the first look has its value in the queue by the second.
    pub(super) fn is_settled(&self) -> bool {
        self.gate.load(SeqCst) & !CLOSED == 0 && self.is_empty()
    }
}
