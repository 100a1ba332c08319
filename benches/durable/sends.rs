//! Figure 1: sends/s of a durable channel under each policy, at 1, 4 and 64 senders, against
//! the [`bare`](crate::bare) log in the same round.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use keyed_batch::ack::ack_all;
use keyed_batch::durable::FsyncPolicy;
use keyed_batch::timed;

use crate::common::mix;
use crate::plan::{Plan, KEYS};
use crate::report::{median, range, Target};
use crate::{bare, runtime};

const SENDERS: [usize; 3] = [1, 4, 64];
const INTERVAL: Duration = Duration::from_millis(5);
const POLICIES: [FsyncPolicy; 3] = [
    FsyncPolicy::Always,
    FsyncPolicy::Interval(INTERVAL),
    FsyncPolicy::Never,
];
const VALUE_BYTES: usize = 64;

/// The key sender `sender` gives its `i`th value.
pub(crate) fn key(sender: usize, i: u64) -> u64 {
    mix(((sender as u64) << 40) | i) % KEYS
}

/// The `i`th value of a sender.
pub(crate) fn value(i: u64) -> Vec<u8> {
    vec![i as u8; VALUE_BYTES]
}

pub(crate) fn policy_name(policy: FsyncPolicy) -> String {
    match policy {
        FsyncPolicy::Always => "Always".into(),
        FsyncPolicy::Interval(d) => format!("Interval({} ms)", d.as_millis()),
        FsyncPolicy::Never => "Never".into(),
    }
}

/// One timed run of one side.
#[derive(Clone, Copy)]
pub(crate) struct Run {
    pub(crate) sends: u64,
    pub(crate) secs: f64,
    /// Bytes written per send (durable: the log's size over sends, done records
    /// included; bare: the record).
    pub(crate) bytes_per_send: f64,
    /// Syncs (bare only).
    pub(crate) syncs: u64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.sends as f64 / self.secs
    }
}

/// Every round of one concurrency and policy.
pub(crate) struct Row {
    senders: usize,
    policy: FsyncPolicy,
    durable: Vec<Run>,
    bare: Vec<Run>,
}

impl Row {
    fn rate(runs: &[Run]) -> f64 {
        median(&runs.iter().map(Run::rate).collect::<Vec<_>>())
    }

    /// Bare sends/s over durable sends/s, in each round.
    fn cost_ratios(&self) -> Vec<f64> {
        self.durable
            .iter()
            .zip(&self.bare)
            .map(|(d, b)| b.rate() / d.rate())
            .collect()
    }

    /// The median over rounds of the cost ratio.
    fn cost_ratio(&self) -> f64 {
        median(&self.cost_ratios())
    }
}

/// Runs every round: each concurrency and policy, durable and bare in an order that
/// swaps from round to round.
pub(crate) fn run(plan: &Plan, work: &Path) -> Vec<Row> {
    let mut rows: Vec<Row> = SENDERS
        .iter()
        .flat_map(|&senders| {
            POLICIES.iter().map(move |&policy| Row {
                senders,
                policy,
                durable: Vec::new(),
                bare: Vec::new(),
            })
        })
        .filter(|row| plan.runs(row.senders, row.policy))
        .collect();
    for round in 0..plan.rounds {
        for row in &mut rows {
            for side in 0..2 {
                let durable_side = (side + round) % 2 == 0;
                let dir = work.join(format!("sends-{round}-{side}"));
                let run = match durable_side {
                    true => durable(&dir, row.senders, row.policy, plan.run_for),
                    false => bare::run(&dir, row.senders, row.policy, plan.run_for),
                };
                std::fs::remove_dir_all(&dir).expect("the run's log removed");
                eprintln!(
                    "  round {}/{} senders {:>2} {:<15} {:<7} {:>9.0} sends/s {:>7} sends {:>6} syncs",
                    round + 1,
                    plan.rounds,
                    row.senders,
                    policy_name(row.policy),
                    if durable_side { "durable" } else { "bare" },
                    run.rate(),
                    run.sends,
                    if durable_side { "?".to_string() } else { run.syncs.to_string() },
                );
                match durable_side {
                    true => row.durable.push(run),
                    false => row.bare.push(run),
                }
            }
        }
    }
    rows
}

