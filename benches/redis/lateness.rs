//! Figure 3: how late past its due time each delivery comes, with a 50 ms window at a
//! modest rate; against a plain LIST handed over with `BLPOP` (due at once), and against
//! the in-memory `timed` channel (tokio's timer alone).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use keyed_batch::ack::{ack_all, Delivery};
use keyed_batch::timed;
use tokio::time::Instant;

use crate::plan::Plan;
use crate::probe::{Server, Snap, Usage};
use crate::report::{percentile, Line};
use crate::runtime;

pub(crate) const WINDOW: Duration = Duration::from_millis(50);
/// Values a second, each under a key of its own, so that each delivery is one value.
pub(crate) const RATE: u32 = 1000;
/// The target: p99 at most this, in ms.
const TARGET_P99_MS: f64 = 10.0;
/// How long the last deliveries may take to come once the last send returned.
const DRAIN: Duration = Duration::from_secs(10);

/// One delivery: ms past its due time by this process's clock (the send's start plus the
/// window; the send itself is a round trip later, so this errs towards late), and, for
/// keyed-batch, by [`Delivery::entered`](keyed_batch::ack::Delivery::entered) plus the
/// window, which the server reports to the ms.
#[derive(Clone, Copy)]
struct Sample {
    /// ms from the run's start to the send's start.
    sent: f64,
    past_due: f64,
    by_entered: Option<f64>,
}

/// The deliveries of one side, and what they cost the server.
pub(crate) struct Side {
    what: &'static str,
    samples: Vec<Sample>,
}

impl Side {
    fn past_due(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.past_due).collect()
    }

    fn by_entered(&self) -> Vec<f64> {
        self.samples.iter().filter_map(|s| s.by_entered).collect()
    }

    /// p50, p99, max, min.
    fn stats(xs: &[f64]) -> [f64; 4] {
        [
            percentile(xs, 50.0),
            percentile(xs, 99.0),
            percentile(xs, 100.0),
            percentile(xs, 0.0),
        ]
    }

    fn json(&self) -> serde_json::Value {
        let ms = |xs: &[f64]| {
            let [p50, p99, max, min] = Side::stats(xs);
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "max_ms": max, "min_ms": min })
        };
        // The latest deliveries, with when they were sent: a stall shows as a run of them.
        let mut latest = self.samples.clone();
        latest.sort_by(|a, b| b.past_due.total_cmp(&a.past_due));
        let latest: Vec<_> = latest
            .iter()
            .take(20)
            .map(|s| {
                serde_json::json!({
                    "sent_ms": s.sent,
                    "past_due_ms": s.past_due,
                    "by_entered_ms": s.by_entered,
                })
            })
            .collect();
        serde_json::json!({
            "side": self.what,
            "latest": latest,
            "deliveries": self.samples.len(),
            "past_due": ms(&self.past_due()),
            "past_due_by_entered": ms(&self.by_entered()),
        })
    }
}

pub(crate) struct Figures {
    keyed: Side,
    memory: Side,
    plain: Side,
    secs: f64,
    usage: Usage,
}

/// A send of one side: value `i`, stamped with the ns since the run's start just before
/// it goes.
type Send = Box<dyn Fn(u64) -> BoxFuture<'static, ()>>;

