//! A small cache of what a module call found in an instance `__dict__` and
//! its class, so repeated calls skip ~12 dictionary/MRO lookups.
//!
//! An entry is valid only while both are unchanged: the instance dict's
//! version tag (CPython bumps it, from a process-wide counter, on every
//! insertion, deletion or rebinding) and the class's `tp_version_tag` (reset
//! by any attribute change on the class or a base). Values that can change
//! without touching either — the contents of the hook dicts, tracing state,
//! the global hooks — are still read on every call. Pointers are borrowed: the
//! unchanged dict/class keep them alive.
use pyo3::ffi;
use std::cell::UnsafeCell;

#[derive(Clone, Copy)]
pub struct Entry {
    dict: *mut ffi::PyObject,
    dict_version: u64,
    tp: *mut ffi::PyTypeObject,
    tp_version: u32,
    /// The 4 per-module hook dicts, in `_call_impl`'s order.
    pub hooks: [*mut ffi::PyObject; 4],
    /// The class's Python function `forward`.
    pub forward: *mut ffi::PyObject,
}

const SIZE: usize = 512;
const EMPTY: Entry = Entry {
    dict: std::ptr::null_mut(),
    dict_version: 0,
    tp: std::ptr::null_mut(),
    tp_version: 0,
    hooks: [std::ptr::null_mut(); 4],
    forward: std::ptr::null_mut(),
};

struct Table(UnsafeCell<[Entry; SIZE]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Table {}
static TABLE: Table = Table(UnsafeCell::new([EMPTY; SIZE]));

#[inline(always)]
fn index(dict: *mut ffi::PyObject) -> usize {
    let a = dict as usize;
    ((a >> 4) ^ (a >> 13)) & (SIZE - 1)
}

#[allow(deprecated)]
#[inline(always)]
unsafe fn dict_version(dict: *mut ffi::PyObject) -> u64 {
    (*(dict as *mut ffi::PyDictObject)).ma_version_tag
}

/// The entry for this instance dict and class, if still valid.
#[inline(always)]
pub unsafe fn lookup(
    tp: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyObject,
) -> Option<&'static Entry> {
    if dict.is_null() {
        return None;
    }
    let e = &(*TABLE.0.get())[index(dict)];
    let tv = (*tp).tp_version_tag;
    if e.dict == dict
        && e.tp == tp
        && tv != 0
        && e.tp_version == tv
        && e.dict_version == dict_version(dict)
    {
        Some(e)
    } else {
        None
    }
}

/// Remember a fully checked fast call (instance forward absent, class forward
/// a Python function, `_compiled_call_impl` None, hook dicts plain).
#[inline(always)]
pub unsafe fn store(
    tp: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyObject,
    hooks: [*mut ffi::PyObject; 4],
    forward: *mut ffi::PyObject,
) {
    let tv = (*tp).tp_version_tag;
    if cfg!(Py_3_13) || tv == 0 || ffi::PyDict_CheckExact(dict) == 0 {
        return;
    }
    (*TABLE.0.get())[index(dict)] = Entry {
        dict,
        dict_version: dict_version(dict),
        tp,
        tp_version: tv,
        hooks,
        forward,
    };
}
