//! Dicts whose every key is an exact `str`, checked by reading them.
//!
//! A lookup by an exact `str` in such a dict compares only `str`s (whatever
//! its key-table kind: a general table left by a deleted non-str key
//! included), so it runs no code and cannot fail. Unlike
//! [`super::quiet::dict`] this reads every entry, and it accepts any dict
//! whose lookups are `dict`'s own (exact `dict`, exact `OrderedDict`): meant
//! for the small metadata dicts `load_state_dict` reads.
use pyo3::ffi;

/// Are all of `d`'s keys exact `str`? `d` must be a dict (exact or a
/// subclass); reads its table without allocating or running code.
///
/// # Safety
/// GIL held; `d` a live dict.
pub unsafe fn all_str(d: *mut ffi::PyObject) -> bool {
    if super::quiet::dict(d) {
        return true;
    }
    let (mut pos, mut k, mut v) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while ffi::PyDict_Next(d, &mut pos, &mut k, &mut v) != 0 {
        if ffi::PyUnicode_CheckExact(k) == 0 {
            return false;
        }
    }
    true
}
