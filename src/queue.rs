//! The sorted keyed queue: the synchronous core that every channel flavour wraps.
//!
//! A [`SortedQueue`] holds pending values grouped by key. Each key has a *rank* (a deadline,
//! a priority, anything `Ord`), which is the smallest rank among its pending values. Batches
//! come out in rank order; ties go to the key whose current pending run started first.
//!
//! The queue knows nothing about time, locks or wakers. The async channels in this crate are
//! a thin layer over it, and it is useful on its own wherever a synchronous keyed batcher will
//! do.
//!
//! # Examples
//!
//! ```
//! use sorted_channel::queue::SortedQueue;
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
//! A push whose `(rank, arrival)` is not smaller than the last one pushed is O(1): the index
//! is then a FIFO, as it is for a channel whose values all get `now + window`. Other pushes,
//! and rank changes, cost O(log n) in a binary heap. A key holds a constant-sized slot plus its
//! values; there is no index entry per value.
//!
//! # Panics in user code
//!
//! `Hash` and `Eq` of `K` run only while a value goes in, before the queue changes; the queue
//! stores each key's hash and never calls them while taking batches or growing. `Ord` and
//! `Clone` of `R`, and `Clone` of `K`, run before the data they guard moves. If any of them
//! panics, the call panics and the queue stays whole: no other key's values are lost.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::mem;

use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashTable};

/// Index sizes below this are never compacted or shrunk: too small to matter.
const SMALL: usize = 64;

/// A keyed queue whose keys come out in rank order, each with all of its pending values.
///
/// `R` is the rank (smaller comes first), `K` the key and `V` the value. See the
/// [module documentation](self) for the rules and costs.
pub struct SortedQueue<R, K, V> {
    /// One slot per pending key. The table stores each key's hash, so lookups by ticket and
    /// resizes never call `K`'s `Hash` or `Eq`.
    slots: HashTable<Slot<R, K, V>>,
    hasher: DefaultHashBuilder,
    /// Tickets pushed in non-decreasing order: the common path, O(1).
    fifo: VecDeque<Ticket<R>>,
    /// Tickets that arrived out of order.
    heap: BinaryHeap<Reverse<Ticket<R>>>,
    /// Pending values, over all keys.
    values: usize,
    /// Source of arrival sequence numbers and ticket ids.
    next_id: u64,
    /// Set while user `Ord` runs on the index. If it is still set when the next call starts,
    /// that `Ord` panicked part way, and the index is rebuilt from the slots.
    dirty: bool,
}

/// A pending key.
struct Slot<R, K, V> {
    hash: u64,
    key: K,
    values: Vec<V>,
    rank: R,
    /// When the current pending run started: breaks ties between equal ranks.
    seq: u64,
    /// The id of the one ticket that is live for this slot.
    ticket: u64,
}

/// An index entry: where a key stands in the order. A ticket is *stale* once its slot is gone
/// or has a newer ticket; stale tickets are skipped and dropped when they reach the front.
struct Ticket<R> {
    rank: R,
    seq: u64,
    id: u64,
    hash: u64,
}

impl<R: Ord> Ord for Ticket<R> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank.cmp(&other.rank).then(self.seq.cmp(&other.seq))
    }
}

impl<R: Ord> PartialOrd for Ticket<R> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<R: Ord> PartialEq for Ticket<R> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<R: Ord> Eq for Ticket<R> {}

/// One key's share of a batch, planned before any value moves.
struct Take<K> {
    hash: u64,
    id: u64,
    count: usize,
    /// A copy of the key when only part of its values go: the slot keeps the original.
    split: Option<K>,
}

/// Which index holds the front ticket.
#[derive(Clone, Copy)]
enum Side {
    Fifo,
    Heap,
}

impl<R, K, V> SortedQueue<R, K, V> {
    /// Pending values, over all keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
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

    /// Pending keys: keys with at least one pending value.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 1, 0);
    /// q.push("a", 2, 0);
    /// assert_eq!(q.key_count(), 1);
    /// ```
    pub fn key_count(&self) -> usize {
        self.slots.len()
    }

