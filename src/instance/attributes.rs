//! Small primitives shared by the slot implementations: instance `__dict__`
//! access and "plain" attribute reads that follow `object.__getattribute__`
//! exactly for the common case and report anything unusual to the caller.
use crate::cpython::capi;
use crate::cpython::private_api::_PyObject_GetDictPtr;
use crate::cpython::type_cache::type_lookup;

/// Outcome of reading an attribute that torch keeps in the instance `__dict__`.
pub enum Plain {
    /// Borrowed value, found exactly as `object.__getattribute__` would.
    Found(*mut capi::PyObject),
    /// A descriptor or a miss: only torch's own code can answer exactly.
    Unusual,
    /// A Python exception is set.
    Error,
}

/// Borrowed instance `__dict__`, or null; ready to be remembered by the
/// caches (`crate::cpython::validity::own_values`).
#[inline(always)]
pub unsafe fn instance_dict(obj: *mut capi::PyObject) -> *mut capi::PyObject {
    let d = dict_as_is(obj);
    if !d.is_null() {
        crate::cpython::validity::own_values(obj, d);
    }
    d
}

/// Borrowed instance `__dict__`, or null, not readied.
#[inline(always)]
pub unsafe fn dict_as_is(obj: *mut capi::PyObject) -> *mut capi::PyObject {
    let p = _PyObject_GetDictPtr(obj);
    if p.is_null() {
        std::ptr::null_mut()
    } else {
        *p
    }
}

/// Is `obj`'s instance `__dict__` (null: none) still `dict`, one remembered
/// from [`instance_dict`]? That dict was readied when it was found, and
/// stays so (an object's inline values, once given up, are never shared
/// again), so it is not readied again: the whole-tree checks compare
/// thousands of modules in a row and need not touch each dict.
#[inline(always)]
pub unsafe fn instance_dict_is(obj: *mut capi::PyObject, dict: *mut capi::PyObject) -> bool {
    dict_as_is(obj) == dict
}

/// `obj.<name>` for a name that is normally an instance attribute (`name`
/// an exact `str`). Only a quiet instance dict (see `crate::cpython::quiet`)
/// is read: its lookup runs no code, so a caller may use what it found and
/// what it read before. Any other dict is Unusual (torch's code answers).
#[inline(always)]
pub unsafe fn plain_attr(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Plain {
    let descr = type_lookup(tp, name);
    if !descr.is_null() {
        let dt = capi::Py_TYPE(descr);
        let (get, set) = crate::cpython::types::descr_slots(dt);
        if get.is_some() || set.is_some() {
            return Plain::Unusual;
        }
    }
    if !dict.is_null() {
        if !crate::cpython::quiet::dict(dict) {
            return Plain::Unusual;
        }
        let v = crate::instance::walk_facts::dict_get(tp, dict, name);
        if !v.is_null() {
            return Plain::Found(v);
        }
        if !capi::PyErr_Occurred().is_null() {
            return Plain::Error;
        }
    }
    if descr.is_null() {
        Plain::Unusual
    } else {
        Plain::Found(descr)
    }
}

/// `obj.<name>` for an attribute torch keeps in the instance `__dict__`
/// (a registry): Some(value) when found exactly as `object.__getattribute__`
/// would, None when only a full attribute lookup can answer.
pub fn instance_attr<'py>(
    obj: &pyo3::Bound<'py, pyo3::PyAny>,
    name: &pyo3::Bound<'py, pyo3::types::PyString>,
) -> pyo3::PyResult<Option<pyo3::Bound<'py, pyo3::PyAny>>> {
    let py = obj.py();
    unsafe {
        let m = obj.as_ptr();
        match plain_attr(capi::Py_TYPE(m), instance_dict(m), name.as_ptr()) {
            Plain::Found(d) => Ok(Some(pyo3::Bound::from_borrowed_ptr(py, d))),
            Plain::Error => Err(pyo3::PyErr::fetch(py)),
            Plain::Unusual => Ok(None),
        }
    }
}

/// `bool(value)` of a call's result.
pub fn truthy(v: pyo3::PyResult<pyo3::Bound<'_, pyo3::PyAny>>) -> pyo3::PyResult<bool> {
    use pyo3::types::PyAnyMethods;
    v?.is_truthy()
}

/// Is `obj` an exact `str`?
pub fn exact_str(obj: &pyo3::Bound<'_, pyo3::PyAny>) -> bool {
    unsafe { capi::PyUnicode_CheckExact(obj.as_ptr()) != 0 }
}

