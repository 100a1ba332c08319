//! Keys and ranks whose user code panics on demand: [`Touchy`] (`Hash`, `Eq`, `Clone`) and
//! [`TouchyRank`] (`Ord`, `Clone`). [`arm`] picks the id and the behaviours that panic, on
//! this thread; [`disarm`] stops it.
//!
//! Std only, so that the queue's unit tests can include this file too. They declare it
//! beside their `mod tests` (a `#[path]` inside an inline module resolves from a folder that
//! does not exist): `#[cfg(test)] #[path = "../../tests/common/touchy.rs"] mod touchy;` in
//! `src/queue/mod.rs`, or `"../tests/common/touchy.rs"` from `src/queue.rs`. Items are
//! `pub(crate)`, which suits both crates and the library's `unreachable_pub` lint.

use std::cell::Cell;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A behaviour of user code that [`arm`] can make panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// `Touchy::hash`.
    Hash,
    /// `Touchy::eq`, comparing the armed id with itself.
    Eq,
    /// `Touchy::clone` and `TouchyRank::clone`.
    Clone,
    /// `TouchyRank::cmp` (and so `partial_cmp` and `eq`), with the armed id on either side.
    Ord,
}

impl What {
    fn bit(self) -> u8 {
        1 << self as u8
    }
}

thread_local! {
    /// The armed id, and the behaviours of it that panic (a bit per `What`), on this thread.
    static ARMED: Cell<Option<(u32, u8)>> = const { Cell::new(None) };
}

/// Makes each behaviour in `what` panic for `id` on this thread, until [`disarm`]. Replaces
/// what was armed before.
pub(crate) fn arm(id: u32, what: &[What]) {
    let bits = what.iter().fold(0, |bits, what| bits | what.bit());
    ARMED.with(|armed| armed.set(Some((id, bits))));
}

/// Nothing panics on this thread any more.
pub(crate) fn disarm() {
    ARMED.with(|armed| armed.set(None));
}

/// Whether `what` panics for `id` now.
fn armed(id: u32, what: What) -> bool {
    ARMED.with(|armed| {
        armed
            .get()
            .is_some_and(|(on, bits)| on == id && bits & what.bit() != 0)
    })
}

/// Panics if `what` is armed for `id`.
fn trip(id: u32, what: What) {
    assert!(!armed(id, what), "{what:?} of {id} panics");
}

/// Whether `f` panicked.
pub(crate) fn panics<T>(f: impl FnOnce() -> T) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// A key whose `Hash`, `Eq` and `Clone` panic when armed for its id.
///
/// `Eq` panics only comparing the armed id with itself: a hash table may compare a key with
/// any other on a partial hash match, at random, and that must not panic.
#[derive(Debug)]
pub(crate) struct Touchy(pub(crate) u32);

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        trip(self.0, What::Hash);
        self.0.hash(state);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        if self.0 == other.0 {
            trip(self.0, What::Eq);
        }
        self.0 == other.0
    }
}

impl Eq for Touchy {}

impl Clone for Touchy {
    fn clone(&self) -> Self {
        trip(self.0, What::Clone);
        Touchy(self.0)
    }
}

/// A rank (sort key) whose `Ord` and `Clone` panic when armed for its id.
///
/// `Ord` panics with the armed id on either side; `eq` is `cmp`, so it does too.
#[derive(Debug)]
pub(crate) struct TouchyRank(pub(crate) u32);

impl Ord for TouchyRank {
    fn cmp(&self, other: &Self) -> Ordering {
        trip(self.0, What::Ord);
        trip(other.0, What::Ord);
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for TouchyRank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for TouchyRank {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for TouchyRank {}

impl Clone for TouchyRank {
    fn clone(&self) -> Self {
        trip(self.0, What::Clone);
        TouchyRank(self.0)
    }
}
