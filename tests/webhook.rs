//! End to end: the `webhook` example, run short (2 s at 2,000 events/s, 100 customers, a
//! 500 ms window, 10% of requests failing, and in one run 10 customers down for the first
//! second).
//!
//! The example's source is compiled into this test with `#[path]`, and the tests call its
//! `run` function with parsed command-line options. That runs exactly the code that
//! `cargo run --example webhook` runs, without a second cargo invocation inside the test, and
//! the assertions read the same `Report` that the table and `--json` are made from.
//!
//! Unlike the rest of the suite, these tests use real time and real sockets: the point is a
//! real HTTP exchange, and paused time does not drive socket I/O. Each test runs one mode for
//! 2 s, side by side, so the file takes about 3 s (5 s where the tests run two at a time);
//! with the `durable` feature, one more test runs three times in a row, about 8 s.
//!
//! With the `redis` feature, one more test runs batched mode with `--redis`, against a
//! `redis-server` of its own: in two processes, this test and a second run of this test
//! binary (`redis_worker`) that stands in for the example's worker process.

// The example's `mod server;` and its other `mod` lines resolve beside `main.rs`, in
// `examples/webhook/`: a file loaded through `#[path]` owns its directory, as a `mod.rs` does.
#[path = "../examples/webhook/main.rs"]
#[allow(dead_code)] // the example's `main`, table and JSON output are not used here
mod webhook;

#[cfg(feature = "redis")]
#[path = "common/redis_server.rs"]
mod redis_server;

use clap::error::ErrorKind;
use clap::Parser as _;
use webhook::{Options, Report};

const CUSTOMERS: u64 = 100;
const WINDOW_MS: f64 = 500.0;
const BACKOFF_MS: f64 = 50.0;

/// Time a delivery may take beyond the window and the retry delays: waking the consumer,
/// the POST over loopback, and for a retry the release of the held key and another `recv`,
/// in a debug build on a busy machine. It is kept below the window, so a key that waited a
/// second window (a retry that is not due when its delay ends, say) still fails the test.
const SLACK_MS: f64 = 200.0;

/// The options of a short run of `mode`, with `extra` arguments after the common ones.
fn run_args(mode: &str, extra: &[&str]) -> Options {
    let common = [
        "--mode",
        mode,
        "--seconds",
        "2",
        "--rate",
        "2000",
        "--customers",
        "100",
        "--window",
        "500ms",
        "--fail-rate",
        "0.1",
        "--backoff",
        "50ms",
    ];
    let args: Vec<&str> = common.iter().chain(extra).copied().collect();
    parse(&args).expect("valid options").expect("not --help")
}

/// Parses the arguments after the program name as `main` does; `Ok(None)` for `--help`.
fn parse(args: &[&str]) -> Result<Option<Options>, clap::Error> {
    match Options::try_parse_from(std::iter::once("webhook").chain(args.iter().copied())) {
        Ok(options) => Ok(Some(options)),
        Err(err) if err.kind() == ErrorKind::DisplayHelp => Ok(None),
        Err(err) => Err(err),
    }
}

async fn run(mode: &str, extra: &[&str]) -> Report {
    let report = run_options(&run_args(mode, extra)).await;
    assert_eq!(report.mode, mode);
    // The failure path ran: 10% of some hundreds of requests failed.
    assert!(report.failed_requests > 0, "{report:#?}");
    report
}

/// Runs one mode with `options` and returns its report.
async fn run_options(options: &Options) -> Report {
    let mut reports = webhook::run(options).await;
    assert_eq!(reports.len(), 1, "one mode, one report");
    let report = reports.remove(0);
    // The producers make a fixed number of events: 4,000 at 2,000 events/s for 2 s.
    let events = options.events_per_producer() * u64::from(options.producers);
    assert_eq!(report.events_produced, events, "{report:#?}");
    report
}

/// Every event, those recovered from a `--durable` log included, got in exactly once, and
/// none was given up (there is no `--max-attempts`).
fn assert_exactly_once(report: &Report) {
    assert_eq!(
        report.events_received,
        report.events_produced + report.events_recovered,
        "{report:#?}"
    );
    assert_eq!(report.duplicate_events, 0, "{report:#?}");
    assert_eq!(report.dead_letters, 0, "{report:#?}");
}

/// Each customer got its events in order, and never two requests at once.
fn assert_in_order_one_at_a_time(report: &Report) {
    assert_eq!(report.out_of_order_events, 0, "{report:#?}");
    assert_eq!(report.overlapping_requests, 0, "{report:#?}");
}

/// Each customer got at most one request per window, plus one per failed request.
///
/// Each request carries one run of a customer's events. A run that neither a failure nor the
/// final close cut short lasts at least the window, and runs start only while the producers
/// run, so a customer has at most floor(S / window) + 1 of them (the + 1: runs are not
/// aligned with the start, and the close cuts the last one short). A failed request's events
/// are retried, which may make one more, short run.
fn assert_one_request_per_window(report: &Report) {
    let runs = (report.produce_seconds * 1000.0 / WINDOW_MS).floor() as u64 + 1;
    let most = CUSTOMERS * runs + report.failed_requests;
    assert!(
        report.http_requests <= most,
        "{} requests, at most {most} expected: {report:#?}",
        report.http_requests
    );
}