/// Borrowed `dict.get(key)` for an exact dict; null when missing or on error
/// (check `PyErr_Occurred`).
#[inline(always)]
pub unsafe fn dict_get(dict: *mut capi::PyObject, key: *mut capi::PyObject) -> *mut capi::PyObject {
    if dict.is_null() {
        return std::ptr::null_mut();
    }
    capi::PyDict_GetItemWithError(dict, key)
}

/// `func(slf, *args, **kwargs)` without building a new tuple.
pub unsafe fn call_with_self(
    func: *mut capi::PyObject,
    slf: *mut capi::PyObject,
    args: *mut capi::PyObject,
    kwargs: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let n = capi::PyTuple_GET_SIZE(args) as usize;
    const INLINE: usize = 8;
    if n < INLINE {
        let mut buf: [*mut capi::PyObject; INLINE] = [std::ptr::null_mut(); INLINE];
        buf[0] = slf;
        for (i, slot) in buf.iter_mut().enumerate().skip(1).take(n) {
            *slot = capi::PyTuple_GET_ITEM(args, (i - 1) as capi::Py_ssize_t);
        }
        capi::PyObject_VectorcallDict(func, buf.as_ptr(), n + 1, kwargs)
    } else {
        let mut v: Vec<*mut capi::PyObject> = Vec::with_capacity(n + 1);
        v.push(slf);
        for i in 0..n {
            v.push(capi::PyTuple_GET_ITEM(args, i as capi::Py_ssize_t));
        }
        capi::PyObject_VectorcallDict(func, v.as_ptr(), n + 1, kwargs)
    }
}

/// `hasattr(obj, name)` through the object's own `tp_getattro`: Ok(bool), or
/// Err(()) with an exception set (only AttributeError means "no").
pub unsafe fn has_attr_generic(
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Result<bool, ()> {
    let mut out: *mut capi::PyObject = std::ptr::null_mut();
    match capi::PyObject_GetOptionalAttr(obj, name, &mut out) {
        1 => {
            capi::Py_DECREF(out);
            Ok(true)
        }
        0 => Ok(false),
        _ => Err(()),
    }
}

/// `obj.<name>` where `name` is a static interned name normally served by a
/// data descriptor of the class (a torch getset such as `grad` or `dtype`):
/// the descriptor's getter called directly when the class uses
/// `object.__getattribute__` (which would call exactly that getter, a data
/// descriptor taking precedence over the instance dict); a plain `getattr`
/// otherwise.
pub fn data_attr<'py>(
    obj: &pyo3::Bound<'py, pyo3::PyAny>,
    name: &pyo3::Bound<'py, pyo3::types::PyString>,
) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::PyAny>> {
    use pyo3::types::PyAnyMethods;
    unsafe {
        let tp = capi::Py_TYPE(obj.as_ptr());
        if let Some((descr, get)) = class_data_descr(tp, name.as_ptr()) {
            // Held across the call, as object.__getattribute__ does.
            capi::Py_INCREF(descr);
            let r = get(descr, obj.as_ptr(), tp as *mut capi::PyObject);
            capi::Py_DECREF(descr);
            return pyo3::Bound::from_owned_ptr_or_err(obj.py(), r);
        }
    }
    obj.getattr(name)
}

/// The data descriptor (borrowed, with its getter) that reading `name` on an
/// instance of `tp` calls, when `tp` uses `object.__getattribute__` (a data
/// descriptor of the class then takes precedence over the instance dict);
/// None otherwise.
pub unsafe fn class_data_descr(
    tp: *mut capi::PyTypeObject,
    name: *mut capi::PyObject,
) -> Option<(*mut capi::PyObject, capi::descrgetfunc)> {
    // object's own slot, read from its type: both addresses are libpython's.
    let generic = crate::cpython::types::getattro_slot(crate::cpython::types::object_type());
    if crate::cpython::types::getattro_slot(tp).map(|f| f as usize) != generic.map(|f| f as usize) {
        return None;
    }
    let descr = type_lookup(tp, name);
    // `unknown()` is a stand-in data descriptor, never to be called: a plain
    // `getattr` makes the lookup, as stock does.
    if descr.is_null() || descr == crate::cpython::type_cache::unknown() {
        return None;
    }
    let dt = capi::Py_TYPE(descr);
    match crate::cpython::types::descr_slots(dt) {
        (Some(get), Some(_)) => Some((descr, get)),
        _ => None,
    }
}
