//! Figure 2: values pulled and acked a second by 1 and 2 consumers from a queue filled
//! beforehand, against `LPOP list COUNT` on as many connections from one LIST holding the
//! same values, in the same round; and by 1 consumer with one value a key, where each
//! key's own cost shows.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyed_batch::ack::ack_all;
use tokio::sync::Notify;

use crate::plan::Plan;
use crate::probe::{Server, Snap};
use crate::publish::{value, IN_FLIGHT};
use crate::report::{k, median, range, Line, Pair, Run};
use crate::runtime;

/// Values a batch: the `Builder`'s default `max_batch`, and the `LPOP` count.
const BATCH: usize = 1000;
/// Senders that fill the queue, each with [`IN_FLIGHT`] tasks.
const FILLERS: usize = 4;
/// The target, values/s.
const TARGET: f64 = 150_000.0;

/// Every round of one number of consumers, values and keys.
pub(crate) struct Row {
    /// `Receiver`s on one side, connections on the other.
    consumers: usize,
    values: u64,
    keys: u64,
    /// Whether the target applies: the rows with many values a key, as the issue sized it.
    targeted: bool,
    pair: Pair,
    /// Values/s of each fill of the keyed queue (window 0, no receiver): a second look at
    /// publishing, with [`FILLERS`] senders.
    fills: Vec<f64>,
}

pub(crate) fn run(plan: &Plan, server: &Server) -> Vec<Row> {
    let row = |consumers, values, keys, targeted| Row {
        consumers,
        values,
        keys,
        targeted,
        pair: Pair::new(),
        fills: Vec::new(),
    };
    let mut rows = vec![
        row(1, plan.pull_values, plan.pull_keys, true),
        row(2, plan.pull_values, plan.pull_keys, true),
        row(1, plan.pull_single, plan.pull_single, false),
    ];
    for round in 0..plan.rounds {
        for row in &mut rows {
            let (consumers, values, keys) = (row.consumers, row.values, row.keys);
            let fills = &mut row.fills;
            row.pair.round(round, |keyed_side| {
                let run = match keyed_side {
                    true => {
                        let (run, fill) = keyed(server, consumers, values, keys);
                        fills.push(fill);
                        run
                    }
                    false => plain(server, consumers, values),
                };
                eprintln!(
                    "  pull round {}/{} consumers {} values/key {} {:<5} {:>9.0} values/s",
                    round + 1,
                    plan.rounds,
                    consumers,
                    values / keys,
                    if keyed_side { "keyed" } else { "plain" },
                    run.rate(),
                );
                run
            });
        }
    }
    rows
}

/// Fills a queue (window 0) with `values` over `keys` keys, then `consumers` receivers,
/// each opened with its own `receiver()`, `recv` and `ack_all` until every value is
/// acked. Returns the run and the fill's values/s.
fn keyed(server: &Server, consumers: usize, values: u64, keys: u64) -> (Run, f64) {
    runtime().block_on(async {
        let name = server.name("pull");
        let queue =
            keyed_batch::redis::Builder::new(server.url.as_str(), name.as_str(), Duration::ZERO);
        let fill_start = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut fillers = Vec::new();
        for _ in 0..FILLERS {
            let tx = queue
                .sender::<u64, Vec<u8>>()
                .await
                .expect("a sender opens");
            for _ in 0..IN_FLIGHT {
                let (tx, next) = (tx.clone(), Arc::clone(&next));
                fillers.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= values {
                            return;
                        }
                        tx.send(i % keys, value(i)).await.expect("sent");
                    }
                }));
            }
        }
        for filler in fillers {
            filler.await.expect("a fill task");
        }
        let fill = values as f64 / fill_start.elapsed().as_secs_f64();

        let mut receivers = Vec::new();
        for _ in 0..consumers {
            receivers.push(
                queue
                    .receiver::<u64, Vec<u8>>()
                    .await
                    .expect("a receiver opens"),
            );
        }
        let check = receivers[0].clone();
        assert_eq!(check.len().await.expect("len"), values, "the queue is full");
        let mut admin = server.conn().await;
        let before = Snap::take(&mut admin).await;
        let acked = Arc::new(AtomicU64::new(0));
        let done = Arc::new(Notify::new());
        let start = Instant::now();
        let mut tasks: Vec<_> = receivers
            .into_iter()
            .map(|mut rx| {
                let (acked, done) = (Arc::clone(&acked), Arc::clone(&done));
                tokio::spawn(async move {
                    loop {
                        let batch = rx.recv().await.expect("pulled").expect("not closed");
                        let n: u64 = batch.iter().map(|d| d.values().len() as u64).sum();
                        ack_all(batch).await.expect("acked");
                        if acked.fetch_add(n, Ordering::Relaxed) + n >= values {
                            done.notify_one();
                        }
                    }
                })
            })
            .collect();
        {
            // A consumer ends only by panicking: then the run ends too.
            let ended = futures::future::select_all(tasks.iter_mut());
            tokio::select! {
                () = done.notified() => {}
                (ended, _, _) = ended => panic!("a consumer ended: {ended:?}"),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        // The others wait for values that will not come.
        for task in &tasks {
            task.abort();
        }
        let usage = Snap::take(&mut admin).await.since(&before);
        // A value delivered twice would have ended the run early, with values left.
        assert_eq!(acked.load(Ordering::Relaxed), values, "each value once");
        assert_eq!(check.len().await.expect("len"), 0, "every value acked");
        drop(check);
        Server::clean(&mut admin, &name).await;
        let run = Run {
            values,
            secs,
            usage,
        };
        (run, fill)
    })
}

