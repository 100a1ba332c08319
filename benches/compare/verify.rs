//! Checking what arrives: every value exactly once, under its key, and when it came.

use std::time::Instant;

use crate::measure::proc_status_kb;
use crate::workload::{Keys, Value, INDEX_BITS, INDEX_MASK};

/// What a consumer hands every delivered key (and its `V`s) to.
pub(crate) trait Sink<V>: Send + 'static {
    fn deliver(&mut self, key: u64, values: &[V]);
    fn done(&self) -> bool;
}

/// Checks that every value arrives exactly once, under the right key.
pub(crate) struct Verifier {
    keys: Keys,
    total: u64,
    seen: Vec<u64>,
    count: u64,
    /// Keys delivered: one per key in a batch, one per message for `mpsc`.
    pub(crate) deliveries: u64,
    /// `VmRSS` when the last value arrived, while the channel still exists.
    pub(crate) rss_end_kb: u64,
}

impl Verifier {
    pub(crate) fn new(keys: Keys, total: u64) -> Self {
        Verifier {
            keys,
            total,
            seen: vec![0; total.div_ceil(64) as usize],
            count: 0,
            deliveries: 0,
            rss_end_kb: 0,
        }
    }

    fn check(&mut self, key: u64, index: u64) {
        assert!(index < self.total, "value {index} was never sent");
        assert_eq!(
            key,
            self.keys.of(index),
            "value {index} arrived under the wrong key"
        );
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        assert!(self.seen[word] & bit == 0, "value {index} arrived twice");
        self.seen[word] |= bit;
        self.count += 1;
        if self.count == self.total {
            self.rss_end_kb = proc_status_kb("VmRSS");
        }
    }

    /// Whether every value has arrived.
    pub(crate) fn done(&self) -> bool {
        self.count == self.total
    }

    pub(crate) fn finish(&self) {
        assert_eq!(self.count, self.total, "values were lost");
    }
}

impl<V: Value> Sink<V> for Verifier {
    fn deliver(&mut self, key: u64, values: &[V]) {
        self.deliveries += 1;
        for value in values {
            self.check(key, value.index());
        }
    }

    fn done(&self) -> bool {
        Verifier::done(self)
    }
}

/// Checks every value like [`Verifier`], and records each delivery's lateness.
pub(crate) struct LatenessSink {
    pub(crate) verifier: Verifier,
    pub(crate) base: Instant,
    pub(crate) window_ns: i64,
    pub(crate) lateness_ns: Vec<i64>,
}

impl Sink<u64> for LatenessSink {
    fn deliver(&mut self, key: u64, values: &[u64]) {
        let now = self.base.elapsed().as_nanos() as i64;
        let mut first_sent = i64::MAX;
        for &value in values {
            self.verifier.check(key, value & INDEX_MASK);
            first_sent = first_sent.min((value >> INDEX_BITS) as i64);
        }
        self.lateness_ns.push(now - (first_sent + self.window_ns));
    }

    fn done(&self) -> bool {
        self.verifier.done()
    }
}
