//! The index of ranks: where keys stand in rank order, as tickets in a FIFO while they
//! arrive sorted and in a binary heap otherwise.
//!
//! Invariant: the FIFO is sorted, and the front of each part is a live ticket (its slot is
//! pending and still holds that ticket). Stale tickets further back are skipped lazily.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::mem;

use super::mostly_unused;
use super::slot::Slot;

/// An index entry. A ticket is *stale* once its slot is gone or has a newer ticket.
pub(super) struct Ticket<R> {
    pub(super) rank: R,
    /// The run's arrival: breaks ties between equal ranks.
    pub(super) seq: u64,
    pub(super) id: u64,
    pub(super) hash: u64,
}

/// Which part of the index holds the front ticket.
#[derive(Clone, Copy)]
pub(super) enum Side {
    Fifo,
    Heap,
}

pub(super) struct Index<R> {
    /// Tickets pushed in non-decreasing order: the common path, O(1).
    fifo: VecDeque<Ticket<R>>,
    /// Tickets that arrived out of order: O(log n).
    heap: BinaryHeap<Reverse<Ticket<R>>>,
    /// Set while user `Ord` runs on the index (see [`guard`](Self::guard)).
    torn: bool,
    /// Ranks to drop later, if the owner asked for that.
    trash: Trash<R>,
}

/// Ranks dropped by the index, kept for the owner to drop at a time of its choosing: a
/// channel drops them once its lock is released, since a rank's `Drop` is user code.
struct Trash<R> {
    deferred: bool,
    ranks: Vec<R>,
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

impl<R> Index<R> {
    pub(super) fn new() -> Self {
        Index {
            fifo: VecDeque::new(),
            heap: BinaryHeap::new(),
            torn: false,
            trash: Trash {
                deferred: false,
                ranks: Vec::new(),
            },
        }
    }

    pub(super) fn len(&self) -> usize {
        self.fifo.len() + self.heap.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.fifo.capacity() + self.heap.capacity()
    }

    /// Runs `f`, which may call user `Ord`, with the index marked torn: should `Ord`
    /// panic part way, the mark stays, and [`is_torn`](Self::is_torn) tells the next call
    /// to rebuild the index before trusting it.
    pub(super) fn guard<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        self.torn = true;
        let out = f(self);
        self.torn = false;
        out
    }

    /// Whether a panic in user `Ord` may have broken the invariant.
    pub(super) fn is_torn(&self) -> bool {
        self.torn
    }

    /// Drops later, through [`take_trash`](Self::take_trash), what would be dropped now.
    pub(super) fn defer_drops(&mut self) {
        self.trash.deferred = true;
    }

    /// The ranks kept by [`defer_drops`](Self::defer_drops).
    pub(super) fn take_trash(&mut self) -> Vec<R> {
        mem::take(&mut self.trash.ranks)
    }

    /// Drops a rank now, or later if drops are deferred and dropping it runs code.
    pub(super) fn discard(&mut self, rank: R) {
        if mem::needs_drop::<R>() && self.trash.deferred {
            self.trash.ranks.push(rank);
        }
    }

    fn discard_tickets(&mut self, tickets: impl IntoIterator<Item = Ticket<R>>) {
        if mem::needs_drop::<R>() && self.trash.deferred {
            let ranks = tickets.into_iter().map(|t| t.rank);
            self.trash.ranks.extend(ranks);
        }
    }

    /// Which part holds the smallest ticket.
    pub(super) fn front_side(&self) -> Option<Side>
    where
        R: Ord,
    {
        match (self.fifo.front(), self.heap.peek()) {
            (None, None) => None,
            (Some(_), None) => Some(Side::Fifo),
            (None, Some(_)) => Some(Side::Heap),
            (Some(f), Some(Reverse(h))) => Some(if f <= h { Side::Fifo } else { Side::Heap }),
        }
    }

    /// The front of each part, without comparing them: no user `Ord` runs.
    pub(super) fn fronts(&self) -> impl Iterator<Item = &Ticket<R>> {
        let heap = self.heap.peek().map(|Reverse(t)| t);
        self.fifo.front().into_iter().chain(heap)
    }