/// The total of the retry delays an event waits after `failures` failed POSTs: 50 ms,
/// doubling after each further failure, each delay capped at 2 s.
fn backoff_ms(failures: u32) -> f64 {
    (0..failures)
        .map(|i| (BACKOFF_MS * 2f64.powi(i as i32)).min(2_000.0))
        .sum()
}

/// Batched mode delivers every event exactly once despite the failures, no event waits
/// much longer than the window plus its retry delays, and a customer gets at most one request
/// per window plus one per failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched() {
    let report = run("batched", &[]).await;

    assert_exactly_once(&report);
    assert_in_order_one_at_a_time(&report);

    let bound = WINDOW_MS + backoff_ms(report.max_event_failures) + SLACK_MS;
    assert!(
        report.delay_max_ms <= bound,
        "max delay {} ms over {bound} ms: {report:#?}",
        report.delay_max_ms
    );

    assert_one_request_per_window(&report);
}

/// With 10 of the 100 customers down for the first second, and 10% of all requests failing
/// besides, batched mode still delivers every event exactly once, each customer's in order,
/// with at most one request in flight per customer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_down_customers() {
    let report = run("batched", &["--down-customers", "10"]).await;

    assert_exactly_once(&report);
    assert_in_order_one_at_a_time(&report);
    // The down period was felt: a down customer's first delivery (about 500 ms in) failed,
    // and so did its retries 50 and 150 ms later, all before the customer was up at 1 s.
    assert!(report.max_event_failures >= 3, "{report:#?}");
}

/// Direct mode makes one request per event, plus one per failed request (its retry), and
/// delivers every event exactly once. It does not keep a customer's events in order: a
/// failed event's retry comes after newer events that got in, which is what the server's
/// order check sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct() {
    let report = run("direct", &[]).await;

    assert_exactly_once(&report);
    assert_eq!(
        report.http_requests,
        report.events_produced + report.failed_requests,
        "{report:#?}"
    );
    assert!(report.out_of_order_events > 0, "{report:#?}");
}

/// With `--durable`, a run stopped as a crash would, once its producers are done and while
/// every customer is down, leaves all its events in the log. The next run delivers them with
/// its own, each exactly once and each customer's in order, and after that run's clean close
/// none of them comes back.
#[cfg(feature = "durable")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().to_str().expect("a UTF-8 path");
    // Every send waits for a sync of the log: 1,000 events, not 4,000, keep the runs short.
    let durable = ["--durable", dir, "--rate", "500"];

    let down = ["--down-customers", "100", "--down-for", "3600s"];
    let mut options = run_args("batched", &[&durable[..], &down].concat());
    options.abandon = true;
    let crashed = run_options(&options).await;
    assert_eq!(crashed.events_received, 0, "{crashed:#?}");
    assert_eq!(crashed.events_recovered, 0, "{crashed:#?}");

    let restarted = run("batched", &durable).await;
    assert_eq!(
        restarted.events_recovered, crashed.events_produced,
        "{restarted:#?}"
    );
    assert_exactly_once(&restarted);
    assert_in_order_one_at_a_time(&restarted);

    let again = run("batched", &durable).await;
    assert_eq!(again.events_recovered, 0, "{again:#?}");
    assert_exactly_once(&again);
}

/// The environment variable that hands `redis_worker` its command line, one argument a line.
#[cfg(feature = "redis")]
const WORKER_ENV: &str = "KEYED_BATCH_WEBHOOK_WORKER";

/// With `--redis`, batched mode runs in two processes, each with half the producers and its
/// own consumers, sharing one queue in Redis, and POSTs to the parent's server: every event
/// still gets in exactly once, each customer's in order and one request at a time, despite
/// the failures; both processes deliver, and batching holds across them: a customer gets
/// about one request per window, and no event waits a second window beyond its retries.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_processes() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let mut options = run_args("batched", &["--redis", &server.url()]);
    options.worker_command = worker_command;
    let report = run_options(&options).await;
    assert_eq!(report.mode, "batched");
    assert!(report.failed_requests > 0, "{report:#?}");

    assert_exactly_once(&report);
    assert_in_order_one_at_a_time(&report);

    // Each process made the events of its half of the producers, and delivered some.
    let [parent, worker] = report.processes.clone().expect("two processes' figures");
    let half = options.events_per_producer() * u64::from(options.producers / 2);
    assert_eq!(
        (parent.events_produced, worker.events_produced),
        (half, half)
    );
    assert!(parent.requests_delivered > 0, "{report:#?}");
    assert!(worker.requests_delivered > 0, "{report:#?}");
    // What the two processes' consumers got in is what the server took, none twice.
    assert_eq!(
        parent.events_delivered + worker.events_delivered,
        report.events_received,
        "{report:#?}"
    );
    assert_eq!(
        parent.requests_delivered + worker.requests_delivered,
        report.http_requests - report.failed_requests,
        "{report:#?}"
    );

    // Each step of a delivery through Redis is a round trip (the send, the pull, each
    // decision) among three busy processes: the slack is a whole window here, not
    // `SLACK_MS`. The median event still waits less than a window.
    let bound = WINDOW_MS + backoff_ms(report.max_event_failures) + WINDOW_MS;
    assert!(
        report.delay_max_ms <= bound,
        "max delay {} ms over {bound} ms: {report:#?}",
        report.delay_max_ms
    );
    assert!(report.delay_p50_ms < WINDOW_MS, "{report:#?}");
    // Batching held across the processes.
    assert_one_request_per_window(&report);
}

