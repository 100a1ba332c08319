//! The origin's design, ported: a sorted list of publish times and a dictionary of values
//! under one lock, pulled by the consumer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `SortedList<DateTime, List<TKey>> _queue` and `Dictionary<TKey, List<TValue>> _data`.
type OriginState<V> = (BTreeMap<Instant, Vec<u64>>, HashMap<u64, Vec<V>>);

/// The origin's `TimeSortedQueue<TKey, TValue>`, ported line by line: a sorted list of
/// publish times, each with the keys published then, and a dictionary of pending values,
/// both under one lock.
pub(crate) struct OriginQueue<V> {
    state: Mutex<OriginState<V>>,
    window: Duration,
}

impl<V> OriginQueue<V> {
    pub(crate) fn new(window: Duration) -> Self {
        OriginQueue {
            state: Mutex::new((BTreeMap::new(), HashMap::new())),
            window,
        }
    }

    /// `Publish`: one queue entry per publish time, then the value into the dictionary.
    pub(crate) fn publish(&self, key: u64, value: V) {
        let now = Instant::now();
        let mut state = self.state.lock().expect("not poisoned");
        let (queue, data) = &mut *state;
        match queue.get_mut(&now) {
            Some(keys) => {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            None => {
                queue.insert(now, vec![key]);
            }
        }
        match data.get_mut(&key) {
            Some(values) => values.push(value),
            None => {
                data.insert(key, vec![value]);
            }
        }
    }

    /// `Pull`: takes whole queue entries while the first is at least a window old, each
    /// key with every value it holds, until `max` values are taken.
    pub(crate) fn pull(&self, max: usize) -> Vec<(u64, Vec<V>)> {
        let mut result = Vec::new();
        let now = Instant::now();
        let mut state = self.state.lock().expect("not poisoned");
        let (queue, data) = &mut *state;
        let mut count = 0;
        while let Some(first) = queue.first_entry() {
            // `now.Subtract(first.Key).TotalMilliseconds < window`, negative included.
            if now < *first.key() + self.window {
                break;
            }
            for key in first.remove() {
                if let Some(values) = data.remove(&key) {
                    count += values.len();
                    result.push((key, values));
                }
            }
            if count >= max {
                break;
            }
        }
        result
    }

    pub(crate) fn is_drained(&self) -> bool {
        self.state.lock().expect("not poisoned").1.is_empty()
    }
}
