//! The sorted keyed queue: the synchronous core that every channel flavour wraps.
//!
//! A [`SortedQueue`] holds pending values grouped by key. Each key has a *rank* (a deadline,
//! a priority, anything `Ord`): the smallest rank given to it (by a push, a requeue, a
//! promote or a promote_all) since its current pending run began; the rest of a key that a
//! batch split keeps the key's rank. Batches come out in rank order; ties go to the key
//! whose current pending run started first.
//!
//! Each value has a *weight*, 1 unless given ([`push_with`](SortedQueue::push_with),
//! [`requeue_weighted`](SortedQueue::requeue_weighted)), so that batches can be capped by
//! weight as well as by count.
//!
//! The queue knows nothing about time, locks or wakers. The async channels in this crate are
//! a thin layer over it, and it is useful on its own wherever a synchronous keyed batcher will
//! do.
//!
//! # Examples
//!
//! ```
//! use keyed_batch::queue::SortedQueue;
//!
//! let mut q = SortedQueue::new();
//! q.push("b", 1, 20);
//! q.push("a", 2, 10);
//! q.push("b", 3, 30); // "b" keeps rank 20: the smallest of its values
//!
//! // Take everything ranked at or below 20, at most 10 values.
//! let batch = q.pop_batch(10, |rank| *rank <= 20);
//! assert_eq!(batch, vec![("a", vec![2]), ("b", vec![1, 3])]);
//! assert!(q.is_empty());
//! ```
//!
//! # Cost
//!
//! A push whose `(rank, arrival)` is not smaller than the last one that went in order is
//! O(1): the index is then a FIFO, as it is for a channel whose values all get
//! `now + window`. Other pushes, and rank changes, cost O(log n) in a binary heap, amortized
//! (stale index entries are dropped in bulk, and the table grows by doubling). A key holds
//! a constant-sized slot plus its values (and their weights, once one differs from 1);
//! there is no index entry per value. The slots sit in the hash table itself until 7,168
//! keys are in; the next push moves them into a slab behind a table of 8-byte positions,
//! which stays in cache far longer, and they go back into the table at the first batch
//! taken with fewer than 896 keys left. A queue holds at most `u32::MAX` keys at once (over
//! 300 GB of slots): a push of a new key past that panics, changing nothing.
//!
//! # Panics in user code
//!
//! `Hash` and `Eq` of `K` run only while a value goes in (or a key is promoted), before the
//! queue changes, and in [`contains_key`](SortedQueue::contains_key); the queue stores each
//! key's hash and never calls them while taking batches or growing. `Ord` and `Clone` of
//! `R`, and `Clone` of `K`, run before the data they guard moves, but in the tidying of
//! stale index entries that may follow a push, once its value is in. If any of them panics,
//! the call panics and the queue stays whole: no other key's values are lost (a push that
//! panics in that tidying keeps its value), and an index left unsorted is rebuilt by the
//! next call that changes the queue.
//!
//! Splitting a key (when it does not fit in a batch) clones it. If that `Clone` panics, the
//! key is not split again for the rest of its current run: its values go out together,
//! whole (alone, even past the caps, when they do not fit), so that the keys behind it are
//! not stuck.

use std::any::Any;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{self, AssertUnwindSafe};

use hashbrown::DefaultHashBuilder;

use self::index::{Index, Ticket};
use self::slab::{SlotEntry, Slots};
pub(crate) use self::slot::{Front, Items, Returned};
use self::slot::{Slot, Values, HELD};

mod index;
mod slab;
mod slot;
#[cfg(test)]
mod tests;
#[cfg(test)]
#[path = "../../tests/common/touchy.rs"]
mod touchy;

/// Index sizes below this are never compacted: too small to matter.
const SMALL: usize = 64;

/// Tables and indexes at or below this capacity are never shrunk. A busy channel drains and
/// refills all the time; giving back its last few thousand slots each time only to grow them
/// again cost a fifth of the time per value in the benchmarks.
const SHRINK_ABOVE: usize = 4096;

/// A keyed queue whose keys come out in rank order, each with all of its pending values
/// unless a batch's cap splits the key: then the batch takes its first values, and the rest
/// wait, keeping the key's rank and place.
///
/// `R` is the rank (smaller comes first), `K` the key and `V` the value. See the
/// [module documentation](self) for the rules and costs.
pub struct SortedQueue<R, K, V> {
    /// One slot per pending key. Each slot stores its key's hash, so lookups by ticket and
    /// resizes never call `K`'s `Hash` or `Eq`.
    slots: Slots<R, K, V>,
    hasher: DefaultHashBuilder,
    index: Index<R>,
    /// Pending values, over all keys.
    values: usize,
    /// Their total weight.
    weight: usize,
    /// Source of arrival sequence numbers and ticket ids.
    next_id: u64,
    /// Runs whose key's `Clone` panicked while being split: they go out whole.
    unsplittable: Vec<Run>,
    /// Held slots with no values (see [`take_held`](Self::take_held)).
    held_empty: usize,
    /// The last batch's plan, emptied: kept so that planning the next one allocates nothing.
    plans: Plan<R, K, V>,
}

/// How much a [`SortedQueue`] holds without allocating: see [`SortedQueue::capacity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Pending keys the queue has room for.
    pub keys: usize,
    /// Entries the rank index has room for.
    pub index: usize,
}

/// A batch, planned before any value leaves the queue: one share a key, in rank order.
///
/// A key taken whole (the common case) leaves the table as it is planned, so that its slot,
/// a cache miss away in a large table, is read once: the move then reads the plan in order.
/// Until the plan is done those slots are still the queue's: a panic in user code while it
/// is made puts them back.
struct Plan<R, K, V> {
    shares: Vec<Share<R, K, V>>,
}

