//! One pending key: its values, what is known of them beyond their count, its rank and its
//! run.

use std::mem;

/// A pending key.
pub(super) struct Slot<R, K, V> {
    pub(super) hash: u64,
    pub(super) key: K,
    pub(super) values: Values<V>,
    /// What is known of the values beyond their count; `None` while every weight is 1 and
    /// no value was handed out before. A slot is hot and gets copied as the table grows, so
    /// the common case pays 8 bytes for this.
    pub(super) extra: Option<Box<Extra>>,
    pub(super) rank: R,
    /// When the current pending run started: breaks ties between equal ranks.
    pub(super) seq: u64,
    /// The id of the one ticket that is live for this slot, or, with [`HELD`] set, the
    /// slot's hold: it has no live ticket and is not due (see `SortedQueue::take_held`).
    pub(super) ticket: u64,
}

/// A key's pending values.
///
/// A run of one value is the common case (a short window, or many keys), so the first value
/// is kept in place, and a `Vec` is made for a second one or when the values go out. Made
/// then, it is made by the receiver, on the thread that most often frees it: a `Vec` made on
/// a sender's thread, under the channel's lock, and freed on the receiver's costs more with
/// allocators whose free goes back to the allocating thread's arena under its lock (glibc's):
/// 5–15% of a value's time at a million keys in `benches/compare`.
pub(super) enum Values<V> {
    One(V),
    /// Any number, none included.
    Many(Vec<V>),
}

