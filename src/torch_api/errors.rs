//! Raising the exceptions torch raises, with torch's exact texts.
//!
//! Messages are assembled from Python `str` objects (never via Rust `String`)
//! so that any name a user can pass, lone surrogates included, round-trips.
use crate::cpython::capi;
use crate::torch_api::originals::Globals;
use std::ffi::CStr;

/// A piece of an error message.
#[derive(Clone, Copy)]
pub enum Part<'a> {
    Lit(&'a CStr),
    /// A borrowed object, formatted like an f-string field (`format(obj, "")`).
    Obj(*mut capi::PyObject),
}

/// Build the message; null with an exception set on failure.
pub unsafe fn join(g: &Globals, parts: &[Part<'_>]) -> *mut capi::PyObject {
    let list = capi::PyList_New(0);
    if list.is_null() {
        return list;
    }
    for p in parts {
        let s = match p {
            Part::Lit(c) => capi::PyUnicode_FromString(c.as_ptr()),
            Part::Obj(o) => capi::PyObject_Format(*o, g.names.empty),
        };
        if s.is_null() || capi::PyList_Append(list, s) < 0 {
            capi::Py_XDECREF(s);
            capi::Py_DECREF(list);
            return std::ptr::null_mut();
        }
        capi::Py_DECREF(s);
    }
    let r = capi::PyUnicode_Join(g.names.empty, list);
    capi::Py_DECREF(list);
    r
}

/// Raise `exc(message)`; always returns null for convenient tail calls.
pub unsafe fn raise(
    g: &Globals,
    exc: *mut capi::PyObject,
    parts: &[Part<'_>],
) -> *mut capi::PyObject {
    let msg = join(g, parts);
    if !msg.is_null() {
        // KeyError and friends must receive the message as their single
        // argument, exactly as `raise KeyError("...")` does.
        let e = capi::PyObject_CallOneArg(exc, msg);
        capi::Py_DECREF(msg);
        if !e.is_null() {
            capi::PyErr_SetObject(exc, e);
            capi::Py_DECREF(e);
        }
    }
    std::ptr::null_mut()
}

/// `torch.typename(obj)` as a new reference (null with an exception set).
pub unsafe fn typename(g: &Globals, obj: *mut capi::PyObject) -> *mut capi::PyObject {
    capi::PyObject_CallOneArg(g.typename, obj)
}

/// nn.Module.__getattr__'s final
/// `AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")`.
pub unsafe fn no_attribute(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let tname = capi::PyObject_GetAttr(
        capi::Py_TYPE(obj) as *mut capi::PyObject,
        g.names.dunder_name,
    );
    if tname.is_null() {
        return tname;
    }
    raise(
        g,
        capi::PyExc_AttributeError,
        &[
            Part::Lit(c"'"),
            Part::Obj(tname),
            Part::Lit(c"' object has no attribute '"),
            Part::Obj(name),
            Part::Lit(c"'"),
        ],
    );
    capi::Py_DECREF(tname);
    std::ptr::null_mut()
}

/// Raised from a slot when `_core.init` never ran (cannot happen through the
/// public package, which initialises before installing any slot).
pub unsafe fn not_initialised() -> *mut capi::PyObject {
    capi::PyErr_SetString(
        capi::PyExc_RuntimeError,
        c"fastmodule._core is not initialised".as_ptr(),
    );
    std::ptr::null_mut()
}
