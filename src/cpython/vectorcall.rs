//! A Python function's vectorcall entry point: reading it, and replacing it
//! (`PyFunction_SetVectorcall` from 3.12 on; on 3.11, which lacks it, the
//! struct fields it writes).
use pyo3::ffi;

/// Whether Python-to-Python calls skip a function's vectorcall entry point
/// (CPython 3.11), so that setting it changes only calls made from C.
pub const VECTORCALL_INLINED: bool = cfg!(not(Py_3_12));

/// The current vectorcall entry point of the Python function `func`.
///
/// # Safety
/// GIL held; `func` a live function object.
#[inline(always)]
pub unsafe fn vectorcall_of(func: *mut ffi::PyFunctionObject) -> Option<ffi::vectorcallfunc> {
    (*func).vectorcall
}

#[cfg(Py_3_12)]
extern "C" {
    fn PyFunction_SetVectorcall(func: *mut ffi::PyFunctionObject, vectorcall: ffi::vectorcallfunc);
}

/// Make `vc` the entry point of calls of the Python function `func` (calls
/// made through its vectorcall: from C, and from Python code from 3.12 on).
///
/// # Safety
/// GIL held; `func` a live function object.
pub unsafe fn set_vectorcall(func: *mut ffi::PyFunctionObject, vc: ffi::vectorcallfunc) {
    #[cfg(Py_3_12)]
    PyFunction_SetVectorcall(func, vc);
    #[cfg(not(Py_3_12))]
    {
        // What PyFunction_SetVectorcall does on 3.12: also stop call-site
        // specialisation from caching the function.
        (*func).func_version = 0;
        (*func).vectorcall = Some(vc);
    }
}
