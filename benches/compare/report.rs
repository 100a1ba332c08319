//! The figures (medians over rounds, ratios within a round) and the report they make:
//! the markdown on stdout and what `compare.json` holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::child::RunResult;
pub(crate) use crate::common::median;
use crate::plan::{Plan, Scenario, Workload, LATENESS_RATE, LATENESS_WINDOW_MS};

/// The variants the README's table shows; `timed_acked` is in the full table.
const README_COLUMNS: [&str; 7] = [
    "mpsc",
    "diy_delayqueue",
    "diy_exact",
    "origin_port",
    "timed",
    "ordered",
    "diy_binaryheap",
];

/// `x` rounded to two decimal places.
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Every run of one scenario: variant -> one result per round.
pub(crate) type Runs = BTreeMap<&'static str, Vec<RunResult>>;

/// One scenario and every run of it so far.
pub(crate) struct ScenarioRuns {
    pub(crate) scenario: Scenario,
    pub(crate) runs: Runs,
}

impl ScenarioRuns {
    pub(crate) fn has(&self, variant: &str) -> bool {
        self.runs.contains_key(variant)
    }

    /// The median over rounds of one figure of `variant`'s runs.
    pub(crate) fn figure(&self, variant: &str, f: impl Fn(&RunResult) -> f64) -> f64 {
        median(&self.runs[variant].iter().map(f).collect::<Vec<_>>())
    }

    /// The median over rounds of `a`'s ns/value over `b`'s in the same round.
    pub(crate) fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        self.ratio_of(a, b, |r| r.ns_per_value)
    }

    /// The same for CPU ns/value (every thread's CPU time): on two shared cores, four
    /// producers can make the wall figure say more about the scheduler than the work.
    pub(crate) fn cpu_ratio(&self, a: &str, b: &str) -> Option<f64> {
        self.ratio_of(a, b, |r| r.cpu_ns_per_value)
    }

    fn ratio_of(&self, a: &str, b: &str, f: impl Fn(&RunResult) -> f64) -> Option<f64> {
        let (ra, rb) = (self.runs.get(a)?, self.runs.get(b)?);
        let per_round: Vec<f64> = ra.iter().zip(rb).map(|(x, y)| f(x) / f(y)).collect();
        Some(median(&per_round))
    }

    /// The ratios `compare.json` gives for this scenario, each rounded to two places.
    fn ratios(&self) -> BTreeMap<String, f64> {
        let pairs = [
            ("timed", "mpsc"),
            ("timed", "diy_delayqueue"),
            ("timed", "diy_exact"),
            ("timed_acked", "timed"),
            ("diy_delayqueue", "mpsc"),
            ("diy_exact", "mpsc"),
            ("origin_port", "mpsc"),
            ("origin_port", "diy_delayqueue"),
            ("ordered", "mpsc"),
            ("ordered", "diy_binaryheap"),
            ("diy_binaryheap", "mpsc"),
        ];
        // Wall-clock ratios under `a/b`, CPU ratios under `cpu:a/b`.
        let wall = pairs
            .iter()
            .filter_map(|&(a, b)| Some((format!("{a}/{b}"), round2(self.ratio(a, b)?))));
        let cpu = pairs
            .iter()
            .filter_map(|&(a, b)| Some((format!("cpu:{a}/{b}"), round2(self.cpu_ratio(a, b)?))));
        wall.chain(cpu).collect()
    }
}

/// What `compare.json` holds.
#[derive(Serialize)]
pub(crate) struct Report {
    scenarios: Vec<ScenarioOut>,
    pub(crate) lateness: Vec<LatenessOut>,
}

impl Report {
    /// The medians and ratios of every scenario that ran, and the lateness figures.
    pub(crate) fn new(scenarios: &[ScenarioRuns], lateness: Vec<LatenessOut>) -> Report {
        Report {
            scenarios: scenarios
                .iter()
                .filter(|s| !s.runs.is_empty())
                .map(|s| ScenarioOut {
                    name: s.scenario.name(),
                    window_ms: s.scenario.window_ms,
                    producers: s.scenario.producers,
                    keys: s.scenario.keys,
                    results: s
                        .runs
                        .keys()
                        .map(|v| {
                            let out = VariantOut {
                                ns_per_value: round2(s.figure(v, |r| r.ns_per_value)),
                                cpu_ns_per_value: round2(s.figure(v, |r| r.cpu_ns_per_value)),
                                peak_rss_mb: round2(s.figure(v, |r| r.peak_rss_mb)),
                            };
                            (v.to_string(), out)
                        })
                        .collect(),
                    ratios: s.ratios(),
                })
                .collect(),
            lateness,
        }
    }
}

#[derive(Serialize)]
struct ScenarioOut {
    name: String,
    window_ms: u64,
    producers: u64,
    keys: u64,
    results: BTreeMap<String, VariantOut>,
    ratios: BTreeMap<String, f64>,
}

#[derive(Serialize)]
struct VariantOut {
    ns_per_value: f64,
    cpu_ns_per_value: f64,
    peak_rss_mb: f64,
}

