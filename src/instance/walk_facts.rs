//! What the tree walks re-derive from every module's instance `__dict__`,
//! remembered per instance: which walked method names the dict lacks (so no
//! instance attribute shadows the class's method), the registry dicts it
//! holds (`_parameters`, `_buffers`, `_modules`), and, for `train`/`eval`,
//! the current `training` value and the registry versions at which
//! `training` was in none of the registries.
//!
//! An entry is valid under the call cache's rule: only while the instance
//! dict's version tag and the class's `tp_version_tag` are unchanged (any
//! insertion, deletion or rebinding in the dict, any change to the class or a
//! base, invalidates it). Pointers are borrowed: the unchanged dict keeps them
//! alive. A walk over a tree of thousands of modules visits each once per
//! call, so the table is sized for such trees (allocated, zeroed, on first
//! use; untouched pages cost nothing).
use crate::cpython::capi;
use crate::cpython::validity::{dict_version, Key};
use std::cell::UnsafeCell;

#[derive(Clone, Copy)]
pub struct Facts {
    key: Key,
    /// Bit `m`: `traversal::is_native` holds for method index `m`.
    native: u32,
    /// The dict's values for the registry names; null where not yet read (or
    /// missing from the dict).
    regs: [*mut capi::PyObject; 3],
    /// The dict's `training` value; null where not yet read.
    training: *mut capi::PyObject,
    /// The versions of the three registries (in `regs` order) at which
    /// `training` was a key of none of them; zero where not checked.
    training_clear: [u64; 3],
}

const EMPTY: Facts = Facts {
    key: Key::EMPTY,
    native: 0,
    regs: [std::ptr::null_mut(); 3],
    training: std::ptr::null_mut(),
    training_clear: [0; 3],
};

const SET_BITS: u32 = 15;
const SETS: usize = 1 << SET_BITS;
type Set = [Facts; 2];

struct Table(UnsafeCell<*mut Set>);
// SAFETY: allocated once and read/written only with the GIL held.
unsafe impl Sync for Table {}
static TABLE: Table = Table(UnsafeCell::new(std::ptr::null_mut()));

/// The interned registry names, in `regs` order (set once, at import).
struct Names(UnsafeCell<[*mut capi::PyObject; 3]>);
// SAFETY: as TABLE.
unsafe impl Sync for Names {}
static REG_NAMES: Names = Names(UnsafeCell::new([std::ptr::null_mut(); 3]));

/// Allocate the table (once, at import).
pub fn init(g: &crate::torch_api::originals::Globals) {
    unsafe {
        if !(*TABLE.0.get()).is_null() {
            return;
        }
        let Ok(layout) = std::alloc::Layout::array::<Set>(SETS) else {
            return;
        };
        // All-zero is EMPTY: null pointers never match a live dict. Left null
        // (no facts remembered) if the allocation fails.
        let p = std::alloc::alloc_zeroed(layout) as *mut Set;
        *REG_NAMES.0.get() = [g.names.parameters, g.names.buffers, g.names.modules];
        *TABLE.0.get() = p;
    }
}

/// `dict.get(name)` (borrowed; null when missing, or on error with an
/// exception set), through the registry facts for the registry names.
#[inline(always)]
pub unsafe fn dict_get(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let names = &*REG_NAMES.0.get();
    match names.iter().position(|&n| n == name) {
        Some(slot) => registry(tp, dict, name, slot),
        None => capi::PyDict_GetItemWithError(dict, name),
    }
}

#[inline(always)]
unsafe fn set_of(dict: *mut capi::PyObject) -> Option<&'static mut Set> {
    let t = *TABLE.0.get();
    if t.is_null() || !crate::cpython::validity::caches_on() {
        return None;
    }
    let h = (dict as u64 >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    Some(&mut *t.add((h >> (64 - SET_BITS)) as usize))
}

/// The valid entry for `dict` (an exact dict) of an instance of `tp`, if any.
#[inline(always)]
unsafe fn find(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
) -> Option<&'static mut Facts> {
    let set = set_of(dict)?;
    let key = Key::now(tp, dict)?;
    set.iter_mut().find(|e| e.key == key)
}

/// The entry for `dict`/`tp` at the dict's current version: the valid one, or
/// a fresh one replacing the least recently created in its set.
#[inline(always)]
unsafe fn entry(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
) -> Option<&'static mut Facts> {
    if capi::PyDict_CheckExact(dict) == 0 {
        return None;
    }
    let key = Key::now(tp, dict)?;
    let set = set_of(dict)?;
    if let Some(i) = set.iter().position(|e| e.key == key) {
        return Some(&mut set[i]);
    }
    if set[0].key.dict != dict {
        set[1] = set[0];
    }
    set[0] = Facts { key, ..EMPTY };
    Some(&mut set[0])
}

/// Forget what is remembered for `module`'s instance dict (`restore`). The
/// facts hold no reference; this only leaves nothing of a restored tree.
pub fn forget(module: *mut capi::PyObject) {
    // SAFETY: GIL held; `module` is alive (the caller holds it).
    unsafe {
        let dict = crate::instance::attributes::dict_as_is(module);
        if dict.is_null() {
            return;
        }
        if let Some(set) = set_of(dict) {
            for e in set.iter_mut() {
                if e.key.dict == dict {
                    *e = EMPTY;
                }
            }
        }
    }
}

