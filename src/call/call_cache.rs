//! A small cache of what a module call found in an instance `__dict__` and
//! its class, so repeated calls skip ~12 dictionary/MRO lookups.
//!
//! An entry is valid only while both are unchanged: the instance dict's
//! version (it changes on every insertion, deletion or rebinding) and the
//! class's version (reset by any attribute change on the class or a base),
//! both as `crate::cpython::validity` defines them. Values that can change
//! without touching either — the contents of the hook dicts, tracing state,
//! the global hooks — are still read on every call. Pointers are borrowed: the
//! unchanged dict/class keep them alive.
use crate::call::frames::Frames;
use crate::cpython::capi;
use crate::cpython::validity::{dict_version, Key};
use std::cell::UnsafeCell;

#[derive(Clone, Copy)]
pub struct Entry {
    key: Key,
    /// The 4 per-module hook dicts, in `_call_impl`'s order, then the 3 hook-id
    /// sets (null: not found plainly; see `crate::call::module_call::Hooks`).
    pub hooks: [*mut capi::PyObject; 7],
    /// The class's Python function `forward`; null when the entry was stored
    /// by a call that handed over (its forward not looked up).
    pub forward: *mut capi::PyObject,
    /// What that `forward` needs of torch's call frames.
    pub frames: Frames,
    /// What a native torch layer (`crate::call::layers`) read from the instance,
    /// valid with the entry (and `reg`'s version where `reg` is set).
    pub leaf: Leaf,
}

/// Borrowed objects a native layer read from the instance: `Linear`'s
/// `weight`/`bias` (from the `_parameters` dict `reg`, checked at version
/// `reg_version` too), `ReLU`'s `inplace`, `Sequential`'s `_modules` dict.
/// Every pointer is kept alive by the unchanged instance dict (or `reg`).
#[derive(Clone, Copy)]
pub struct Leaf {
    pub kind: LeafKind,
    pub reg: *mut capi::PyObject,
    pub reg_version: u64,
    pub a: *mut capi::PyObject,
    pub b: *mut capi::PyObject,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LeafKind {
    None,
    Linear,
    Relu,
    Sequential,
}

pub const NO_LEAF: Leaf = Leaf {
    kind: LeafKind::None,
    reg: std::ptr::null_mut(),
    reg_version: 0,
    a: std::ptr::null_mut(),
    b: std::ptr::null_mut(),
};

impl Leaf {
    /// The cached reads for `kind`, if still valid.
    #[inline(always)]
    pub unsafe fn get(&self, kind: LeafKind) -> Option<(*mut capi::PyObject, *mut capi::PyObject)> {
        if self.kind != kind {
            return None;
        }
        if !self.reg.is_null() && dict_version(self.reg) != self.reg_version {
            return None;
        }
        Some((self.a, self.b))
    }
}

/// Sets of two entries (the most recently stored first): a model of a few
/// hundred modules fits without slots evicting each other on every call.
const SETS: usize = 1024;
const EMPTY: Entry = Entry {
    key: Key::EMPTY,
    hooks: [std::ptr::null_mut(); 7],
    forward: std::ptr::null_mut(),
    frames: Frames::None,
    leaf: NO_LEAF,
};

struct Table(UnsafeCell<[[Entry; 2]; SETS]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Table {}
static TABLE: Table = Table(UnsafeCell::new([[EMPTY; 2]; SETS]));

#[inline(always)]
fn index(dict: *mut capi::PyObject) -> usize {
    let a = dict as usize;
    ((a >> 4) ^ (a >> 14)) & (SETS - 1)
}

/// The entry for this instance dict and class, if still valid. A raw
/// pointer: a nested module call may overwrite the slot, so callers copy what
/// they need before calling out.
#[inline(always)]
pub unsafe fn lookup(tp: *mut capi::PyTypeObject, dict: *mut capi::PyObject) -> Option<*mut Entry> {
    if dict.is_null() {
        return None;
    }
    let set = &mut (*TABLE.0.get())[index(dict)];
    let key = Key::now(tp, dict)?;
    set.iter_mut()
        .find(|e| e.key == key)
        .map(|e| e as *mut Entry)
}

/// Remember a fully checked call decision (`_compiled_call_impl` None, hook
/// registries found plainly) and, for a fast call, its `forward` (instance
/// forward absent, class forward a Python function); `forward` null for a
/// call that handed over; `frames`: what that forward needs of torch's
/// call frames.
#[inline(always)]
pub unsafe fn store(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    hooks: [*mut capi::PyObject; 7],
    forward: *mut capi::PyObject,
    frames: Frames,
) -> *mut Entry {
    if !crate::cpython::validity::caches_on() || capi::PyDict_CheckExact(dict) == 0 {
        return std::ptr::null_mut();
    }
    let Some(key) = Key::now(tp, dict) else {
        return std::ptr::null_mut();
    };
    let set = &mut (*TABLE.0.get())[index(dict)];
    // Most recent first; an older entry for the same dict is dropped.
    if set[0].key.dict != dict {
        set[1] = set[0];
    }
    let slot = &mut set[0];
    *slot = Entry {
        key,
        hooks,
        forward,
        frames,
        leaf: NO_LEAF,
    };
    slot as *mut Entry
}

/// Record a native layer's reads on `entry` (null: nothing to record), if the
/// entry still describes `dict` at its current version *and* `tp` (the
/// instance's class now, under which the reads were judged) at its current
/// version: a read that ran code (a property) may have reassigned
/// `__class__` or had a nested call overwrite the slot with another class's
/// entry for the same dict, and a leaf judged under one class must never be
/// kept on another class's entry.
#[inline(always)]
pub unsafe fn set_leaf(
    entry: *mut Entry,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    leaf: Leaf,
) {
    if entry.is_null() {
        return;
    }
    let e = &mut *entry;
    if e.key.dict == dict && Key::now(tp, dict) == Some(e.key) {
        e.leaf = leaf;
    }
}
