//! Figure 1: values published a second by 1 and 4 `Sender`s, each on its own connection,
//! against plain `RPUSH` on as many connections, driven alike, in the same round.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::common::mix;
use crate::plan::Plan;
use crate::probe::{Server, Snap};
use crate::report::{k, range, Line, Pair, Run};
use crate::runtime;

/// Connections: `Sender`s on one side, connections of the `redis` crate on the other.
pub(crate) const CONNS: [usize; 2] = [1, 4];
/// Send tasks a connection, each with one send in flight, so that sends coalesce.
pub(crate) const IN_FLIGHT: usize = 64;
/// The keys values spread over.
pub(crate) const KEYS: u64 = 10_000;
/// Bytes a value: `Vec<u8>`, which postcard encodes with one more for its length.
pub(crate) const VALUE_BYTES: usize = 16;
/// The window of the publish queue: nothing comes due while it runs, and no one pulls.
const WINDOW: Duration = Duration::from_secs(3600);
/// The target, values/s.
const TARGET: f64 = 60_000.0;

/// The `i`th value of a task.
pub(crate) fn value(i: u64) -> Vec<u8> {
    vec![i as u8; VALUE_BYTES]
}

/// Every round of one number of connections.
pub(crate) struct Row {
    conns: usize,
    pair: Pair,
}

pub(crate) fn run(plan: &Plan, server: &Server) -> Vec<Row> {
    let mut rows: Vec<Row> = CONNS
        .iter()
        .map(|&conns| Row {
            conns,
            pair: Pair::new(),
        })
        .collect();
    for round in 0..plan.rounds {
        for row in &mut rows {
            let conns = row.conns;
            row.pair.round(round, |keyed_side| {
                let run = match keyed_side {
                    true => keyed(server, conns, plan.run_for),
                    false => plain(server, conns, plan.run_for),
                };
                eprintln!(
                    "  publish round {}/{} conns {} {:<5} {:>9.0} values/s",
                    round + 1,
                    plan.rounds,
                    conns,
                    if keyed_side { "keyed" } else { "plain" },
                    run.rate(),
                );
                run
            });
        }
    }
    rows
}

/// `conns` senders, each opened with its own `sender()`, each driven by [`IN_FLIGHT`]
/// tasks that send for `run_for`.
fn keyed(server: &Server, conns: usize, run_for: Duration) -> Run {
    runtime().block_on(async {
        let name = server.name("publish");
        let queue = keyed_batch::redis::Builder::new(server.url.as_str(), name.as_str(), WINDOW);
        let mut senders = Vec::new();
        for _ in 0..conns {
            let tx = queue
                .sender::<u64, Vec<u8>>()
                .await
                .expect("a sender opens");
            // The first call of a script loads it into the server: not part of the figure.
            tx.send(u64::MAX, value(0)).await.expect("sent");
            senders.push(tx);
        }
        let mut admin = server.conn().await;
        let before = Snap::take(&mut admin).await;
        let start = Instant::now();
        let until = start + run_for;
        let mut tasks = Vec::new();
        for (s, tx) in senders.iter().enumerate() {
            for t in 0..IN_FLIGHT {
                let tx = tx.clone();
                let seed = ((s * IN_FLIGHT + t) as u64) << 40;
                tasks.push(tokio::spawn(async move {
                    let mut i = 0;
                    while Instant::now() < until {
                        tx.send(mix(seed | i) % KEYS, value(i)).await.expect("sent");
                        i += 1;
                    }
                    i
                }));
            }
        }
        let mut values = 0;
        for task in tasks {
            values += task.await.expect("a send task");
        }
        let secs = start.elapsed().as_secs_f64();
        let usage = Snap::take(&mut admin).await.since(&before);
        drop(senders);
        Server::clean(&mut admin, &name).await;
        Run {
            values,
            secs,
            usage,
        }
    })
}