impl<R, K, V> Default for Plan<R, K, V> {
    fn default() -> Self {
        Plan { shares: Vec::new() }
    }
}

impl<R, K, V> Plan<R, K, V> {
    /// Kept for the next batch, and given back, as the index is, once mostly unused: a plan
    /// that outlives a burst would hold its bytes per key. `planned`: the last batch's keys.
    /// Nor is it kept with room for more keys than the table has, `keys` (or than
    /// [`SHRINK_ABOVE`]): the plan that drained a backlog holds a slot a key, and goes with
    /// the table it drained.
    fn shrink(&mut self, planned: usize, keys: usize) {
        if mostly_unused(planned, self.shares.capacity(), SMALL) {
            self.shares.shrink_to(planned * 2);
        }
        let most = keys.max(SHRINK_ABOVE);
        if self.shares.capacity() > most {
            self.shares.shrink_to(most);
        }
    }
}

/// Whether a container with room for `capacity` that holds `used` should give memory back:
/// it is larger than `above`, and under an eighth full. Shrunk then to twice `used`, it
/// gives back at amortized O(1).
pub(crate) fn mostly_unused(used: usize, capacity: usize, above: usize) -> bool {
    capacity > above && used * 8 < capacity
}

/// Where a rebuild of the index takes its tickets from.
#[derive(Clone, Copy)]
enum Tickets {
    /// New ones for every key, each with a clone of its slot's rank: the ranks changed, or
    /// most tickets are stale.
    Fresh,
    /// The live ones the index holds, and new ones only for keys that have none (planned
    /// out of it, say), so that a rank whose `Clone` panics does not stop the repair of an
    /// index that a panic left torn.
    Kept,
}

/// One key's share of a batch.
enum Share<R, K, V> {
    /// The key goes whole: its slot, out of the table.
    Whole(Slot<R, K, V>),
    /// The slot stays, in the table: a split, or a hold.
    Kept {
        /// Where the slot sits: its bucket in the table, or its place in the slab.
        at: usize,
        id: u64,
        count: usize,
        weight: usize,
        /// A copy of the key: the slot keeps the original.
        copy: K,
        /// The key's rank, when its slot is held.
        rank: Option<R>,
    },
}

/// A key taken out with [`SortedQueue::take_held`].
pub(crate) struct Taken<R, K, V> {
    pub(crate) key: K,
    pub(crate) front: Front<V>,
    /// The values' weight.
    pub(crate) weight: usize,
    /// The key's hold; `None` for a key whose `Clone` panicked, which cannot be held.
    pub(crate) hold: Option<Hold>,
    /// The key's rank when it was taken, if the key was held or taken whole.
    pub(crate) rank: Option<R>,
    /// The key's run: its start is a time at or before its values entered.
    pub(crate) run: Run,
}

/// A held slot: it stays, takes new values, and is not due until released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    hash: u64,
    id: u64,
}

/// The rank a released hold goes back with.
pub(crate) enum Release<R> {
    /// The rank of the values that came while it was held.
    Keep,
    /// The smaller of that and this.
    Lower(R),
}

/// Lowers a released key's rank as `release` says: the rank left over, for the index to
/// drop, if any. May run user `Ord`.
fn lowered<R: Ord>(rank: &mut R, release: Release<R>) -> Option<R> {
    match release {
        Release::Keep => None,
        Release::Lower(r) if r >= *rank => Some(r),
        Release::Lower(r) => Some(std::mem::replace(rank, r)),
    }
}

/// A key's current run of pending values, to tell later whether it is still pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) hash: u64,
    pub(crate) seq: u64,
}

/// What an insert did, and what it did not keep.
pub(crate) struct Inserted<R, K> {
    /// The key now stands first: the smallest rank moved down, or the queue was empty.
    pub(crate) leads: bool,
    /// The key was not pending before: a new run started.
    pub(crate) new_run: Option<Run>,
    /// The key passed in, when the key was pending already: the slot keeps its own.
    pub(crate) spare_key: Option<K>,
    /// A rank that did not lower the key's.
    pub(crate) spare_rank: Option<R>,
    /// A panic of user `Ord` (another key's, as the index settled) after the values went in:
    /// for the caller to [`resume`](Self::resume) once it has counted them, and put the
    /// spare key and rank where their drop may run.
    pub(crate) panic: Option<Box<dyn Any + Send>>,
}

impl<R, K> Inserted<R, K> {
    /// Goes on with the panic that came after the values went in, if one did.
    pub(crate) fn resume(&mut self) {
        if let Some(panic) = self.panic.take() {
            panic::resume_unwind(panic);
        }
    }
}

