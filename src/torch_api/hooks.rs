//! The module-level hook dicts of `torch.nn.modules.module`.
//!
//! `_call_impl` reads `_global_forward_hooks` & co. as module globals on every
//! call. We do the same, but skip the four dict lookups while the module's
//! globals dict is unchanged (its version tag moves on any insertion,
//! deletion or rebinding). The dicts' contents are always read live.
use crate::cpython::capi;
use crate::torch_api::originals::Globals;
use std::cell::Cell;

struct Cache {
    version: Cell<u64>,
    dicts: Cell<[*mut capi::PyObject; 4]>,
}

// SAFETY: only touched with the GIL held.
unsafe impl Sync for Cache {}

static CACHE: Cache = Cache {
    version: Cell::new(0),
    dicts: Cell::new([std::ptr::null_mut(); 4]),
};

use crate::cpython::validity::dict_version as version;

/// Ok(true) when all four global call-hook dicts are empty dicts/OrderedDicts.
/// Ok(false) means torch's code must decide (hooks, or something unusual).
#[inline(always)]
pub unsafe fn global_call_hooks_empty(g: &Globals) -> Result<bool, ()> {
    let v = version(g.module_globals);
    if v == 0 || v != CACHE.version.get() {
        // A non-str key in the module's globals could run code during the
        // lookups below: torch's code reads them then.
        if !crate::cpython::quiet::dict(g.module_globals) {
            return Ok(false);
        }
        let mut dicts = [std::ptr::null_mut(); 4];
        for (slot, &name) in dicts.iter_mut().zip(g.names.global_hooks.iter()) {
            let h = capi::PyDict_GetItemWithError(g.module_globals, name);
            if h.is_null() {
                return if capi::PyErr_Occurred().is_null() {
                    Ok(false)
                } else {
                    Err(())
                };
            }
            *slot = h;
        }
        // Borrowed: the module's globals keep them alive until the version
        // changes, and we re-read them then.
        CACHE.dicts.set(dicts);
        CACHE.version.set(v);
    }
    for h in CACHE.dicts.get() {
        if !matches!(hook_dict_len(h, g.odict), Some(0)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A hook registry whose truth value is its length: `dict` or `OrderedDict`.
#[inline(always)]
pub unsafe fn hook_dict_len(
    obj: *mut capi::PyObject,
    odict: *mut capi::PyTypeObject,
) -> Option<isize> {
    let t = capi::Py_TYPE(obj);
    if t == std::ptr::addr_of_mut!(capi::PyDict_Type) || t == odict {
        Some(crate::cpython::dicts::used(obj))
    } else {
        None
    }
}
