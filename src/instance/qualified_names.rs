//! The names the walks build from strings (`prefix + "." + key` for the
//! iterators, `prefix + key`, `prefix + key + "."` and `prefix[:-1]` for
//! `state_dict`), remembered per (kind, prefix, key) of string objects.
//!
//! Walking an unchanged tree again builds the same names from the same
//! string objects: the keys are the registries' own, and each prefix is a name
//! this cache returned on the previous walk. Reusing the result skips a string
//! allocation, two copies and, later, the deallocation. The cache holds strong
//! references to the prefix, the key and the result, so an address in it
//! always denotes the object it was stored for; it holds only exact `str`s
//! (never modules or tensors), and a bounded number of them. [`clear`] gives
//! them back (each str goes unless something else holds it): when a tree is
//! restored, and when a tree whose plans were kept dies after many names were
//! made ([`note_tree_freed`]).
use crate::cpython::capi;
use std::cell::UnsafeCell;

/// How a name is built from `prefix` and `key`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `prefix + "." + key` (non-empty prefix).
    Dotted,
    /// `prefix + key`.
    Plain,
    /// `prefix + key + "."`.
    Child,
    /// `prefix[:-1]` (`key` is `prefix`).
    ButLast,
}

#[derive(Clone, Copy)]
struct Slot {
    kind: Kind,
    prefix: *mut capi::PyObject,
    key: *mut capi::PyObject,
    joined: *mut capi::PyObject,
}

const EMPTY: Slot = Slot {
    kind: Kind::Dotted,
    prefix: std::ptr::null_mut(),
    key: std::ptr::null_mut(),
    joined: std::ptr::null_mut(),
};
const SET_BITS: u32 = 16;

struct Table(UnsafeCell<[[Slot; 2]; 1 << SET_BITS]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Table {}
static TABLE: Table = Table(UnsafeCell::new([[EMPTY; 2]; 1 << SET_BITS]));

#[inline(always)]
fn set_index(kind: Kind, prefix: *mut capi::PyObject, key: *mut capi::PyObject) -> usize {
    let h = ((prefix as u64) >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ ((key as u64) >> 4).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (kind as u64).wrapping_mul(0x1656_67b1_9e37_79f9);
    (h >> (64 - SET_BITS)) as usize
}

/// The `kind` name of `prefix` and `key` (a new reference) if remembered;
/// only exact strs are ever stored.
#[inline(always)]
pub unsafe fn cached(
    kind: Kind,
    prefix: *mut capi::PyObject,
    key: *mut capi::PyObject,
) -> Option<*mut capi::PyObject> {
    if crate::cpython::FREE_THREADED {
        return None;
    }
    let set = &(*TABLE.0.get())[set_index(kind, prefix, key)];
    for s in set {
        if s.prefix == prefix && s.key == key && s.kind == kind {
            capi::Py_INCREF(s.joined);
            return Some(s.joined);
        }
    }
    None
}

/// Remember `joined` as the `kind` name of `prefix` and `key` (all three
/// exact strs), replacing the older entry of its set.
#[inline(always)]
pub unsafe fn store(
    kind: Kind,
    prefix: *mut capi::PyObject,
    key: *mut capi::PyObject,
    joined: *mut capi::PyObject,
) {
    if crate::cpython::FREE_THREADED {
        return;
    }
    let set = &mut (*TABLE.0.get())[set_index(kind, prefix, key)];
    *STORED.0.get() += 1;
    let old = set[1];
    set[1] = set[0];
    capi::Py_INCREF(prefix);
    capi::Py_INCREF(key);
    capi::Py_INCREF(joined);
    set[0] = Slot {
        kind,
        prefix,
        key,
        joined,
    };
    // Freeing strs runs no Python code, and the table is consistent already.
    for p in [old.prefix, old.key, old.joined] {
        if !p.is_null() {
            capi::Py_DECREF(p);
        }
    }
}

/// Names stored since the last [`clear`].
struct Stored(UnsafeCell<usize>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Stored {}
static STORED: Stored = Stored(UnsafeCell::new(0));

/// How many names must have been made since the last [`clear`] before a
/// tree's death clears again: clearing reads the whole table (4 MiB), and
/// names of trees still alive are made again on their next live walk, so
/// trees that die often cost it once per this many names (each one an
/// allocation) at most.
const CLEAR_AFTER: usize = 1 << 12;

/// Forget every remembered name: each str goes unless something else (a
/// plan, the caller's dict of names) holds it. Runs no Python code: only
/// exact strs are released.
pub fn clear() {
    if crate::cpython::FREE_THREADED {
        return;
    }
    // SAFETY: GIL held; the table is consistent before each release.
    unsafe {
        *STORED.0.get() = 0;
        for set in (*TABLE.0.get()).iter_mut() {
            for slot in set.iter_mut() {
                if !slot.joined.is_null() {
                    release(slot);
                }
            }
        }
    }
}

/// Empty `slot`, releasing its three strs.
unsafe fn release(slot: &mut Slot) {
    let old = std::mem::replace(slot, EMPTY);
    for p in [old.prefix, old.key, old.joined] {
        if !p.is_null() {
            capi::Py_DECREF(p);
        }
    }
}

/// A tree whose plans were kept died: forget every name if many were made
/// since the last time (a large tree's, which nothing may hold now).
pub fn note_tree_freed() {
    // SAFETY: GIL held.
    if unsafe { *STORED.0.get() } >= CLEAR_AFTER {
        clear();
    }
}

/// How many names are remembered (for tests).
pub fn count() -> usize {
    // SAFETY: GIL held.
    unsafe {
        (*TABLE.0.get())
            .iter()
            .flatten()
            .filter(|s| !s.joined.is_null())
            .count()
    }
}

/// The `kind` name of exact strs `prefix` and `key`, built by `build` when not
/// remembered (then remembered if the result is an exact str).
#[inline(always)]
pub fn name<'py>(
    kind: Kind,
    prefix: &pyo3::Bound<'py, pyo3::PyAny>,
    key: &pyo3::Bound<'py, pyo3::PyAny>,
    build: impl FnOnce() -> pyo3::PyResult<pyo3::Bound<'py, pyo3::PyAny>>,
) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::PyAny>> {
    unsafe {
        let (p, k) = (prefix.as_ptr(), key.as_ptr());
        let exact = capi::PyUnicode_CheckExact(p) != 0 && capi::PyUnicode_CheckExact(k) != 0;
        if !exact {
            return build();
        }
        if let Some(j) = cached(kind, p, k) {
            return Ok(pyo3::Bound::from_owned_ptr(prefix.py(), j));
        }
        let built = build()?;
        if capi::PyUnicode_CheckExact(built.as_ptr()) != 0 {
            store(kind, p, k, built.as_ptr());
        }
        Ok(built)
    }
}