impl<R, K, V> SortedQueue<R, K, V> {
    /// Pending values, over all keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 0);
    /// q.push("a", 2, 0);
    /// q.push("b", 3, 0);
    /// assert_eq!(q.len(), 3);
    /// assert_eq!(q.key_count(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.values
    }

    /// The total weight of the pending values: their count, unless weights were given.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", "xyz", 0);
    /// q.push_with("a", "long value", 10, |_, _| 0);
    /// assert_eq!(q.len(), 2);
    /// assert_eq!(q.weight(), 11);
    /// ```
    pub fn weight(&self) -> usize {
        self.weight
    }

    /// Pending keys: keys with at least one pending value.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 0);
    /// q.push("a", 2, 0);
    /// assert_eq!(q.key_count(), 1);
    /// ```
    pub fn key_count(&self) -> usize {
        self.slots.len() - self.held_empty
    }

    /// Keys that are pending or held: what a key limit counts when deliveries hold keys.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// assert!(q.is_empty());
    /// q.push("a", 1, 0);
    /// assert!(!q.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.values == 0
    }

    /// How many keys the queue can hold without allocating, and how many index entries.
    ///
    /// Both fall back after the keys drain: each time a batch is taken (or a pop finds
    /// nothing), the queue shrinks its table, and each of its index's two parts (a FIFO and
    /// a heap), that is under an eighth full and has room for more than 4,096 entries, to
    /// about twice what it holds (the table rounds up to its own sizes), so a burst of
    /// distinct keys does not pin memory for good. An empty queue may so keep room for
    /// about 4,096 keys and 8,192 index entries.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// for key in 0..100_000 {
    ///     q.push(key, (), 0);
    /// }
    /// assert!(q.capacity().keys >= 100_000);
    /// while !q.pop_batch(1_000, |_| true).is_empty() {}
    /// assert!(q.capacity().keys < 10_000);
    /// ```
    pub fn capacity(&self) -> Capacity {
        Capacity {
            keys: self.slots.capacity(),
            index: self.index.capacity(),
        }
    }

    /// The hasher that [`insert`](Self::insert) expects hashes from: a channel hashes keys
    /// with a copy of it before taking its lock.
    pub(crate) fn hasher(&self) -> &DefaultHashBuilder {
        &self.hasher
    }

    /// Whether a key with this hash is pending: a key of it may be, and another key with
    /// the same hash may be instead.
    pub(crate) fn has_hash(&self, hash: u64) -> bool {
        self.slots.find(hash, |s| s.hash == hash).is_some()
    }

    /// Whether `run` is still the key's current run of pending values.
    pub(crate) fn is_pending(&self, run: Run) -> bool {
        let slot = self.slots.find(run.hash, |s| s.seq == run.seq);
        slot.is_some_and(|s| !s.values.is_empty())
    }

    /// Keeps the ranks the queue drops (stale index entries, replaced and delivered
    /// ranks) for [`take_trash`](Self::take_trash), instead of dropping them in place.
    pub(crate) fn defer_drops(&mut self) {
        self.index.defer_drops();
    }

    /// Drops a rank the owner has no more use for, as the queue drops its own: later, if
    /// drops are deferred.
    pub(crate) fn discard(&mut self, rank: R) {
        self.index.discard(rank);
    }

    /// The ranks kept since the last call, when drops are deferred.
    pub(crate) fn take_trash(&mut self) -> Vec<R> {
        self.index.take_trash()
    }

    /// Empties the queue and returns its keys and values as they were, to be dropped later:
    /// the channel drops them outside its lock, since a value's `Drop` is user code.
    pub(crate) fn take_all(&mut self) -> impl Sized {
        self.index.clear();
        self.values = 0;
        self.weight = 0;
        self.unsplittable = Vec::new();
        self.held_empty = 0;
        std::mem::take(&mut self.slots)
    }
}

impl<R: Ord, K, V> SortedQueue<R, K, V> {
    /// The smallest rank in the queue: the rank of the key that comes out next.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// assert_eq!(q.peek_rank(), None);
    /// q.push("a", (), 7);
    /// q.push("b", (), 3);
    /// assert_eq!(q.peek_rank(), Some(&3));
    /// ```
    pub fn peek_rank(&self) -> Option<&R> {
        if self.index.is_torn() {
            // A panic in user `Ord` left the index to be rebuilt by the next call that may
            // change it; until then, the smallest rank is found among the slots.
            return (self.slots.iter().filter(|slot| !slot.is_held()))
                .map(|slot| (&slot.rank, slot.seq))
                .min()
                .map(|(rank, _)| rank);
        }
        self.index.front().map(|ticket| &ticket.rank)
    }

    /// The ranks of the keys that may come out next, one of which is the smallest: found
    /// without comparing ranks, so with no user `Ord`.
    pub(crate) fn fronts(&self) -> impl Iterator<Item = &R> {
        self.index.fronts().map(|ticket| &ticket.rank)
    }

    /// Creates an empty queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let q: SortedQueue<u32, &str, i32> = SortedQueue::new();
    /// assert!(q.is_empty());
    /// ```
    pub fn new() -> Self {
        SortedQueue {
            slots: Slots::default(),
            hasher: DefaultHashBuilder::default(),
            index: Index::new(),
            values: 0,
            weight: 0,
            next_id: 0,
            unsplittable: Vec::new(),
            held_empty: 0,
            plans: Plan::default(),
        }
    }
}