/// Has `is_native` answered yes for method `bit` on an instance of `tp` with
/// instance dict `dict`, at the dict's and the class's current versions? Its
/// answer depends only on the class (and its bases, `torch.nn.Module`
/// included, whose changes reset the class's version) and on whether the
/// dict holds the method's name.
#[inline(always)]
pub unsafe fn known_native(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    bit: u32,
) -> bool {
    matches!(find(tp, dict), Some(f) if f.native & (1 << bit) != 0)
}

/// Remember `is_native`'s yes for method `bit`, decided while the dict was at
/// version `version` (not recorded if the dict has changed since: a key's
/// `__eq__` may have run during the lookup).
#[inline(always)]
pub unsafe fn note_native(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    bit: u32,
    version: u64,
) {
    if dict_version(dict) == version {
        if let Some(f) = entry(tp, dict) {
            f.native |= 1 << bit;
        }
    }
}

/// `dict.get(<registry>)` (borrowed; null when missing), remembered while the
/// dict and the class are unchanged. Null with a Python exception set on
/// error.
#[inline(always)]
unsafe fn registry(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
    slot: usize,
) -> *mut capi::PyObject {
    if let Some(f) = find(tp, dict) {
        let v = f.regs[slot];
        if !v.is_null() {
            return v;
        }
    }
    let before = dict_version(dict);
    let v = capi::PyDict_GetItemWithError(dict, name);
    if !v.is_null() && dict_version(dict) == before {
        if let Some(f) = entry(tp, dict) {
            f.regs[slot] = v;
        }
    }
    v
}

/// The fast `self.training = mode` of torch's `__setattr__` for an instance
/// whose dict holds three exact-dict registries, none with a `training` key,
/// a bool `training`, and whose class has no `training` attribute (so
/// `object.__setattr__` only rebinds the dict entry). Some(Ok) when done,
/// Some(Err) with a Python exception set, None where the facts are not known
/// (the caller runs the full path, then [`note_training`]).
#[inline(always)]
pub unsafe fn set_training(
    obj: *mut capi::PyObject,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
    mode: *mut capi::PyObject,
) -> Option<Result<(), ()>> {
    let f = find(tp, dict)?;
    let old = f.training;
    if old.is_null() || f.training_clear[0] == 0 {
        return None;
    }
    // The registries are held by the unchanged (quiet) instance dict; each
    // unchanged since `note_training` found it quiet and without `training`.
    for (reg, v) in f.regs.iter().zip(f.training_clear) {
        if reg.is_null() || capi::PyDict_CheckExact(*reg) == 0 || dict_version(*reg) != v {
            return None;
        }
    }
    if !crate::cpython::type_cache::type_lookup(tp, name).is_null() {
        return None;
    }
    if old == mode {
        // Rebinding a dict entry to the object it holds changes nothing
        // (CPython does not even bump the version).
        return Some(Ok(()));
    }
    if old != capi::Py_True() && old != capi::Py_False() {
        return None;
    }
    if capi::PyObject_GenericSetAttr(obj, name, mode) < 0 {
        return Some(Err(()));
    }
    // The dict is quiet (the entry's key matched), so the store compared no
    // keys with `__eq__`, and the old value was a bool, so releasing it ran
    // no code: the dict changed only in this entry. Confirm, then carry the
    // facts to the new version.
    let before = dict_version(dict);
    if capi::PyDict_GetItemWithError(dict, name) == mode && dict_version(dict) == before {
        if let Some(f) = entry_for_rebind(tp, dict, before) {
            f.training = mode;
        }
    }
    capi::PyErr_Clear();
    Some(Ok(()))
}

/// The entry that was valid just before this module's own rebinding of
/// `training`, moved to the dict's new version `version`.
#[inline(always)]
unsafe fn entry_for_rebind(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    version: u64,
) -> Option<&'static mut Facts> {
    let set = set_of(dict)?;
    let tv = crate::cpython::validity::class_version(tp);
    let f = set
        .iter_mut()
        .find(|e| e.key.dict == dict && e.key.tp == tp && e.key.tp_version == tv)?;
    f.key.version = version;
    Some(f)
}

/// After the full `self.training = mode` succeeded: remember the facts that
/// let the next one take [`set_training`]'s path.
pub unsafe fn note_training(
    g: &crate::torch_api::originals::Globals,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) {
    // Quiet dicts only (the instance dict and the three registries): then no
    // lookup below runs code, and what one read stays true for the next.
    if !crate::cpython::quiet::dict(dict) {
        return;
    }
    let n = &g.names;
    let before = dict_version(dict);
    let mut regs = [std::ptr::null_mut(); 3];
    let mut versions = [0u64; 3];
    for (i, reg_name) in [n.parameters, n.buffers, n.modules].into_iter().enumerate() {
        let r = capi::PyDict_GetItemWithError(dict, reg_name);
        if r.is_null() || !crate::cpython::quiet::dict(r) {
            capi::PyErr_Clear();
            return;
        }
        let v = dict_version(r);
        match capi::PyDict_Contains(r, name) {
            0 if dict_version(r) == v => {}
            _ => {
                capi::PyErr_Clear();
                return;
            }
        }
        regs[i] = r;
        versions[i] = v;
    }
    let training = capi::PyDict_GetItemWithError(dict, name);
    if training.is_null() || dict_version(dict) != before {
        capi::PyErr_Clear();
        return;
    }
    if let Some(f) = entry(tp, dict) {
        f.regs = regs;
        f.training = training;
        f.training_clear = versions;
    }
}
