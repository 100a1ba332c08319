//! Shared test support, included by each test file with `mod common;`.
//!
//! - [`time`]: durations and a paused runtime.
//! - [`touchy`]: keys and ranks whose `Hash`, `Eq`, `Clone` or `Ord` panic on demand (std
//!   only: the queue's unit tests include it too).

// Every test binary compiles all of `common` and uses a part of it.
#![allow(dead_code)]

pub(crate) mod time;
pub(crate) mod touchy;
