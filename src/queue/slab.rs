//! Where a queue's slots live: in the buckets of a hash table while the queue is small, and
//! in a slab behind a table of their positions once it is large.
//!
//! A slot is 72 bytes for `u64` keys and values. As a table's buckets, at a load of 44–88%,
//! slots fill several megabytes at tens of thousands of keys, and every push and every pop
//! misses the cache there. Behind a table of 8-byte buckets (a position and a tag), the
//! table stays in cache far longer, a new slot takes the position that the last slot to
//! leave freed (likely still in cache), and a slot is read where it sits, once. In a small
//! queue, though, that table is one more load before a key is found, and one more cache
//! line that a sender and a receiver on two cores hand back and forth: with slots always in
//! a slab, `benches/compare` took 1.16–1.21 of the time at window 0. So a queue keeps them
//! in the buckets up to [`INLINE_MOST`] keys. The figures are in `CHANGELOG.md`.

use std::mem;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use super::mostly_unused;
use super::slot::Slot;

/// The most keys a queue keeps in a table's buckets: a table of 8,192 buckets, about 600 KB
/// of slots, about what a core's own cache holds. It moves them into a slab when it outgrows
/// that, and back once it holds under an eighth of it.
///
/// Measured against other bounds (`benches/compare`, `timed` at a 50 ms window, builds
/// alternated; the figures are in `CHANGELOG.md`): the slab costs 16% at 4,096 keys, about
/// 5% at 16,384, nothing at 32,768, and saves 9–12% from 65,536 keys on. Moving at 32,768
/// would win those 5% and lose the rest.
const INLINE_MOST: usize = 7 * 1024;

/// [`INLINE_MOST`]; 0 with `KEYED_BATCH_SLAB=always` (and the `fault-injection` feature),
/// so that this crate's tests of a few keys can drive the slab.
#[inline]
fn inline_most() -> usize {
    #[cfg(feature = "fault-injection")]
    {
        static MOST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *MOST.get_or_init(|| {
            let always = std::env::var_os("KEYED_BATCH_SLAB").is_some_and(|v| v == "always");
            if always {
                0
            } else {
                INLINE_MOST
            }
        })
    }
    #[cfg(not(feature = "fault-injection"))]
    INLINE_MOST
}

/// See the module docs.
pub(super) enum Slots<R, K, V> {
    Inline(HashTable<Slot<R, K, V>>),
    /// Boxed, so that a small queue, and the channel state around it, stays small.
    Slab(Box<Slab<R, K, V>>),
}

/// The slots of a large queue.
pub(super) struct Slab<R, K, V> {
    /// The position of each slot in `slab`, found by the slot's hash.
    table: HashTable<Pos>,
    /// The slots; `None` at the positions that `free` lists.
    slab: Vec<Option<Slot<R, K, V>>>,
    /// Positions in `slab` that hold no slot, the one to reuse next last.
    free: Vec<u32>,
}

/// A slot's bucket in a [`Slab`]'s table: where it sits, and the high half of its hash.
///
/// The table hashes by that half alone (see [`table_hash`]), so that it can grow from what
/// it holds, without reading the slots; the tag also spares a slot's read for most buckets
/// that share a probe.
#[derive(Clone, Copy, Debug)]
struct Pos {
    at: u32,
    tag: u32,
}

impl Pos {
    fn at(self) -> usize {
        self.at as usize
    }
}

fn tag(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// The hash a slab's table files a slot under: its tag, twice over, so that both the bucket
/// (low bits) and hashbrown's control byte (top 7 bits) come from the tag.
fn table_hash(tag: u32) -> u64 {
    let tag = u64::from(tag);
    tag << 32 | tag
}

fn rehash(pos: &Pos) -> u64 {
    table_hash(pos.tag)
}

/// What a slab's table is probed with for a slot of hash `tag`: the tag, and `eq` on the
/// slot a matching bucket points at.
fn probe<'s, R, K, V>(
    slab: &'s [Option<Slot<R, K, V>>],
    tag: u32,
    mut eq: impl FnMut(&Slot<R, K, V>) -> bool + 's,
) -> impl FnMut(&Pos) -> bool + 's {
    move |pos| pos.tag == tag && eq(live(&slab[pos.at()]))
}

