//! The module-level hook dicts of `torch.nn.modules.module`.
//!
//! `_call_impl` reads `_global_forward_hooks` & co. as module globals on every
//! call. We do the same, but skip the dict lookups while the module's
//! globals dict is unchanged (its version tag moves on any insertion,
//! deletion or rebinding). The dicts' contents are always read live.
use crate::cpython::{capi, Owned};
use crate::torch_api::hook_support::HookSupport;
use crate::torch_api::originals::Globals;
use std::cell::Cell;

/// module.py's hook globals as of one version of its globals dict
/// (borrowed: the unchanged dict keeps them alive), in
/// `Globals::names.global_hooks`'s order.
struct Cache {
    version: Cell<u64>,
    dicts: Cell<[*mut capi::PyObject; 6]>,
}

// SAFETY: only touched with the GIL held.
unsafe impl Sync for Cache {}

static CACHE: Cache = Cache {
    version: Cell::new(0),
    dicts: Cell::new([std::ptr::null_mut(); 6]),
};

use crate::cpython::validity::dict_version as version;

/// module.py's six hook globals (borrowed), remembered while its globals dict
/// keeps its version; None when one is missing or the dict is not quiet (a
/// non-str key could run code during the lookups: the caller reads them as
/// Python does then); Err(()) with a Python exception set.
#[inline(always)]
pub unsafe fn hook_globals(g: &Globals) -> Result<Option<[*mut capi::PyObject; 6]>, ()> {
    match remembered(g) {
        Some(dicts) => Ok(Some(*dicts)),
        None => look_up(g),
    }
}

/// The remembered globals, in place, while module.py's globals keep the
/// version they had when read (no Python code may run while it is used).
#[inline(always)]
unsafe fn remembered(g: &Globals) -> Option<&'static [*mut capi::PyObject; 6]> {
    let v = version(g.module_globals);
    (v != 0 && v == CACHE.version.get()).then(|| &*CACHE.dicts.as_ptr())
}

#[inline(never)]
unsafe fn look_up(g: &Globals) -> Result<Option<[*mut capi::PyObject; 6]>, ()> {
    if !crate::cpython::quiet::dict(g.module_globals) {
        return Ok(None);
    }
    let mut dicts = [std::ptr::null_mut(); 6];
    for (slot, &name) in dicts.iter_mut().zip(g.names.global_hooks.iter()) {
        let h = capi::PyDict_GetItemWithError(g.module_globals, name);
        if h.is_null() {
            return if capi::PyErr_Occurred().is_null() {
                Ok(None)
            } else {
                Err(())
            };
        }
        *slot = h;
    }
    let v = version(g.module_globals);
    if v != 0 {
        CACHE.dicts.set(dicts);
        CACHE.version.set(v);
    }
    Ok(Some(dicts))
}

/// What the four global call-hook dicts hold, as the module call needs to
/// know it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum GlobalHooks {
    /// All four are empty dicts/OrderedDicts.
    None,
    /// Forward (pre-)hooks only: the native hook dispatch can run them.
    Forward,
    /// Backward hooks (perhaps forward ones too): torch's code runs the call.
    Backward,
    /// A registry missing or not a dict/OrderedDict, or module.py's globals
    /// not plain: torch's code must decide.
    Unusual,
}

/// The state of the global call hooks (`_global_backward_pre_hooks`,
/// `_global_backward_hooks`, `_global_forward_hooks`,
/// `_global_forward_pre_hooks`), read live.
#[inline(always)]
pub unsafe fn global_call_hooks(g: &Globals) -> Result<GlobalHooks, ()> {
    let fresh;
    let dicts = match remembered(g) {
        Some(dicts) => dicts,
        None => match look_up(g)? {
            Some(d) => {
                fresh = d;
                &fresh
            }
            None => return Ok(GlobalHooks::Unusual),
        },
    };
    let mut lens = [0isize; 4];
    for (len, &h) in lens.iter_mut().zip(dicts.iter()) {
        match hook_dict_len(h, g.odict) {
            Some(n) => *len = n,
            None => return Ok(GlobalHooks::Unusual),
        }
    }
    Ok(match lens {
        [0, 0, 0, 0] => GlobalHooks::None,
        [0, 0, _, _] => GlobalHooks::Forward,
        _ => GlobalHooks::Backward,
    })
}

/// `(hook_id, hook)` pairs: up to four inline (a module rarely has more
/// hooks), the rest on the heap.
pub struct Pairs {
    inline: [Option<(Owned, Owned)>; 4],
    len: usize,
    more: Vec<(Owned, Owned)>,
}

impl Pairs {
    pub fn new() -> Pairs {
        Pairs {
            inline: [const { None }; 4],
            len: 0,
            more: Vec::new(),
        }
    }

    fn push(&mut self, pair: (Owned, Owned)) {
        match self.inline.get_mut(self.len) {
            Some(slot) => *slot = Some(pair),
            None => self.more.push(pair),
        }
        self.len += 1;
    }

