//! What a durable channel adds to a channel: recovered values put back at open, decisions
//! recorded in the log, and the log's figures and error.

use std::hash::{BuildHasher, Hash};
use std::io;
use std::sync::Arc;

use super::{Chan, Rx};
use crate::ack::Decided;
use crate::durable::recover::Pending;
use crate::durable::Clocks;
use crate::error::DeliveryError;
use crate::flavor::{self, Clock, Flavor};
use crate::queue::Items;
use crate::stats::Stats;

impl<F: Flavor, K, V> Chan<F, K, V> {
    /// Records that the values `seqs` are done, in a durable channel: the record's number,
    /// or the error that poisoned the log. `None` in other channels.
    pub(super) fn log_done(&self, seqs: &[u64]) -> Option<Result<u64, Arc<io::Error>>> {
        let log = self.log.as_ref()?;
        (!seqs.is_empty()).then(|| log.journal.done(seqs))
    }

    /// Records how many times values were handed out, once they came back: as `log_done`.
    pub(super) fn log_retried(&self, handed: &[(u64, u32)]) -> Option<Result<u64, Arc<io::Error>>> {
        let log = self.log.as_ref()?;
        (!handed.is_empty()).then(|| log.journal.retried(handed))
    }

    /// What a decision resolves to once `record`, if any, is written.
    pub(super) fn decided(&self, record: Option<Result<u64, Arc<io::Error>>>) -> Decided<()> {
        let (Some(log), Some(record)) = (&self.log, record) else {
            return Decided::done(Ok(()));
        };
        match record {
            Err(err) => Decided::done(Err(DeliveryError::Io(err))),
            Ok(_) if log.journal.acks_early() => Decided::done(Ok(())),
            Ok(record) => {
                let journal = Arc::clone(&log.journal);
                Decided::waiting(
                    async move { journal.written(record).await.map_err(DeliveryError::Io) },
                )
            }
        }
    }

    /// The log's figures, in a durable channel.
    pub(super) fn add_log_stats(&self, stats: &mut Stats) {
        if let Some(log) = &self.log {
            let figures = log.journal.stats();
            stats.log_segments = figures.segments;
            stats.log_bytes = figures.bytes;
            stats.log_truncated_bytes = log.truncated;
        }
    }

    /// Has a failed log close the channel as soon as it fails, so that sends waiting for room
    /// fail too, not only those that touch the log.
    pub(super) fn close_on_log_failure(self: &Arc<Self>)
    where
        F: 'static,
        F::Rank: Send,
        F::Input: Send,
        K: Send + 'static,
        V: Send + 'static,
    {
        let Some(log) = &self.log else { return };
        // Weak: the journal is the channel's, and must not keep it alive.
        let chan = Arc::downgrade(self);
        log.journal.on_failure(Box::new(move || {
            if let Some(chan) = chan.upgrade() {
                chan.close(&mut chan.lock());
            }
        }));
    }

    /// The error that poisoned the log, in a durable channel whose log failed.
    pub(super) fn log_error(&self) -> Option<Arc<io::Error>> {
        self.log.as_ref()?.journal.poisoned()
    }
}

impl<F: Flavor, K: Hash + Eq + Clone, V> Rx<F, K, V>
where
    F::Rank: Ord + Clone,
{
    /// Puts the values a durable channel's log held back in the queue, in the order they
    /// were sent, each with its deadline or sort key and the attempts it had.
    pub(crate) fn restore(&self, values: Vec<Pending<F::Input, K, V>>, clocks: &Clocks) {
        let chan = &*self.chan;
        // User code (the weigher, `Hash`) runs before the lock is taken.
        let values: Vec<_> = values
            .into_iter()
            .map(|p| {
                let weight = chan.weigh.as_ref().map_or(1, |weigh| weigh(&p.value));
                (chan.hasher.hash_one(&p.key), weight, p)
            })
            .collect();
        let mut guard = chan.lock();
        let state = &mut *guard;
        state.counts.recovered += values.len() as u64;
        // Keys and ranks the queue did not keep, dropped after the lock.
        let mut spare = Vec::new();
        for (hash, weight, p) in values {
            let Pending {
                seq,
                arrival,
                input,
                key,
                value,
                handed,
            } = p;
            let mut clock = Clock::new(chan.epoch, &mut state.last_now);
            let items = Items::AppendLogged(value, weight, seq, handed);
            let inserted =
                chan.insert_ranked(&mut state.queue, &mut clock, (hash, key, input), items);
            let entered = flavor::since(chan.epoch, clocks.instant_of(arrival));
            state
                .arrivals
                .extend(inserted.new_run.map(|run| (run, entered)));
            spare.push((inserted.spare_key, inserted.spare_rank));
        }
        drop(guard);
        drop(spare);
    }
}
