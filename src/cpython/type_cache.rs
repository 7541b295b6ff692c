//! fastmodule's own cache in front of `_PyType_Lookup` (MRO lookups by name).
use pyo3::ffi::{self, PyObject, PyTypeObject};
use std::sync::atomic::{AtomicPtr, Ordering};

/// What [`type_lookup`] answers where the lookup could run Python code: a
/// private data descriptor (a `property`) that no class holds, so it equals
/// none of torch's originals and reads as "the class defines something
/// here", whatever a caller compares it with.
static UNKNOWN: AtomicPtr<PyObject> = AtomicPtr::new(std::ptr::null_mut());

/// [`type_lookup`]'s answer where it could not look without running code
/// (null before [`init`]).
#[inline(always)]
pub fn unknown() -> *mut PyObject {
    UNKNOWN.load(Ordering::Relaxed)
}

/// Make the "unknown" answer (once, at import). Until then [`type_lookup`]
/// is `_PyType_Lookup`'s (no native path runs before import ends).
pub fn init(py: pyo3::Python<'_>) -> pyo3::PyResult<()> {
    if !unknown().is_null() {
        return Ok(());
    }
    // SAFETY: GIL held; the new reference is kept for the process.
    let p =
        unsafe { ffi::PyObject_CallNoArgs(std::ptr::addr_of_mut!(ffi::PyProperty_Type).cast()) };
    if p.is_null() {
        return Err(pyo3::PyErr::fetch(py));
    }
    UNKNOWN.store(p, Ordering::Relaxed);
    Ok(())
}

/// Can `_PyType_Lookup(tp, name)`, for an exact-`str` `name`, run no Python
/// code? Its MRO walk looks `name` up in every class dict up to the one that
/// holds it; a dict with a key that is not an exact `str` compares a key of
/// the same hash with `__eq__` (code that may reassign `__bases__`, free
/// objects a caller holds borrowed, re-enter fastmodule). Heap classes'
/// dicts are read (str-only key table, or every key an exact `str`); static
/// types' dicts cannot be written from Python (and from 3.12 on are not in
/// `tp_dict`). A type not yet ready (no MRO) would be readied: not quiet.
unsafe fn lookup_runs_no_code(tp: *mut PyTypeObject) -> bool {
    let mro = (*tp).tp_mro;
    if mro.is_null() || ffi::PyTuple_Check(mro) == 0 {
        return false;
    }
    for i in 0..ffi::PyTuple_GET_SIZE(mro) {
        let k = ffi::PyTuple_GET_ITEM(mro, i);
        if ffi::PyType_Check(k) == 0 {
            return false;
        }
        let k = k as *mut PyTypeObject;
        if ffi::PyType_GetFlags(k) & ffi::Py_TPFLAGS_HEAPTYPE == 0 {
            continue;
        }
        let d = (*k).tp_dict;
        if d.is_null() || ffi::PyDict_Check(d) == 0 || !super::str_keys::all_str(d) {
            return false;
        }
    }
    true
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
///
/// Runs no Python code: where a class dict in the MRO has a key that is not
/// an exact `str` (a lookup there may call that key's `__eq__`), the answer
/// is [`unknown()`] instead, which compares equal to no original and is not
/// null, so every caller hands over to torch's code, which then makes the
/// lookups stock makes. Callers may therefore hold borrowed pointers across
/// it. The result is borrowed from a class dict (or is [`unknown()`]).
#[inline(always)]
pub unsafe fn type_lookup(tp: *mut PyTypeObject, name: *mut PyObject) -> *mut PyObject {
    let version = super::validity::class_version(tp);
    let slot = &(*TYPE_CACHE.0.get())[type_slot(tp, name)];
    if version != 0 && slot.tp == tp && slot.name == name && slot.version == version {
        return slot.found;
    }
    type_lookup_uncached(tp, name)
}

#[inline(never)]
unsafe fn type_lookup_uncached(tp: *mut PyTypeObject, name: *mut PyObject) -> *mut PyObject {
    let unknown = unknown();
    let found = if unknown.is_null() || lookup_runs_no_code(tp) {
        super::private_api::_PyType_Lookup(tp, name)
    } else {
        unknown
    };
    // The lookup assigns a tag to a type that had none. Any change to a
    // class dict in the MRO resets the tag, so an "unknown" is remembered
    // under the same rule as a found value.
    let version = super::validity::class_version(tp);
    if version != 0 {
        (*TYPE_CACHE.0.get())[type_slot(tp, name)] = TypeSlot {
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