    /// The smallest ticket.
    pub(super) fn front(&self) -> Option<&Ticket<R>>
    where
        R: Ord,
    {
        self.front_side().map(|side| self.ticket(side))
    }

    pub(super) fn ticket(&self, side: Side) -> &Ticket<R> {
        match side {
            Side::Fifo => self.fifo.front(),
            Side::Heap => self.heap.peek().map(|Reverse(t)| t),
        }
        .expect("side is not empty")
    }

    pub(super) fn pop(&mut self, side: Side)
    where
        R: Ord,
    {
        let ticket = match side {
            Side::Fifo => self.fifo.pop_front(),
            Side::Heap => self.heap.pop().map(|Reverse(t)| t),
        };
        self.discard_tickets(ticket);
    }

    /// Pushes a ticket: onto the FIFO if that keeps it sorted, else into the heap. Calls
    /// user `Ord`; run it under [`guard`](Self::guard).
    pub(super) fn push(&mut self, ticket: Ticket<R>)
    where
        R: Ord,
    {
        if self.fifo.back().is_none_or(|last| *last <= ticket) {
            self.fifo.push_back(ticket);
        } else {
            self.heap.push(Reverse(ticket));
        }
    }

    /// Gives `slot` the smaller `rank`, under a new ticket `id`; its old ticket goes stale.
    /// Hands `rank` back if it is not smaller. Calls user `Ord` and `Clone`, guarded.
    pub(super) fn lower<K, V>(
        &mut self,
        slot: &mut Slot<R, K, V>,
        rank: R,
        id: u64,
    ) -> Result<(), R>
    where
        R: Ord + Clone,
    {
        let rank = self.guard(|index| {
            if rank >= slot.rank {
                return Err(rank);
            }
            index.push(Ticket {
                rank: rank.clone(),
                seq: slot.seq,
                id,
                hash: slot.hash,
            });
            Ok(rank)
        })?;
        let old = mem::replace(&mut slot.rank, rank);
        slot.ticket = id;
        self.discard(old);
        Ok(())
    }

    /// Drops stale tickets from both fronts, restoring the invariant.
    pub(super) fn prune(&mut self, live: impl Fn(&Ticket<R>) -> bool)
    where
        R: Ord,
    {
        while self.fifo.front().is_some_and(|t| !live(t)) {
            self.pop(Side::Fifo);
        }
        while self.heap.peek().is_some_and(|Reverse(t)| !live(t)) {
            self.pop(Side::Heap);
        }
    }

    /// Replaces every ticket with `tickets`, which hold one live ticket per key.
    pub(super) fn rebuild(&mut self, mut tickets: Vec<Ticket<R>>)
    where
        R: Ord,
    {
        tickets.sort_unstable();
        let fifo = mem::replace(&mut self.fifo, tickets.into());
        let heap = mem::take(&mut self.heap);
        self.discard_tickets(fifo);
        self.discard_tickets(heap.into_iter().map(|Reverse(t)| t));
    }

    /// Takes every ticket out, keeping those `live` says are; the others are discarded.
    pub(super) fn take_live(&mut self, live: impl Fn(&Ticket<R>) -> bool) -> Vec<Ticket<R>> {
        let fifo = mem::take(&mut self.fifo);
        let heap = mem::take(&mut self.heap).into_iter().map(|Reverse(t)| t);
        let (live, stale): (Vec<_>, Vec<_>) = fifo.into_iter().chain(heap).partition(live);
        self.discard_tickets(stale);
        live
    }

    /// Drops every ticket.
    pub(super) fn clear(&mut self) {
        let fifo = mem::take(&mut self.fifo);
        let heap = mem::take(&mut self.heap);
        self.discard_tickets(fifo);
        self.discard_tickets(heap.into_iter().map(|Reverse(t)| t));
    }

    /// Gives memory back once a part is mostly empty (see [`mostly_unused`]).
    pub(super) fn shrink(&mut self, above: usize)
    where
        R: Ord,
    {
        let fifo = &mut self.fifo;
        if mostly_unused(fifo.len(), fifo.capacity(), above) {
            fifo.shrink_to(fifo.len() * 2);
        }
        let heap = &mut self.heap;
        if mostly_unused(heap.len(), heap.capacity(), above) {
            heap.shrink_to(heap.len() * 2);
        }
    }
}