/// Fills one LIST with the same encoded values, then `consumers` connections `LPOP` it in
/// batches of [`BATCH`], decoding each value, until it is empty.
fn plain(server: &Server, consumers: usize, values: u64) -> Run {
    runtime().block_on(async {
        let name = server.name("pull-plain");
        let list = format!("{{{name}}}:list");
        let mut admin = server.conn().await;
        let mut i = 0;
        while i < values {
            let chunk: Vec<Vec<u8>> = (i..values.min(i + BATCH as u64))
                .map(|i| postcard::to_stdvec(&value(i)).expect("encoded"))
                .collect();
            i += chunk.len() as u64;
            let _: i64 = redis::cmd("RPUSH")
                .arg(&list)
                .arg(chunk)
                .query_async(&mut admin)
                .await
                .expect("RPUSH");
        }
        let mut connections = Vec::new();
        for _ in 0..consumers {
            connections.push(server.conn().await);
        }
        let before = Snap::take(&mut admin).await;
        let start = Instant::now();
        let tasks: Vec<_> = connections
            .into_iter()
            .map(|mut conn| {
                let list = list.clone();
                tokio::spawn(async move {
                    let mut got = 0u64;
                    loop {
                        let popped: Option<Vec<Vec<u8>>> = redis::cmd("LPOP")
                            .arg(&list)
                            .arg(BATCH)
                            .query_async(&mut conn)
                            .await
                            .expect("LPOP");
                        let Some(popped) = popped else { return got };
                        for encoded in &popped {
                            let v: Vec<u8> = postcard::from_bytes(encoded).expect("decoded");
                            assert_eq!(v.len(), crate::publish::VALUE_BYTES);
                        }
                        got += popped.len() as u64;
                    }
                })
            })
            .collect();
        let mut got = 0;
        for task in tasks {
            got += task.await.expect("a consumer");
        }
        let secs = start.elapsed().as_secs_f64();
        let usage = Snap::take(&mut admin).await.since(&before);
        assert_eq!(got, values, "every value popped once");
        Server::clean(&mut admin, &name).await;
        Run {
            values,
            secs,
            usage,
        }
    })
}

pub(crate) fn table(plan: &Plan, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### 2. Pulled and acked values/s ({} rounds, medians)\n",
        plan.rounds
    );
    let _ = writeln!(
        out,
        "- keyed-batch: a queue with window 0 filled first ({FILLERS} senders × {IN_FLIGHT} \
         tasks, not timed), then each consumer, a `redis::Receiver` opened with its own \
         `Builder::receiver()`, loops on `recv().await` and `ack_all(batch).await` \
         (`max_batch` {BATCH}) until every value is acked; timed from the first `recv` to \
         the last ack.\n\
         - plain: one LIST filled with the same encoded values, then each consumer, a \
         connection of the `redis` crate, loops on `LPOP list {BATCH}` and decodes the \
         values, until the LIST is empty.\n\
         - The last row has one value a key: plain's cost per value is the same, while \
         keyed-batch pays for each key (its state, its lease) on every value. It has no \
         target: the issue's target is for many values a key.\n\
         - ×plain as in figure 1. keyed ceiling: 10⁶ over the server's CPU µs a value, the \
         values/s Redis could serve with a core to itself. calls/1000 values: `EVALSHA` \
         calls (a pull, or a batch's acks) per 1000 values. fill values/s: the keyed fill, \
         a second look at publishing ({} connections, window 0).\n",
        FILLERS
    );
    let _ = writeln!(
        out,
        "| consumers | values, keys | keyed values/s | plain values/s | ×plain | min–max | server CPU µs/value keyed, plain | keyed ceiling | client CPU µs/value keyed, plain | calls/1000 values keyed | script µs/value | fill values/s |"
    );
    let _ = writeln!(out, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let p = &row.pair;
        let (ks, kc) = Pair::cpu(&p.keyed);
        let (ps, pc) = Pair::cpu(&p.plain);
        let (lo, hi) = range(&p.ratios());
        let _ = writeln!(
            out,
            "| {} | {}, {} | {:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2} | {ks:.1}, {ps:.1} | {} | {kc:.1}, {pc:.1} | {:.1} | {:.1} | {:.0} |",
            row.consumers,
            row.values,
            row.keys,
            Pair::rate(&p.keyed),
            Pair::rate(&p.plain),
            p.ratio(),
            k(1e6 / ks),
            1000.0 / Pair::per_call(&p.keyed, "evalsha"),
            Pair::usec_per_value(&p.keyed, "evalsha"),
            median(&row.fills),
        );
    }
    out
}

pub(crate) fn lines(rows: &[Row]) -> Vec<Line> {
    rows.iter()
        .map(|row| {
            let rate = Pair::rate(&row.pair.keyed);
            Line {
                what: format!(
                    "pulled + acked values/s, {} consumer{}, {} value{} a key",
                    row.consumers,
                    if row.consumers == 1 { "" } else { "s" },
                    row.values / row.keys,
                    if row.values / row.keys == 1 { "" } else { "s" }
                ),
                keyed: k(rate),
                plain: k(Pair::rate(&row.pair.plain)),
                ratio: format!("{:.2}", row.pair.ratio()),
                target: match row.targeted {
                    true => format!("≥ {}", k(TARGET)),
                    false => "report it".into(),
                },
                met: row.targeted.then_some(rate >= TARGET),
            }
        })
        .collect()
}

pub(crate) fn json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|row| {
                let mut v = row.pair.json();
                v["consumers"] = row.consumers.into();
                v["values"] = row.values.into();
                v["keys"] = row.keys.into();
                v["fill_values_per_s"] = row.fills.clone().into();
                v
            })
            .collect(),
    )
}
