//! Shared test support, included by each test file with `mod common;`.
//!
//! - [`time`]: durations and a paused runtime.
//! - [`touchy`]: keys and ranks whose `Hash`, `Eq`, `Clone` or `Ord` panic on demand (std
//!   only: the queue's unit tests include it too).
//! - [`flavour`]: the `timed` and `ordered` channels behind one shape.

// Every test binary compiles all of `common` and uses a part of it.
#![allow(dead_code)]

pub(crate) mod flavour;
pub(crate) mod time;
pub(crate) mod touchy;
