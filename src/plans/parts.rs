//! What the recorded eager walks share (`crate::plans::eager` for `train` and
//! `_apply`, `crate::state::state_dict_plan`, `crate::state::load_state_dict_plan`): the small table
//! each keeps its plans in, the check of one visited module, the refusals
//! that spare a tree no plan can describe a recording walk on every call,
//! and the recursion-limit check a replay makes for the live walk it stands
//! for.
//!
//! Like the per-instance facts, plans are off on 3.13 and free-threaded
//! builds; everything here is used with the GIL held.
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::dict_version;
use crate::plans::module_walks::{holds, seen_now, Seen};
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;
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
pub struct Table<P> {
    slots: UnsafeCell<[Option<Arc<P>>; SLOTS]>,
    next: UnsafeCell<usize>,
    recorded: AtomicUsize,
    replayed: AtomicUsize,
}

// SAFETY: the slots are read and written only with the GIL held (never on
// free-threaded builds); a plan's raw pointers are only dereferenced there.
unsafe impl<P> Sync for Table<P> {}

impl<P> Table<P> {
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

    /// Drop slot `i`'s plan (stale: the next call records afresh).
    pub fn forget(&self, i: usize) {
        // Released after the slot is consistent.
        let old = self.slots()[i].take();
        drop(old);
    }

    /// Keep `plan`, in the slot of the plan `is` accepts or the next one.
    pub fn store(&self, is: impl Fn(&P) -> bool, plan: P) {
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

    pub fn clear(&self) {
        for i in 0..SLOTS {
            self.forget(i);
        }
    }
}

/// One visited module as a plan records it: its class and instance dict
/// with their versions (the call cache's key), and its `_parameters`,
/// `_buffers` and `_modules` dicts with theirs.
#[derive(Clone, Copy)]
pub struct Checked {
    /// Borrowed (the root is the caller's; a child is a value of its
    /// parent's unchanged `_modules`).
    pub module: *mut capi::PyObject,
    pub seen: Seen,
    pub regs: [(*mut capi::PyObject, u64); 3],
}

impl Checked {
    /// `module` now, when a plan can depend on it: an exact instance dict
    /// holding the three registries as exact dicts, found as plain entries
    /// (the class has no attribute of those names), all four quiet
    /// (`crate::cpython::quiet::dict`: a lookup by an exact str runs no
    /// code). A replay skips torch's lookups in them (`"training" in
    /// self._parameters`, `name in self._modules`), the same only while
    /// those run no code; each stays quiet while its version is unchanged.
    pub unsafe fn read(g: &Globals, module: *mut capi::PyObject) -> Option<Checked> {
        let seen = seen_now(module)?;
        let tp = capi::Py_TYPE(module);
        let n = &g.names;
        let mut regs = [(std::ptr::null_mut(), 0); 3];
        for (slot, name) in regs.iter_mut().zip([n.parameters, n.buffers, n.modules]) {
            let r = dict_entry(tp, seen.dict, name);
            if r.is_null() || !crate::cpython::quiet::dict(r) {
                return None;
            }
            *slot = (r, dict_version(r));
        }
        Some(Checked { module, seen, regs })
    }

    /// Are the class, the instance dict and the registries as recorded?
    /// Dereferences `module` only after its holder was checked (visit order).
    #[inline(always)]
    pub unsafe fn holds(&self) -> bool {
        holds(&self.seen, self.module) && self.regs.iter().all(|&(d, v)| dict_version(d) == v)
    }

    pub fn parameters(&self) -> *mut capi::PyObject {
        self.regs[0].0
    }

    pub fn buffers(&self) -> *mut capi::PyObject {
        self.regs[1].0
    }

    pub fn modules(&self) -> *mut capi::PyObject {
        self.regs[2].0
    }
}

/// An attribute torch reads with `self.<name>`, when a plain entry of the
/// instance dict (the class has no attribute of that name); borrowed, null
/// otherwise.
pub unsafe fn dict_entry(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    if !type_lookup(tp, name).is_null() {
        return std::ptr::null_mut();
    }
    capi::PyDict_GetItemWithError(dict, name)
}

/// The two hook dicts `names` of a checked module, when plain entries that
/// are empty dicts or `OrderedDict`s (their sizes change without the
/// instance dict: a replay checks them with [`hooks_empty`]).
pub unsafe fn empty_hooks(
    g: &Globals,
    c: &Checked,
    names: [*mut capi::PyObject; 2],
) -> Option<[*mut capi::PyObject; 2]> {
    let tp = capi::Py_TYPE(c.module);
    let mut hooks = [std::ptr::null_mut(); 2];
    for (slot, name) in hooks.iter_mut().zip(names) {
        let h = dict_entry(tp, c.seen.dict, name);
        if h.is_null() || hook_dict_len(h, g.odict) != Some(0) {
            return None;
        }
        *slot = h;
    }
    Some(hooks)
}

/// Are hook dicts recorded by [`empty_hooks`] still empty?
#[inline(always)]
pub unsafe fn hooks_empty(g: &Globals, hooks: &[*mut capi::PyObject; 2]) -> bool {
    hooks.iter().all(|&h| hook_dict_len(h, g.odict) == Some(0))
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

/// Forget every refusal (with the plans, for tests).
pub fn clear_refusals() {
    // SAFETY: GIL held.
    for r in unsafe { &mut *REFUSED.0.get() }.iter_mut() {
        r.1 = 0;
    }
}

/// `a + b` for exact strs (None on failure, with an exception set).
pub unsafe fn concat<'py>(
    a: &pyo3::Bound<'py, pyo3::PyAny>,
    b: *mut capi::PyObject,
) -> Option<pyo3::Bound<'py, pyo3::PyAny>> {
    pyo3::Bound::from_owned_ptr_or_opt(a.py(), capi::PyUnicode_Concat(a.as_ptr(), b))
}

/// `checked`'s children in registry order, as torch's recursive `state_dict`
/// and `load` take them: None entries skipped, each child visited with the
/// prefix `prefix + name + "."`. False as soon as `name_ok` refuses a name,
/// a prefix cannot be built, or `visit` returns false.
pub unsafe fn visit_children<'py>(
    g: &Globals,
    checked: &Checked,
    prefix: &pyo3::Bound<'py, pyo3::PyAny>,
    name_ok: impl Fn(*mut capi::PyObject) -> bool,
    mut visit: impl FnMut(&pyo3::Bound<'py, pyo3::PyAny>, &pyo3::Bound<'py, pyo3::PyAny>) -> bool,
) -> bool {
    let py = prefix.py();
    let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while capi::PyDict_Next(checked.modules(), &mut pos, &mut name, &mut value) != 0 {
        if value == capi::Py_None() {
            continue;
        }
        if !name_ok(name) {
            return false;
        }
        let Some(child_prefix) = concat(prefix, name).and_then(|p| concat(&p, g.names.dot)) else {
            return false;
        };
        let child = pyo3::Bound::from_borrowed_ptr(py, value);
        if !visit(&child, &child_prefix) {
            return false;
        }
    }
    true
}
