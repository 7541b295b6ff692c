//! Containers whose lookups by an exact `str` cannot run Python code.
//!
//! CPython keeps a dict whose keys are all exact `str` in a str-only key
//! table (`DICT_KEYS_UNICODE`, or `DICT_KEYS_SPLIT` for instance dicts); a
//! lookup by an exact `str` there compares by identity and string equality,
//! never calling `__eq__`. Any other key turns the table general, for good.
//! The table kind is an internal field (`PyDictKeysObject.dk_kind`); its
//! offset is the same on 3.11-3.14 default builds, and [`init`] verifies it
//! on live dicts at import. Where the check fails (an interpreter laid out
//! otherwise), no dict is quiet: every fast path that needs one hands over
//! to torch, and `quiet_dicts_known()` says so.
use pyo3::ffi;
use std::sync::atomic::{AtomicBool, Ordering};

/// `PyDictKeysObject`: `Py_ssize_t dk_refcnt; uint8_t dk_log2_size;
/// uint8_t dk_log2_index_bytes; uint8_t dk_kind; ...` (3.11-3.14, GIL builds).
const DK_KIND_OFFSET: usize = std::mem::size_of::<ffi::Py_ssize_t>() + 2;
const DICT_KEYS_GENERAL: u8 = 0;

static KNOWN: AtomicBool = AtomicBool::new(false);

#[inline(always)]
unsafe fn dk_kind(dict: *mut ffi::PyObject) -> u8 {
    let keys = (*(dict as *mut ffi::PyDictObject)).ma_keys as *const u8;
    *keys.add(DK_KIND_OFFSET)
}

/// Is `obj` an exact dict whose lookups by an exact `str` run no code?
#[inline(always)]
pub unsafe fn dict(obj: *mut ffi::PyObject) -> bool {
    ffi::PyDict_CheckExact(obj) != 0
        && KNOWN.load(Ordering::Relaxed)
        && dk_kind(obj) != DICT_KEYS_GENERAL
}

/// Is `obj` an exact set whose elements are all exact `str` (so a lookup by
/// an exact `str` runs no code)? Reads the set's table (the public
/// `PySetObject` layout) without allocating; linear in the table size, and
/// the sets torch keeps (`_non_persistent_buffers_set`) are small.
pub unsafe fn set(obj: *mut ffi::PyObject) -> bool {
    if ffi::PySet_CheckExact(obj) == 0 {
        return false;
    }
    let so = obj as *mut ffi::PySetObject;
    let used = (*so).used;
    if used == 0 {
        return true;
    }
    // Live entries that are exact str; deleted slots hold a private dummy
    // object, which is not one, so "all live entries are str" is a count.
    let table = (*so).table;
    let mut strs: ffi::Py_ssize_t = 0;
    for i in 0..=(*so).mask {
        let key = (*table.offset(i)).key;
        if !key.is_null() && ffi::PyUnicode_CheckExact(key) != 0 {
            strs += 1;
        }
    }
    strs == used
}

/// Did the layout check at import succeed?
pub fn known() -> bool {
    KNOWN.load(Ordering::Relaxed)
}

/// Verify the key-table kind offset on live dicts: str keys, an instance
/// dict (split or str-only), and a dict that was given a non-str key.
pub fn init(py: pyo3::Python<'_>) -> pyo3::PyResult<()> {
    use pyo3::types::{PyDict, PyDictMethods};
    let strs = PyDict::new(py);
    strs.set_item("a", 1)?;
    let general = PyDict::new(py);
    general.set_item("a", 1)?;
    general.set_item(1, 1)?;
    let general2 = PyDict::new(py);
    general2.set_item(1, 1)?;
    let ok = unsafe {
        dk_kind(strs.as_ptr()) != DICT_KEYS_GENERAL
            && dk_kind(general.as_ptr()) == DICT_KEYS_GENERAL
            && dk_kind(general2.as_ptr()) == DICT_KEYS_GENERAL
            && dk_kind(strs.copy()?.as_ptr()) != DICT_KEYS_GENERAL
            && dk_kind(PyDict::new(py).as_ptr()) != DICT_KEYS_GENERAL
    };
    // Plausible values only: kinds are small enumerations.
    let small = unsafe { dk_kind(strs.as_ptr()) <= 3 };
    let _ = strs.get_item("a")?;
    KNOWN.store(ok && small, Ordering::Relaxed);
    Ok(())
}