/// `senders` tasks send for `run_for` into a durable channel that one consumer acks.
fn durable(dir: &Path, senders: usize, policy: FsyncPolicy, run_for: Duration) -> Run {
    runtime().block_on(async {
        let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
            .durable(dir)
            .fsync(policy)
            .open::<u64, Vec<u8>>()
            .await
            .expect("the log opens");
        let consumer = tokio::spawn(async move {
            let mut acked = 0u64;
            while let Some(batch) = rx.recv().await {
                acked += batch.iter().map(|d| d.values().len() as u64).sum::<u64>();
                ack_all(batch).await.expect("acked");
            }
            acked
        });
        let start = Instant::now();
        let until = start + run_for;
        let tasks: Vec<_> = (0..senders)
            .map(|s| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut i = 0;
                    while Instant::now() < until {
                        tx.send(key(s, i), value(i)).await.expect("sent");
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        let mut sent = 0;
        for task in tasks {
            sent += task.await.expect("a sender");
        }
        let secs = start.elapsed().as_secs_f64();
        let log_bytes = tx.stats().log_bytes;
        drop(tx);
        let acked = consumer.await.expect("the consumer");
        assert_eq!(acked, sent, "every value sent was delivered and acked");
        Run {
            sends: sent,
            secs,
            bytes_per_send: log_bytes as f64 / sent.max(1) as f64,
            syncs: 0,
        }
    })
}

pub(crate) fn table(plan: &Plan, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### 1. Sends/s: durable channel against a bare log ({} rounds of {} s, medians)\n",
        plan.rounds,
        plan.run_for.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "- Durable: `timed` window 0, {KEYS} keys, {VALUE_BYTES}-byte values (`Vec<u8>`); \
         each sender task loops on `send(..).await`; one consumer task acks each batch \
         with `ack_all`.\n\
         - Bare: the durable log's send records, the same size and framing (length, \
         CRC-32C, type, sequence, time, input, postcard key and value), under the same \
         policy, by hand, with no channel, no consumer and no done records. 1 \
         writer: a plain thread that writes each record and syncs it itself (`fdatasync`). \
         N writers: tasks that append to a shared buffer and wait; one committer thread \
         writes all that is pending in one `write`, syncs (group commit), and wakes them. \
         `Interval({} ms)` syncs once that long has passed since the last sync; `Never` \
         only writes.\n\
         - cost ×bare: bare sends/s over durable sends/s in a round, median over rounds \
         (1.00: as fast as the bare log; 1.50: the durable send costs 1.5 times as much), \
         and its range over rounds. ×bare Always: the bare log that syncs each commit, \
         against this row (medians).\n",
        INTERVAL.as_millis()
    );
    let _ = writeln!(
        out,
        "| senders | policy | durable sends/s | bare sends/s | cost ×bare | min–max | ×bare Always | bare sends/sync | bytes/send durable, bare |"
    );
    let _ = writeln!(out, "|--:|---|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let vs_always = rows
            .iter()
            .find(|r| r.senders == row.senders && r.policy == FsyncPolicy::Always)
            .map_or("–".to_string(), |always| {
                format!("{:.2}", Row::rate(&always.bare) / Row::rate(&row.durable))
            });
        let syncs: u64 = row.bare.iter().map(|r| r.syncs).sum();
        let bare_sent: u64 = row.bare.iter().map(|r| r.sends).sum();
        let per_sync = match syncs {
            0 => "–".to_string(),
            n => format!("{:.1}", bare_sent as f64 / n as f64),
        };
        let bytes =
            |runs: &[Run]| median(&runs.iter().map(|r| r.bytes_per_send).collect::<Vec<_>>());
        let (lo, hi) = range(&row.cost_ratios());
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2} | {} | {} | {:.0}, {:.0} |",
            row.senders,
            policy_name(row.policy),
            Row::rate(&row.durable),
            Row::rate(&row.bare),
            row.cost_ratio(),
            vs_always,
            per_sync,
            bytes(&row.durable),
            bytes(&row.bare),
        );
    }
    out
}

pub(crate) fn targets(rows: &[Row]) -> Vec<Target> {
    rows.iter()
        .map(|row| Target {
            what: format!(
                "sends cost ×bare, {} senders, {}",
                row.senders,
                policy_name(row.policy)
            ),
            limit: "≤ 1.5".into(),
            measured: format!("{:.2}", row.cost_ratio()),
            met: row.cost_ratio() <= 1.5,
        })
        .collect()
}
