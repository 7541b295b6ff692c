//! The public C API items fastmodule's domain code calls, re-exported from
//! one place: outside `cpython/`, code writes `capi::PyDict_GetItemWithError`
//! and never `ffi::` / `pyo3::ffi` directly. The list is explicit, so this
//! file is the inventory of the C API the crate relies on; none of it is
//! private (`_Py*`) or a struct-layout read — those live beside it in
//! `private_api`, `type_cache`, `types`, `dicts`, `strs`, `vectorcall`,
//! `recursion`, `gc`, `validity`, `quiet`, `tracer`, each behind typed
//! wrappers. Add a name here when domain code needs another public function.

/// Object and function-pointer types.
pub use pyo3::ffi::{
    descrgetfunc, getattrofunc, ternaryfunc, vectorcallfunc, PyFunctionObject, PyObject,
    PyTypeObject, Py_ssize_t,
};

/// Type objects (addresses compared with `Py_TYPE`).
pub use pyo3::ffi::{
    PyBaseObject_Type, PyDict_Type, PyGetSetDescr_Type, PyMethodDescr_Type, PyTuple_Type,
    PyType_Type,
};

/// Exception types.
pub use pyo3::ffi::{
    PyExc_AttributeError, PyExc_KeyError, PyExc_NameError, PyExc_RuntimeError, PyExc_TypeError,
    PyExc_UserWarning, PyExc_ValueError,
};

/// Functions and macros of the public C API.
pub use pyo3::ffi::{
    PyDict_Check, PyDict_CheckExact, PyDict_Contains, PyDict_DelItem, PyDict_GetItemWithError,
    PyDict_Next, PyDict_SetItem, PyDict_Size, PyErr_Clear, PyErr_ExceptionMatches, PyErr_Format,
    PyErr_Occurred, PyErr_SetObject, PyErr_SetString, PyFunction_Check, PyIter_Next, PyList_Append,
    PyList_New, PyLong_FromLong, PyLong_FromSsize_t, PyObject_Call, PyObject_CallFunctionObjArgs,
    PyObject_CallMethod, PyObject_CallMethodObjArgs, PyObject_CallNoArgs, PyObject_CallOneArg,
    PyObject_Format, PyObject_GenericGetAttr, PyObject_GenericSetAttr, PyObject_GetAttr,
    PyObject_GetItem, PyObject_GetIter, PyObject_IsInstance, PyObject_IsTrue,
    PyObject_RichCompareBool, PyObject_SetItem, PyObject_Vectorcall, PyObject_VectorcallDict,
    PySequence_Contains, PySet_CheckExact, PySet_Contains, PySet_Discard, PySlice_New,
    PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_Pack, PyTuple_SET_ITEM,
    PyType_IsSubtype, PyUnicode_Check, PyUnicode_CheckExact, PyUnicode_Compare,
    PyUnicode_CompareWithASCIIString, PyUnicode_Concat, PyUnicode_FindChar, PyUnicode_FromString,
    PyUnicode_GET_LENGTH, PyUnicode_GetLength, PyUnicode_Join, PyUnicode_Substring,
    PyUnicode_Tailmatch, PyVectorcall_NARGS, Py_DECREF, Py_EQ, Py_EnterRecursiveCall, Py_False,
    Py_GetRecursionLimit, Py_INCREF, Py_IncRef, Py_LeaveRecursiveCall, Py_None, Py_TYPE, Py_True,
    Py_XDECREF,
};

/// pyo3's shims of functions newer CPythons declare (`PyObject_GetOptionalAttr`
/// is 3.13's; older versions get pyo3's equivalent).
pub use pyo3::ffi::compat::PyObject_GetOptionalAttr;

/// Used by the native dispatch of forward hooks (`crate::call::hooks_dispatch`)
/// and the native torch layers (`crate::call::layers`).
pub use pyo3::ffi::{
    PyBool_Check, PyCell_Get, PyDict_Copy, PyDict_New, PyErr_WarnExplicitObject, PyFloat_AS_DOUBLE,
    PyFloat_CheckExact, PyFloat_FromDouble, PyFunction_GetCode, PyFunction_GetDefaults,
    PyFunction_GetKwDefaults, PyList_SET_ITEM, PyLong_AsLongLong, PyLong_CheckExact,
    PyLong_FromLongLong, PyModule_CheckExact, PyNumber_Float, PyNumber_TrueDivide,
    PyObject_CallMethodNoArgs, PyObject_CallMethodOneArg, PyObject_Size, PyObject_Str,
    PyObject_VectorcallMethod, PySet_Add, PySet_New, PyTuple_CheckExact, PyType_GetName,
    PyUnicode_FromFormat,
};
