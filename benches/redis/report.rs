//! What the tables share: a run and its costs, keyed-batch against plain Redis over
//! rounds, percentiles, the machine, and the summary table.

use std::fmt::Write as _;

pub(crate) use crate::common::median;
use crate::probe::Usage;

/// One timed run of one side.
#[derive(Clone)]
pub(crate) struct Run {
    pub(crate) values: u64,
    pub(crate) secs: f64,
    pub(crate) usage: Usage,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.values as f64 / self.secs
    }

    /// CPU µs per value, server and client.
    fn cpu_per_value(&self) -> (f64, f64) {
        let per = |s: f64| s * 1e6 / self.values.max(1) as f64;
        (per(self.usage.server_cpu), per(self.usage.client_cpu))
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "values": self.values,
            "secs": self.secs,
            "values_per_s": self.rate(),
            "usage": self.usage.json(),
        })
    }
}

/// keyed-batch against plain Redis, for one row of a figure, over every round.
pub(crate) struct Pair {
    pub(crate) keyed: Vec<Run>,
    pub(crate) plain: Vec<Run>,
}

impl Pair {
    pub(crate) fn new() -> Pair {
        Pair {
            keyed: Vec::new(),
            plain: Vec::new(),
        }
    }

    /// Runs both sides once, in `round`, with `run(keyed_side)`: the side that goes first
    /// swaps from round to round.
    pub(crate) fn round(&mut self, round: usize, mut run: impl FnMut(bool) -> Run) {
        for side in 0..2 {
            let keyed_side = (side + round) % 2 == 0;
            let done = run(keyed_side);
            match keyed_side {
                true => self.keyed.push(done),
                false => self.plain.push(done),
            }
        }
    }

    /// The median over rounds of a side's values/s.
    pub(crate) fn rate(runs: &[Run]) -> f64 {
        median(&runs.iter().map(Run::rate).collect::<Vec<_>>())
    }

    /// keyed-batch's values/s over plain Redis's, in each round.
    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.keyed
            .iter()
            .zip(&self.plain)
            .map(|(k, p)| k.rate() / p.rate())
            .collect()
    }

    /// The median over rounds of the ratio.
    pub(crate) fn ratio(&self) -> f64 {
        median(&self.ratios())
    }

    /// Median CPU µs per value of a side: (server, client).
    pub(crate) fn cpu(runs: &[Run]) -> (f64, f64) {
        let (server, client): (Vec<f64>, Vec<f64>) = runs.iter().map(Run::cpu_per_value).unzip();
        (median(&server), median(&client))
    }

    /// Values per call of `command` on a side, over every round: how many values a
    /// round trip carries.
    pub(crate) fn per_call(runs: &[Run], command: &str) -> f64 {
        let values: u64 = runs.iter().map(|r| r.values).sum();
        let calls: u64 = runs.iter().map(|r| r.usage.calls(command)).sum();
        values as f64 / calls.max(1) as f64
    }

    /// The server's µs in `command` per value on a side, over every round.
    pub(crate) fn usec_per_value(runs: &[Run], command: &str) -> f64 {
        let values: u64 = runs.iter().map(|r| r.values).sum();
        let usec: u64 = runs.iter().map(|r| r.usage.usec(command)).sum();
        usec as f64 / values.max(1) as f64
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "keyed_values_per_s": Pair::rate(&self.keyed),
            "plain_values_per_s": Pair::rate(&self.plain),
            "ratio": self.ratio(),
            "ratios": self.ratios(),
            "keyed_runs": self.keyed.iter().map(Run::json).collect::<Vec<_>>(),
            "plain_runs": self.plain.iter().map(Run::json).collect::<Vec<_>>(),
        })
    }
}

/// The least and the greatest of `xs`.
pub(crate) fn range(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// The `p`th percentile of `xs` (0 to 100), by nearest rank; NaN if there are none.
pub(crate) fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

/// A rate in thousands a second: `61.3k`.
pub(crate) fn k(rate: f64) -> String {
    format!("{:.1}k", rate / 1000.0)
}

/// One line of the summary: a figure, both sides, and its target where it has one.
pub(crate) struct Line {
    pub(crate) what: String,
    pub(crate) keyed: String,
    pub(crate) plain: String,
    pub(crate) ratio: String,
    pub(crate) target: String,
    /// `None`: a figure to report, with no target.
    pub(crate) met: Option<bool>,
}

impl Line {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "what": self.what,
            "keyed_batch": self.keyed,
            "plain_redis": self.plain,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        })
    }
}

/// The summary table: every figure against plain Redis, and the targets.
pub(crate) fn summary(lines: &[Line]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n### Summary\n");
    let _ = writeln!(
        out,
        "| figure | keyed-batch | plain Redis | ratio | target | met |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|---|:-:|");
    for l in lines {
        let met = match l.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {met} |",
            l.what, l.keyed, l.plain, l.ratio, l.target
        );
    }
    out
}

pub(crate) use crate::common::cores;

/// What a reader needs to judge the figures: cores, CPU, load, and the server.
pub(crate) fn header(label: &str, server: &str, version: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## keyed-batch on Redis ({label})\n");
    let _ = writeln!(out, "{}", crate::common::machine_line());
    let _ = writeln!(out, "- server: {server}, redis {version}");
    out
}
