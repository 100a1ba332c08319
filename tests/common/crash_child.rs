//! The crash loop's child: it opens the log, reports what came back, then sends, receives
//! and decides at random until the parent kills it. Every report is a line appended to the
//! facts file, written after what it reports (or, for `try` and `acking`, before it
//! starts), so that whatever lines the parent finds after the kill are true.
//!
//! The lines, one per event:
//!
//! - `open <truncated> <recovered> <segments>`: the stats once the log is open;
//! - `rec <key> <attempt> <id>:<digest> ...`: a delivery taken at once after the open, with
//!   every value that came back; `recdone` when they are all reported;
//! - `try <id> <key>`: a send is about to start; `sent <id>`: it returned `Ok`;
//! - `got <key> <attempt> <id>:<digest> ...`: a delivery received;
//! - `acking <token> <id> ...`: an `ack`, `ack_all` or `give_up` is about to be made;
//!   `acked <token>`: its future resolved `Ok`;
//! - `retry <id> ...`: a `retry` or `retry_after` was made (its record is appended by then);
//! - `senderr`, `ackerr`: a send or a decision failed, which no kill should cause.

use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keyed_batch::ack::{self, Delivery};
use keyed_batch::durable::FsyncPolicy;
use keyed_batch::timed;

/// The channel's values: an id that no other value has, and a body made from it, so that a
/// changed or invented value shows.
pub(crate) type Value = (u64, Vec<u8>);

/// Names the child's work directory: the test binary is the child when it is set.
pub(crate) const CHILD_ENV: &str = "KEYED_BATCH_CRASH_CHILD";
/// The child's orders: `<first id> <seed> <policy> <send held> <verify only>`.
pub(crate) const ORDERS_ENV: &str = "KEYED_BATCH_CRASH_ORDERS";
/// What the child prints on stdout once it has reported what came back.
pub(crate) const READY: &str = "crash-child-ready";

/// A key whose one value is never acknowledged (only retried later, or held): it pins the
/// oldest segment until the journal copies it forward.
pub(crate) const HELD: u32 = 0;
/// A key whose deliveries are held until the kill, and decided only at a restart: its
/// values live across several runs and segments.
pub(crate) const SLOW: u32 = 1;
/// Keys `2..KEYS` are decided at random.
pub(crate) const KEYS: u32 = 14;
/// Sender tasks; each sends to its own keys, one value after another, so that a key's
/// values are sent in the order of their ids.
const SENDERS: u32 = 6;
/// Small segments, so that rotation, deletion and copying forward happen every few runs.
pub(crate) const SEGMENT_SIZE: u64 = 4 << 10;
/// The channel's window: keys are due almost at once.
const WINDOW: Duration = Duration::from_millis(1);
/// A retry that waits this long is not redelivered before the kill.
const LONG: Duration = Duration::from_secs(3600);

/// The log directory and the facts file in the child's work directory.
pub(crate) fn paths(work: &Path) -> (PathBuf, PathBuf) {
    (work.join("log"), work.join("facts"))
}

/// The body of value `id`: 0 to 47 bytes that follow from it.
pub(crate) fn body(id: u64) -> Vec<u8> {
    let mut x = mix(id);
    let len = (x % 48) as usize;
    (0..len)
        .map(|_| {
            x = mix(x);
            x as u8
        })
        .collect()
}

/// A digest of a body (FNV-1a), which the child reports for each value it receives.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// SplitMix64's finaliser.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small random number generator (SplitMix64), seeded by the parent.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A number in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the parent tells a child to do.
#[derive(Clone, Debug)]
pub(crate) struct Orders {
    /// The first id to give a value; ids go up from there.
    pub(crate) first_id: u64,
    pub(crate) seed: u64,
    pub(crate) policy: FsyncPolicy,
    /// Send a value to `HELD`: the parent's model has none that may still be in the log.
    pub(crate) send_held: bool,
    /// Report what came back and exit, without sending: the last check of a loop.
    pub(crate) verify_only: bool,
}

impl Orders {
    pub(crate) fn to_env(&self) -> String {
        let policy = match self.policy {
            FsyncPolicy::Always => "always",
            FsyncPolicy::Never => "never",
            FsyncPolicy::Interval(_) => "interval",
        };
        let (held, verify) = (u8::from(self.send_held), u8::from(self.verify_only));
        format!("{} {} {policy} {held} {verify}", self.first_id, self.seed)
    }

