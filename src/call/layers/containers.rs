//! `nn.Sequential.forward` and `nn.Identity.forward`.
use super::{cached, Leaves};
use crate::call::call_cache::{set_leaf, Entry, Leaf, LeafKind};
use crate::cpython::capi;
use crate::instance::attributes::{instance_dict, plain_attr, Plain};

/// `for module in self: input = module(input)`, with `self.__iter__` being
/// torch's `iter(self._modules.values())`.
pub(super) unsafe fn sequential(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    // The class (`__iter__`) and the instance dict (`_modules`) are what the
    // entry was validated against.
    let modules = match cached(entry, LeafKind::Sequential) {
        Some((d, _)) => d,
        None => {
            let tp = capi::Py_TYPE(slf);
            if crate::cpython::type_cache::type_lookup(tp, l.names.iter) != l.sequential_iter {
                return None;
            }
            // Not validated just now (a call with hooks: they may have given
            // the class a `__getattribute__`, through which torch's `__iter__`
            // reads `self._modules`): asked here, else torch's forward runs.
            let plain = crate::torch_api::originals::globals()
                .is_some_and(|g| crate::instance::fast::plain_getattribute(g, tp));
            if !plain {
                return None;
            }
            let dict = instance_dict(slf);
            let d = match plain_attr(tp, dict, l.names.modules) {
                Plain::Found(d) if capi::PyDict_CheckExact(d) != 0 => d,
                Plain::Error => return Some(std::ptr::null_mut()),
                _ => return None,
            };
            if !entry.is_null() && !dict.is_null() {
                let leaf = Leaf {
                    kind: LeafKind::Sequential,
                    reg: std::ptr::null_mut(),
                    reg_version: 0,
                    a: d,
                    b: std::ptr::null_mut(),
                };
                set_leaf(entry, tp, dict, leaf);
            }
            d
        }
    };
    // Held for the loop, as torch's frame holds `self._modules`.
    capi::Py_INCREF(modules);
    // Nested containers recurse natively: count them as torch's frames would.
    if capi::Py_EnterRecursiveCall(c" while calling a Python object".as_ptr()) != 0 {
        capi::Py_DECREF(modules);
        return Some(std::ptr::null_mut());
    }
    let r = sequential_loop(modules, input);
    capi::Py_LeaveRecursiveCall();
    capi::Py_DECREF(modules);
    Some(r)
}

unsafe fn sequential_loop(
    modules: *mut capi::PyObject,
    input: *mut capi::PyObject,
) -> *mut capi::PyObject {
    // `iter(self._modules.values())` with the dict iterator's checks (those
    // of `Items::next`), on borrowed pointers: each module is held as the
    // loop variable holds it, from the iterator's handing it over until the
    // next one is handed over (or the loop ends), and each input as `input`
    // holds it, up to `input = module(input)`: they are released in torch's
    // order (their finalizers and weakref callbacks run in it).
    let used = crate::cpython::dicts::used(modules);
    let mut pos: capi::Py_ssize_t = 0;
    let mut left = used;
    capi::Py_INCREF(input);
    let mut x = input;
    // The loop variable `module` (null before the first).
    let mut module: *mut capi::PyObject = std::ptr::null_mut();
    // Leaving the frame: `input`, then `module`.
    let leave = |x: *mut capi::PyObject, module: *mut capi::PyObject| {
        capi::Py_XDECREF(x);
        capi::Py_XDECREF(module);
    };
    loop {
        if crate::cpython::dicts::used(modules) != used {
            capi::PyErr_SetString(
                capi::PyExc_RuntimeError,
                c"dictionary changed size during iteration".as_ptr(),
            );
            leave(x, module);
            return std::ptr::null_mut();
        }
        let mut k: *mut capi::PyObject = std::ptr::null_mut();
        let mut v: *mut capi::PyObject = std::ptr::null_mut();
        if used == 0 || capi::PyDict_Next(modules, &mut pos, &mut k, &mut v) == 0 {
            capi::Py_XDECREF(module);
            return x;
        }
        if left == 0 {
            capi::PyErr_SetString(
                capi::PyExc_RuntimeError,
                c"dictionary keys changed during iteration".as_ptr(),
            );
            leave(x, module);
            return std::ptr::null_mut();
        }
        left -= 1;
        // `for module in ...`: the new one bound, the previous released.
        capi::Py_INCREF(v);
        let previous = std::mem::replace(&mut module, v);
        capi::Py_XDECREF(previous);
        let r = crate::call::module_call::call_one(module, x);
        if r.is_null() {
            leave(x, module);
            return r;
        }
        // `input = ...`: the previous input released.
        capi::Py_DECREF(std::mem::replace(&mut x, r));
    }
}
