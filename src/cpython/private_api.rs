//! CPython's private entry points (`_Py*`) that fastmodule calls, which
//! pyo3-ffi does not declare.
//!
//! All are exported by libpython 3.11-3.13 (they back `getattr`, attribute
//! specialisation, Cython and PEP 523 frame evaluators); we only ever call
//! them with the GIL held. Nothing outside `cpython/` names them: the typed
//! wrappers beside them (`type_cache`, `attributes` users) do.
use pyo3::ffi::{PyInterpreterState, PyObject, PyTypeObject};
use std::os::raw::{c_int, c_void};

extern "C" {
    /// MRO lookup through the type's method cache; borrowed result, no error set.
    pub fn _PyType_Lookup(tp: *mut PyTypeObject, name: *mut PyObject) -> *mut PyObject;
    /// `object.__getattribute__`; with `suppress != 0` a missing attribute
    /// (including an AttributeError raised by a descriptor) returns NULL
    /// without an exception, which is what `slot_tp_getattr_hook` does before
    /// calling `__getattr__`.
    pub fn _PyObject_GenericGetAttrWithDict(
        obj: *mut PyObject,
        name: *mut PyObject,
        dict: *mut PyObject,
        suppress: c_int,
    ) -> *mut PyObject;
    /// Address of the instance `__dict__` slot (materialising a managed dict).
    pub fn _PyObject_GetDictPtr(obj: *mut PyObject) -> *mut *mut PyObject;
    /// The interpreter's PEP 523 frame evaluator (Dynamo installs its own).
    pub fn _PyInterpreterState_GetEvalFrameFunc(interp: *mut PyInterpreterState) -> *mut c_void;
    /// CPython's default frame evaluator.
    pub fn _PyEval_EvalFrameDefault(
        tstate: *mut pyo3::ffi::PyThreadState,
        frame: *mut c_void,
        throwflag: c_int,
    ) -> *mut PyObject;
}

/// Is a PEP 523 frame evaluator (torch.compile's Dynamo, some debuggers)
/// active? Then torch's Python frames must exist exactly as in stock, so the
/// call fast paths step aside.
#[inline(always)]
pub unsafe fn custom_eval_frame() -> bool {
    let f = _PyInterpreterState_GetEvalFrameFunc(pyo3::ffi::PyInterpreterState_Get());
    !f.is_null() && f != _PyEval_EvalFrameDefault as *mut c_void
}