impl<V> Values<V> {
    pub(super) const fn new() -> Self {
        Values::Many(Vec::new())
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Values::One(_) => 1,
            Values::Many(values) => values.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn push(&mut self, value: V) {
        match self {
            Values::Many(values) if values.is_empty() => *self = Values::One(value),
            Values::Many(values) => values.push(value),
            Values::One(_) => {
                let Values::One(first) = mem::replace(self, Values::new()) else {
                    unreachable!("matched above")
                };
                *self = Values::Many(vec![first, value]);
            }
        }
    }

    /// All of them, in a `Vec`.
    pub(super) fn into_vec(self) -> Vec<V> {
        match self {
            Values::One(value) => vec![value],
            Values::Many(values) => values,
        }
    }

    /// Puts `front` before them.
    pub(super) fn prepend(&mut self, mut front: Vec<V>) {
        match mem::replace(self, Values::new()) {
            Values::One(value) => front.push(value),
            Values::Many(values) => front.extend(values),
        }
        *self = Values::Many(front);
    }

    /// Takes the first `count` of them.
    pub(super) fn take_front(&mut self, count: usize) -> Vec<V> {
        match self {
            Values::Many(values) => take_front(values, count),
            Values::One(_) if count == 0 => Vec::new(),
            Values::One(_) => mem::replace(self, Values::new()).into_vec(),
        }
    }
}

/// The first `count` of `items`, in a `Vec` of their own. Not `split_off`, which leaves the
/// front in the old buffer: a batch of ten values split off a key of a million held that
/// key's whole buffer, and every rest was copied into a new one.
fn take_front<T>(items: &mut Vec<T>, count: usize) -> Vec<T> {
    match count >= items.len() {
        true => mem::take(items),
        false => items.drain(..count).collect(),
    }
}

/// Marks a slot's `ticket` as a hold. Ticket ids never reach it.
pub(super) const HELD: u64 = 1 << 63;

/// What is known of a key's values beyond their count.
#[derive(Default)]
pub(super) struct Extra {
    /// Each value's weight, and their sum, once one of them differs from 1.
    weights: Option<Weights>,
    /// How many times each of the first values was handed out before. The values after
    /// them never were. Counts only fall from front to back: values come back in front.
    pub(super) handed: Vec<u32>,
    /// A time at or before which the front value entered: known once values came back.
    pub(super) entered: Option<u64>,
    /// Each value's sequence number in a durable channel's log; empty in other channels.
    pub(super) seqs: Vec<u64>,
}

struct Weights {
    each: Vec<usize>,
    total: usize,
}

/// Values to add to a key.
pub(crate) enum Items<V> {
    /// One value and its weight, after the key's values.
    Append(V, usize),
    /// One value, its weight, its sequence number in the log, and how many times it was
    /// handed out before (a durable channel's values, reopened), after the key's values.
    AppendLogged(V, usize, u64, u32),
    /// Values before the key's values: they came back.
    Prepend(Returned<V>),
}

/// A whole slot's extras, as a front, for a slot taken whole.
pub(super) fn whole<V>(values: Values<V>, extra: Option<Box<Extra>>) -> Front<V> {
    let values = values.into_vec();
    match extra.map(|e| *e) {
        None => Front {
            values,
            weights: None,
            handed: Vec::new(),
            entered: None,
            seqs: Vec::new(),
        },
        Some(Extra {
            weights,
            handed,
            entered,
            seqs,
        }) => Front {
            values,
            weights: weights.map(|w| w.each),
            handed,
            entered,
            seqs,
        },
    }
}

/// Values that come back to the front of their key.
pub(crate) struct Returned<V> {
    pub(crate) values: Vec<V>,
    /// Their weights; `None`: all 1.
    pub(crate) weights: Option<Vec<usize>>,
    /// How many times each was handed out; empty: never.
    pub(crate) handed: Vec<u32>,
    /// When the first of them entered, if known.
    pub(crate) entered: Option<u64>,
    /// Their sequence numbers in a durable channel's log; empty in other channels.
    pub(crate) seqs: Vec<u64>,
}

impl<V> Returned<V> {
    /// Values that were never handed out, with their weights. Weights that are all 1 are
    /// not kept: a slot keeps weights only once one differs from 1.
    pub(crate) fn new(values: Vec<V>, weights: Option<Vec<usize>>) -> Self {
        Returned {
            values,
            weights: weights.filter(|weights| weights.iter().any(|&weight| weight != 1)),
            handed: Vec::new(),
            entered: None,
            seqs: Vec::new(),
        }
    }
}

impl<V> Items<V> {
    /// How many values, and their weight.
    ///
    /// # Panics
    ///
    /// Panics if the weights overflow `usize`.
    pub(super) fn size(&self) -> (usize, usize) {
        match self {
            Items::Append(_, weight) | Items::AppendLogged(_, weight, ..) => (1, *weight),
            Items::Prepend(back) => match &back.weights {
                None => (back.values.len(), back.values.len()),
                Some(weights) => {
                    let sum = weights
                        .iter()
                        .try_fold(0usize, |sum, w| sum.checked_add(*w));
                    let sum = sum.expect("the total pending weight overflows usize");
                    (weights.len(), sum)
                }
            },
        }
    }
}

/// One key's values taken from the front.
pub(crate) struct Front<V> {
    pub(crate) values: Vec<V>,
    /// Their weights; `None`: all 1.
    pub(crate) weights: Option<Vec<usize>>,
    /// How many times each of the first of them was handed out before (see
    /// [`Extra::handed`]).
    pub(crate) handed: Vec<u32>,
    /// A time at or before which the first of them entered, if known.
    pub(crate) entered: Option<u64>,
    /// Their sequence numbers in a durable channel's log; empty in other channels.
    pub(crate) seqs: Vec<u64>,
}

impl<R, K, V> Slot<R, K, V> {
    pub(super) fn weight(&self) -> usize {
        match self.extra.as_deref() {
            Some(Extra {
                weights: Some(w), ..
            }) => w.total,
            _ => self.values.len(),
        }
    }

    fn weight_at(&self, i: usize) -> usize {
        match self.extra.as_deref() {
            Some(Extra {
                weights: Some(w), ..
            }) => w.each[i],
            _ => 1,
        }
    }

    fn is_weighted(&self) -> bool {
        self.extra.as_ref().is_some_and(|e| e.weights.is_some())
    }

    pub(super) fn is_held(&self) -> bool {
        self.ticket & HELD != 0
    }

