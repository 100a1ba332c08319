//! Child processes: the parent starts one per run, and a child runs one variant through one
//! scenario and prints what it measured.

use std::env;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::consumers::Json;
use crate::measure::{cpu_ns, proc_status_kb, IDLE_AFTER_SENT_NS};
use crate::plan::{Workload, ZIPF_EXPONENT};
use crate::variants::{self, LATENESS};
use crate::verify::{LatenessSink, Verifier};
use crate::workload::{Burst, Keys, Paced, Zipf, INDEX_BITS};

/// The flag that makes this binary a throughput child.
pub(crate) const THROUGHPUT_FLAG: &str = "--child";
/// The flag that makes this binary a lateness child.
pub(crate) const LATENESS_FLAG: &str = "--lateness-child";
/// What starts the line a child prints its result on.
const RESULT: &str = "RESULT ";

/// What a throughput child measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub(crate) struct RunResult {
    pub(crate) ns_per_value: f64,
    pub(crate) cpu_ns_per_value: f64,
    pub(crate) values_per_delivery: f64,
    pub(crate) peak_rss_mb: f64,
    pub(crate) rss_end_mb: f64,
}

/// What a lateness child measured: the spread of lateness over its deliveries.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub(crate) struct LatenessResult {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    pub(crate) early: u64,
    pub(crate) deliveries: u64,
}

// ===== in the child =====

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn arg<T: std::str::FromStr>(args: &[String], at: usize, what: &str) -> T {
    args.get(at)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("child argument {at} ({what}) missing or bad: {args:?}"))
}

/// Runs one variant through one throughput scenario.
/// Arguments: variant window_ms producers keys values [workload, `uniform` if left out].
pub(crate) fn throughput(args: &[String]) -> RunResult {
    let variant: String = arg(args, 0, "variant");
    let window = Duration::from_millis(arg(args, 1, "window_ms"));
    let producers: u64 = arg(args, 2, "producers");
    let keys: u64 = arg(args, 3, "keys");
    let values: u64 = arg(args, 4, "values");
    let workload = args.get(5).map_or(Workload::Uniform, |w| {
        Workload::from_arg(w).unwrap_or_else(|| panic!("unknown workload {w}"))
    });
    let limit = Duration::from_secs(60) + Duration::from_micros(20 * values);

    let rt = runtime();
    // The zipf tables are built here, before the clock starts.
    let keys = match workload {
        Workload::Uniform => Keys::Uniform(keys),
        Workload::Zipf => Keys::Zipf(Arc::new(Zipf::new(keys, ZIPF_EXPONENT))),
    };
    let sink = Verifier::new(keys.clone(), values);
    let load = Burst {
        producers,
        values,
        keys,
    };
    let cpu_before = cpu_ns();
    let start = Instant::now();
    let sink = match workload {
        Workload::Uniform => rt.block_on(variants::run_throughput(
            &variant, window, load, sink, limit,
        )),
        Workload::Zipf => {
            let sink = Json(sink);
            rt.block_on(variants::run::<String, _>(
                &variant, window, load, sink, limit,
            ))
            .0
        }
    };
    // Once everything is sent, a windowed consumer sits waiting for the last deadlines:
    // that wait is the workload's, not the channel's cost, and it would swamp short runs.
    let idle = Duration::from_nanos(IDLE_AFTER_SENT_NS.load(Relaxed));
    let elapsed = start.elapsed().saturating_sub(idle);
    let cpu = cpu_ns() - cpu_before;
    sink.finish();
    RunResult {
        ns_per_value: elapsed.as_nanos() as f64 / values as f64,
        cpu_ns_per_value: cpu as f64 / values as f64,
        values_per_delivery: values as f64 / sink.deliveries as f64,
        peak_rss_mb: proc_status_kb("VmHWM") as f64 / 1024.0,
        rss_end_mb: sink.rss_end_kb as f64 / 1024.0,
    }
}

/// Runs one variant through the lateness scenario.
/// Arguments: variant keys rate_per_s millis window_ms.
pub(crate) fn lateness(args: &[String]) -> LatenessResult {
    let variant: String = arg(args, 0, "variant");
    assert!(
        LATENESS.contains(&variant.as_str()),
        "unknown lateness variant {variant}"
    );
    let keys: u64 = arg(args, 1, "keys");
    let rate: u64 = arg(args, 2, "rate");
    let millis: u64 = arg(args, 3, "millis");
    let window = Duration::from_millis(arg(args, 4, "window_ms"));
    let total = rate * millis / 1000;
    assert!(total < 1 << INDEX_BITS, "too many values for the encoding");
    let limit = Duration::from_millis(millis) + Duration::from_secs(30);

    let rt = runtime();
    let base = Instant::now();
    let sink = LatenessSink {
        verifier: Verifier::new(Keys::Uniform(keys), total),
        base,
        window_ns: window.as_nanos() as i64,
        lateness_ns: Vec::with_capacity(total as usize),
    };
    let load = Paced {
        total,
        rate,
        keys,
        base,
    };
    let sink = rt.block_on(variants::run(&variant, window, load, sink, limit));
    sink.verifier.finish();
    let mut lateness = sink.lateness_ns;
    lateness.sort_unstable();
    let pick = |q: f64| {
        let at = ((lateness.len() as f64 * q).ceil() as usize).clamp(1, lateness.len()) - 1;
        lateness[at] as f64 / 1000.0
    };
    LatenessResult {
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        max_us: pick(1.0),
        early: lateness.iter().filter(|&&l| l < 0).count() as u64,
        deliveries: lateness.len() as u64,
    }
}

/// Prints `result` on the line [`run`] reads.
pub(crate) fn reply(result: &impl Serialize) {
    println!(
        "{RESULT}{}",
        serde_json::to_string(result).expect("serializable")
    );
}

// ===== in the parent =====

/// Runs this binary again with `flag` and `args`, and reads back the result it printed.
pub(crate) fn run<T: DeserializeOwned>(flag: &str, args: &[String]) -> T {
    let exe = env::current_exe().expect("own path");
    let out = Command::new(exe)
        .arg(flag)
        .args(args)
        .output()
        .expect("child started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "child {flag} {args:?} failed ({}):\n{}\n{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .unwrap_or_else(|| panic!("child {flag} {args:?} printed no result:\n{stdout}"));
    serde_json::from_str(line).expect("child result")
}
