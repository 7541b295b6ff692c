//! Which modules take the native paths: instances of `fastmodule.Module`
//! subclasses and of classes accelerated in place, whose `super()` after
//! `torch.nn.Module` reaches `object`'s `__setattr__` and `__delattr__` (the
//! only calls torch's reproduced code makes through `super()`): a plain
//! `(nn.Module, object)` ending, or mixins after `nn.Module` that define
//! neither, as Hugging Face's `PreTrainedModel(nn.Module, ...Mixin)` and
//! `GenerationMixin` roots.
use crate::cpython::capi;
use crate::torch_api::originals::Globals;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// `fastmodule.disabled()` / `FASTMODULE_DISABLE=1`: while set, no instance is
/// fast and the module call and attribute read hand over at once, so every
/// native path runs torch's own code (process-wide).
static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// Is fastmodule switched off (every native path hands over)?
#[inline(always)]
pub fn switched_off() -> bool {
    SWITCHED_OFF.load(Ordering::Relaxed)
}

/// Switch every native path off (true) or back on.
pub fn switch_off(off: bool) {
    SWITCHED_OFF.store(off, Ordering::Relaxed);
}

/// Is `obj` an instance of a fastmodule class whose `super()` after
/// `torch.nn.Module` is `object`'s for `__setattr__`/`__delattr__`? Only such
/// instances take the native paths; every other module keeps running
/// torch's Python code.
#[inline(always)]
pub unsafe fn is_fast_instance(g: &Globals, obj: *mut capi::PyObject) -> bool {
    let tp = capi::Py_TYPE(obj);
    !switched_off()
        && (capi::PyType_IsSubtype(tp, g.fast_module) != 0 || super::accelerated::contains(tp))
        && object_after_nn_module(g, tp)
        && plain_getattribute(g, tp)
}

/// Does `tp` read attributes with `object.__getattribute__`? torch's code
/// reads `self._parameters`, `self.__dict__`, ... through the class's
/// `__getattribute__`; the native paths read the instance dict, which is the
/// same only then. A class of its own, or a mixin before or after
/// `nn.Module`, that defines one keeps torch's code.
#[inline(always)]
pub unsafe fn plain_getattribute(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    crate::cpython::type_cache::type_lookup(tp, g.names.dunder_getattribute)
        == g.orig.object_getattribute
}

/// Does `super()` in torch's `nn.Module.__setattr__`/`__delattr__` reach
/// `object`'s for instances of `tp` (so the native registration paths, which
/// end in `object.__setattr__`, are torch's)? True at once for an MRO ending
/// in `(nn.Module, object)`; with classes between them, from what those
/// classes define, remembered while `tp`'s version tag is unchanged (CPython
/// clears it whenever `tp` or any base changes).
#[inline(always)]
pub unsafe fn object_after_nn_module(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    let mro = crate::cpython::types::mro(tp);
    if mro.is_null() || capi::PyTuple_Check(mro) == 0 {
        return false;
    }
    let n = capi::PyTuple_GET_SIZE(mro);
    if n < 2 {
        return false;
    }
    if capi::PyTuple_GET_ITEM(mro, n - 2) == g.nn_module as *mut capi::PyObject
        && capi::PyTuple_GET_ITEM(mro, n - 1)
            == std::ptr::addr_of_mut!(capi::PyBaseObject_Type) as *mut capi::PyObject
    {
        return true;
    }
    mixins_after(g, tp)
}

#[derive(Clone, Copy)]
struct Seen {
    tp: *mut capi::PyTypeObject,
    version: u32,
    answer: bool,
}

const SEEN_BITS: u32 = 6;
struct SeenTable(UnsafeCell<[Seen; 1 << SEEN_BITS]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for SeenTable {}
static SEEN: SeenTable = SeenTable(UnsafeCell::new(
    [Seen {
        tp: std::ptr::null_mut(),
        version: 0,
        answer: false,
    }; 1 << SEEN_BITS],
));

/// Classes after `nn.Module` in `tp`'s MRO: do `__setattr__` and `__delattr__`
/// still resolve past them to `object`'s?
#[inline(never)]
unsafe fn mixins_after(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    let n = &g.names;
    if crate::cpython::validity::class_version(tp) == 0 {
        // A lookup gives a class without a version tag one.
        crate::cpython::type_cache::type_lookup(tp, n.dunder_setattr);
    }
    let version = crate::cpython::validity::class_version(tp);
    let i = ((tp as usize >> 4).wrapping_mul(0x9e37_79b9) >> 8) & ((1 << SEEN_BITS) - 1);
    let slot = &mut (*SEEN.0.get())[i];
    if version != 0 && slot.tp == tp && slot.version == version {
        return slot.answer;
    }
    let object = crate::cpython::types::object_type();
    let object_is = |name| {
        let want = crate::cpython::type_cache::type_lookup(object, name);
        crate::cpython::types::lookup_after(tp, g.nn_module, name) == Some(want)
    };
    let answer = object_is(n.dunder_setattr) && object_is(n.dunder_delattr);
    let version = crate::cpython::validity::class_version(tp);
    if version != 0 {
        *slot = Seen {
            tp,
            version,
            answer,
        };
    }
    answer
}