impl<R, K, V> SortedQueue<R, K, V>
where
    R: Ord + Clone,
    K: Hash + Eq + Clone,
{
    /// Appends `value` to `key`'s pending values; the key's rank becomes the smaller of its
    /// rank and `rank`.
    ///
    /// Returns `true` if this call moved the front of the queue: the queue was empty, or the
    /// key now stands first because this call lowered its rank or made it pending, below
    /// the smallest rank before or equal to it with the older run (ties go to the run that
    /// started first). A push to the key that already leads, leaving its rank as it was,
    /// returns `false`.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if the total pending weight would overflow `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// assert!(q.push("a", 'x', 5)); // first key: it leads
    /// assert!(!q.push("b", 'y', 7)); // behind "a"
    /// assert!(q.push("b", 'z', 1)); // "b" now ranks 1 and leads
    /// assert_eq!(q.peek_rank(), Some(&1));
    /// ```
    pub fn push(&mut self, key: K, value: V, rank: R) -> bool {
        self.push_with(key, value, 1, |_, _| rank)
    }

    /// Appends `value`, of the given `weight`, to `key`'s pending values. The key's rank
    /// becomes the smaller of its rank and `rank(values, weight)`, where `values` and `weight`
    /// are the key's count and total weight once `value` is in.
    ///
    /// This is how a caller makes a full key due at once without a second lookup. Returns
    /// whether this call moved the front of the queue, as [`push`](Self::push) does.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if the total pending weight would overflow `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// // Rank 100 normally, but 0 once a key holds three values or weighs 10.
    /// let rank = |values: usize, weight: usize| if values >= 3 || weight >= 10 { 0 } else { 100 };
    /// let mut q = SortedQueue::new();
    /// q.push_with("a", 1, 1, rank);
    /// q.push_with("a", 2, 1, rank);
    /// assert_eq!(q.peek_rank(), Some(&100));
    /// q.push_with("a", 3, 1, rank);
    /// assert_eq!(q.peek_rank(), Some(&0));
    ///
    /// q.push_with("b", 4, 10, rank);
    /// assert_eq!(q.weight(), 13);
    /// ```
    pub fn push_with(
        &mut self,
        key: K,
        value: V,
        weight: usize,
        rank: impl FnOnce(usize, usize) -> R,
    ) -> bool {
        let hash = self.hasher.hash_one(&key);
        let rank = |_: Option<&R>, values, weight| Some(rank(values, weight));
        let mut inserted = self.insert(hash, key, Items::Append(value, weight), rank, true);
        inserted.resume();
        inserted.leads
    }

    /// Puts `values` back in front of `key`'s pending values, as after a failed delivery. The
    /// key's rank becomes the smaller of its rank and `rank`. Each value weighs 1.
    ///
    /// Returns `true` if this call moved the front of the queue, as [`push`](Self::push)
    /// does. An empty `values` changes nothing and returns `false`.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if the total pending weight would overflow `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 3, 10);
    /// q.requeue("a", vec![1, 2], 10);
    /// assert_eq!(q.pop_batch(usize::MAX, |_| true), vec![("a", vec![1, 2, 3])]);
    /// ```
    pub fn requeue(&mut self, key: K, values: Vec<V>, rank: R) -> bool {
        self.requeue_weighted_inner(key, values, None, rank)
    }

    /// Like [`requeue`](Self::requeue), with each value's weight.
    ///
    /// # Panics
    ///
    /// Panics if `weights` and `values` differ in length, and, changing nothing, if the
    /// total pending weight would overflow `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.requeue_weighted("a", vec!["xx", "yyy"], vec![2, 3], 0);
    /// assert_eq!(q.weight(), 5);
    /// ```
    #[track_caller]
    pub fn requeue_weighted(
        &mut self,
        key: K,
        values: Vec<V>,
        weights: Vec<usize>,
        rank: R,
    ) -> bool {
        assert_eq!(values.len(), weights.len(), "one weight per requeued value");
        self.requeue_weighted_inner(key, values, Some(weights), rank)
    }

    fn requeue_weighted_inner(
        &mut self,
        key: K,
        values: Vec<V>,
        weights: Option<Vec<usize>>,
        rank: R,
    ) -> bool {
        if values.is_empty() {
            return false;
        }
        let hash = self.hasher.hash_one(&key);
        let items = Items::Prepend(Returned::new(values, weights));
        let mut inserted = self.insert(hash, key, items, |_, _, _| Some(rank), true);
        inserted.resume();
        inserted.leads
    }

    /// Lowers `key`'s rank to `rank`, if the key is pending and `rank` is smaller. Returns
    /// whether this call moved the front of the queue, as [`push`](Self::push) does: `false`
    /// if the rank was not lowered, even for a key that leads.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 10);
    /// q.push("b", 2, 20);
    /// assert!(q.promote(&"b", 0));
    /// assert!(!q.promote(&"c", 0), "not pending");
    /// assert_eq!(q.pop_batch(1, |_| true), vec![("b", vec![2])]);
    /// ```
    pub fn promote(&mut self, key: &K, rank: R) -> bool {
        let hash = self.hasher.hash_one(key);
        self.promote_hashed(hash, key, rank)
    }

    /// [`promote`](Self::promote), with the key's hash from [`hasher`](Self::hasher).
    pub(crate) fn promote_hashed(&mut self, hash: u64, key: &K, rank: R) -> bool {
        self.repair();
        let id = self.take_id();
        let Some(slot) = self.slots.find_mut(hash, |s| s.key == *key) else {
            return false;
        };
        if slot.is_held() {
            // Lowered, but still held: it comes due by this rank once released.
            let lower = self.index.guard(|_| rank < slot.rank);
            let spare = match lower {
                true => std::mem::replace(&mut slot.rank, rank),
                false => rank,
            };
            self.index.discard(spare);
            return false;
        }
        match self.index.lower(slot, rank, id) {
            Ok(()) => {
                self.settle_stale();
                self.leads(id)
            }
            Err(rank) => {
                self.index.discard(rank);
                false
            }
        }
    }

    /// Lowers every pending key's rank to at most `rank`. Returns whether any rank moved.
    ///
    /// O(n), and O(n log n) when a rank moves: the index is rebuilt.
    ///
    /// # Panics
    ///
    /// If `Ord` or `Clone` of `R` panics, the call panics with some keys lowered and others
    /// not; the queue stays whole.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 10);
    /// q.push("b", 2, 20);
    /// assert!(q.promote_all(5));
    /// assert_eq!(q.pop_batch(10, |rank| *rank <= 5), vec![("a", vec![1]), ("b", vec![2])]);
    /// ```
    pub fn promote_all(&mut self, rank: R) -> bool {
        self.repair();
        let (slots, next_id) = (&mut self.slots, &mut self.next_id);
        // Replaced ranks are collected, to be discarded once user `Ord` is done.
        let (moved, old) = self.index.guard(|_| {
            let mut old = Vec::new();
            // Held slots are lowered too: they come due by it once released.
            for slot in slots.iter_mut() {
                if rank < slot.rank {
                    old.push(std::mem::replace(&mut slot.rank, rank.clone()));
                    // A new ticket id: the ticket with the old rank is stale, even to a
                    // repair that keeps live tickets, should this or the rebuild panic.
                    if !slot.is_held() {
                        *next_id += 1;
                        slot.ticket = *next_id;
                    }
                }
            }
            (!old.is_empty(), old)
        });
        old.into_iter().for_each(|r| self.index.discard(r));
        self.index.discard(rank);
        if moved {
            self.rebuild(Tickets::Fresh);
        }
        moved
    }

    /// Takes the next batch: due keys in rank order, at most `max_values` values in all.
    ///
    /// A key is due when `is_due(rank)` is true; taking stops at the first key that is not.
    /// A key with more values than the room left is split: the batch takes its first values
    /// (those [`requeue`](Self::requeue) put in front, then the oldest), and the rest keep
    /// the key's rank and place: ahead of keys of equal rank whose runs started later. The
    /// result is empty when nothing is due or `max_values` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 1);
    /// q.push("a", 2, 1);
    /// q.push("b", 3, 2);
    /// assert_eq!(q.pop_batch(1, |_| true), vec![("a", vec![1])]);
    /// assert_eq!(q.pop_batch(2, |_| true), vec![("a", vec![2]), ("b", vec![3])]);
    /// ```
    pub fn pop_batch(
        &mut self,
        max_values: usize,
        is_due: impl FnMut(&R) -> bool,
    ) -> Vec<(K, Vec<V>)> {
        self.pop_batch_weighted(max_values, usize::MAX, is_due)
    }

    /// Like [`pop_batch`](Self::pop_batch), with the batch's total weight capped at
    /// `max_weight` too.
    ///
    /// A key that does not fit by weight is split the same way. A single value heavier than
    /// `max_weight` goes out alone, in a batch of its own, rather than being stuck.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push_with("a", 'x', 4, |_, _| 0);
    /// q.push_with("a", 'y', 4, |_, _| 0);
    /// q.push_with("b", 'z', 9, |_, _| 1);
    /// assert_eq!(q.pop_batch_weighted(10, 5, |_| true), vec![("a", vec!['x'])]);
    /// assert_eq!(q.pop_batch_weighted(10, 5, |_| true), vec![("a", vec!['y'])]);
    /// assert_eq!(q.pop_batch_weighted(10, 5, |_| true), vec![("b", vec!['z'])]); // alone
    /// ```
    pub fn pop_batch_weighted(
        &mut self,
        max_values: usize,
        max_weight: usize,
        is_due: impl FnMut(&R) -> bool,
    ) -> Vec<(K, Vec<V>)> {
        let mut batch = Vec::new();
        self.take(max_values, max_weight, is_due, false, |taken, keys| {
            // Sized once, for every key of the batch.
            batch.reserve_exact(keys);
            batch.push((taken.key, taken.front.values))
        });
        batch
    }

    /// Takes the next batch as [`pop_batch_weighted`](Self::pop_batch_weighted) does, into
    /// `out` key by key, but holds each key's slot: it stays, even when emptied, and takes
    /// new values, but it is not due, and its values are not taken again, until
    /// [`release`](Self::release). This is how a channel keeps one delivery per key in
    /// flight.
    ///
    /// Each key is cloned for the batch, since its slot keeps it. A key whose `Clone`
    /// panicked once cannot be held: it is taken whole, its slot removed, with no hold.
    pub(crate) fn take_held(
        &mut self,
        max_values: usize,
        max_weight: usize,
        is_due: impl FnMut(&R) -> bool,
        mut out: impl FnMut(Taken<R, K, V>),
    ) {
        self.take(max_values, max_weight, is_due, true, |taken, _| out(taken));
    }

    /// Plans a batch, then moves it into `out`, key by key, with the number of keys left
    /// (this one included).
    fn take(
        &mut self,
        max_values: usize,
        max_weight: usize,
        is_due: impl FnMut(&R) -> bool,
        hold: bool,
        mut out: impl FnMut(Taken<R, K, V>, usize),
    ) {
        self.repair();
        // Plan first, then move: every call into user code (`Ord` in the heap, `K::clone`
        // for a split or held key, `R::clone` for a held key) happens while the plan is
        // made, and a panic there puts back the slots it took out, so every value stays.
        // Only the index can be left torn, and `repair` mends it.
        let mut plan = self.plan(max_values, max_weight, is_due, hold);
        let planned = plan.shares.len();
        for (left, share) in (1..=planned).rev().zip(plan.shares.drain(..)) {
            let taken = match share {
                Share::Whole(slot) => {
                    let weight = slot.weight();
                    self.values -= slot.values.len();
                    self.weight -= weight;
                    let Slot {
                        key,
                        values,
                        extra,
                        rank,
                        hash,
                        seq,
                        ..
                    } = slot;
                    if !self.unsplittable.is_empty() {
                        self.unsplittable.retain(|run| *run != Run { hash, seq });
                    }
                    let front = slot::whole(values, extra);
                    // A plain batch has no use for the rank: it goes with the other drops
                    // the owner may defer.
                    let rank = match hold {
                        true => Some(rank),
                        false => {
                            self.index.discard(rank);
                            None
                        }
                    };
                    Taken {
                        key,
                        front,
                        weight,
                        hold: None,
                        rank,
                        run: Run { hash, seq },
                    }
                }
                Share::Kept {
                    at,
                    id,
                    count,
                    weight,
                    copy,
                    rank,
                } => {
                    // Removing planned slots moves no other slot, but check the id all the same.
                    let slot = self.slots.get_mut(at);
                    assert!(slot.ticket == id, "a planned slot stays where it is");
                    self.values -= count;
                    self.weight -= weight;
                    let run = Run {
                        hash: slot.hash,
                        seq: slot.seq,
                    };
                    let front = slot.take_front(count, weight);
                    let held = rank.map(|rank| {
                        self.next_id += 1;
                        slot.ticket = HELD | self.next_id;
                        if slot.values.is_empty() {
                            self.held_empty += 1;
                        }
                        let hold = Hold {
                            hash: slot.hash,
                            id: self.next_id,
                        };
                        (hold, rank)
                    });
                    // Unheld, it is a split: the slot keeps its rank and its ticket.
                    let (hold, rank) = held.unzip();
                    Taken {
                        key: copy,
                        front,
                        weight,
                        hold,
                        rank,
                        run,
                    }
                }
            };
            out(taken, left);
        }
        self.shrink();
        plan.shrink(planned, self.slots.capacity());
        self.plans = plan;
    }

    /// The shares of the next batch, in rank order; see
    /// [`pop_batch_weighted`](Self::pop_batch_weighted) and [`take_held`](Self::take_held).
    fn plan(
        &mut self,
        max_values: usize,
        max_weight: usize,
        mut is_due: impl FnMut(&R) -> bool,
        hold: bool,
    ) -> Plan<R, K, V> {
        let mut plan = std::mem::take(&mut self.plans);
        let shares = &mut plan.shares;
        let slots = &mut self.slots;
        let unsplittable = &mut self.unsplittable;
        // Every call into user code is caught, so that the slots already out of the table
        // can go back before the panic goes on.
        let planned = self.index.guard(|index| {
            panic::catch_unwind(AssertUnwindSafe(|| {
                let (mut room, mut room_weight) = (max_values, max_weight);
                while room > 0 {
                    let Some(side) = index.front_side() else {
                        break;
                    };
                    let ticket = index.ticket(side);
                    let (hash, id) = (ticket.hash, ticket.id);
                    // One probe per key: it tells whether the ticket is live and finds the
                    // slot, which either leaves the table here or is reached again where it
                    // sits.
                    let Some(entry) = slots.find_entry(hash, |s| s.ticket == id) else {
                        // A stale ticket that surfaced once the key ahead of it was planned.
                        index.pop(side);
                        continue;
                    };
                    let slot = entry.get();
                    // Check what fits before asking whether it is due, so that `is_due` is
                    // asked only about keys that go out.
                    let empty = shares.is_empty();
                    let (mut count, mut weight) = slot.fitting(room, room_weight, empty);
                    let run = Run {
                        hash,
                        seq: slot.seq,
                    };
                    let len = slot.values.len();
                    // A key whose `Clone` panicked cannot be split, nor held: whole and
                    // alone, or not in this batch.
                    let unclonable = unsplittable.contains(&run);
                    if unclonable && count < len {
                        (count, weight) = match empty {
                            true => (len, slot.weight()),
                            false => (0, 0),
                        };
                    }
                    if count == 0 || !is_due(&ticket.rank) {
                        break;
                    }
                    // A value heavier than the whole cap goes out alone, and so does a key
                    // that cannot be split.
                    let alone = weight > room_weight || count > room;
                    room = room.saturating_sub(count);
                    room_weight = room_weight.saturating_sub(weight);
                    let split = count < len;
                    if (hold || split) && !unclonable {
                        let key = &slot.key;
                        let copy = match panic::catch_unwind(AssertUnwindSafe(|| key.clone())) {
                            Ok(copy) => copy,
                            Err(panic) => {
                                unsplittable.push(run);
                                panic::resume_unwind(panic);
                            }
                        };
                        // A rank whose `Clone` panics makes the key one that cannot be
                        // held: next time it goes whole, its slot removed and its rank
                        // moved out.
                        let rank = match hold {
                            false => None,
                            true => {
                                let rank = &ticket.rank;
                                match panic::catch_unwind(AssertUnwindSafe(|| rank.clone())) {
                                    Ok(rank) => Some(rank),
                                    Err(panic) => {
                                        unsplittable.push(run);
                                        panic::resume_unwind(panic);
                                    }
                                }
                            }
                        };
                        shares.push(Share::Kept {
                            at: entry.at(),
                            id,
                            count,
                            weight,
                            copy,
                            rank,
                        });
                    } else {
                        shares.push(Share::Whole(entry.remove()));
                    }
                    // A split key keeps its ticket, and its place at the front; every other
                    // key leaves the index here.
                    if split && !hold {
                        break;
                    }
                    index.pop(side);
                    if alone || split {
                        break;
                    }
                }
                index.prune(|t| slots.find(t.hash, |s| s.ticket == t.id).is_some());
            }))
        });
        if let Err(panic) = planned {
            // The slots planned whole go back, and the tickets popped for planned keys with
            // them: rebuild the index.
            for share in plan.shares.drain(..) {
                if let Share::Whole(slot) = share {
                    self.slots.insert_unique(slot);
                }
            }
            self.plans = plan;
            self.rebuild(Tickets::Kept);
            panic::resume_unwind(panic)
        }
        plan
    }

    /// Whether `key` has pending values.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 0);
    /// assert!(q.contains_key(&"a"));
    /// assert!(!q.contains_key(&"b"));
    /// ```
    pub fn contains_key(&self, key: &K) -> bool {
        self.contains_hashed(self.hasher.hash_one(key), key)
    }

    /// [`contains_key`](Self::contains_key), with the key's hash from
    /// [`hasher`](Self::hasher).
    pub(crate) fn contains_hashed(&self, hash: u64, key: &K) -> bool {
        self.slots.find(hash, |s| s.key == *key).is_some()
    }

    /// Puts values back in front of a held key's values, as after a failed delivery. The key
    /// stays held. Returns the key's run: the one that was in flight, or, if values came for
    /// the key meanwhile, theirs. Hands the values back if there is no such hold.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if the total pending weight would overflow `usize`.
    pub(crate) fn give_back(&mut self, hold: Hold, back: Returned<V>) -> Result<Run, Returned<V>> {
        let items = Items::Prepend(back);
        let (count, weight) = items.size();
        let total = weight.checked_add(self.weight);
        assert!(total.is_some(), "the total pending weight overflows usize");
        let held = HELD | hold.id;
        let Some(slot) = self.slots.find_mut(hold.hash, |s| s.ticket == held) else {
            let Items::Prepend(back) = items else {
                unreachable!("made above")
            };
            return Err(back);
        };
        if slot.values.is_empty() {
            self.held_empty -= 1;
        }
        slot.add(items);
        self.values += count;
        self.weight += weight;
        Ok(Run {
            hash: slot.hash,
            seq: slot.seq,
        })
    }

    /// Ends a hold: the key is due again by `rank` (see [`Release`]) if it has values, and
    /// leaves the queue if not. Returns whether the key now leads (or may: an index that a
    /// panic tore does not tell until it is rebuilt), and the key if it left,
    /// for the caller to drop when it chooses: a channel drops keys after its lock. Ending a
    /// hold that is not there does nothing.
    pub(crate) fn release(&mut self, hold: Hold, rank: Release<R>) -> (bool, Option<K>) {
        let held = HELD | hold.id;
        let Some(entry) = self.slots.find_entry(hold.hash, |s| s.ticket == held) else {
            if let Release::Lower(r) = rank {
                self.index.discard(r);
            }
            return (false, None);
        };
        if entry.get().values.is_empty() {
            let slot = entry.remove();
            self.held_empty -= 1;
            self.index.discard(slot.rank);
            if let Release::Lower(r) = rank {
                self.index.discard(r);
            }
            return (false, Some(slot.key));
        }
        let slot = entry.into_mut();
        self.next_id += 1;
        let id = self.next_id;
        // The hold ends before user `Ord` runs: should it panic, the rebuild that mends the
        // index gives the slot a ticket, and the key does not stay held.
        slot.ticket = id;
        let index = &mut self.index;
        if index.is_torn() {
            // An earlier panic tore the index. The hold ends all the same, and the next
            // call's rebuild gives the slot its ticket (by then `Ord` may not panic: a
            // rebuild here that did would leave the key held). Whether it leads is not known.
            if let Some(old) = lowered(&mut slot.rank, rank) {
                index.discard(old);
            }
            return (true, None);
        }
        let old = index.guard(|index| {
            let old = lowered(&mut slot.rank, rank);
            index.push(Ticket {
                rank: slot.rank.clone(),
                seq: slot.seq,
                id,
                hash: slot.hash,
            });
            old
        });
        if let Some(old) = old {
            index.discard(old);
        }
        (self.leads(id), None)
    }

    /// Adds `items` to `key`, whose hash from [`hasher`](Self::hasher) is `hash`, and lowers
    /// its rank to `rank(current, values, weight)`: the key's rank if it is pending, and its
    /// count and weight once the items are in. The closure may return `None` when it knows
    /// the rank would not drop; for a new key it must return a rank.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if the total pending weight would overflow `usize`, or if
    /// user code (`Eq`, `Ord`, `Clone`, the closure) panics before the items are in. With
    /// `user_ord`, a panic of `Ord` after, as the index settles, comes back in
    /// [`Inserted::panic`]; without, `Ord` is the caller's own, and does not panic.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        key: K,
        items: Items<V>,
        rank: impl FnOnce(Option<&R>, usize, usize) -> Option<R>,
        user_ord: bool,
    ) -> Inserted<R, K> {
        self.repair();
        let (count, weight) = items.size();
        // Weights are the caller's numbers: refuse, before anything changes, a total that
        // does not fit. Every key's total is part of the queue's, so that one check will do.
        let total = weight.checked_add(self.weight);
        assert!(total.is_some(), "the total pending weight overflows usize");
        // User code (`Eq`, the rank closure, `Ord`, `Clone`) runs before anything changes,
        // except index pushes, which `guard` covers.
        let id = self.take_id();
        let index = &mut self.index;
        let mut inserted = Inserted {
            leads: false,
            new_run: None,
            spare_key: None,
            spare_rank: None,
            panic: None,
        };
        // Only a lowered rank leaves a stale ticket behind; only a new ticket can lead.
        let stale = match self.slots.entry(hash, |s| s.key == key) {
            SlotEntry::Occupied(slot) if slot.is_held() => {
                // A held slot takes the values, but stays held: no ticket, and it does not
                // lead. Its rank is what the values that came while it was held give it.
                let (values, slot_weight) = (slot.values.len(), slot.weight());
                if values == 0 {
                    // The first of them: a new run.
                    let rank = rank(None, count, weight).expect("a new run has a rank");
                    let old = std::mem::replace(&mut slot.rank, rank);
                    index.discard(old);
                    slot.seq = id;
                    self.held_empty -= 1;
                    inserted.new_run = Some(Run { hash, seq: id });
                } else if let Some(rank) =
                    rank(Some(&slot.rank), values + count, slot_weight + weight)
                {
                    let lower = index.guard(|_| rank < slot.rank);
                    match lower {
                        true => index.discard(std::mem::replace(&mut slot.rank, rank)),
                        false => inserted.spare_rank = Some(rank),
                    }
                }
                slot.add(items);
                inserted.spare_key = Some(key);
                false
            }
            SlotEntry::Occupied(slot) => {
                let rank = rank(
                    Some(&slot.rank),
                    slot.values.len() + count,
                    slot.weight() + weight,
                );
                let lowered = match rank {
                    Some(rank) => index.lower(slot, rank, id).map_err(Some),
                    None => Err(None),
                };
                let was_lowered = lowered.is_ok();
                inserted.spare_rank = lowered.err().flatten();
                slot.add(items);
                inserted.spare_key = Some(key);
                inserted.leads = was_lowered;
                was_lowered
            }
            SlotEntry::Vacant(entry) => {
                let rank = rank(None, count, weight).expect("a new key has a rank");
                index.guard(|index| {
                    index.push(Ticket {
                        rank: rank.clone(),
                        seq: id,
                        id,
                        hash,
                    })
                });
                let mut slot = Slot {
                    hash,
                    key,
                    values: Values::new(),
                    extra: None,
                    rank,
                    seq: id,
                    ticket: id,
                };
                slot.add(items);
                entry.insert(slot);
                inserted.leads = true;
                inserted.new_run = Some(Run { hash, seq: id });
                false
            }
        };
        self.values += count;
        self.weight += weight;
        let settle = |queue: &mut Self| {
            if stale {
                queue.settle_stale();
            }
            inserted.leads && queue.leads(id)
        };
        if !user_ord {
            inserted.leads = settle(self);
        } else if stale || inserted.leads {
            // The values are in: a panic of the user `Ord` that runs from here on must not
            // unwind past the caller's count of them, nor drop the spare key and rank under
            // its lock. A torn index is rebuilt by the next call.
            match panic::catch_unwind(AssertUnwindSafe(|| settle(self))) {
                Ok(leads) => inserted.leads = leads,
                Err(panic) => {
                    inserted.leads = true;
                    inserted.panic = Some(panic);
                }
            }
        }
        inserted
    }

    fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether the ticket `id` stands first.
    fn leads(&self, id: u64) -> bool {
        self.index.front().is_some_and(|ticket| ticket.id == id)
    }

    /// After a rank was lowered: drops the stale ticket if it reached a front, and rebuilds
    /// once stale tickets outnumber live ones, so the index stays O(keys) at an amortized
    /// O(log n) per stale ticket.
    fn settle_stale(&mut self) {
        let slots = &self.slots;
        self.index
            .guard(|index| index.prune(|t| slots.find(t.hash, |s| s.ticket == t.id).is_some()));
        if self.index.len() > 2 * self.slots.len() + SMALL {
            self.rebuild(Tickets::Fresh);
        }
    }

    /// Rebuilds the index, if a panic in user code may have torn it.
    fn repair(&mut self) {
        if self.index.is_torn() {
            self.rebuild(Tickets::Kept);
        }
    }

    /// Rebuilds the index: one live ticket per key, sorted, in the FIFO. Held slots get
    /// none: they are not due until released.
    fn rebuild(&mut self, tickets: Tickets) {
        let Self { slots, index, .. } = self;
        // User `Clone` and `Ord` run under the guard: should either panic, the index stays
        // marked torn, and the next call rebuilds it again.
        index.guard(|index| {
            // The ids of the live tickets kept, if any are: their keys need no new one.
            let (mut tickets, kept) = match tickets {
                Tickets::Fresh => (Vec::with_capacity(slots.len()), None),
                Tickets::Kept => {
                    let live =
                        index.take_live(|t| slots.find(t.hash, |s| s.ticket == t.id).is_some());
                    let ids: std::collections::HashSet<u64> = live.iter().map(|t| t.id).collect();
                    (live, Some(ids))
                }
            };
            let needs_one = |slot: &&Slot<R, K, V>| {
                !slot.is_held() && kept.as_ref().is_none_or(|ids| !ids.contains(&slot.ticket))
            };
            for slot in slots.iter().filter(needs_one) {
                tickets.push(Ticket {
                    rank: slot.rank.clone(),
                    seq: slot.seq,
                    id: slot.ticket,
                    hash: slot.hash,
                });
            }
            index.rebuild(tickets);
        });
    }

    /// Gives memory back once the table or the index is mostly empty. Shrinking to twice
    /// the live size only when it falls under an eighth keeps this amortized O(1).
    fn shrink(&mut self) {
        self.slots.shrink(SHRINK_ABOVE);
        self.index.shrink(SHRINK_ABOVE);
    }
}

impl<R: Ord, K, V> Default for SortedQueue<R, K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R, K, V> fmt::Debug for SortedQueue<R, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SortedQueue")
            .field("keys", &self.slots.len())
            .field("values", &self.values)
            .field("weight", &self.weight)
            .finish_non_exhaustive()
    }
}
