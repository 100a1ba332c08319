//! Several processes share one Redis queue: two producers and two consumers, each a child
//! run of this test binary. One consumer is killed with `SIGKILL` while it holds a batch
//! undecided; the other must get that batch again, once its lease has run out, and the
//! values must come out acked exactly once, in order within each key.
//!
//! A child is this binary run as `--exact child --nocapture` with `KB_REDIS_ROLE` set; the
//! `child` test returns at once when the variable is not set. A consumer writes one line per
//! delivery it takes and one per ack that returned `Ok`, on stdout, which the parent reads.

#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use keyed_batch::redis;
use redis_server::RedisServer;

/// Names the part a child plays: `producer` or `consumer`. Unset in the parent.
const ROLE: &str = "KB_REDIS_ROLE";
const URL: &str = "KB_REDIS_URL";
const QUEUE: &str = "KB_REDIS_QUEUE";
/// The producer's or consumer's number.
const ID: &str = "KB_REDIS_ID";
/// Set for the consumer to kill: after this many batches it holds the last one undecided.
const HOLD_AFTER: &str = "KB_REDIS_HOLD_AFTER";

const PRODUCERS: u8 = 2;
const PER_PRODUCER: u32 = 3_000;
const KEYS: u32 = 50;
/// The tasks of one producer; each sends the values of its share of the keys, in order.
const PRODUCER_TASKS: u32 = 5;
const WINDOW: Duration = Duration::from_millis(20);
const LEASE: Duration = Duration::from_millis(500);
/// The batch the consumer to kill holds: late enough that both consumers are busy.
const HOLD_BATCH: usize = 5;
/// How long any one stage of the parent may take before it gives up.
const STAGE: Duration = Duration::from_secs(20);

/// A value: the producer and its sequence number. The key is `seq % KEYS`.
type Value = (u8, u32);

fn builder(url: &str, queue: &str) -> redis::Builder {
    redis::Builder::new(url, queue, WINDOW).lease(LEASE)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Microseconds since the Unix epoch: the clock the processes share.
fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros()
}

fn format_values(values: &[Value]) -> String {
    let parts: Vec<String> = values.iter().map(|(p, s)| format!("{p}:{s}")).collect();
    parts.join(",")
}

// ===== the children =====

/// A child's work; returns at once in the parent's own test run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match role.as_str() {
        "producer" => runtime.block_on(produce()),
        "consumer" => runtime.block_on(consume()),
        other => panic!("unknown {ROLE} {other:?}"),
    }
}

