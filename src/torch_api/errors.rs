//! Raising the exceptions torch raises, with torch's exact texts.
//!
//! Messages are assembled from Python `str` objects (never via Rust `String`)
//! so that any name a user can pass, lone surrogates included, round-trips.
use crate::torch_api::originals::Globals;
use pyo3::ffi;
use std::ffi::CStr;

/// A piece of an error message.
#[derive(Clone, Copy)]
pub enum Part<'a> {
    Lit(&'a CStr),
    /// A borrowed object, formatted like an f-string field (`format(obj, "")`).
    Obj(*mut ffi::PyObject),
}

/// Build the message; null with an exception set on failure.
pub unsafe fn join(g: &Globals, parts: &[Part<'_>]) -> *mut ffi::PyObject {
    let list = ffi::PyList_New(0);
    if list.is_null() {
        return list;
    }
    for p in parts {
        let s = match p {
            Part::Lit(c) => ffi::PyUnicode_FromString(c.as_ptr()),
            Part::Obj(o) => ffi::PyObject_Format(*o, g.names.empty),
        };
        if s.is_null() || ffi::PyList_Append(list, s) < 0 {
            ffi::Py_XDECREF(s);
            ffi::Py_DECREF(list);
            return std::ptr::null_mut();
        }
        ffi::Py_DECREF(s);
    }
    let r = ffi::PyUnicode_Join(g.names.empty, list);
    ffi::Py_DECREF(list);
    r
}

/// Raise `exc(message)`; always returns null for convenient tail calls.
pub unsafe fn raise(
    g: &Globals,
    exc: *mut ffi::PyObject,
    parts: &[Part<'_>],
) -> *mut ffi::PyObject {
    let msg = join(g, parts);
    if !msg.is_null() {
        // KeyError and friends must receive the message as their single
        // argument, exactly as `raise KeyError("...")` does.
        let e = ffi::PyObject_CallOneArg(exc, msg);
        ffi::Py_DECREF(msg);
        if !e.is_null() {
            ffi::PyErr_SetObject(exc, e);
            ffi::Py_DECREF(e);
        }
    }
    std::ptr::null_mut()
}

/// `torch.typename(obj)` as a new reference (null with an exception set).
pub unsafe fn typename(g: &Globals, obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    ffi::PyObject_CallOneArg(g.typename, obj)
}

/// nn.Module.__getattr__'s final
/// `AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")`.
pub unsafe fn no_attribute(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let tname = ffi::PyObject_GetAttr(ffi::Py_TYPE(obj) as *mut ffi::PyObject, g.names.dunder_name);
    if tname.is_null() {
        return tname;
    }
    raise(
        g,
        ffi::PyExc_AttributeError,
        &[
            Part::Lit(c"'"),
            Part::Obj(tname),
            Part::Lit(c"' object has no attribute '"),
            Part::Obj(name),
            Part::Lit(c"'"),
        ],
    );
    ffi::Py_DECREF(tname);
    std::ptr::null_mut()
}

/// Raised from a slot when `_core.init` never ran (cannot happen through the
/// public package, which initialises before installing any slot).
pub unsafe fn not_initialised() -> *mut ffi::PyObject {
    ffi::PyErr_SetString(
        ffi::PyExc_RuntimeError,
        c"fastmodule._core is not initialised".as_ptr(),
    );
    std::ptr::null_mut()
}
