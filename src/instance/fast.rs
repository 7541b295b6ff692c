//! Which modules take the native paths: instances of `fastmodule.Module`
//! subclasses and of classes accelerated in place, whose MRO ends in
//! `torch.nn.Module, object` (so stock's `super().__setattr__` is
//! `object.__setattr__`).
use crate::cpython::capi;
use crate::torch_api::originals::Globals;

/// Is `obj` an instance of a fastmodule class whose MRO puts only `object`
/// after `torch.nn.Module` (so stock's `super().__setattr__` is
/// `object.__setattr__`)? Only such instances take the native paths; every
/// other module keeps running torch's Python code.
#[inline(always)]
pub unsafe fn is_fast_instance(g: &Globals, obj: *mut capi::PyObject) -> bool {
    let tp = capi::Py_TYPE(obj);
    (capi::PyType_IsSubtype(tp, g.fast_module) != 0 || super::accelerated::contains(tp))
        && object_after_nn_module(g, tp)
}

/// Is `object` the only class after `torch.nn.Module` in `tp`'s MRO?
#[inline(always)]
pub unsafe fn object_after_nn_module(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    let mro = crate::cpython::types::mro(tp);
    if mro.is_null() || capi::PyTuple_Check(mro) == 0 {
        return false;
    }
    let n = capi::PyTuple_GET_SIZE(mro);
    n >= 2
        && capi::PyTuple_GET_ITEM(mro, n - 2) == g.nn_module as *mut capi::PyObject
        && capi::PyTuple_GET_ITEM(mro, n - 1)
            == std::ptr::addr_of_mut!(capi::PyBaseObject_Type) as *mut capi::PyObject
}