/// The lateness figures of one variant at one key count: medians over rounds, the worst
/// max, and every early delivery.
#[derive(Serialize, Clone)]
pub(crate) struct LatenessOut {
    pub(crate) keys: u64,
    pub(crate) variant: String,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    pub(crate) early: u64,
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "".to_string(), |x| format!("{x:.2}"))
}

/// The report on stdout: every figure, the README table, lateness, and the targets.
pub(crate) fn markdown(md: &mut String, plan: &Plan, scenarios: &[ScenarioRuns], report: &Report) {
    let _ = writeln!(
        md,
        "## keyed-batch compare ({}: {} rounds, {} values a run, medians)\n",
        plan.label, plan.rounds, plan.values
    );
    let _ = writeln!(
        md,
        "| scenario | variant | ns/value | min–max | CPU ns/value | values/delivery | peak RSS MB | RSS end MB | ×mpsc | ×diy |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        for (variant, runs) in &s.runs {
            let ns: Vec<f64> = runs.iter().map(|r| r.ns_per_value).collect();
            let (lo, hi) = ns
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            // `ordered` against its hand-written twin; the rest against the DelayQueue one.
            let diy = match *variant {
                "ordered" => s.ratio(variant, "diy_binaryheap"),
                "timed" | "timed_acked" | "origin_port" => s.ratio(variant, "diy_delayqueue"),
                _ => None,
            };
            let vs_mpsc = (*variant != "mpsc")
                .then(|| s.ratio(variant, "mpsc"))
                .flatten();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0}–{:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} |",
                s.scenario.name(),
                variant,
                median(&ns),
                lo,
                hi,
                s.figure(variant, |r| r.cpu_ns_per_value),
                s.figure(variant, |r| r.values_per_delivery),
                s.figure(variant, |r| r.peak_rss_mb),
                s.figure(variant, |r| r.rss_end_mb),
                fmt_ratio(vs_mpsc),
                fmt_ratio(diy),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n×mpsc, ×diy: medians of per-round ratios of ns/value; ×diy is against \
         `diy_delayqueue` (`diy_binaryheap` for `ordered`)."
    );

    // The compact table the README shows: the three ratios, wall (CPU).
    let cols = README_COLUMNS;
    let _ = writeln!(md, "\n### README table: ns per value (medians)\n");
    let _ = writeln!(
        md,
        "| scenario | {} | timed/mpsc | timed/diy_delayqueue | timed/diy_exact | ordered/diy_binaryheap |",
        cols.join(" | ")
    );
    let _ = writeln!(md, "|---|{}--:|--:|--:|--:|", "--:|".repeat(cols.len()));
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        let mut row = format!("| {} |", s.scenario.name());
        for v in cols {
            if s.has(v) {
                let _ = write!(row, " {:.0} |", s.figure(v, |r| r.ns_per_value));
            } else {
                row.push_str(" – |");
            }
        }
        let both = |a, b| match (s.ratio(a, b), s.cpu_ratio(a, b)) {
            (Some(wall), Some(cpu)) => format!("{wall:.2} ({cpu:.2})"),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "{row} {} | {} | {} | {} |",
            both("timed", "mpsc"),
            both("timed", "diy_delayqueue"),
            both("timed", "diy_exact"),
            both("ordered", "diy_binaryheap"),
        );
    }
    let _ = writeln!(
        md,
        "\nRatios: wall-clock ns/value, and in brackets CPU ns/value, each the median of \
         per-round ratios."
    );

    if !report.lateness.is_empty() {
        let _ = writeln!(
            md,
            "\n### Lateness: window {LATENESS_WINDOW_MS} ms, {LATENESS_RATE} values/s for {:.1} s, one producer (µs, per delivered key)\n",
            plan.lateness_millis as f64 / 1000.0
        );
        let _ = writeln!(md, "| keys | variant | p50 | p99 | max | early |");
        let _ = writeln!(md, "|--:|---|--:|--:|--:|--:|");
        for l in &report.lateness {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {} |",
                l.keys, l.variant, l.p50_us, l.p99_us, l.max_us, l.early
            );
        }
    }

    targets(md, scenarios, &report.lateness);
}