/// Sends `PER_PRODUCER` values, `(id, seq)` under key `seq % KEYS`, each key's in order.
async fn produce() {
    let id: u8 = env(ID).parse().unwrap();
    let tx: redis::Sender<u32, Value> = builder(&env(URL), &env(QUEUE))
        .sender()
        .await
        .expect("a producer opens the queue");
    let tasks: Vec<_> = (0..PRODUCER_TASKS)
        .map(|task| {
            let tx = tx.clone();
            tokio::spawn(async move {
                // One task owns each key, so the key's values go in sequence order.
                for seq in (0..PER_PRODUCER).filter(|s| (s % KEYS) % PRODUCER_TASKS == task) {
                    if let Err(err) = tx.send(seq % KEYS, (id, seq)).await {
                        panic!("producer {id}: send of {seq} failed: {err}");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    println!("SENT {id}");
}

/// Takes batches until the stream ends. For each delivery it writes
/// `D <n> <time µs> <key> <attempt> <values>` as it takes it, and `A <n>` once its ack
/// returned `Ok`, where `n` numbers this consumer's deliveries. With `HOLD_AFTER` set, it
/// writes `HOLDING` after that many batches and keeps the last one undecided for ever.
async fn consume() {
    let id: u8 = env(ID).parse().unwrap();
    let hold_after: Option<usize> = std::env::var(HOLD_AFTER).ok().map(|n| n.parse().unwrap());
    let mut rx: redis::Receiver<u32, Value> = builder(&env(URL), &env(QUEUE))
        .receiver()
        .await
        .expect("a consumer opens the queue");
    println!("READY {id}");
    let mut batches = 0;
    let mut delivery = 0u64;
    while let Some(batch) = rx.next().await {
        batches += 1;
        let mut numbered = Vec::with_capacity(batch.len());
        for d in batch {
            delivery += 1;
            println!(
                "D {delivery} {} {} {} {}",
                now_us(),
                d.key(),
                d.attempt(),
                format_values(d.values())
            );
            numbered.push((delivery, d));
        }
        if hold_after == Some(batches) {
            println!("HOLDING");
            // The receiver's own task keeps renewing the leases until the process dies.
            let _held = numbered;
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        let acks = numbered
            .into_iter()
            .map(|(n, d)| async move { (n, d.ack().await) });
        for (n, outcome) in futures::future::join_all(acks).await {
            match outcome {
                Ok(()) => println!("A {n}"),
                Err(err) => println!("E {n} {err}"),
            }
        }
    }
    println!("END {id}");
}

// ===== the parent =====

/// A child process, with a thread that reads its stdout into lines and passes each on.
struct Proc {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(name: &str, role: &str, id: u8, url: &str, queue: &str, hold: Option<usize>) -> Proc {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(URL, url)
            .env(QUEUE, queue)
            .env(ID, id.to_string())
            .env_remove(HOLD_AFTER)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(n) = hold {
            command.env(HOLD_AFTER, n.to_string());
        }
        let mut child = command
            .spawn()
            .expect("the test binary runs again as a child");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The test harness writes `test child ... ` before the child's first line.
                let line = match line.strip_prefix("test child ... ") {
                    Some(rest) => rest.to_string(),
                    None => line,
                };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: name.to_string(),
            child,
            lines,
            seen: Vec::new(),
            reader: Some(reader),
        }
    }

    /// Reads lines until one equals `want`; panics after `STAGE`.
    fn wait_for_line(&mut self, want: &str) {
        let deadline = Instant::now() + STAGE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line == want;
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => {
                    let stderr = self.stderr_now();
                    let tail = &self.seen[self.seen.len().saturating_sub(5)..];
                    panic!(
                        "{} did not write {want:?} within {STAGE:?}; its last lines: \
                         {tail:?}; stderr:\n{stderr}",
                        self.name
                    )
                }
            }
        }
    }

    /// Waits for the process to exit (panics after `STAGE`, or if it failed) and returns
    /// every line it wrote.
    fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + STAGE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let stderr = self.stderr_now();
                panic!(
                    "{} did not exit within {STAGE:?}; stderr:\n{stderr}",
                    self.name
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        if !status.success() {
            let stderr = self.stderr_now();
            panic!("{} failed: {status}; stderr:\n{stderr}", self.name);
        }
        self.drain()
    }

    /// Kills the process with `SIGKILL` and returns every line it wrote.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.drain()
    }

    /// The lines read so far, the process still running.
    fn drain_now(&mut self) -> Vec<String> {
        self.seen.extend(self.lines.try_iter());
        self.seen.clone()
    }

    fn drain(&mut self) -> Vec<String> {
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.seen.extend(self.lines.try_iter());
        std::mem::take(&mut self.seen)
    }

    fn stderr_now(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A panic elsewhere leaves no child behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One delivery as a consumer wrote it.
#[derive(Clone, Debug)]
struct Taken {
    consumer: u8,
    number: u64,
    at_us: u128,
    key: u32,
    attempt: u32,
    values: Vec<Value>,
}

/// A consumer's lines: its deliveries in order, the numbers of those acked `Ok`, and the
/// numbers of the deliveries of its last batch (the held one, for the killed consumer).
struct Log {
    taken: Vec<Taken>,
    acked: HashSet<u64>,
    last_batch: Vec<u64>,
    holding: bool,
}

fn parse(consumer: u8, lines: &[String]) -> Log {
    let mut log = Log {
        taken: Vec::new(),
        acked: HashSet::new(),
        last_batch: Vec::new(),
        holding: false,
    };
    // A batch's D lines come together, before its acks.
    let mut in_batch = false;
    for line in lines {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[0] {
            "D" => {
                assert_eq!(fields.len(), 6, "bad line {line:?}");
                let number = fields[1].parse().unwrap();
                if !in_batch {
                    log.last_batch.clear();
                    in_batch = true;
                }
                log.last_batch.push(number);
                let values = fields[5]
                    .split(',')
                    .map(|v| {
                        let (p, s) = v.split_once(':').unwrap();
                        (p.parse().unwrap(), s.parse().unwrap())
                    })
                    .collect();
                log.taken.push(Taken {
                    consumer,
                    number,
                    at_us: fields[2].parse().unwrap(),
                    key: fields[3].parse().unwrap(),
                    attempt: fields[4].parse().unwrap(),
                    values,
                });
            }
            "A" => {
                in_batch = false;
                assert!(
                    log.acked.insert(fields[1].parse().unwrap()),
                    "acked twice: {line:?}"
                );
            }
            "E" => panic!("consumer {consumer} had a decision fail: {line:?}"),
            "HOLDING" => log.holding = true,
            _ => {}
        }
    }
    log
}

#[test]
fn killed_consumer_batch_goes_to_the_survivor() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let started = Instant::now();
    let url = server.url();
    let queue = "procs";

    // Consumer 1 holds its fifth batch and is killed; consumer 2 survives.
    let mut doomed = Proc::spawn("consumer 1", "consumer", 1, &url, queue, Some(HOLD_BATCH));
    let mut survivor = Proc::spawn("consumer 2", "consumer", 2, &url, queue, None);
    doomed.wait_for_line("READY 1");
    survivor.wait_for_line("READY 2");
    let producers: Vec<Proc> = (1..=PRODUCERS)
        .map(|id| Proc::spawn(&format!("producer {id}"), "producer", id, &url, queue, None))
        .collect();

    doomed.wait_for_line("HOLDING");
    let killed_at = Instant::now();
    let doomed_lines = doomed.kill();
    let killed_after = started.elapsed();
    for producer in producers {
        let lines = producer.finish();
        assert!(lines.iter().any(|l| l.starts_with("SENT ")), "{lines:?}");
    }
    let sent_after = started.elapsed();

    // The survivor drains the queue, the held batch included once its lease ran out.
    let deadline = Instant::now() + STAGE;
    loop {
        let reply = server.command(&["HGET", &format!("{{{queue}}}:meta"), "pending"]);
        if reply == "$1\r\n0\r\n" {
            break;
        }
        if Instant::now() >= deadline {
            let q = format!("{{{queue}}}");
            let state = [
                server.command(&["TIME"]),
                server.command(&["ZRANGE", &format!("{q}:due"), "0", "4", "WITHSCORES"]),
                server.command(&["ZCARD", &format!("{q}:due")]),
                server.command(&["ZRANGE", &format!("{q}:lease"), "0", "-1", "WITHSCORES"]),
                server.command(&["HGETALL", &format!("{q}:meta")]),
                server.command(&["ZRANGE", &format!("{q}:wake"), "0", "-1", "WITHSCORES"]),
                server.command(&["CLIENT", "LIST"]),
            ];
            let lines = survivor.drain_now();
            let tail = &lines[lines.len().saturating_sub(10)..];
            panic!(
                "the queue still holds values after {STAGE:?}: pending {reply:?}\n\
                 Redis: {state:?}\nthe survivor's last lines: {tail:?}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let drained_after = started.elapsed();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tx: redis::Sender<u32, Value> = builder(&url, queue).sender().await.unwrap();
        tx.close().await.unwrap();
    });
    let survivor_lines = survivor.finish();
    assert!(
        survivor_lines.iter().any(|l| l == "END 2"),
        "the survivor's stream did not end"
    );

    let doomed_log = parse(1, &doomed_lines);
    let survivor_log = parse(2, &survivor_lines);
    assert!(doomed_log.holding);

    // Every value was delivered, and acked exactly once over both consumers.
    let all: Vec<(u32, Value)> = (1..=PRODUCERS)
        .flat_map(|p| (0..PER_PRODUCER).map(move |s| (s % KEYS, (p, s))))
        .collect();
    let mut delivered: HashSet<(u32, Value)> = HashSet::new();
    let mut acked: HashMap<Value, u32> = HashMap::new();
    for log in [&doomed_log, &survivor_log] {
        for t in &log.taken {
            for v in &t.values {
                assert_eq!(v.1 % KEYS, t.key, "value {v:?} came under key {}", t.key);
                delivered.insert((t.key, *v));
                if log.acked.contains(&t.number) {
                    *acked.entry(*v).or_default() += 1;
                }
            }
        }
    }
    for kv in &all {
        assert!(delivered.contains(kv), "{kv:?} was never delivered");
    }
    assert_eq!(
        delivered.len(),
        all.len(),
        "values delivered that were never sent"
    );
    let twice: Vec<_> = acked.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "acked more than once: {twice:?}");
    assert_eq!(acked.len(), all.len(), "not every value was acked");

    // The killed consumer acked nothing of the batch it held, and the survivor got all of
    // it again with a later attempt, after the lease ran out.
    let held: Vec<&Taken> = doomed_log
        .taken
        .iter()
        .filter(|t| doomed_log.last_batch.contains(&t.number))
        .collect();
    assert!(!held.is_empty());
    let killed_us = now_us() - killed_at.elapsed().as_micros();
    let mut gap_us = u128::MAX;
    for h in &held {
        assert!(
            !doomed_log.acked.contains(&h.number),
            "a held delivery was acked: {h:?}"
        );
        for v in &h.values {
            // A key's values may come back split over deliveries, if a batch is full.
            let again = survivor_log
                .taken
                .iter()
                .find(|t| t.key == h.key && t.values.contains(v) && t.at_us > h.at_us)
                .unwrap_or_else(|| panic!("the survivor never got {v:?} of the held {h:?}"));
            assert!(
                again.attempt > h.attempt,
                "{v:?} of held {h:?} came again with attempt {}",
                again.attempt
            );
            assert!(
                again.at_us >= killed_us,
                "{v:?} of held {h:?} came again before its holder was killed: {again:?}"
            );
            gap_us = gap_us.min(again.at_us - killed_us);
        }
    }

    // Within each key, the acked values of each producer come in sequence order. A key's
    // deliveries follow one another (the next is taken only once the last is decided), so
    // the times they were taken put them in order.
    let mut by_key: BTreeMap<u32, Vec<&Taken>> = BTreeMap::new();
    for log in [&doomed_log, &survivor_log] {
        for t in log.taken.iter().filter(|t| log.acked.contains(&t.number)) {
            by_key.entry(t.key).or_default().push(t);
        }
    }
    for (key, mut takes) in by_key {
        takes.sort_by_key(|t| t.at_us);
        let mut last: HashMap<u8, u32> = HashMap::new();
        for t in &takes {
            for (p, s) in &t.values {
                if let Some(prev) = last.insert(*p, *s) {
                    assert!(
                        prev < *s,
                        "key {key}: producer {p}'s {s} was acked after its {prev} \
                         (consumer {}, delivery {})",
                        t.consumer,
                        t.number
                    );
                }
            }
        }
    }

    eprintln!(
        "procs: killed after {killed_after:?}, producers done after {sent_after:?}, \
         drained after {drained_after:?}, all over after {:?}; {} held deliveries ({} values) \
         redelivered, the first {:?} after the kill; consumer 1 took {} deliveries, \
         consumer 2 took {}",
        started.elapsed(),
        held.len(),
        held.iter().map(|h| h.values.len()).sum::<usize>(),
        Duration::from_micros(gap_us as u64),
        doomed_log.taken.len(),
        survivor_log.taken.len(),
    );
}