    fn from_env(text: &str) -> Self {
        let words: Vec<&str> = text.split(' ').collect();
        let [first_id, seed, policy, held, verify] = words[..] else {
            panic!("{ORDERS_ENV}={text:?}: five words expected");
        };
        Orders {
            first_id: first_id.parse().expect("first id"),
            seed: seed.parse().expect("seed"),
            policy: match policy {
                "always" => FsyncPolicy::Always,
                "never" => FsyncPolicy::Never,
                "interval" => FsyncPolicy::Interval(Duration::from_millis(2)),
                other => panic!("no such policy {other:?}"),
            },
            send_held: held == "1",
            verify_only: verify == "1",
        }
    }
}

/// The facts file, appended to one line per write, so that a kill leaves at most the last
/// line cut short.
#[derive(Clone)]
struct Facts(Arc<File>);

impl Facts {
    fn line(&self, text: impl Display) {
        let line = format!("{text}\n");
        (&*self.0)
            .write_all(line.as_bytes())
            .expect("the facts file takes a line");
    }

    fn delivery(&self, tag: &str, delivery: &Delivery<u32, Value>) {
        let mut line = format!("{tag} {} {}", delivery.key(), delivery.attempt());
        for (id, body) in delivery.values() {
            line.push_str(&format!(" {id}:{:x}", digest(body)));
        }
        self.line(line)
    }
}

fn ids(delivery: &Delivery<u32, Value>) -> String {
    let ids: Vec<String> = delivery.values().iter().map(|v| v.0.to_string()).collect();
    ids.join(" ")
}

/// Runs the child: called by the `crash_child` test when `CHILD_ENV` is set.
pub(crate) fn run(work: &Path) {
    let orders = std::env::var(ORDERS_ENV).expect("the parent sets the orders");
    let orders = Orders::from_env(&orders);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(child(work, orders));
}

async fn child(work: &Path, orders: Orders) {
    let (log, facts) = paths(work);
    let facts = OpenOptions::new()
        .append(true)
        .open(facts)
        .expect("the parent made the facts file");
    let facts = Facts(Arc::new(facts));
    let opened = timed::Builder::new(WINDOW)
        .durable(&log)
        .fsync(orders.policy)
        .segment_size(SEGMENT_SIZE)
        .open::<u32, Value>()
        .await;
    let (tx, mut rx) = opened.unwrap_or_else(|err| panic!("the log did not open: {err}"));
    let stats = rx.stats();
    let (truncated, recovered) = (stats.log_truncated_bytes, stats.log_recovered);
    facts.line(format_args!(
        "open {truncated} {recovered} {}",
        stats.log_segments
    ));
    let recovered: Vec<_> = rx.drain_now().into_iter().flatten().collect();
    for delivery in &recovered {
        facts.delivery("rec", delivery);
    }
    facts.line("recdone");
    if orders.verify_only {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}").expect("stdout");
    stdout.flush().expect("stdout");
    drop(stdout);

    let next_id = Arc::new(AtomicU64::new(orders.first_id));
    let mut rng = Rng::new(orders.seed);
    if orders.send_held {
        let (tx, facts, next_id) = (tx.clone(), facts.clone(), Arc::clone(&next_id));
        tokio::spawn(async move { send_one(&tx, &facts, &next_id, HELD).await });
    }
    for task in 0..SENDERS {
        let keys: Vec<u32> = (2..KEYS).filter(|k| k % SENDERS == task).collect();
        let sender = Sender {
            tx: tx.clone(),
            facts: facts.clone(),
            next_id: Arc::clone(&next_id),
            keys,
            slow: task == 0,
            rng: Rng::new(rng.next()),
        };
        tokio::spawn(sender.run());
    }
    drop(tx);

    let mut decider = Decider {
        facts,
        rng: Rng::new(rng.next()),
        held: Vec::new(),
        together: Vec::new(),
        tokens: Arc::new(AtomicU64::new(0)),
    };
    for delivery in recovered {
        decider.decide(delivery, true);
    }
    decider.ack_together();
    // A child the parent failed to kill stops by itself, and its parent reports it.
    let give_up = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(give_up);
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let batch = batch.expect("the senders outlive the receiver");
                for delivery in batch {
                    decider.facts.delivery("got", &delivery);
                    decider.decide(delivery, false);
                }
                decider.ack_together();
            }
            () = &mut give_up => panic!("the child ran 20 s and was not killed"),
        }
    }
}

/// Sends one value to `key`, reporting it before and after.
async fn send_one(
    tx: &timed::Sender<u32, Value>,
    facts: &Facts,
    next_id: &AtomicU64,
    key: u32,
) -> bool {
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    facts.line(format_args!("try {id} {key}"));
    match tx.send(key, (id, body(id))).await {
        Ok(()) => {
            facts.line(format_args!("sent {id}"));
            true
        }
        Err(_) => {
            facts.line(format_args!("senderr {id} {:?}", tx.log_error()));
            false
        }
    }
}

