//! The variants: which ones there are, and which scenarios each runs in.

/// Every variant, in the order the README table shows them. Window 0 scenarios run all.
pub(crate) const ALL: [&str; 6] = [
    "mpsc",
    "diy_delayqueue",
    "origin_port",
    "timed",
    "ordered",
    "diy_binaryheap",
];
/// The variants that take a window: the only ones windowed scenarios run.
pub(crate) const WINDOWED: [&str; 4] = ["mpsc", "diy_delayqueue", "origin_port", "timed"];
/// The variants the lateness scenario runs, in this order.
pub(crate) const LATENESS: [&str; 3] = ["timed", "diy_delayqueue", "origin_port"];
