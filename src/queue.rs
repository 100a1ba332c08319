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
        // Only a lowered rank leaves a stale ticket behind; only a new ticket can lead.
        let (pushed, stale) = match self.slots.entry(hash, |s| s.key == key, |s| s.hash) {
            Entry::Occupied(mut entry) => {
                let slot = entry.get_mut();
                let rank = rank(slot.values.len() + count);
                let lowered = rank < slot.rank;
                if lowered {
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
                (lowered, lowered)
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
                (true, false)
            }
        };
        self.values += count;
        if stale {
            self.dirty = true;
            self.prune();
            // Rebuild once stale tickets outnumber live ones, so the index stays O(keys):
            // amortized O(log n) per stale ticket.
            if self.fifo.len() + self.heap.len() > 2 * self.slots.len() + SMALL {
                self.rebuild();
            }
            self.dirty = false;
        }
        pushed
            && self
                .front_side()
                .is_some_and(|side| self.ticket(side).id == id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    fn all<R: Ord + Clone, K: Hash + Eq + Clone, V>(
        q: &mut SortedQueue<R, K, V>,
    ) -> Vec<(K, Vec<V>)> {
        q.pop_batch(usize::MAX, |_| true)
    }

    #[test]
    fn aggregates_values_per_key_in_send_order() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 5);
        q.push("b", 2, 6);
        q.push("a", 3, 7);
        assert_eq!(all(&mut q), vec![("a", vec![1, 3]), ("b", vec![2])]);
        assert!(q.is_empty());
        assert_eq!(q.key_count(), 0);
    }

    #[test]
    fn rank_is_smallest_of_pending_values() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 10);
        q.push("b", 2, 5);
        assert!(q.push("a", 3, 1), "a's rank drops to 1, so it leads");
        assert_eq!(q.peek_rank(), Some(&1));
        assert!(!q.push("a", 4, 100), "a higher rank does not raise a key");
        assert_eq!(all(&mut q), vec![("a", vec![1, 3, 4]), ("b", vec![2])]);
    }

    #[test]
    fn ties_go_to_earliest_run() {
        let mut q = SortedQueue::new();
        q.push("b", 1, 3);
        q.push("a", 2, 3);
        q.push("c", 3, 3);
        let keys: Vec<_> = all(&mut q).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a", "c"]);
    }

    #[test]
    fn a_refilled_key_is_a_new_arrival() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 0);
        q.push("b", 2, 0);
        assert_eq!(q.pop_batch(1, |_| true), vec![("a", vec![1])]);
        q.push("a", 3, 0);
        let keys: Vec<_> = all(&mut q).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a"]);
    }

    #[test]
    fn split_keeps_rank_and_place() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 1);
        q.push("a", 2, 1);
        q.push("a", 3, 1);
        q.push("b", 4, 2);
        assert_eq!(q.pop_batch(2, |_| true), vec![("a", vec![1, 2])]);
        assert_eq!(q.peek_rank(), Some(&1));
        // The remainder leads, and the split did not make it a new arrival.
        q.push("c", 5, 1);
        assert_eq!(
            q.pop_batch(3, |_| true),
            vec![("a", vec![3]), ("c", vec![5]), ("b", vec![4])]
        );
    }

    #[test]
    fn split_remainder_yields_to_smaller_rank() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 5);
        q.push("a", 2, 5);
        assert_eq!(q.pop_batch(1, |_| true), vec![("a", vec![1])]);
        q.push("b", 3, 4);
        assert_eq!(all(&mut q), vec![("b", vec![3]), ("a", vec![2])]);
    }

    #[test]
    fn stops_at_first_key_not_due() {
        let mut q = SortedQueue::new();
        q.push("a", 1, 1);
        q.push("b", 2, 5);
        q.push("c", 3, 2);
        assert_eq!(
            q.pop_batch(10, |r| *r <= 2),
            vec![("a", vec![1]), ("c", vec![3])]
        );
        assert!(q.pop_batch(10, |r| *r <= 4).is_empty());
        assert_eq!(q.len(), 1);
        assert!(q.pop_batch(0, |_| true).is_empty(), "no room, no batch");
    }

    #[test]
    fn requeue_goes_in_front_and_lowers_rank() {
        let mut q = SortedQueue::new();
        q.push("a", 3, 10);
        q.push("b", 9, 5);
        assert!(q.requeue("a", vec![1, 2], 1));
        assert!(
            !q.requeue("b", vec![], 0),
            "nothing to requeue changes nothing"
        );
        assert_eq!(q.len(), 4);
        assert_eq!(all(&mut q), vec![("a", vec![1, 2, 3]), ("b", vec![9])]);
        assert!(
            q.requeue("c", vec![7], 3),
            "requeue of an absent key starts a run"
        );
        assert_eq!(all(&mut q), vec![("c", vec![7])]);
    }

    #[test]
    fn push_with_sees_key_length() {
        let mut q = SortedQueue::new();
        let mut seen = Vec::new();
        for v in 0..3 {
            q.push_with("a", v, |len| {
                seen.push(len);
                10
            });
        }
        assert_eq!(seen, [1, 2, 3]);
    }

    #[test]
    fn leads_reports_new_front_only() {
        let mut q = SortedQueue::new();
        assert!(q.push(1, (), 5), "none to some");
        assert!(!q.push(2, (), 5), "equal rank, later run: behind");
        assert!(!q.push(1, (), 5), "same key, same rank: nothing moved");
        assert!(q.push(3, (), 4), "smaller rank leads");
        assert!(!q.push(4, (), 9));
    }

    #[test]
    fn out_of_order_ranks_sort() {
        let mut q = SortedQueue::new();
        let ranks = [50, 10, 40, 20, 30, 0, 60, 5];
        for (key, rank) in ranks.iter().enumerate() {
            q.push(key, *rank, *rank);
        }
        let got: Vec<i32> = all(&mut q).into_iter().map(|(_, v)| v[0]).collect();
        let mut want = ranks.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn stale_tickets_stay_bounded() {
        let mut q = SortedQueue::new();
        // Every push lowers the rank of one of ten keys: each leaves a stale ticket.
        for i in 0..100_000i64 {
            q.push(i % 10, i, -i);
        }
        assert_eq!(q.len(), 100_000);
        let index = q.fifo.len() + q.heap.len();
        assert!(
            index <= 2 * q.key_count() + SMALL + 1,
            "index has {index} tickets"
        );
        let batch = all(&mut q);
        assert_eq!(batch.len(), 10);
        assert_eq!(batch[0].0, 9, "key 9 got the smallest rank last");
        assert_eq!(batch.iter().map(|(_, v)| v.len()).sum::<usize>(), 100_000);
    }

    #[test]
    fn memory_falls_back_after_drain() {
        let mut q = SortedQueue::new();
        for key in 0..200_000u32 {
            q.push(key, key, key);
        }
        let (keys, index) = q.capacity();
        assert!(keys >= 200_000 && index >= 200_000);
        while !q.pop_batch(997, |_| true).is_empty() {}
        let (keys, index) = q.capacity();
        assert!(keys <= 2 * SMALL, "key capacity {keys}");
        assert!(index <= 2 * SMALL, "index capacity {index}");
    }

    thread_local! {
        static PANIC_ON: Cell<Option<u32>> = const { Cell::new(None) };
    }

    fn trip(id: u32, what: &str) {
        if PANIC_ON.with(Cell::get) == Some(id) {
            panic!("{what} panics on {id}");
        }
    }

    /// A key whose `Hash`, `Eq` and `Clone` panic on a chosen id.
    #[derive(Debug)]
    struct Touchy(u32);

    impl Hash for Touchy {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            trip(self.0, "hash");
            self.0.hash(state);
        }
    }

    impl PartialEq for Touchy {
        fn eq(&self, other: &Self) -> bool {
            trip(self.0, "eq");
            trip(other.0, "eq");
            self.0 == other.0
        }
    }

    impl Eq for Touchy {}

    impl Clone for Touchy {
        fn clone(&self) -> Self {
            trip(self.0, "clone");
            Touchy(self.0)
        }
    }

    /// A rank whose `Ord` panics on a chosen id.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct TouchyRank(u32);

    impl Ord for TouchyRank {
        fn cmp(&self, other: &Self) -> Ordering {
            trip(self.0, "cmp");
            trip(other.0, "cmp");
            self.0.cmp(&other.0)
        }
    }

    impl PartialOrd for TouchyRank {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }

    fn panics(f: impl FnOnce()) -> bool {
        catch_unwind(AssertUnwindSafe(f)).is_err()
    }

    fn ids(batch: Vec<(Touchy, Vec<u32>)>) -> Vec<(u32, Vec<u32>)> {
        batch.into_iter().map(|(k, v)| (k.0, v)).collect()
    }

    #[test]
    fn panicking_hash_loses_nothing() {
        let mut q = SortedQueue::new();
        for id in 0..50 {
            q.push(Touchy(id), id, id);
        }
        PANIC_ON.with(|p| p.set(Some(7)));
        assert!(panics(|| {
            q.push(Touchy(7), 100, 0);
        }));
        PANIC_ON.with(|p| p.set(None));
        assert_eq!(q.len(), 50);
        let batch = ids(q.pop_batch(usize::MAX, |_| true));
        let want: Vec<_> = (0..50).map(|id| (id, vec![id])).collect();
        assert_eq!(batch, want);
    }

    #[test]
    fn panicking_eq_loses_nothing() {
        let mut q = SortedQueue::new();
        for id in 0..50 {
            q.push(Touchy(id), id, 10);
        }
        // Eq runs when the probe meets key 3 itself.
        PANIC_ON.with(|p| p.set(Some(3)));
        assert!(panics(|| {
            q.push(Touchy(3), 100, 0);
        }));
        // Taking batches never calls Eq or Hash, even with the switch still on.
        let batch = ids(q.pop_batch(usize::MAX, |_| true));
        PANIC_ON.with(|p| p.set(None));
        assert_eq!(batch.len(), 50);
        assert!(batch.iter().all(|(id, v)| *v == vec![*id]));
    }

    #[test]
    fn panicking_clone_during_split_loses_nothing() {
        let mut q = SortedQueue::new();
        q.push(Touchy(1), 1, 0);
        q.push(Touchy(2), 2, 1);
        q.push(Touchy(2), 3, 1);
        PANIC_ON.with(|p| p.set(Some(2)));
        // Key 1 fits; key 2 must be split, which clones it: the call panics.
        assert!(panics(|| {
            q.pop_batch(2, |_| true);
        }));
        PANIC_ON.with(|p| p.set(None));
        assert_eq!(q.len(), 3);
        let batch = ids(q.pop_batch(usize::MAX, |_| true));
        assert_eq!(batch, vec![(1, vec![1]), (2, vec![2, 3])]);
    }

    #[test]
    fn panicking_ord_loses_nothing() {
        let mut q = SortedQueue::new();
        // Descending ranks go to the heap, where pushes and pops compare.
        for id in (10..60).rev() {
            q.push(id, id, TouchyRank(id));
        }
        PANIC_ON.with(|p| p.set(Some(33)));
        assert!(panics(|| {
            q.pop_batch(usize::MAX, |_| true);
        }));
        assert!(panics(|| {
            q.push(5, 5, TouchyRank(33));
        }));
        PANIC_ON.with(|p| p.set(None));
        assert_eq!(q.len(), 50);
        let batch = q.pop_batch(usize::MAX, |_| true);
        let want: Vec<_> = (10..60).map(|id| (id, vec![id])).collect();
        assert_eq!(batch, want);
    }
}