/// A task that sends to its own keys, one value after another.
struct Sender {
    tx: timed::Sender<u32, Value>,
    facts: Facts,
    next_id: Arc<AtomicU64>,
    keys: Vec<u32>,
    /// Whether this task also sends to `SLOW`, now and then.
    slow: bool,
    rng: Rng,
}

impl Sender {
    async fn run(mut self) {
        loop {
            let key = match self.slow && self.rng.below(100) < 4 {
                true => SLOW,
                false => self.keys[self.rng.below(self.keys.len() as u64) as usize],
            };
            if !send_one(&self.tx, &self.facts, &self.next_id, key).await {
                return;
            }
            // Under `Never` a send returns at once: a pause keeps the log from racing ahead.
            if self.rng.below(3) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// Decides deliveries at random, reporting each decision.
struct Decider {
    facts: Facts,
    rng: Rng,
    /// Deliveries left undecided until the kill.
    held: Vec<Delivery<u32, Value>>,
    /// Deliveries to acknowledge together with `ack_all` at the end of a batch.
    together: Vec<Delivery<u32, Value>>,
    /// Numbers the `acking` lines, so that an `acked` line names its own.
    tokens: Arc<AtomicU64>,
}

impl Decider {
    /// Decides a delivery; `recovered`: it came back at the open.
    fn decide(&mut self, delivery: Delivery<u32, Value>, recovered: bool) {
        let roll = self.rng.below(100);
        match *delivery.key() {
            HELD if roll < 50 => self.retry(delivery, LONG),
            HELD => self.held.push(delivery),
            SLOW if recovered && roll < 30 => ack(&self.facts, &self.tokens, delivery, false),
            SLOW if recovered && roll < 50 => self.retry(delivery, LONG),
            SLOW => self.held.push(delivery),
            _ => match roll {
                0..45 => ack(&self.facts, &self.tokens, delivery, false),
                45..60 => self.together.push(delivery),
                60..72 => {
                    // Acknowledged a little later, so that acknowledgements are in flight
                    // at any moment.
                    let delay = Duration::from_millis(self.rng.below(20));
                    let (facts, tokens) = (self.facts.clone(), Arc::clone(&self.tokens));
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        ack(&facts, &tokens, delivery, false);
                    });
                }
                72..80 => self.retry(delivery, Duration::ZERO),
                80..87 => {
                    let delay = Duration::from_millis(1 + self.rng.below(5));
                    self.retry(delivery, delay)
                }
                87..95 => ack(&self.facts, &self.tokens, delivery, true),
                _ => self.held.push(delivery),
            },
        }
    }

    /// Acknowledges the deliveries gathered from a batch with one `ack_all`.
    fn ack_together(&mut self) {
        if self.together.is_empty() {
            return;
        }
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let all: Vec<String> = self.together.iter().map(ids).collect();
        self.facts
            .line(format_args!("acking {token} {}", all.join(" ")));
        let decided = ack::ack_all(std::mem::take(&mut self.together));
        let facts = self.facts.clone();
        tokio::spawn(async move { report(&facts, token, decided.await) });
    }

    fn retry(&mut self, delivery: Delivery<u32, Value>, after: Duration) {
        let ids = ids(&delivery);
        let decided = delivery.retry_after(after);
        // The retry's record is appended by now; the future resolves at once.
        self.facts.line(format_args!("retry {ids}"));
        let facts = self.facts.clone();
        tokio::spawn(async move {
            if let Err(err) = decided.await {
                facts.line(format_args!("ackerr retry {err}"));
            }
        });
    }
}

/// Acknowledges a delivery (or gives it up, which the log records the same way), and
/// reports it before and after.
fn ack(facts: &Facts, tokens: &AtomicU64, delivery: Delivery<u32, Value>, give_up: bool) {
    let token = tokens.fetch_add(1, Ordering::Relaxed);
    facts.line(format_args!("acking {token} {}", ids(&delivery)));
    let facts = facts.clone();
    match give_up {
        false => {
            let decided = delivery.ack();
            tokio::spawn(async move { report(&facts, token, decided.await) });
        }
        true => {
            let decided = delivery.give_up();
            tokio::spawn(async move { report(&facts, token, decided.await.map(drop)) });
        }
    }
}

fn report<E: Display>(facts: &Facts, token: u64, result: Result<(), E>) {
    match result {
        Ok(()) => facts.line(format_args!("acked {token}")),
        Err(err) => facts.line(format_args!("ackerr {token} {err}")),
    }
}
