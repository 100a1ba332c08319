//! What the tables share: medians, ranges, sizes, and the targets table.

use std::fmt::Write as _;

pub(crate) use crate::common::median;

/// A target of the issue, checked against this run.
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) limit: String,
    pub(crate) measured: String,
    pub(crate) met: bool,
}

/// The least and the greatest of `xs`.
pub(crate) fn range(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// Bytes in MiB.
pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// A size in KiB or MiB, whichever reads better.
pub(crate) fn size(bytes: u64) -> String {
    match bytes < 1 << 20 {
        true => format!("{:.0} KiB", bytes as f64 / 1024.0),
        false => format!("{:.0} MiB", mib(bytes)),
    }
}

/// The targets table: each target, its limit, what this run measured, and whether it met it.
pub(crate) fn targets(targets: &[Target]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n### Targets\n");
    let _ = writeln!(out, "| target | limit | measured | met |");
    let _ = writeln!(out, "|---|--:|--:|:-:|");
    for t in targets {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            t.what,
            t.limit,
            t.measured,
            if t.met { "yes" } else { "**no**" }
        );
    }
    out
}
