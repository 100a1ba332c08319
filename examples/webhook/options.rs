//! The command line: the options with their defaults and checks, the modes to run, and the
//! worker process's command line in a `--redis` run.

use std::path::PathBuf;
#[cfg(feature = "redis")]
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// The command line.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "webhook",
    override_usage = "cargo run --release --example webhook -- [OPTIONS]",
    about = "Pushes events to customers over HTTP: one request per event, against one request \
             per customer per window through keyed_batch::timed.",
    after_help = "Durations take a unit: 1s, 500ms, 2.5s.",
    // A repeated option takes its last value.
    args_override_self = true
)]
pub struct Options {
    /// Which way to deliver; compare runs both
    #[arg(long, value_enum, value_name = "MODE", default_value = "compare")]
    pub mode: ModeChoice,
    /// Same as --mode compare
    #[arg(long, overrides_with = "mode")]
    compare: bool,
    /// How long the producers run, in seconds
    #[arg(long, value_name = "S", default_value = "10", value_parser = seconds)]
    pub seconds: Duration,
    /// Events per second, all producers
    #[arg(long, value_name = "R", default_value = "20000", value_parser = positive)]
    pub rate: f64,
    /// Customers (HTTP endpoints)
    #[arg(long, value_name = "N", default_value = "1000", value_parser = at_least_one::<u32>)]
    pub customers: u32,
    /// Producer tasks
    #[arg(long, value_name = "P", default_value = "4", value_parser = at_least_one::<u32>)]
    pub producers: u32,
    /// Batched: longest wait for a customer
    #[arg(long, value_name = "D", default_value = "1s", value_parser = duration)]
    pub window: Duration,
    /// Batched: Builder::max_batch [default: off]
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_batch: Option<usize>,
    /// Batched: Builder::capacity [default: off]
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub capacity: Option<usize>,
    /// Batched: consumer tasks
    #[arg(long, value_name = "N", default_value = "4", value_parser = at_least_one::<usize>)]
    pub consumers: usize,
    /// Most requests in flight at once
    #[arg(long, value_name = "N", default_value = "64", value_parser = at_least_one::<usize>)]
    pub in_flight: usize,
    /// Share of requests answered with 503
    #[arg(long, value_name = "F", default_value = "0", value_parser = fail_rate)]
    pub fail_rate: f64,
    /// First retry delay; doubles, up to 2 s
    #[arg(long, value_name = "D", default_value = "100ms", value_parser = duration)]
    pub backoff: Duration,
    /// POSTs of an event before it is given up as a dead letter; 0: no limit
    #[arg(long, value_name = "N", default_value = "0")]
    pub max_attempts: u32,
    /// Customers 0 to N-1 answer 503 to every request for the first --down-for
    #[arg(long, value_name = "N", default_value = "0")]
    pub down_customers: u32,
    /// How long the --down-customers are down [default: half of --seconds]
    #[arg(long, value_name = "D", value_parser = duration)]
    down_for: Option<Duration>,
    /// Seed for customers and failures
    #[arg(long, value_name = "N", default_value = "1")]
    pub seed: u64,
    /// Batched: keep the channel in a log in DIR, and deliver what an earlier run left
    /// there (needs the durable feature)
    #[arg(long, value_name = "DIR", value_parser = durable_dir)]
    pub durable: Option<PathBuf>,
    /// Batched: keep the queue in Redis at URL, and deliver it from two processes, this one
    /// and a worker it starts, each with half the producers and --consumers consumers (needs
    /// the redis feature)
    #[arg(long, value_name = "URL", value_parser = redis_url, conflicts_with = "durable")]
    pub redis: Option<String>,
    /// Run as the worker process of a --redis run: the parent starts it with the options
    /// below and its own workload options.
    #[cfg(feature = "redis")]
    #[arg(long, hide = true, requires_all = ["redis", "server_port", "queue", "clock_zero"])]
    pub worker: bool,
    /// The worker's: the port of the customers' server, on 127.0.0.1.
    #[cfg(feature = "redis")]
    #[arg(long, hide = true, value_name = "PORT")]
    pub server_port: Option<u16>,
    /// The worker's: the name of the queue in Redis.
    #[cfg(feature = "redis")]
    #[arg(long, hide = true, value_name = "NAME")]
    pub queue: Option<String>,
    /// The worker's: when the parent's events' clock read 0, in µs since the Unix epoch.
    #[cfg(feature = "redis")]
    #[arg(long, hide = true, value_name = "US")]
    pub clock_zero: Option<u64>,
    /// Also write the figures as JSON
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Whether to draw a progress bar on stderr. Not an option: `main` sets it where stdout
    /// and stderr are terminals, and it stays off in the tests.
    #[arg(skip)]
    pub progress: bool,
    /// Whether batched mode stops once its producers are done, dropping the channel with
    /// everything still pending, as a crash would. Not an option: a test sets it, to stop a
    /// `--durable` run in the middle without killing the process.
    #[arg(skip)]
    pub abandon: bool,
    /// How a `--redis` run starts its worker process, given the worker's arguments. Not an
    /// option: this program by default; the test runs itself instead.
    #[cfg(feature = "redis")]
    #[arg(skip = worker_command as WorkerCommand)]
    pub worker_command: WorkerCommand,
}

