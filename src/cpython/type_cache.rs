//! fastmodule's own cache in front of `_PyType_Lookup` (MRO lookups by name).
use pyo3::ffi::{PyObject, PyTypeObject};

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
    let version = super::validity::class_version(tp);
    let slot = &mut (*TYPE_CACHE.0.get())[type_slot(tp, name)];
    if version != 0 && slot.tp == tp && slot.name == name && slot.version == version {
        return slot.found;
    }
    let found = super::private_api::_PyType_Lookup(tp, name);
    // The lookup assigns a tag to a type that had none.
    let version = super::validity::class_version(tp);
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