/// Starts `redis_worker`: this test binary again, its arguments in [`WORKER_ENV`].
#[cfg(feature = "redis")]
fn worker_command(args: &[String]) -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = std::process::Command::new(exe);
    command
        .args(["redis_worker", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads=1", "--quiet"])
        .env(WORKER_ENV, args.join("\n"));
    command
}

/// The worker process of `redis_two_processes`, which runs it with [`WORKER_ENV`] set.
#[cfg(feature = "redis")]
#[test]
#[ignore = "the worker process of redis_two_processes: that test runs it"]
fn redis_worker() {
    let args = std::env::var(WORKER_ENV).unwrap_or_else(|_| {
        panic!("redis_worker is redis_two_processes's worker: it runs it with {WORKER_ENV} set")
    });
    let args: Vec<&str> = args.lines().collect();
    let options = parse(&args)
        .expect("the parent's arguments")
        .expect("not --help");
    assert!(options.worker, "{args:?}");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(webhook::run_worker(&options));
}

/// The command line takes both `--name value` and `--name=value`, and refuses what it
/// cannot run.
#[test]
fn options() {
    let options = parse(&["--window=250ms", "--seconds", "1.5", "--max-batch", "7"])
        .unwrap()
        .unwrap();
    assert_eq!(options.window, std::time::Duration::from_millis(250));
    assert_eq!(options.seconds, std::time::Duration::from_millis(1500));
    assert_eq!(options.max_batch, Some(7));
    assert_eq!(options.capacity, None);
    assert_eq!((options.max_attempts, options.down_customers), (0, 0));
    assert_eq!(options.down_for(), std::time::Duration::from_millis(750));

    let options = parse(&["--max-attempts=3", "--down-customers=5", "--down-for=2s"])
        .unwrap()
        .unwrap();
    assert_eq!((options.max_attempts, options.down_customers), (3, 5));
    assert_eq!(options.down_for(), std::time::Duration::from_secs(2));

    assert!(parse(&["--help"]).unwrap().is_none());
    assert!(
        parse(&["--window", "2"]).is_err(),
        "a duration needs a unit"
    );
    assert!(
        parse(&["--fail-rate", "1"]).is_err(),
        "every retry would fail"
    );
    assert!(
        parse(&["--capacity", "0"]).is_err(),
        "the builder would panic"
    );
    assert!(parse(&["--mode", "sideways"]).is_err());
    assert!(parse(&["--rate"]).is_err(), "a missing value");

    // `--redis` needs the `redis` feature, and says so; the worker's command line, made
    // from the parent's options, parses back to the same workload.
    let redis = parse(&["--redis", "redis://127.0.0.1:6379/", "--window", "250ms"]);
    #[cfg(feature = "redis")]
    {
        let options = redis.unwrap().unwrap();
        assert_eq!(options.redis.as_deref(), Some("redis://127.0.0.1:6379/"));
        let args = options.worker_args(8080, "q", 42);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let worker = parse(&args).unwrap().unwrap();
        assert!(worker.worker);
        assert_eq!(worker.redis, options.redis);
        assert_eq!(worker.server_port, Some(8080));
        assert_eq!(worker.queue.as_deref(), Some("q"));
        assert_eq!(worker.clock_zero, Some(42));
        assert_eq!(worker.window, options.window);
        assert_eq!(worker.backoff, options.backoff);
        assert_eq!(worker.seconds, options.seconds);
        assert_eq!(worker.events_per_producer(), options.events_per_producer());
        assert!(
            parse(&["--worker"]).is_err(),
            "a worker needs its parent's options"
        );
    }
    #[cfg(not(feature = "redis"))]
    {
        let err = redis.unwrap_err().to_string();
        assert!(err.contains("--features redis"), "{err}");
    }

    // `--durable` needs the `durable` feature, and says so.
    let durable = parse(&["--durable", "/tmp/queue"]);
    if cfg!(feature = "durable") {
        let options = durable.unwrap().unwrap();
        assert_eq!(options.durable, Some("/tmp/queue".into()));
    } else {
        let err = durable.unwrap_err().to_string();
        assert!(err.contains("--features durable"), "{err}");
    }
}