fn slot_hash<R, K, V>(slot: &Slot<R, K, V>) -> u64 {
    slot.hash
}

/// A slot found by [`Slots::find_entry`].
pub(super) struct Occupied<'a, R, K, V>(Held<'a, R, K, V>);

enum Held<'a, R, K, V> {
    Inline(hashbrown::hash_table::OccupiedEntry<'a, Slot<R, K, V>>),
    Slab {
        entry: hashbrown::hash_table::OccupiedEntry<'a, Pos>,
        slab: &'a mut Vec<Option<Slot<R, K, V>>>,
        free: &'a mut Vec<u32>,
    },
}

impl<'a, R, K, V> Occupied<'a, R, K, V> {
    #[inline]
    pub(super) fn get(&self) -> &Slot<R, K, V> {
        match &self.0 {
            Held::Inline(entry) => entry.get(),
            Held::Slab { entry, slab, .. } => live(&slab[entry.get().at()]),
        }
    }

    #[inline]
    pub(super) fn into_mut(self) -> &'a mut Slot<R, K, V> {
        match self.0 {
            Held::Inline(entry) => entry.into_mut(),
            Held::Slab { entry, slab, .. } => live_mut(&mut slab[entry.get().at()]),
        }
    }

    /// Where the slot is, for [`Slots::get_mut`].
    #[inline]
    pub(super) fn at(&self) -> usize {
        match &self.0 {
            Held::Inline(entry) => entry.bucket_index(),
            Held::Slab { entry, .. } => entry.get().at(),
        }
    }

    /// Takes the slot out.
    #[inline]
    pub(super) fn remove(self) -> Slot<R, K, V> {
        match self.0 {
            Held::Inline(entry) => entry.remove().0,
            Held::Slab { entry, slab, free } => {
                let (pos, rest) = entry.remove();
                let slot = slab[pos.at()].take().expect("the table points at slots");
                if rest.into_table().is_empty() {
                    // Start again from the first position: the next slots go in in
                    // arrival order.
                    slab.clear();
                    free.clear();
                } else {
                    free.push(pos.at);
                }
                slot
            }
        }
    }
}

/// A slot found by [`Slots::entry`], or room for one.
pub(super) enum SlotEntry<'a, R, K, V> {
    Occupied(&'a mut Slot<R, K, V>),
    Vacant(Vacant<'a, R, K, V>),
}

/// Room for a new slot, made by [`Slots::entry`].
pub(super) struct Vacant<'a, R, K, V>(Room<'a, R, K, V>);

enum Room<'a, R, K, V> {
    Inline(hashbrown::hash_table::VacantEntry<'a, Slot<R, K, V>>),
    Slab {
        entry: hashbrown::hash_table::VacantEntry<'a, Pos>,
        slab: &'a mut Vec<Option<Slot<R, K, V>>>,
        free: &'a mut Vec<u32>,
        tag: u32,
    },
}

impl<R, K, V> Vacant<'_, R, K, V> {
    /// Puts in `slot`, whose hash is the one looked for.
    pub(super) fn insert(self, slot: Slot<R, K, V>) {
        match self.0 {
            Room::Inline(entry) => {
                entry.insert(slot);
            }
            Room::Slab {
                entry,
                slab,
                free,
                tag,
            } => {
                let at = place(slab, free, slot);
                entry.insert(Pos { at, tag });
            }
        }
    }
}

/// Puts `slot` in the slab, where `free` says, and returns its position.
fn place<R, K, V>(
    slab: &mut Vec<Option<Slot<R, K, V>>>,
    free: &mut Vec<u32>,
    slot: Slot<R, K, V>,
) -> u32 {
    match free.pop() {
        Some(at) => {
            slab[at as usize] = Some(slot);
            at
        }
        None => {
            let at = u32::try_from(slab.len()).expect("checked by `Slab::has_room`");
            slab.push(Some(slot));
            at
        }
    }
}

fn live<R, K, V>(slot: &Option<Slot<R, K, V>>) -> &Slot<R, K, V> {
    slot.as_ref().expect("the table points at slots")
}

fn live_mut<R, K, V>(slot: &mut Option<Slot<R, K, V>>) -> &mut Slot<R, K, V> {
    slot.as_mut().expect("the table points at slots")
}