    /// How many of the oldest values fit in `room` values and `room_weight`, and their
    /// weight. A first value heavier than `room_weight` fits alone in an empty batch.
    pub(super) fn fitting(
        &self,
        room: usize,
        room_weight: usize,
        empty_batch: bool,
    ) -> (usize, usize) {
        let (len, total) = (self.values.len(), self.weight());
        if len <= room && total <= room_weight {
            return (len, total);
        }
        if !self.is_weighted() {
            // Every value weighs 1.
            let count = room.min(room_weight).min(len);
            return match (count, empty_batch) {
                (0, true) => (1, 1),
                _ => (count, count),
            };
        }
        let (mut count, mut weight) = (0, 0);
        while count < room.min(len) {
            let next = self.weight_at(count);
            if weight + next > room_weight {
                break;
            }
            weight += next;
            count += 1;
        }
        if count == 0 && empty_batch {
            return (1, self.weight_at(0));
        }
        (count, weight)
    }

    pub(super) fn add(&mut self, items: Items<V>) {
        match items {
            Items::AppendLogged(value, weight, seq, handed) => {
                let extra = self.extra.get_or_insert_with(Box::default);
                extra.seqs.push(seq);
                if handed > 0 {
                    // Counts stay a prefix: the values before it that never went out count 0.
                    extra.handed.resize(self.values.len(), 0);
                    extra.handed.push(handed);
                }
                self.add(Items::Append(value, weight));
            }
            Items::Append(value, weight) => {
                if weight != 1 || self.is_weighted() {
                    // The first weight other than 1 makes the ones before it explicit.
                    let ones = self.values.len();
                    let extra = self.extra.get_or_insert_with(Box::default);
                    let weights = extra.weights.get_or_insert_with(|| Weights {
                        each: vec![1; ones],
                        total: ones,
                    });
                    weights.each.push(weight);
                    weights.total += weight;
                }
                self.values.push(value);
            }
            Items::Prepend(back) => self.prepend(back),
        }
    }

    fn prepend(&mut self, back: Returned<V>) {
        let Returned {
            values,
            weights,
            mut handed,
            entered,
            mut seqs,
        } = back;
        let count = values.len();
        self.values.prepend(values);
        let known =
            weights.is_some() || !handed.is_empty() || entered.is_some() || !seqs.is_empty();
        if !known && self.extra.is_none() {
            return;
        }
        let extra = self.extra.get_or_insert_with(Box::default);
        if weights.is_some() || extra.weights.is_some() {
            let mut each = weights.unwrap_or_else(|| vec![1; count]);
            match extra.weights.take() {
                Some(older) => each.extend(older.each),
                None => each.resize(self.values.len(), 1),
            }
            let total = each.iter().sum();
            extra.weights = Some(Weights { each, total });
        }
        if !extra.handed.is_empty() {
            // The older values' counts stay a prefix of the whole.
            handed.resize(count, 0);
            handed.append(&mut extra.handed);
        }
        extra.handed = handed;
        // In a durable channel every value has one, and the older values come first.
        seqs.append(&mut extra.seqs);
        extra.seqs = seqs;
        // The new front is the first value that came back: what is known of it is what
        // came with it (the time kept here is of younger values, and no bound on it).
        extra.entered = match (entered, extra.entered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, _) => a,
        };
    }

    /// Takes the oldest `count` values, which weigh `weight`.
    pub(super) fn take_front(&mut self, count: usize, weight: usize) -> Front<V> {
        let values = self.values.take_front(count);
        let Some(extra) = self.extra.as_deref_mut() else {
            return Front {
                values,
                weights: None,
                handed: Vec::new(),
                entered: None,
                seqs: Vec::new(),
            };
        };
        let weights = extra.weights.as_mut().map(|weights| {
            weights.total -= weight;
            take_front(&mut weights.each, count)
        });
        let handed = take_front(&mut extra.handed, count);
        let seqs = take_front(&mut extra.seqs, count);
        // What is left entered after the front that goes, so the old front's time is
        // still a time at or before it; it goes once nothing is left.
        let entered = extra.entered;
        if self.values.is_empty() {
            extra.entered = None;
        }
        Front {
            values,
            weights,
            handed,
            entered,
            seqs,
        }
    }
}
