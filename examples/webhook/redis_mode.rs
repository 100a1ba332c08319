//! Batched mode with its queue in Redis (`--redis URL`, feature `redis`), across two
//! processes: this one, the parent, which runs the customers' server, and a worker it starts.
//! Each runs half of the `--producers`, which send into one `keyed_batch::redis` queue, and
//! `--consumers` consumers, which take customers' deliveries from it, POST them to the
//! parent's server, and ack them, or retry them after the backoff, as the in-memory consumers
//! do.
//!
//! The parent starts the worker with `--worker`, the queue's name, the server's port and the
//! zero of its events' clock, and reads the worker's stdout: the worker says there, each time
//! on one line that starts with [`PREFIX`], when its producers are done and when its
//! consumers are. Once the producers of both processes are done, the parent closes the queue:
//! what is pending is due at once, and each process's stream of batches ends once everything
//! is delivered. The parent holds the worker's stdin until the worker exits: should the
//! parent die, the worker sees its stdin end and quits.
//!
//! A closed queue stays closed under its name, so each run makes a new one,
//! `webhook-<pid>-<µs since the epoch>`. Redis delivers at least once: a delivery whose lease
//! ran out (its holder died or stalled for the 30 s lease) goes out again, and the server
//! would count its events twice. In a healthy run none does.

use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use keyed_batch::redis::{Builder, Receiver, SendError, Sender};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::report::{CpuTime, ProcessFigures};
use super::support::{self, Stop};
use super::{count_dead, deliver, produce, Client, Event, Options, Produced, Share, Sink};

/// What starts each line the worker writes for its parent; the rest is a JSON [`Message`].
/// Other lines are not the parent's: a test harness that runs the worker writes its own.
const PREFIX: &str = "webhook worker: ";

/// How long a process waits before it tries Redis again after an error.
const RETRY: Duration = Duration::from_secs(1);

/// A line from the worker to its parent.
#[derive(Serialize, Deserialize)]
enum Message {
    /// Its producers are done.
    Produced { events: u64, seconds: f64 },
    /// Its consumers are done: the queue is closed and everything delivered.
    Done {
        figures: ProcessFigures,
        /// The most failed POSTs any event it delivered went through.
        max_event_failures: u32,
        /// The dead letters it took.
        dead_letters: u64,
    },
}

// ===== the parent =====

/// Batched mode through the queue in Redis at `url`: starts the worker, runs this process's
/// producers and consumers, closes the queue once both processes' producers are done, and
/// returns the events of both, with each process's figures. The worker's dead letters and
/// failures go into `client`'s tally, beside this process's.
pub(super) async fn run_batched(
    options: &Options,
    url: &str,
    client: &Client,
    server_port: u16,
    stop: &Stop,
) -> Produced {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let name = format!("webhook-{}-{}", std::process::id(), since_epoch.as_micros());
    // Opened before the worker starts: a URL that does not work fails here, once.
    let (tx, rx) = open(&builder(options, url, &name), "").await;
    let mut worker = Worker::start(options, server_port, &name);

    let consumers = Consumers::start(options, &rx, client);
    let share = Share { index: 0, of: 2 };
    let mut produced = produce(options, stop, share, |_| Sink::Redis(tx.clone())).await;
    let (worker_events, worker_seconds) = worker.produced().await;

    // Both processes' producers are done. Closing the queue makes everything pending due at
    // once, the retries held for their backoff included. The streams of both processes end
    // once every delivery has been acked or dead-lettered, and so do the consumers.
    if let Err(err) = tx.close().await {
        fail(format!("cannot close the queue {name:?} in Redis: {err}"));
    }
    let here = consumers.finish().await;
    let (there, max_event_failures, dead_letters) = worker.done().await;
    client.delivered(max_event_failures);
    client.dead(dead_letters as usize);

    let parent = ProcessFigures {
        events_produced: produced.events,
        ..here
    };
    produced.events += worker_events;
    produced.seconds = produced.seconds.max(worker_seconds);
    produced.processes = Some([parent, there]);
    produced
}