    /// The pairs in the order they were added.
    pub fn into_pairs(self) -> impl Iterator<Item = (Owned, Owned)> {
        self.inline.into_iter().flatten().chain(self.more)
    }
}

impl Default for Pairs {
    fn default() -> Pairs {
        Pairs::new()
    }
}

/// Appends a hook registry's `(hook_id, hook)` pairs in iteration order to
/// `out`, as `(*registry.items(),)` takes them: a snapshot that later
/// additions or removals do not change. An exact dict is read entry by entry
/// (its `items()` makes no lookup); an exact `OrderedDict` whose keys are all
/// exact ints or strs in its own order (keys from its iterator, values from
/// its table, as its `items()` pairs them): its `items()` hashes and compares
/// each key, which runs no code only for such keys. Anything else goes through
/// `items()` itself, so each key's `__hash__`/`__eq__` runs as often as there.
pub unsafe fn snapshot_items(
    d: *mut capi::PyObject,
    s: &HookSupport,
    out: &mut Pairs,
) -> Result<(), ()> {
    let t = capi::Py_TYPE(d);
    let exact_dict = t == std::ptr::addr_of_mut!(capi::PyDict_Type);
    let plain_odict = t == s.odict && int_or_str_keys(d);
    // An OrderedDict of at most one entry is in its table's order (the
    // common case of one hook): read as a dict, without an iterator.
    if exact_dict || (plain_odict && crate::cpython::dicts::used(d) <= 1) {
        let (mut pos, mut k, mut v) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        while capi::PyDict_Next(d, &mut pos, &mut k, &mut v) != 0 {
            out.push((Owned::new_ref(k), Owned::new_ref(v)));
        }
        return Ok(());
    }
    if plain_odict {
        if let Some(pairs) = odict_items(d)? {
            for pair in pairs.into_pairs() {
                out.push(pair);
            }
            return Ok(());
        }
    }
    let items = Owned::from_owned_ptr(capi::PyObject_CallMethodObjArgs(
        d,
        s.names.items,
        std::ptr::null_mut::<capi::PyObject>(),
    ))
    .ok_or(())?;
    let it = Owned::from_owned_ptr(capi::PyObject_GetIter(items.as_ptr())).ok_or(())?;
    while let Some(pair) = Owned::from_owned_ptr(capi::PyIter_Next(it.as_ptr())) {
        out.push(unpack_pair(pair.as_ptr(), s)?);
    }
    if capi::PyErr_Occurred().is_null() {
        Ok(())
    } else {
        Err(())
    }
}

/// Are all of `d`'s keys (a dict or an `OrderedDict`) exact ints or exact
/// strs? Reads its table: no code runs, no lookup is made.
unsafe fn int_or_str_keys(d: *mut capi::PyObject) -> bool {
    let (mut pos, mut k, mut v) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while capi::PyDict_Next(d, &mut pos, &mut k, &mut v) != 0 {
        if capi::PyLong_CheckExact(k) == 0 && capi::PyUnicode_CheckExact(k) == 0 {
            return false;
        }
    }
    true
}

/// An exact `OrderedDict`'s pairs, its keys all exact ints or strs
/// ([`int_or_str_keys`]: no lookup below runs code, so none finds the dict
/// changed); None, as a guard, when a key is not (the caller asks `items()`).
unsafe fn odict_items(d: *mut capi::PyObject) -> Result<Option<Pairs>, ()> {
    let it = Owned::from_owned_ptr(capi::PyObject_GetIter(d)).ok_or(())?;
    let mut out = Pairs::new();
    while let Some(k) = Owned::from_owned_ptr(capi::PyIter_Next(it.as_ptr())) {
        if capi::PyLong_CheckExact(k.as_ptr()) == 0 && capi::PyUnicode_CheckExact(k.as_ptr()) == 0 {
            return Ok(None);
        }
        let v = capi::PyDict_GetItemWithError(d, k.as_ptr());
        if v.is_null() {
            return if capi::PyErr_Occurred().is_null() {
                Ok(None)
            } else {
                Err(())
            };
        }
        out.push((k, Owned::new_ref(v)));
    }
    if capi::PyErr_Occurred().is_null() {
        Ok(Some(out))
    } else {
        Err(())
    }
}

/// `a, b = pair` for an exact 2-tuple; anything else as the unpacking
/// statement does it (`fastmodule._verified.hook_dispatch.unpack_pair`).
pub unsafe fn unpack_pair(
    pair: *mut capi::PyObject,
    s: &HookSupport,
) -> Result<(Owned, Owned), ()> {
    if capi::PyTuple_CheckExact(pair) != 0 && capi::PyTuple_GET_SIZE(pair) == 2 {
        return Ok((
            Owned::new_ref(capi::PyTuple_GET_ITEM(pair, 0)),
            Owned::new_ref(capi::PyTuple_GET_ITEM(pair, 1)),
        ));
    }
    s.unpack_pair_generic(pair)
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
