//! Reads of CPython's str objects beyond the stable accessors: the bytes of
//! a compact ASCII str (a layout pyo3 does not describe on 3.14).
use pyo3::ffi;

/// The bytes of an exact, compact ASCII str (None for any other str; always
/// None on 3.14, whose str state layout pyo3 does not describe: the callers
/// then take their general path).
#[cfg(Py_3_14)]
pub unsafe fn ascii_bytes<'a>(_s: *mut ffi::PyObject) -> Option<&'a [u8]> {
    None
}

/// The bytes of an exact, compact ASCII str (None for any other str).
#[cfg(not(Py_3_14))]
pub unsafe fn ascii_bytes<'a>(s: *mut ffi::PyObject) -> Option<&'a [u8]> {
    if ffi::PyUnicode_CheckExact(s) == 0 || ffi::PyUnicode_IS_ASCII(s) == 0 {
        return None;
    }
    let len = ffi::PyUnicode_GET_LENGTH(s) as usize;
    Some(std::slice::from_raw_parts(
        ffi::PyUnicode_1BYTE_DATA(s),
        len,
    ))
}
