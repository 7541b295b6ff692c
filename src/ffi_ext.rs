//! CPython entry points that pyo3-ffi does not declare.
//!
//! All three are exported by libpython 3.11-3.13 (they back `getattr`,
//! attribute specialisation and Cython); we only ever call them with the GIL
//! held.
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

/// `_PyType_Lookup` through a cache of our own, for the fixed set of names
/// fastmodule looks up (each an interned string it keeps alive for the life
/// of the process — callers must not pass a transient name).
///
/// CPython's method cache is shared by every lookup in the process and
/// indexed by version tag and name address; on a tree walk two of our
/// lookups can map to the same slot and evict each other on every module,
/// each miss then walking the whole MRO. Entries here are valid while the
/// type's `tp_version_tag` is unchanged (CPython resets it to 0 on any change
/// to the type or a base, and tags are never reused), exactly the rule of
/// CPython's own cache; results are borrowed as there.
#[inline(always)]
pub unsafe fn type_lookup(tp: *mut PyTypeObject, name: *mut PyObject) -> *mut PyObject {
    let version = crate::cpython::validity::class_version(tp);
    let slot = &mut (*TYPE_CACHE.0.get())[type_slot(tp, name)];
    if version != 0 && slot.tp == tp && slot.name == name && slot.version == version {
        return slot.found;
    }
    let found = _PyType_Lookup(tp, name);
    // The lookup assigns a tag to a type that had none.
    let version = crate::cpython::validity::class_version(tp);
    if version != 0 {
        *slot = TypeSlot {
            tp,
            name,
            version,
            found,
        };
    }
    found
}

#[derive(Clone, Copy)]
struct TypeSlot {
    tp: *mut PyTypeObject,
    name: *mut PyObject,
    version: u32,
    found: *mut PyObject,
}

const TYPE_CACHE_BITS: u32 = 11;

struct TypeCache(std::cell::UnsafeCell<[TypeSlot; 1 << TYPE_CACHE_BITS]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for TypeCache {}

static TYPE_CACHE: TypeCache = TypeCache(std::cell::UnsafeCell::new(
    [TypeSlot {
        tp: std::ptr::null_mut(),
        name: std::ptr::null_mut(),
        version: 0,
        found: std::ptr::null_mut(),
    }; 1 << TYPE_CACHE_BITS],
));

#[inline(always)]
fn type_slot(tp: *mut PyTypeObject, name: *mut PyObject) -> usize {
    let h = (tp as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (name as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    (h >> (64 - TYPE_CACHE_BITS)) as usize
}