/// Makes the command that starts a worker process with the given arguments.
#[cfg(feature = "redis")]
pub type WorkerCommand = fn(&[String]) -> Command;

/// This program again, with the worker's arguments.
#[cfg(feature = "redis")]
fn worker_command(args: &[String]) -> Command {
    // Should the path be unknown, the spawn fails and says so.
    let exe = std::env::current_exe().unwrap_or_default();
    let mut command = Command::new(exe);
    command.args(args);
    command
}

/// What `--mode` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeChoice {
    Direct,
    Batched,
    Compare,
}

/// One way to deliver: a row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Direct,
    Batched,
}

impl Options {
    /// The modes to run, in order. `--compare` and `--mode` override each other, the last one
    /// given wins.
    pub fn modes(&self) -> &'static [Mode] {
        let choice = if self.compare {
            ModeChoice::Compare
        } else {
            self.mode
        };
        match choice {
            ModeChoice::Direct => &[Mode::Direct],
            ModeChoice::Batched => &[Mode::Batched],
            ModeChoice::Compare => &[Mode::Direct, Mode::Batched],
        }
    }

    /// Each producer's share of `--rate`, in events per second.
    pub fn producer_rate(&self) -> f64 {
        self.rate / f64::from(self.producers)
    }

    /// How many events each producer makes: a fixed number, the last of them due at
    /// `--seconds`.
    pub fn events_per_producer(&self) -> u64 {
        (self.producer_rate() * self.seconds.as_secs_f64()).round() as u64
    }

    /// How long the `--down-customers` are down from the start.
    pub fn down_for(&self) -> Duration {
        self.down_for.unwrap_or(self.seconds / 2)
    }

    /// The command line of a `--redis` run's worker process: `--worker` with the queue, the
    /// server's port and the events' clock, then the options its producers, consumers and
    /// client follow. The server's options (`--fail-rate`, `--down-customers`) stay here:
    /// the worker POSTs to this process's server.
    #[cfg(feature = "redis")]
    pub fn worker_args(&self, server_port: u16, queue: &str, clock_zero: u64) -> Vec<String> {
        let url = self.redis.as_deref().expect("a --redis run");
        let duration = |d: Duration| format!("{}s", d.as_secs_f64());
        let mut args = vec![
            "--worker".to_string(),
            format!("--redis={url}"),
            format!("--server-port={server_port}"),
            format!("--queue={queue}"),
            format!("--clock-zero={clock_zero}"),
            format!("--seconds={}", self.seconds.as_secs_f64()),
            format!("--rate={}", self.rate),
            format!("--customers={}", self.customers),
            format!("--producers={}", self.producers),
            format!("--window={}", duration(self.window)),
            format!("--consumers={}", self.consumers),
            format!("--in-flight={}", self.in_flight),
            format!("--backoff={}", duration(self.backoff)),
            format!("--max-attempts={}", self.max_attempts),
            format!("--seed={}", self.seed),
        ];
        if let Some(n) = self.max_batch {
            args.push(format!("--max-batch={n}"));
        }
        if let Some(n) = self.capacity {
            args.push(format!("--capacity={n}"));
        }
        args
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Batched => "batched",
        }
    }
}

fn number<T: FromStr>(value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{value:?} is not a valid number"))
}

/// A count that must be at least 1 (a builder would panic on 0, a run would make nothing).
fn at_least_one<T: FromStr + PartialOrd + From<u8>>(value: &str) -> Result<T, String> {
    let n: T = number(value)?;
    if n < T::from(1) {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

fn positive(value: &str) -> Result<f64, String> {
    let x: f64 = number(value)?;
    if !(x > 0.0 && x.is_finite()) {
        return Err("must be a positive number".into());
    }
    Ok(x)
}

fn fail_rate(value: &str) -> Result<f64, String> {
    let x: f64 = number(value)?;
    // A rate of 1 would fail every retry too, and the program would never finish.
    if !(0.0..1.0).contains(&x) {
        return Err("must be at least 0 and below 1".into());
    }
    Ok(x)
}

/// `--seconds`: a plain number of seconds.
fn seconds(value: &str) -> Result<Duration, String> {
    let seconds: f64 = number(value)?;
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{seconds} is not a duration"))
}

/// `--durable`: a directory, where the example was built with the `durable` feature.
fn durable_dir(value: &str) -> Result<PathBuf, String> {
    if cfg!(feature = "durable") {
        Ok(PathBuf::from(value))
    } else {
        Err(
            "needs the durable feature: cargo run --release --features durable --example \
             webhook -- ..."
                .into(),
        )
    }
}

/// `--redis`: a URL, where the example was built with the `redis` feature; the queue checks
/// it when it opens.
fn redis_url(value: &str) -> Result<String, String> {
    if cfg!(feature = "redis") {
        Ok(value.to_string())
    } else {
        Err(
            "needs the redis feature: cargo run --release --features redis --example webhook \
             -- --redis ..."
                .into(),
        )
    }
}

/// A duration with a unit: 1s, 500ms, 2.5s.
fn duration(value: &str) -> Result<Duration, String> {
    let (digits, unit) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(format!("{value:?} needs a unit (ms or s)"));
    };
    let seconds: f64 = number(digits)?;
    Duration::try_from_secs_f64(seconds * unit).map_err(|_| format!("{value:?} is not a duration"))
}