/// The worker process, as its parent sees it.
struct Worker {
    /// The worker; `None` once it has exited.
    child: Option<Child>,
    /// Held until the worker has exited: the worker quits when it ends.
    stdin: Option<ChildStdin>,
    /// The worker's lines for its parent, read from its stdout by a thread.
    messages: mpsc::UnboundedReceiver<Message>,
}

impl Worker {
    /// Starts the worker with `options.worker_command`; its stderr is this process's.
    fn start(options: &Options, server_port: u16, queue: &str) -> Worker {
        let args = options.worker_args(server_port, queue, support::clock_zero());
        let mut command = (options.worker_command)(&args);
        command.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| fail(format!("cannot start the worker process: {err}")));
        let stdout = child.stdout.take().expect("piped");
        let (tx, messages) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Some(at) = line.find(PREFIX) else {
                    continue;
                };
                match serde_json::from_str(&line[at + PREFIX.len()..]) {
                    Ok(message) => {
                        let _ = tx.send(message);
                    }
                    Err(err) => eprintln!("error: a line from the worker does not read: {err}"),
                }
            }
        });
        Worker {
            stdin: child.stdin.take(),
            child: Some(child),
            messages,
        }
    }

    /// Waits until the worker's producers are done: the events they made, and how long it
    /// took them.
    async fn produced(&mut self) -> (u64, f64) {
        match self.messages.recv().await {
            Some(Message::Produced { events, seconds }) => (events, seconds),
            _ => self.ended_early().await,
        }
    }

    /// Waits until the worker is done, and has exited: its figures, the most failures an
    /// event it delivered went through, and its dead letters.
    async fn done(mut self) -> (ProcessFigures, u32, u64) {
        let Some(Message::Done {
            figures,
            max_event_failures,
            dead_letters,
        }) = self.messages.recv().await
        else {
            self.ended_early().await
        };
        let status = self.wait().await;
        if !status.success() {
            fail(format!("the worker process failed ({status})"));
        }
        (figures, max_event_failures, dead_letters)
    }

    async fn ended_early(&mut self) -> ! {
        let status = self.wait().await;
        fail(format!(
            "the worker process ended early ({status}); its errors, if any, are above"
        ))
    }

    /// Waits for the worker to exit, then lets its stdin go.
    async fn wait(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("waited for once");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("the wait does not panic");
        drop(self.stdin.take());
        status.unwrap_or_else(|err| fail(format!("cannot wait for the worker process: {err}")))
    }
}

// ===== the worker =====

/// The worker process: takes its parent's clock, runs the producers the parent does not
/// and `--consumers` consumers, POSTing to the parent's server, and tells its parent when
/// the producers are done and when the consumers are.
pub async fn run_worker(options: &Options) {
    let missing = "the parent passes it with --worker";
    let zero = options.clock_zero.expect(missing);
    assert!(
        support::clock_from(zero),
        "the events' clock was read before the worker set it"
    );
    std::thread::spawn(|| {
        // Nothing comes on stdin: it ends when the parent is gone, however it went.
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        eprintln!("{PREFIX}the parent process is gone; quitting");
        std::process::exit(1);
    });
    let cpu = CpuTime::start();
    let stop = Stop::on_ctrl_c();
    let server = SocketAddr::from((Ipv4Addr::LOCALHOST, options.server_port.expect(missing)));
    let client = Client::new(server, options);
    let url = options.redis.as_deref().expect(missing);
    let name = options.queue.as_deref().expect(missing);
    let (tx, rx) = open(&builder(options, url, name), "the worker ").await;

    let consumers = Consumers::start(options, &rx, &client);
    let share = Share { index: 1, of: 2 };
    let produced = produce(options, &stop, share, |_| Sink::Redis(tx.clone())).await;
    tell(&Message::Produced {
        events: produced.events,
        seconds: produced.seconds,
    });
    // The parent closes the queue once its own producers are done too.
    let here = consumers.finish().await;
    tell(&Message::Done {
        figures: ProcessFigures {
            events_produced: produced.events,
            cpu_seconds: cpu.seconds(),
            ..here
        },
        max_event_failures: client.max_failures(),
        dead_letters: client.dead_letters(),
    });
}

/// Writes a line for the parent. A line on stdout goes out whole: Rust's stdout is line
/// buffered.
fn tell(message: &Message) {
    let json = serde_json::to_string(message).expect("plain data");
    println!("{PREFIX}{json}");
}