/// Checks issue 13's targets against this run. Each ratio row gives the worst scenario's
/// wall-clock ratio, which the limit applies to, and its CPU ratio beside it; a row with no
/// limit reports a figure to read the targets by.
fn targets(md: &mut String, scenarios: &[ScenarioRuns], lateness: &[LatenessOut]) {
    type Pick<'a> = &'a dyn Fn(&ScenarioRuns) -> bool;
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut ratio_row = |label: &str, limit: Option<f64>, (a, b): (&str, &str), pick: Pick<'_>| {
        let worst = scenarios
            .iter()
            .filter(|s| pick(s))
            .filter_map(|s| Some((s.ratio(a, b)?, s)))
            .max_by(|x, y| x.0.total_cmp(&y.0));
        if let Some((x, s)) = worst {
            let cpu = s
                .cpu_ratio(a, b)
                .map_or_else(String::new, |c| format!("{c:.2}"));
            let (limit, ok) = match limit {
                Some(limit) => (format!("≤ {limit}"), met(x <= limit)),
                None => ("report".into(), "–"),
            };
            rows.push([
                format!("{label} (worst: {})", s.scenario.name()),
                limit,
                format!("{x:.2}"),
                cpu,
                ok.into(),
            ]);
        }
    };
    let uniform = |s: &ScenarioRuns| s.scenario.workload == Workload::Uniform;
    let at_1k = |s: &ScenarioRuns| uniform(s) && s.scenario.keys == 1_000;
    let at_1m = |s: &ScenarioRuns| uniform(s) && s.scenario.keys == 1_000_000;
    let zipf = |s: &ScenarioRuns| s.scenario.workload == Workload::Zipf;
    ratio_row(
        "timed/mpsc at 1,000 keys",
        Some(1.5),
        ("timed", "mpsc"),
        &at_1k,
    );
    // What the same promise costs by hand, against the same floor.
    ratio_row(
        "diy_exact/mpsc at 1,000 keys",
        None,
        ("diy_exact", "mpsc"),
        &at_1k,
    );
    ratio_row(
        "timed/diy_delayqueue at 1,000,000 keys",
        Some(0.5),
        ("timed", "diy_delayqueue"),
        &at_1m,
    );
    ratio_row(
        "stretch: timed/mpsc at 1,000,000 keys",
        Some(3.0),
        ("timed", "mpsc"),
        &at_1m,
    );
    ratio_row(
        "diy_exact/mpsc at 1,000,000 keys",
        None,
        ("diy_exact", "mpsc"),
        &at_1m,
    );
    ratio_row("timed/diy_exact", None, ("timed", "diy_exact"), &uniform);
    ratio_row(
        "ordered/diy_binaryheap",
        Some(1.0),
        ("ordered", "diy_binaryheap"),
        &uniform,
    );
    ratio_row(
        "stretch: ordered/diy_binaryheap",
        Some(0.7),
        ("ordered", "diy_binaryheap"),
        &uniform,
    );
    // Memory: with a zero window nothing waits, so the channel should hold little more than
    // mpsc does; with a window, what is pending is the job.
    let rss = |s: &ScenarioRuns, v: &str| s.figure(v, |r| r.peak_rss_mb);
    let worst_rss = scenarios
        .iter()
        .filter(|s| uniform(s) && s.scenario.window_ms == 0 && s.has("timed") && s.has("mpsc"))
        .map(|s| (rss(s, "timed") / rss(s, "mpsc"), s))
        .max_by(|x, y| x.0.total_cmp(&y.0));
    if let Some((x, s)) = worst_rss {
        rows.push([
            format!(
                "peak RSS timed/mpsc, window 0 (worst: {})",
                s.scenario.name()
            ),
            "≤ 1.3".into(),
            format!("{x:.2}"),
            String::new(),
            met(x <= 1.3).into(),
        ]);
    }
    // `zipf` is held to an earlier run of itself (no more than 5% slower), which one run
    // cannot check: it reports its ratios for the note to compare.
    for s in scenarios.iter().filter(|s| zipf(s) && s.has("timed")) {
        if let (Some(x), Some(c)) = (
            s.ratio("timed", "diy_delayqueue"),
            s.cpu_ratio("timed", "diy_delayqueue"),
        ) {
            rows.push([
                "zipf: timed/diy_delayqueue, ns/value".into(),
                "report".into(),
                format!("{x:.2}"),
                format!("{c:.2}"),
                "–".into(),
            ]);
        }
        if s.has("diy_delayqueue") {
            rows.push([
                "zipf: peak RSS timed/diy_delayqueue".into(),
                "report".into(),
                format!("{:.2}", rss(s, "timed") / rss(s, "diy_delayqueue")),
                String::new(),
                "–".into(),
            ]);
        }
    }
    for l in lateness.iter().filter(|l| l.variant == "timed") {
        let keys = l.keys;
        let us = "(µs)";
        let checks = [
            ("lateness p99", us, "≤ 2500", l.p99_us, l.p99_us <= 2500.0),
            ("lateness max", us, "≤ 5000", l.max_us, l.max_us <= 5000.0),
            ("early deliveries", "", "0", l.early as f64, l.early == 0),
        ];
        for (what, unit, limit, x, ok) in checks {
            rows.push([
                format!("timed {what}, {keys} keys {unit}")
                    .trim_end()
                    .to_string(),
                limit.into(),
                format!("{x:.0}"),
                String::new(),
                met(ok).into(),
            ]);
        }
    }
    let _ = writeln!(md, "\n### Targets\n");
    let _ = writeln!(md, "| target | limit | measured | CPU | met |");
    let _ = writeln!(md, "|---|--:|--:|--:|:-:|");
    for [label, limit, x, cpu, ok] in rows {
        let _ = writeln!(md, "| {label} | {limit} | {x} | {cpu} | {ok} |");
    }
}

fn met(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}
