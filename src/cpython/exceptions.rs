//! Exceptions in flight and being handled, as Python's `try`/`except` sees
//! them: taking the raised exception out of the thread state and putting it
//! back, and the "handled" exception (`sys.exception()`, the implicit
//! `__context__` of anything raised meanwhile) while an `except` block runs.
//!
//! CPython 3.12 keeps one normalised exception object per thread
//! (`PyErr_GetRaisedException`); 3.11 keeps a (type, value, traceback) triple
//! that is normalised here, so both give one exception instance with its
//! traceback attached.
use crate::cpython::Owned;
use pyo3::ffi;

/// The exception being raised, taken out of the thread state (none set:
/// None).
///
/// # Safety
/// The GIL must be held.
pub unsafe fn take_raised() -> Option<Owned> {
    #[cfg(Py_3_12)]
    {
        Owned::from_owned_ptr(ffi::PyErr_GetRaisedException())
    }
    #[cfg(not(Py_3_12))]
    {
        let (mut t, mut v, mut tb) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        ffi::PyErr_Fetch(&mut t, &mut v, &mut tb);
        if t.is_null() {
            return None;
        }
        ffi::PyErr_NormalizeException(&mut t, &mut v, &mut tb);
        if !tb.is_null() && !v.is_null() {
            ffi::PyException_SetTraceback(v, tb);
        }
        ffi::Py_XDECREF(t);
        ffi::Py_XDECREF(tb);
        Owned::from_owned_ptr(v)
    }
}

/// Raise `exc` again (as a bare `raise` in its `except` block does: the same
/// object with its traceback).
///
/// # Safety
/// The GIL must be held; `exc` an exception instance.
pub unsafe fn reraise(exc: Owned) {
    let p = exc.into_ptr();
    #[cfg(Py_3_12)]
    {
        ffi::PyErr_SetRaisedException(p);
    }
    #[cfg(not(Py_3_12))]
    {
        let t = ffi::Py_TYPE(p) as *mut ffi::PyObject;
        ffi::Py_INCREF(t);
        ffi::PyErr_Restore(t, p, ffi::PyException_GetTraceback(p));
    }
}

/// Is `exc` an instance of `Exception` (what `except Exception:` catches)?
///
/// # Safety
/// The GIL must be held.
pub unsafe fn is_exception(exc: &Owned) -> bool {
    ffi::PyObject_TypeCheck(exc.as_ptr(), ffi::PyExc_Exception as *mut ffi::PyTypeObject) != 0
}

/// Runs `f` as the body of an `except` block handling `exc`: meanwhile
/// `exc` is the thread's handled exception (the `__context__` of anything
/// raised), and the previous one is restored after.
///
/// # Safety
/// The GIL must be held.
pub unsafe fn while_handling<R>(exc: &Owned, f: impl FnOnce() -> R) -> R {
    let previous = ffi::PyErr_GetHandledException();
    ffi::PyErr_SetHandledException(exc.as_ptr());
    let r = f();
    ffi::PyErr_SetHandledException(previous);
    ffi::Py_XDECREF(previous);
    r
}