impl<R, K, V> Default for Slots<R, K, V> {
    fn default() -> Self {
        Slots::Inline(HashTable::new())
    }
}

impl<R, K, V> Default for Slab<R, K, V> {
    fn default() -> Self {
        Slab {
            table: HashTable::new(),
            slab: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<R, K, V> Slab<R, K, V> {
    /// A slab of `slots`, in order from the first position, with room for `capacity`.
    fn from_slots(slots: impl IntoIterator<Item = Slot<R, K, V>>, capacity: usize) -> Self {
        let mut slab = Slab {
            table: HashTable::with_capacity(capacity),
            slab: Vec::with_capacity(capacity),
            free: Vec::new(),
        };
        slots.into_iter().for_each(|slot| slab.insert_unique(slot));
        slab
    }

    /// Whether a new slot has a position: at most `u32::MAX` slots, which at 72 bytes each
    /// is over 300 GB.
    fn has_room(&self) -> bool {
        !self.free.is_empty() || self.slab.len() < u32::MAX as usize
    }

    fn insert_unique(&mut self, slot: Slot<R, K, V>) {
        assert!(self.has_room(), "a queue holds at most u32::MAX keys");
        let tag = tag(slot.hash);
        let at = place(&mut self.slab, &mut self.free, slot);
        self.table
            .insert_unique(table_hash(tag), Pos { at, tag }, rehash);
    }

    /// Gives memory back once the table or the slab is mostly unused, to about twice what
    /// is in. A slab given back is compacted: its slots move.
    fn shrink(&mut self, above: usize) {
        let live = self.table.len();
        if mostly_unused(live, self.slab.capacity(), above) {
            let slots = mem::take(&mut self.slab).into_iter().flatten();
            *self = Slab::from_slots(slots, live * 2);
        } else if mostly_unused(live, self.table.capacity(), above) {
            self.table.shrink_to(live * 2, rehash);
        }
        if mostly_unused(self.free.len(), self.free.capacity(), above) {
            self.free.shrink_to(self.free.len() * 2);
        }
    }
}

impl<R, K, V> Slots<R, K, V> {
    pub(super) fn len(&self) -> usize {
        match self {
            Slots::Inline(table) => table.len(),
            Slots::Slab(slab) => slab.table.len(),
        }
    }

    /// Slots it holds without allocating.
    pub(super) fn capacity(&self) -> usize {
        match self {
            Slots::Inline(table) => table.capacity(),
            Slots::Slab(slab) => slab.table.capacity().min(slab.slab.capacity()),
        }
    }

    /// Moves the slots into a slab once [`INLINE_MOST`] are in the table.
    #[inline]
    fn make_room(&mut self) {
        if let Slots::Inline(table) = self {
            if table.len() >= inline_most() {
                self.move_to_slab();
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn move_to_slab(&mut self) {
        if let Slots::Inline(table) = self {
            let table = mem::take(table);
            let capacity = table.len() * 2;
            *self = Slots::Slab(Box::new(Slab::from_slots(table, capacity)));
        }
    }

    #[inline]
    pub(super) fn find(
        &self,
        hash: u64,
        eq: impl FnMut(&Slot<R, K, V>) -> bool,
    ) -> Option<&Slot<R, K, V>> {
        match self {
            Slots::Inline(table) => table.find(hash, eq),
            Slots::Slab(boxed) => {
                let Slab { table, slab, .. } = &**boxed;
                let tag = tag(hash);
                let pos = table.find(table_hash(tag), probe(slab, tag, eq))?;
                Some(live(&slab[pos.at()]))
            }
        }
    }

    #[inline]
    pub(super) fn find_mut(
        &mut self,
        hash: u64,
        eq: impl FnMut(&Slot<R, K, V>) -> bool,
    ) -> Option<&mut Slot<R, K, V>> {
        self.find_entry(hash, eq).map(Occupied::into_mut)
    }

    /// The slot of `hash` that `eq` accepts, to read, change or take out.
    #[inline]
    pub(super) fn find_entry(
        &mut self,
        hash: u64,
        eq: impl FnMut(&Slot<R, K, V>) -> bool,
    ) -> Option<Occupied<'_, R, K, V>> {
        match self {
            Slots::Inline(table) => table.find_entry(hash, eq).ok().map(Held::Inline),
            Slots::Slab(boxed) => {
                let Slab { table, slab, free } = &mut **boxed;
                let tag = tag(hash);
                let entry = table.find_entry(table_hash(tag), probe(slab, tag, eq));
                entry.ok().map(|entry| Held::Slab { entry, slab, free })
            }
        }
        .map(Occupied)
    }

    /// The slot at `at`, from [`Occupied::at`], if no slot went in since, and the slots did
    /// not shrink: taking others out moves none.
    #[inline]
    pub(super) fn get_mut(&mut self, at: usize) -> &mut Slot<R, K, V> {
        match self {
            Slots::Inline(table) => table.get_bucket_mut(at).expect("the slot is there"),
            Slots::Slab(slab) => live_mut(&mut slab.slab[at]),
        }
    }

    /// The slot of `hash` that `eq` accepts, or room for one.
    ///
    /// # Panics
    ///
    /// Panics, changing nothing, if there is no slot and `u32::MAX` slots are in.
    #[inline]
    pub(super) fn entry(
        &mut self,
        hash: u64,
        eq: impl FnMut(&Slot<R, K, V>) -> bool,
    ) -> SlotEntry<'_, R, K, V> {
        self.make_room();
        match self {
            Slots::Inline(table) => match table.entry(hash, eq, slot_hash) {
                Entry::Occupied(entry) => SlotEntry::Occupied(entry.into_mut()),
                Entry::Vacant(entry) => SlotEntry::Vacant(Vacant(Room::Inline(entry))),
            },
            Slots::Slab(slab) => {
                let tag = tag(hash);
                let room = slab.has_room();
                let Slab { table, slab, free } = &mut **slab;
                let entry = table.entry(table_hash(tag), probe(slab, tag, eq), rehash);
                match entry {
                    Entry::Occupied(entry) => {
                        SlotEntry::Occupied(live_mut(&mut slab[entry.get().at()]))
                    }
                    Entry::Vacant(entry) => {
                        assert!(room, "a queue holds at most u32::MAX keys");
                        SlotEntry::Vacant(Vacant(Room::Slab {
                            entry,
                            slab,
                            free,
                            tag,
                        }))
                    }
                }
            }
        }
    }

    /// Puts in a slot whose key has no other slot.
    pub(super) fn insert_unique(&mut self, slot: Slot<R, K, V>) {
        self.make_room();
        match self {
            Slots::Inline(table) => {
                table.insert_unique(slot.hash, slot, slot_hash);
            }
            Slots::Slab(slab) => slab.insert_unique(slot),
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Slot<R, K, V>> {
        let (inline, slab) = match self {
            Slots::Inline(table) => (Some(table.iter()), None),
            Slots::Slab(slab) => (None, Some(slab.slab.iter().flatten())),
        };
        inline
            .into_iter()
            .flatten()
            .chain(slab.into_iter().flatten())
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Slot<R, K, V>> {
        let (inline, slab) = match self {
            Slots::Inline(table) => (Some(table.iter_mut()), None),
            Slots::Slab(slab) => (None, Some(slab.slab.iter_mut().flatten())),
        };
        inline
            .into_iter()
            .flatten()
            .chain(slab.into_iter().flatten())
    }

    /// Gives memory back once the slots take mostly unused room (see [`mostly_unused`]) of
    /// more than `above`, to about twice what is in; a slab under an eighth of
    /// [`INLINE_MOST`] goes back into a table's buckets. Slots may move.
    pub(super) fn shrink(&mut self, above: usize) {
        match self {
            Slots::Inline(table) => {
                let live = table.len();
                if mostly_unused(live, table.capacity(), above) {
                    table.shrink_to(live * 2, slot_hash);
                }
            }
            Slots::Slab(slab) if slab.table.len() * 8 < inline_most() => {
                let live = slab.table.len();
                let Slab { slab, .. } = mem::take(&mut **slab);
                let mut table = HashTable::with_capacity(live * 2);
                slab.into_iter().flatten().for_each(|slot| {
                    table.insert_unique(slot.hash, slot, slot_hash);
                });
                *self = Slots::Inline(table);
            }
            Slots::Slab(slab) => slab.shrink(above),
        }
    }
}