    /// Whether no value is pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
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
    /// Both fall back after the keys drain: the queue shrinks its table and its index once
    /// they are mostly empty, so a burst of distinct keys does not pin memory for good.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// for key in 0..100_000 {
    ///     q.push(key, (), 0);
    /// }
    /// let (keys, _) = q.capacity();
    /// assert!(keys >= 100_000);
    /// while !q.pop_batch(1_000, |_| true).is_empty() {}
    /// assert!(q.capacity().0 < 1_000);
    /// ```
    pub fn capacity(&self) -> (usize, usize) {
        (
            self.slots.capacity(),
            self.fifo.capacity() + self.heap.capacity(),
        )
    }

    /// Empties the queue and returns its keys and values as they were, to be dropped later:
    /// the channel drops them outside its lock, since a value's `Drop` is user code.
    pub(crate) fn take_all(&mut self) -> impl Sized {
        self.fifo.clear();
        self.heap.clear();
        self.values = 0;
        mem::take(&mut self.slots)
    }
}

impl<R: Ord, K, V> SortedQueue<R, K, V> {
    /// Creates an empty queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let q: SortedQueue<u32, &str, i32> = SortedQueue::new();
    /// assert!(q.is_empty());
    /// ```
    pub fn new() -> Self {
        SortedQueue {
            slots: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            fifo: VecDeque::new(),
            heap: BinaryHeap::new(),
            values: 0,
            next_id: 0,
            dirty: false,
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
    /// Returns `true` if the key now stands first, ahead of every other key: the smallest
    /// rank in the queue moved down, or the queue was empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// assert!(q.push("a", 'x', 5)); // first key: it leads
    /// assert!(!q.push("b", 'y', 7)); // behind "a"
    /// assert!(q.push("b", 'z', 1)); // "b" now ranks 1 and leads
    /// assert_eq!(q.peek_rank(), Some(&1));
    /// ```
    pub fn push(&mut self, key: K, value: V, rank: R) -> bool {
        self.push_with(key, value, |_| rank)
    }

    /// Like [`push`](Self::push), but the rank is computed from the number of values the key
    /// holds once `value` is in.
    ///
    /// This is how a caller makes a full key due at once without a second lookup.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// // Rank 100 normally, but 0 once a key holds three values.
    /// let rank = |len: usize| if len >= 3 { 0 } else { 100 };
    /// let mut q = SortedQueue::new();
    /// q.push_with("a", 1, rank);
    /// q.push_with("a", 2, rank);
    /// assert_eq!(q.peek_rank(), Some(&100));
    /// q.push_with("a", 3, rank);
    /// assert_eq!(q.peek_rank(), Some(&0));
    /// ```
    pub fn push_with(&mut self, key: K, value: V, rank: impl FnOnce(usize) -> R) -> bool {
        self.insert(key, 1, rank, |values| values.push(value))
    }

    /// Puts `values` back in front of `key`'s pending values, as after a failed delivery. The
    /// key's rank becomes the smaller of its rank and `rank`.
    ///
    /// Returns `true` if the key now stands first, as [`push`](Self::push) does. An empty
    /// `values` changes nothing and returns `false`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// q.push("a", 3, 10);
    /// q.requeue("a", vec![1, 2], 10);
    /// assert_eq!(q.pop_batch(usize::MAX, |_| true), vec![("a", vec![1, 2, 3])]);
    /// ```
    pub fn requeue(&mut self, key: K, values: Vec<V>, rank: R) -> bool {
        if values.is_empty() {
            return false;
        }
        let count = values.len();
        self.insert(
            key,
            count,
            |_| rank,
            |pending| {
                let newer = mem::replace(pending, values);
                pending.extend(newer);
            },
        )
    }

    /// Takes the next batch: due keys in rank order, at most `max_values` values in all.
    ///
    /// A key is due when `is_due(rank)` is true; taking stops at the first key that is not.
    /// A key with more values than the room left is split: the batch takes its oldest values,
    /// and the rest keep the key's rank and place, so they lead the next batch. The result is
    /// empty when nothing is due or `max_values` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
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
        mut is_due: impl FnMut(&R) -> bool,
    ) -> Vec<(K, Vec<V>)> {
        self.repair();
        // Plan first, then move: every call into user code (`Ord` in the heap, `K::clone`
        // for a split key) happens while the plan is made, so a panic there leaves every
        // value in its slot. Only the index can be left torn, and `dirty` repairs it.
        self.dirty = true;
        let mut plan: Vec<Take<K>> = Vec::new();
        let mut room = max_values;
        while room > 0 {
            let Some(side) = self.front_side() else { break };
            let ticket = self.ticket(side);
            if !is_due(&ticket.rank) {
                break;
            }
            let (hash, id) = (ticket.hash, ticket.id);
            let slot = self
                .slots
                .find(hash, |s| s.ticket == id)
                .expect("front ticket is live");
            let len = slot.values.len();
            if len <= room {
                plan.push(Take {
                    hash,
                    id,
                    count: len,
                    split: None,
                });
                room -= len;
                self.pop_ticket(side);
                self.prune();
            } else {
                let split = Some(slot.key.clone());
                plan.push(Take {
                    hash,
                    id,
                    count: room,
                    split,
                });
                room = 0;
            }
        }
        self.dirty = false;

        let mut batch = Vec::with_capacity(plan.len());
        for take in plan {
            let Ok(entry) = self.slots.find_entry(take.hash, |s| s.ticket == take.id) else {
                unreachable!("planned slot is present")
            };
            self.values -= take.count;
            match take.split {
                None => {
                    let (slot, _) = entry.remove();
                    batch.push((slot.key, slot.values));
                }
                Some(key) => {
                    let slot = entry.into_mut();
                    let rest = slot.values.split_off(take.count);
                    batch.push((key, mem::replace(&mut slot.values, rest)));
                }
            }
        }
        self.shrink();
        batch
    }

    /// The smallest rank in the queue: the rank of the key that comes out next.
    ///
    /// # Examples
    ///
    /// ```
    /// use sorted_channel::queue::SortedQueue;
    ///
    /// let mut q = SortedQueue::new();
    /// assert_eq!(q.peek_rank(), None);
    /// q.push("a", (), 7);
    /// q.push("b", (), 3);
    /// assert_eq!(q.peek_rank(), Some(&3));
    /// ```
    pub fn peek_rank(&self) -> Option<&R> {
        self.front_side().map(|side| &self.ticket(side).rank)
    }

    /// Whether the first key in rank order satisfies `is_due`.
    pub(crate) fn front_is(&self, is_due: impl FnOnce(&R) -> bool) -> bool {
        self.peek_rank().is_some_and(is_due)
    }

    /// Adds `count` values to `key` (through `put`) and lowers its rank to `rank(len)`, where
    /// `len` counts the key's values once they are in. Returns whether the key now leads.
    fn insert(
        &mut self,
        key: K,
        count: usize,
        rank: impl FnOnce(usize) -> R,
        put: impl FnOnce(&mut Vec<V>),
    ) -> bool {
        self.repair();
        // User code (`Hash`, `Eq`, the rank closure, `Ord`, `Clone`) runs before anything
        // changes, except heap pushes, which `dirty` guards.
        let hash = self.hasher.hash_one(&key);
        let id = self.next_id;
        self.next_id += 1;
        match self.slots.entry(hash, |s| s.key == key, |s| s.hash) {
            Entry::Occupied(mut entry) => {
                let slot = entry.get_mut();
                let rank = rank(slot.values.len() + count);
                if rank < slot.rank {
                    let ticket = Ticket {
                        rank: rank.clone(),
                        seq: slot.seq,
                        id,
                        hash,
                    };
                    self.dirty = true;
                    push_ticket(&mut self.fifo, &mut self.heap, ticket);
                    self.dirty = false;
                    slot.rank = rank;
                    slot.ticket = id;
                }
                put(&mut slot.values);
            }
            Entry::Vacant(entry) => {
                let rank = rank(count);
                let ticket = Ticket {
                    rank: rank.clone(),
                    seq: id,
                    id,
                    hash,
                };
                let mut values = Vec::new();
                put(&mut values);
                self.dirty = true;
                push_ticket(&mut self.fifo, &mut self.heap, ticket);
                self.dirty = false;
                entry.insert(Slot {
                    hash,
                    key,
                    values,
                    rank,
                    seq: id,
                    ticket: id,
                });
            }
        }
        self.values += count;
        self.dirty = true;
        self.prune();
        // Lowering a rank leaves the old ticket behind. Rebuild once stale tickets outnumber
        // live ones, so the index stays O(keys): amortized O(log n) per stale ticket.
        if self.fifo.len() + self.heap.len() > 2 * self.slots.len() + SMALL {
            self.rebuild();
        }
        let leads = self
            .front_side()
            .is_some_and(|side| self.ticket(side).id == id);
        self.dirty = false;
        leads
    }

    /// Which index holds the smallest live ticket.
    fn front_side(&self) -> Option<Side> {
        match (self.fifo.front(), self.heap.peek()) {
            (None, None) => None,
            (Some(_), None) => Some(Side::Fifo),
            (None, Some(_)) => Some(Side::Heap),
            (Some(f), Some(Reverse(h))) => Some(if f <= h { Side::Fifo } else { Side::Heap }),
        }
    }

    fn ticket(&self, side: Side) -> &Ticket<R> {
        match side {
            Side::Fifo => self.fifo.front(),
            Side::Heap => self.heap.peek().map(|Reverse(t)| t),
        }
        .expect("side is not empty")
    }

    fn pop_ticket(&mut self, side: Side) {
        match side {
            Side::Fifo => drop(self.fifo.pop_front()),
            Side::Heap => drop(self.heap.pop()),
        }
    }

    fn is_live(&self, ticket: &Ticket<R>) -> bool {
        self.slots
            .find(ticket.hash, |s| s.ticket == ticket.id)
            .is_some()
    }

    /// Drops stale tickets from both fronts, so that the fronts are always live.
    fn prune(&mut self) {
        while self.fifo.front().is_some_and(|t| !self.is_live(t)) {
            self.fifo.pop_front();
        }
        while self.heap.peek().is_some_and(|Reverse(t)| !self.is_live(t)) {
            self.heap.pop();
        }
    }

    /// Rebuilds the index from the slots, if a panic in user `Ord` may have torn it.
    fn repair(&mut self) {
        if self.dirty {
            self.rebuild();
            self.dirty = false;
        }
    }

    /// Rebuilds the index from the slots: one live ticket per key, sorted, in the FIFO.
    fn rebuild(&mut self) {
        let mut tickets: Vec<Ticket<R>> = self
            .slots
            .iter()
            .map(|s| Ticket {
                rank: s.rank.clone(),
                seq: s.seq,
                id: s.ticket,
                hash: s.hash,
            })
            .collect();
        tickets.sort_unstable();
        self.heap = BinaryHeap::new();
        self.fifo = tickets.into();
    }

    /// Gives memory back once the table or the index is mostly empty. Shrinking to twice
    /// the live size only when it falls under an eighth keeps this amortized O(1).
    fn shrink(&mut self) {
        let live = self.slots.len();
        if self.slots.capacity() > SMALL && live * 8 < self.slots.capacity() {
            self.slots.shrink_to(live * 2, |s| s.hash);
        }
        if self.fifo.capacity() > SMALL && self.fifo.len() * 8 < self.fifo.capacity() {
            self.fifo.shrink_to(self.fifo.len() * 2);
        }
        if self.heap.capacity() > SMALL && self.heap.len() * 8 < self.heap.capacity() {
            self.heap.shrink_to(self.heap.len() * 2);
        }
    }
}

/// Pushes a ticket: onto the FIFO if that keeps it sorted, else into the heap.
fn push_ticket<R: Ord>(
    fifo: &mut VecDeque<Ticket<R>>,
    heap: &mut BinaryHeap<Reverse<Ticket<R>>>,
    ticket: Ticket<R>,
) {
    if fifo.back().is_none_or(|last| *last <= ticket) {
        fifo.push_back(ticket);
    } else {
        heap.push(Reverse(ticket));
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
            .finish_non_exhaustive()
    }
}
