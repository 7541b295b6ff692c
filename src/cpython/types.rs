//! Reads and writes of a type object's fields: its C slots (`tp_call`,
//! `tp_getattro`, `tp_descr_get`/`tp_descr_set`, `tp_hash`,
//! `tp_richcompare`), its MRO and its base. fastmodule installs its own
//! `tp_call`/`tp_getattro` on classes (see `crate::call::slots`) and compares
//! slots with `object`'s; everything else goes through the C API. All with
//! the GIL held, on live type objects.
use pyo3::ffi::{self, PyObject, PyTypeObject};

/// `object` (`PyBaseObject_Type`).
#[inline(always)]
pub fn object_type() -> *mut PyTypeObject {
    std::ptr::addr_of_mut!(ffi::PyBaseObject_Type)
}

/// `tp`'s `tp_call` slot.
#[inline(always)]
pub unsafe fn call_slot(tp: *mut PyTypeObject) -> Option<ffi::ternaryfunc> {
    (*tp).tp_call
}

/// Set `tp`'s `tp_call` slot (CPython recomputes it when a dunder is
/// assigned on the class or a base).
#[inline(always)]
pub unsafe fn set_call_slot(tp: *mut PyTypeObject, f: Option<ffi::ternaryfunc>) {
    (*tp).tp_call = f;
}

/// `tp`'s `tp_getattro` slot.
#[inline(always)]
pub unsafe fn getattro_slot(tp: *mut PyTypeObject) -> Option<ffi::getattrofunc> {
    (*tp).tp_getattro
}

/// Set `tp`'s `tp_getattro` slot (as [`set_call_slot`]).
#[inline(always)]
pub unsafe fn set_getattro_slot(tp: *mut PyTypeObject, f: Option<ffi::getattrofunc>) {
    (*tp).tp_getattro = f;
}

/// `tp`'s descriptor slots `(tp_descr_get, tp_descr_set)`: a data
/// descriptor has both.
#[inline(always)]
pub unsafe fn descr_slots(
    tp: *mut PyTypeObject,
) -> (Option<ffi::descrgetfunc>, Option<ffi::descrsetfunc>) {
    ((*tp).tp_descr_get, (*tp).tp_descr_set)
}

/// `tp`'s `tp_hash` slot.
#[inline(always)]
pub unsafe fn hash_slot(tp: *mut PyTypeObject) -> Option<ffi::hashfunc> {
    (*tp).tp_hash
}

/// `tp`'s `tp_richcompare` slot.
#[inline(always)]
pub unsafe fn richcompare_slot(tp: *mut PyTypeObject) -> Option<ffi::richcmpfunc> {
    (*tp).tp_richcompare
}

/// `tp.__mro__` (borrowed; null before the type is ready).
#[inline(always)]
pub unsafe fn mro(tp: *mut PyTypeObject) -> *mut PyObject {
    (*tp).tp_mro
}

/// `tp`'s `tp_base` (borrowed; null for `object`).
#[inline(always)]
pub unsafe fn base(tp: *mut PyTypeObject) -> *mut PyTypeObject {
    (*tp).tp_base
}

/// `super(start, obj).<name>` for an instance `obj` of `tp`, as a class
/// attribute: what the first class after `start` in `tp`'s MRO holds in its
/// own dict under `name` (borrowed, for an identity comparison; null when
/// none has it). None when `start` is not in the MRO, a class after it is a
/// static type other than `object` (its dict is not read here), or a class
/// dict there has a key that is not an exact `str`: looking `name` up in it
/// could call that key's `__eq__`, which `super()` in torch's code runs on
/// every call and a native path would skip. So no lookup here runs code.
///
/// The MRO and each class read from it are held for the loop anyway, as
/// CPython's `super()` holds them: `tp.__bases__` may be reassigned (freeing
/// the old MRO) by any code a future change lets run in between.
pub unsafe fn lookup_after(
    tp: *mut PyTypeObject,
    start: *mut PyTypeObject,
    name: *mut PyObject,
) -> Option<*mut PyObject> {
    let mro = mro(tp);
    if mro.is_null() || ffi::PyTuple_Check(mro) == 0 {
        return None;
    }
    let mro = super::Owned::new_ref(mro);
    let n = ffi::PyTuple_GET_SIZE(mro.as_ptr());
    let from = (0..n).find(|&i| ffi::PyTuple_GET_ITEM(mro.as_ptr(), i) == start.cast())? + 1;
    for i in from..n {
        let k = super::Owned::new_ref(ffi::PyTuple_GET_ITEM(mro.as_ptr(), i));
        let tk = k.as_ptr() as *mut PyTypeObject;
        if tk == object_type() {
            return Some(super::type_cache::type_lookup(tk, name));
        }
        if ffi::PyType_GetFlags(tk) & ffi::Py_TPFLAGS_HEAPTYPE == 0 {
            return None;
        }
        let d = (*tk).tp_dict;
        if d.is_null() || ffi::PyDict_CheckExact(d) == 0 || !super::str_keys::all_str(d) {
            return None;
        }
        let v = ffi::PyDict_GetItemWithError(d, name);
        if !v.is_null() {
            return Some(v);
        }
        if !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
    }
    Some(std::ptr::null_mut())
}