/// `conns` connections of the `redis` crate, each driven by [`IN_FLIGHT`] tasks that
/// `RPUSH` the same encoded values to one LIST for `run_for`.
fn plain(server: &Server, conns: usize, run_for: Duration) -> Run {
    runtime().block_on(async {
        let name = server.name("publish-plain");
        let list = format!("{{{name}}}:list");
        let mut connections = Vec::new();
        for _ in 0..conns {
            connections.push(server.conn().await);
        }
        let mut admin = server.conn().await;
        let before = Snap::take(&mut admin).await;
        let start = Instant::now();
        let until = start + run_for;
        let mut tasks = Vec::new();
        for conn in &connections {
            for _ in 0..IN_FLIGHT {
                let mut conn = conn.clone();
                let list = list.clone();
                tasks.push(tokio::spawn(async move {
                    let mut i = 0;
                    while Instant::now() < until {
                        let encoded = postcard::to_stdvec(&value(i)).expect("encoded");
                        let _: i64 = redis::cmd("RPUSH")
                            .arg(&list)
                            .arg(encoded)
                            .query_async(&mut conn)
                            .await
                            .expect("RPUSH");
                        i += 1;
                    }
                    i
                }));
            }
        }
        let mut values = 0;
        for task in tasks {
            values += task.await.expect("a push task");
        }
        let secs = start.elapsed().as_secs_f64();
        let usage = Snap::take(&mut admin).await.since(&before);
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
        "\n### 1. Published values/s ({} rounds of {} s, medians)\n",
        plan.rounds,
        plan.run_for.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "- keyed-batch: `redis::Sender<u64, Vec<u8>>`, each opened with its own \
         `Builder::sender()` (its own connection), each driven by {IN_FLIGHT} tasks that \
         loop on `send(key, value).await`; {KEYS} keys, {VALUE_BYTES}-byte values, window \
         {} s (nothing comes due), no receiver.\n\
         - plain: as many connections of the `redis` crate (`MultiplexedConnection`), each \
         driven by {IN_FLIGHT} tasks that loop on `RPUSH list value` with the same encoded \
         value, to one LIST; the connection pipelines what its tasks have in flight.\n\
         - ×plain: keyed-batch's values/s over plain's in a round, median over rounds, and \
         its range. keyed ceiling: 10⁶ over the server's CPU µs a value, the values/s Redis \
         could take with a core to itself (it runs scripts one at a time). CPU µs/value: the server's (`INFO cpu`) and this process's, which are \
         all client. values/call: values per `EVALSHA` (keyed-batch: a coalesced publish \
         script) or per `RPUSH` (plain). script µs/value: the server's time in `EVALSHA` \
         (`INFO commandstats`).\n",
        WINDOW.as_secs()
    );
    let _ = writeln!(
        out,
        "| conns | keyed values/s | plain values/s | ×plain | min–max | server CPU µs/value keyed, plain | keyed ceiling | client CPU µs/value keyed, plain | values/call keyed | script µs/value |"
    );
    let _ = writeln!(out, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let p = &row.pair;
        let (ks, kc) = Pair::cpu(&p.keyed);
        let (ps, pc) = Pair::cpu(&p.plain);
        let (lo, hi) = range(&p.ratios());
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2} | {ks:.1}, {ps:.1} | {} | {kc:.1}, {pc:.1} | {:.1} | {:.1} |",
            row.conns,
            Pair::rate(&p.keyed),
            Pair::rate(&p.plain),
            p.ratio(),
            k(1e6 / ks),
            Pair::per_call(&p.keyed, "evalsha"),
            Pair::usec_per_value(&p.keyed, "evalsha"),
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
                    "published values/s, {} connection{}",
                    row.conns,
                    if row.conns == 1 { "" } else { "s" }
                ),
                keyed: k(rate),
                plain: k(Pair::rate(&row.pair.plain)),
                ratio: format!("{:.2}", row.pair.ratio()),
                target: format!("≥ {}", k(TARGET)),
                met: Some(rate >= TARGET),
            }
        })
        .collect()
}

pub(crate) fn json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|row| {
                let mut v = row.pair.json();
                v["connections"] = row.conns.into();
                v["send_tasks_per_connection"] = IN_FLIGHT.into();
                v
            })
            .collect(),
    )
}
