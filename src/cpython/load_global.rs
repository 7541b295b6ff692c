//! `LOAD_GLOBAL` as a function's code does it: the name in the function's
//! module globals, then in builtins, else `NameError`.
use crate::cpython::Owned;
use pyo3::ffi;

/// `name` (an exact `str`) read as a global of code whose module dict is
/// `globals`; Err(()) with the exception set.
///
/// # Safety
/// The GIL must be held; `globals` a dict.
pub unsafe fn load_global(
    globals: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> Result<Owned, ()> {
    for d in [globals, ffi::PyEval_GetBuiltins()] {
        if d.is_null() {
            continue;
        }
        let v = ffi::PyDict_GetItemWithError(d, name);
        if let Some(v) = std::ptr::NonNull::new(v) {
            return Ok(Owned::from_borrowed(v));
        }
        if !ffi::PyErr_Occurred().is_null() {
            return Err(());
        }
    }
    ffi::PyErr_Format(
        ffi::PyExc_NameError,
        c"name '%U' is not defined".as_ptr(),
        name,
    );
    Err(())
}