/// Runs the three sides at once, so that the machine's hiccups hit them alike: each tick
/// of [`RATE`] spawns one send for each.
pub(crate) fn run(plan: &Plan, server: &Server) -> Figures {
    runtime().block_on(async {
        let name = server.name("lateness");
        let queue = keyed_batch::redis::Builder::new(server.url.as_str(), name.as_str(), WINDOW);
        let tx = queue.sender::<u64, u64>().await.expect("a sender opens");
        let mut rx = queue.receiver::<u64, u64>().await.expect("a receiver opens");
        // Loads the scripts, and sets the receiver waiting.
        tx.send(u64::MAX, 0).await.expect("sent");
        let warm = rx.recv().await.expect("pulled").expect("open");
        ack_all(warm).await.expect("acked");
        let (mem_tx, mut mem_rx) = timed::Builder::new(WINDOW).acked::<u64, u64>();
        let list = format!("{{{name}}}:list");
        let conn = server.conn().await;
        let mut blocking = server.blocking_conn().await;
        let mut admin = server.conn().await;

        let before = Snap::take(&mut admin).await;
        let base = Instant::now();
        let keyed_samples = Arc::new(Mutex::new(Vec::new()));
        let keyed_consumer = tokio::spawn({
            let samples = Arc::clone(&keyed_samples);
            async move {
                loop {
                    let batch = rx.recv().await.expect("pulled").expect("open");
                    let taken = delivered(&batch, base);
                    samples.lock().unwrap().extend(taken);
                    ack_all(batch).await.expect("acked");
                }
            }
        });
        let mem_samples = Arc::new(Mutex::new(Vec::new()));
        let mem_consumer = tokio::spawn({
            let samples = Arc::clone(&mem_samples);
            async move {
                while let Some(batch) = mem_rx.recv().await {
                    let taken = delivered(&batch, base);
                    samples.lock().unwrap().extend(taken);
                    ack_all(batch).await.expect("acked");
                }
            }
        });
        let plain_samples = Arc::new(Mutex::new(Vec::new()));
        let plain_consumer = tokio::spawn({
            let (samples, list) = (Arc::clone(&plain_samples), list.clone());
            async move {
                loop {
                    let popped: Option<(String, u64)> = redis::cmd("BLPOP")
                        .arg(&list)
                        .arg(1)
                        .query_async(&mut blocking)
                        .await
                        .expect("BLPOP");
                    let at = Instant::now();
                    if let Some((_, sent)) = popped {
                        samples.lock().unwrap().push(Sample {
                            sent: sent as f64 / 1e6,
                            past_due: ms_since(at, base) - sent as f64 / 1e6,
                            by_entered: None,
                        });
                    }
                }
            }
        });

        let stamp = move || base.elapsed().as_nanos() as u64;
        let sends: [Send; 3] = [
            Box::new(move |i| {
                let tx = tx.clone();
                Box::pin(async move { tx.send(i, stamp()).await.expect("sent") })
            }),
            Box::new(move |i| {
                let tx = mem_tx.clone();
                Box::pin(async move { tx.send(i, stamp()).await.expect("sent") })
            }),
            Box::new(move |_| {
                let (mut conn, list) = (conn.clone(), list.clone());
                Box::pin(async move {
                    let _: i64 = redis::cmd("RPUSH")
                        .arg(&list)
                        .arg(stamp())
                        .query_async(&mut conn)
                        .await
                        .expect("RPUSH");
                })
            }),
        ];
        let n = (u128::from(RATE) * plan.lateness_for.as_millis() / 1000) as u64;
        let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
        let mut tasks = Vec::new();
        for i in 0..n {
            tick.tick().await;
            // The side that goes first turns with each tick.
            for s in 0..3 {
                tasks.push(tokio::spawn(sends[(i as usize + s) % 3](i)));
            }
        }
        for task in tasks {
            task.await.expect("a send");
        }
        let keyed = drain(&keyed_samples, n, keyed_consumer).await;
        let memory = drain(&mem_samples, n, mem_consumer).await;
        let plain = drain(&plain_samples, n, plain_consumer).await;
        // Not before: the in-memory channel closes with its last sender, and what it holds
        // is then due at once.
        drop(sends);
        let secs = base.elapsed().as_secs_f64();
        let usage = Snap::take(&mut admin).await.since(&before);
        Server::clean(&mut admin, &name).await;
        let figures = Figures {
            keyed: Side { what: "keyed", samples: keyed },
            memory: Side { what: "in memory", samples: memory },
            plain: Side { what: "plain", samples: plain },
            secs,
            usage,
        };
        for side in [&figures.keyed, &figures.memory, &figures.plain] {
            let [p50, p99, max, min] = Side::stats(&side.past_due());
            eprintln!(
                "  lateness {:<9} {} deliveries, past due p50 {p50:.2} p99 {p99:.2} max {max:.2} min {min:.2} ms",
                side.what,
                side.samples.len()
            );
        }
        figures
    })
}

/// ms since `base`.
/// The samples of a batch of keyed-batch deliveries, taken now: each value is its send's
/// start, in ns since `base`.
fn delivered(batch: &[Delivery<u64, u64>], base: Instant) -> Vec<Sample> {
    let at = Instant::now();
    let window = WINDOW.as_secs_f64() * 1e3;
    batch
        .iter()
        .map(|d| Sample {
            sent: d.values()[0] as f64 / 1e6,
            past_due: ms_since(at, base) - d.values()[0] as f64 / 1e6 - window,
            by_entered: Some(ms_since(at, d.entered()) - window),
        })
        .collect()
}

fn ms_since(at: Instant, base: Instant) -> f64 {
    at.duration_since(base).as_secs_f64() * 1e3
}