// ===== both =====

/// The queue's builder, with the options the in-memory channel takes.
fn builder(options: &Options, url: &str, name: &str) -> Builder {
    let mut builder = Builder::new(url, name, options.window);
    if let Some(n) = options.max_batch {
        builder = builder.max_batch(n);
    }
    if let Some(n) = options.capacity {
        builder = builder.capacity(n as u64);
    }
    if options.max_attempts > 0 {
        builder = builder.max_attempts(options.max_attempts);
    }
    builder
}

/// Opens the queue for sending and for receiving; `who` names the process in the error.
async fn open(builder: &Builder, who: &str) -> (Sender<u32, Event>, Receiver<u32, Event>) {
    let opened = async { Ok((builder.sender().await?, builder.receiver().await?)) };
    opened
        .await
        .unwrap_or_else(|err: keyed_batch::redis::Error| {
            fail(format!("{who}cannot open the queue in Redis: {err}"))
        })
}

/// Sends an event, trying again while Redis cannot be reached.
pub(super) async fn send(tx: &Sender<u32, Event>, customer: u32, event: Event) {
    let mut sent = tx.send(customer, event).await;
    while let Err(err) = sent {
        match err {
            SendError::Failed {
                value: (customer, event),
                error,
            } => {
                // A send whose reply was lost may be in the queue already: the server would
                // count its event twice.
                eprintln!("warning: a send to Redis failed, trying again in 1 s: {error}");
                sleep(RETRY).await;
                sent = tx.send(customer, event).await;
            }
            _ => unreachable!("the queue closes after the producers"),
        }
    }
}

/// A process's consumers and its dead-letter counter, with their tally of what got in.
struct Consumers {
    tasks: Vec<JoinHandle<()>>,
    dead: JoinHandle<()>,
    tally: Arc<Tally>,
}

/// The POSTs of a process's consumers that got in, and the events in them.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    events: AtomicU64,
}

impl Consumers {
    fn start(options: &Options, rx: &Receiver<u32, Event>, client: &Client) -> Consumers {
        let tally = Arc::new(Tally::default());
        let tasks = (0..options.consumers)
            .map(|_| tokio::spawn(consume(rx.clone(), client.clone(), tally.clone())))
            .collect();
        Consumers {
            tasks,
            dead: tokio::spawn(count_dead(rx.dead_letters(), client.clone())),
            tally,
        }
    }

    /// Waits until the queue is closed, empty and nothing is in flight; returns what this
    /// process's consumers delivered.
    async fn finish(self) -> ProcessFigures {
        for task in self.tasks {
            task.await.expect("consumer panicked");
        }
        self.dead.await.expect("dead-letter counter panicked");
        ProcessFigures {
            requests_delivered: self.tally.requests.load(Ordering::Relaxed),
            events_delivered: self.tally.events.load(Ordering::Relaxed),
            ..ProcessFigures::default()
        }
    }
}

/// One consumer: takes batches from Redis and POSTs each customer's events in one request,
/// as the in-memory consumer does. Ends when the queue is closed and everything delivered.
async fn consume(mut rx: Receiver<u32, Event>, client: Client, tally: Arc<Tally>) {
    loop {
        let batch = match rx.recv().await {
            Ok(Some(batch)) => batch,
            Ok(None) => return,
            Err(err) => {
                eprintln!("warning: cannot take a batch from Redis, trying again in 1 s: {err}");
                sleep(RETRY).await;
                continue;
            }
        };
        let delivered = join_all(batch.into_iter().map(|delivery| deliver(&client, delivery)));
        for (events, decided) in delivered.await {
            if events > 0 {
                tally.requests.fetch_add(1, Ordering::Relaxed);
                tally.events.fetch_add(events as u64, Ordering::Relaxed);
            }
            if let Err(err) = decided {
                // The lease ran out, or Redis could not be reached: the delivery goes out
                // again, and if its POST got in, the server counts its events twice.
                eprintln!("warning: a decision did not reach Redis: {err}");
            }
        }
    }
}

/// Says what went wrong and quits.
fn fail(what: String) -> ! {
    eprintln!("error: {what}");
    std::process::exit(1)
}
