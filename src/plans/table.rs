//! Where the recorded eager walks (`crate::plans::eager` for `train` and
//! `_apply`, `crate::state::state_dict_plan`,
//! `crate::state::load_state_dict_plan`) keep their plans: a small table per
//! walk, and the refusals that spare a tree no plan can describe a recording
//! walk on every call.
//!
//! Like the per-instance facts, plans are off on 3.13 and free-threaded
//! builds; everything here is used with the GIL held.
use crate::cpython::capi;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Plans are kept only while remembered dict and class versions can be
/// trusted (see `crate::cpython::validity`).
#[inline(always)]
pub fn enabled() -> bool {
    crate::cpython::validity::caches_on()
}

const SLOTS: usize = 4;

/// Up to four plans, found by what they record (their root, and the walk or
/// prefix), replaced round-robin; with the counts of plans recorded and calls
/// replayed (for tests and diagnostics).
pub struct Table<P: Root> {
    slots: UnsafeCell<[Option<Arc<P>>; SLOTS]>,
    next: UnsafeCell<usize>,
    recorded: AtomicUsize,
    replayed: AtomicUsize,
}

// SAFETY: the slots are read and written only with the GIL held (never on
// free-threaded builds); a plan's raw pointers are only dereferenced there.
unsafe impl<P: Root> Sync for Table<P> {}

/// A plan's root (its address: a plan holds no reference to it).
pub trait Root {
    fn root(&self) -> usize;
}

impl<P: Root> crate::plans::roots::Rooted for Table<P> {
    fn forget_roots(&self, is_gone: &dyn Fn(usize) -> bool) {
        for i in 0..SLOTS {
            if self.slots()[i].as_ref().is_some_and(|p| is_gone(p.root())) {
                self.forget(i);
            }
        }
    }

    fn has_root(&self, root: usize) -> bool {
        self.slots().iter().flatten().any(|p| p.root() == root)
    }
}

impl<P: Root> Table<P> {
    pub const fn new() -> Self {
        Table {
            slots: UnsafeCell::new([None, None, None, None]),
            next: UnsafeCell::new(0),
            recorded: AtomicUsize::new(0),
            replayed: AtomicUsize::new(0),
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn slots(&self) -> &mut [Option<Arc<P>>; SLOTS] {
        // SAFETY: GIL held by every caller; no reference outlives a call.
        unsafe { &mut *self.slots.get() }
    }

    /// The slot and plan `is` accepts, if any (it may be stale: the caller
    /// checks).
    pub fn find(&self, is: impl Fn(&P) -> bool) -> Option<(usize, Arc<P>)> {
        if !enabled() {
            return None;
        }
        self.slots()
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.as_ref().filter(|p| is(p)).map(|p| (i, Arc::clone(p))))
    }

    /// Slot `i`'s plan, to update in place, when nothing else holds it.
    pub fn get_mut(&self, i: usize) -> Option<&mut P> {
        self.slots()[i].as_mut().and_then(Arc::get_mut)
    }

    /// Drop `plan` if a slot still holds it (after code may have run, slot
    /// indices found before no longer say which plan is where).
    pub fn forget_plan(&self, plan: &Arc<P>) {
        if let Some(i) = self
            .slots()
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| Arc::ptr_eq(p, plan)))
        {
            self.forget(i);
        }
    }

    /// Drop slot `i`'s plan (stale: the next call records afresh).
    pub fn forget(&self, i: usize) {
        // Released after the slot is consistent.
        let old = self.slots()[i].take();
        drop(old);
    }

    /// Keep `plan` (for `root`), in the slot of the plan `is` accepts or the
    /// next one; not kept when `root` cannot be watched
    /// (`crate::plans::roots`: its plans go when it dies).
    pub fn store(&self, root: &pyo3::Bound<'_, pyo3::PyAny>, is: impl Fn(&P) -> bool, plan: P) {
        debug_assert_eq!(plan.root(), root.as_ptr() as usize);
        if !crate::plans::roots::watch(root) {
            return;
        }
        self.recorded.fetch_add(1, Relaxed);
        let slots = self.slots();
        let i = match slots.iter().position(|p| p.as_ref().is_some_and(|p| is(p))) {
            Some(i) => i,
            None => {
                // SAFETY: GIL held.
                let next = unsafe { &mut *self.next.get() };
                let i = *next;
                *next = (i + 1) % SLOTS;
                i
            }
        };
        let old = slots[i].replace(Arc::new(plan));
        drop(old);
    }

    pub fn note_replay(&self) {
        self.replayed.fetch_add(1, Relaxed);
    }

    /// `(plans recorded, calls replayed)` since import.
    pub fn stats(&self) -> (usize, usize) {
        (self.recorded.load(Relaxed), self.replayed.load(Relaxed))
    }
}

/// Which walk a refusal is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    Train,
    Apply,
    StateDict,
    Load,
}

/// Roots whose last recording failed (a module a plan cannot describe, such
/// as a class overriding the walked method), with the number of live walks
/// left before the next attempt: a tree that cannot be recorded does not pay
/// for a recording walk on every call. A reused address only delays one.
type Refused = ((*mut capi::PyObject, Walk), u32);
const RETRY_AFTER: u32 = 15;
struct Refusals(UnsafeCell<[Refused; SLOTS]>, UnsafeCell<usize>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Refusals {}
static REFUSED: Refusals = Refusals(
    UnsafeCell::new([((std::ptr::null_mut(), Walk::Train), 0); SLOTS]),
    UnsafeCell::new(0),
);

/// Is a recording of `key` to be skipped this time (a recent one failed)?
pub fn refused(key: (*mut capi::PyObject, Walk)) -> bool {
    // SAFETY: GIL held.
    let table = unsafe { &mut *REFUSED.0.get() };
    match table.iter_mut().find(|r| r.0 == key && r.1 > 0) {
        Some(r) => {
            r.1 -= 1;
            true
        }
        None => false,
    }
}

/// Note that recording `key` failed: skip the next attempts.
pub fn refuse(key: (*mut capi::PyObject, Walk)) {
    // SAFETY: GIL held.
    let (table, next) = unsafe { (&mut *REFUSED.0.get(), &mut *REFUSED.1.get()) };
    let i = match table.iter().position(|r| r.0 == key) {
        Some(i) => i,
        None => {
            let i = *next;
            *next = (i + 1) % SLOTS;
            i
        }
    };
    table[i] = (key, RETRY_AFTER);
}

/// Forget the refusals of the roots `is_gone` accepts (freed, or restored).
pub fn forget_refusals(is_gone: &dyn Fn(usize) -> bool) {
    // SAFETY: GIL held.
    for r in unsafe { &mut *REFUSED.0.get() }.iter_mut() {
        if is_gone(r.0 .0 as usize) {
            *r = ((std::ptr::null_mut(), Walk::Train), 0);
        }
    }
}