/// Waits until `n` samples are in, [`DRAIN`] at most, and stops the consumer.
async fn drain<T>(
    samples: &Mutex<Vec<Sample>>,
    n: u64,
    consumer: tokio::task::JoinHandle<T>,
) -> Vec<Sample> {
    let until = Instant::now() + DRAIN;
    while (samples.lock().unwrap().len() as u64) < n && Instant::now() < until {
        assert!(!consumer.is_finished(), "the consumer ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.abort();
    let samples = samples.lock().unwrap().clone();
    assert_eq!(samples.len() as u64, n, "every value delivered once");
    samples
}

pub(crate) fn table(plan: &Plan, f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### 3. Lateness: ms past due ({} values/s for {} s, window {} ms)\n",
        RATE,
        plan.lateness_for.as_secs_f64(),
        WINDOW.as_millis()
    );
    let _ = writeln!(
        out,
        "- The three sides run at once, in one runtime, so that the machine's hiccups hit \
         them alike: each tick spawns one send for each, and each value goes under a key of \
         its own, carrying the time its send started.\n\
         - keyed-batch: one `redis::Sender<u64, u64>` and one `redis::Receiver`, which \
         `recv`s and `ack_all`s. Past due: when `recv` returned, less the send's start, less \
         the window, by this process's clock (the server's clock plays no part; the send's \
         round trip makes it err late, never early). By `entered()`: when `recv` returned, \
         less `Delivery::entered()`, less the window (the server reports `entered` to the \
         ms).\n\
         - in memory: the `timed` channel with `acked()`: tokio's timer alone.\n\
         - plain: `RPUSH` of the send's start to one LIST, one connection in `BLPOP`: due \
         at once, so past due is the hand-over's latency.\n\
         - > {TARGET_P99_MS} ms: deliveries later than the target. Server: {:.0} % of a \
         core over the run, all sides; keyed-batch made {:.2} script calls a delivery \
         (pulls and acks).\n",
        f.usage.server_cpu / f.secs * 100.0,
        f.usage.calls("evalsha") as f64 / f.keyed.samples.len().max(1) as f64,
    );
    let _ = writeln!(
        out,
        "| side | deliveries | p50 | p99 | max | min | > {TARGET_P99_MS} ms | by entered(): p50 | p99 | max | min |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for side in [&f.keyed, &f.memory, &f.plain] {
        let past_due = side.past_due();
        let [p50, p99, max, min] = Side::stats(&past_due);
        let over = past_due.iter().filter(|&&x| x > TARGET_P99_MS).count();
        let by = side.by_entered();
        let entered = match by.is_empty() {
            true => "– | – | – | –".to_string(),
            false => {
                let [a, b, c, d] = Side::stats(&by);
                format!("{a:.2} | {b:.2} | {c:.2} | {d:.2}")
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {p50:.2} | {p99:.2} | {max:.2} | {min:.2} | {over} | {entered} |",
            side.what,
            side.samples.len()
        );
    }
    out
}

pub(crate) fn lines(f: &Figures) -> Vec<Line> {
    let [p50, p99, max, min] = Side::stats(&f.keyed.past_due());
    let [.., entered_min] = Side::stats(&f.keyed.by_entered());
    let [pp50, pp99, pmax, _] = Side::stats(&f.plain.past_due());
    vec![
        Line {
            what: format!(
                "lateness p50 / p99 / max, ms past due (window {} ms)",
                WINDOW.as_millis()
            ),
            keyed: format!("{p50:.1} / {p99:.1} / {max:.1}"),
            plain: format!("{pp50:.1} / {pp99:.1} / {pmax:.1} (BLPOP)"),
            ratio: format!("{:.1} (p99)", p99 / pp99),
            target: format!("p99 ≤ {TARGET_P99_MS} ms"),
            met: Some(p99 <= TARGET_P99_MS),
        },
        Line {
            what: "lateness min, ms past due: local clock, by entered()".into(),
            keyed: format!("{min:.2}, {entered_min:.2}"),
            plain: "–".into(),
            ratio: "–".into(),
            target: "≥ 0 (none early)".into(),
            met: Some(min >= 0.0 && entered_min >= 0.0),
        },
    ]
}

pub(crate) fn json(f: &Figures) -> serde_json::Value {
    serde_json::json!({
        "window_ms": WINDOW.as_millis() as u64,
        "rate_per_s": RATE,
        "keyed": f.keyed.json(),
        "in_memory": f.memory.json(),
        "plain": f.plain.json(),
        "secs": f.secs,
        "usage": f.usage.json(),
    })
}
