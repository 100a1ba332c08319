//! One pending key: its values, their weights, its rank and its run.

use std::mem;

/// A pending key.
pub(super) struct Slot<R, K, V> {
    pub(super) hash: u64,
    pub(super) key: K,
    pub(super) values: Vec<V>,
    /// The values' weights; `None` while every weight is 1. A slot is hot and gets copied
    /// as the table grows, so unweighted queues pay 8 bytes for this, not 32.
    pub(super) weights: Option<Box<Weights>>,
    pub(super) rank: R,
    /// When the current pending run started: breaks ties between equal ranks.
    pub(super) seq: u64,
    /// The id of the one ticket that is live for this slot.
    pub(super) ticket: u64,
}

/// A key's weights, once one of them differs from 1.
pub(super) struct Weights {
    /// Each value's weight, in step with the values.
    each: Vec<usize>,
    /// Their sum.
    total: usize,
}

/// Values to add to a key.
pub(crate) enum Items<V> {
    /// One value and its weight, after the key's values.
    Append(V, usize),
    /// Values before the key's values, with their weights (`None`: all 1).
    Prepend(Vec<V>, Option<Vec<usize>>),
}

impl<V> Items<V> {
    /// How many values, and their weight.
    ///
    /// # Panics
    ///
    /// Panics if the weights overflow `usize`.
    pub(super) fn size(&self) -> (usize, usize) {
        match self {
            Items::Append(_, weight) => (1, *weight),
            Items::Prepend(values, None) => (values.len(), values.len()),
            Items::Prepend(_, Some(weights)) => {
                let sum = weights
                    .iter()
                    .try_fold(0usize, |sum, w| sum.checked_add(*w));
                let sum = sum.expect("the total pending weight overflows usize");
                (weights.len(), sum)
            }
        }
    }
}

impl<R, K, V> Slot<R, K, V> {
    pub(super) fn weight(&self) -> usize {
        self.weights.as_ref().map_or(self.values.len(), |w| w.total)
    }

    fn weight_at(&self, i: usize) -> usize {
        self.weights.as_ref().map_or(1, |w| w.each[i])
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
        if self.weights.is_none() {
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
            Items::Append(value, weight) => {
                if weight != 1 || self.weights.is_some() {
                    // The first weight other than 1 makes the ones before it explicit.
                    let ones = self.values.len();
                    let weights = self.weights.get_or_insert_with(|| {
                        Box::new(Weights {
                            each: vec![1; ones],
                            total: ones,
                        })
                    });
                    weights.each.push(weight);
                    weights.total += weight;
                }
                self.values.push(value);
            }
            Items::Prepend(values, weights) => {
                let count = values.len();
                let older = mem::replace(&mut self.values, values);
                self.values.extend(older);
                if weights.is_none() && self.weights.is_none() {
                    return;
                }
                let mut each = weights.unwrap_or_else(|| vec![1; count]);
                match self.weights.take() {
                    Some(older) => each.extend(older.each),
                    None => each.resize(self.values.len(), 1),
                }
                let total = each.iter().sum();
                self.weights = Some(Box::new(Weights { each, total }));
            }
        }
    }

    /// Takes the oldest `count` values, which weigh `weight`.
    pub(super) fn take_front(&mut self, count: usize, weight: usize) -> Vec<V> {
        let rest = self.values.split_off(count);
        if let Some(weights) = &mut self.weights {
            weights.each.drain(..count);
            weights.total -= weight;
        }
        mem::replace(&mut self.values, rest)
    }
}
