//! `Module.__setattr__` and `Module.__delattr__` for fast instances: each a
//! branch-for-branch transcription of torch's Python code; a precondition
//! that does not hold hands the whole operation to torch's function.
use super::preconditions::{
    attr_of, classify, exact_attrs, hold, raise_typename, reg_hooks, remove_from, run_reg_hooks,
    status, Kind, Outcome,
};
use super::register::{dispatch_register_parameter, native_method};
use crate::cpython::capi;
use crate::cpython::{quiet, Owned};
use crate::instance::attributes::{dict_get, instance_dict};
use crate::torch_api::errors::Part;
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;

/// Is a global registration hook dict empty? Err(Stock) when unusual.
unsafe fn no_reg_hooks(g: &Globals, which: *mut capi::PyObject) -> Result<bool, Outcome> {
    let h = reg_hooks(g, which)?;
    Ok(matches!(hook_dict_len(h, g.odict), Some(0)))
}

/// `self.__dict__.get(<registry>)` of a quiet instance dict (no code runs):
/// Ok(null) for a missing or None entry, Err(Stock) unless it is a quiet dict.
unsafe fn optional_registry(
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Result<*mut capi::PyObject, Outcome> {
    let r = dict_get(dict, name);
    if r.is_null() {
        return if capi::PyErr_Occurred().is_null() {
            Ok(r)
        } else {
            Err(Outcome::Error)
        };
    }
    if r == capi::Py_None() {
        return Ok(std::ptr::null_mut());
    }
    if quiet::dict(r) {
        Ok(r)
    } else {
        Err(Outcome::Stock)
    }
}

/// `name in reg` for a quiet registry (no code runs, no error possible but
/// reported if it came).
unsafe fn in_quiet(reg: *mut capi::PyObject, name: *mut capi::PyObject) -> Result<bool, Outcome> {
    match capi::PyDict_Contains(reg, name) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(Outcome::Error),
    }
}

/// `Module.__setattr__(self, name, value)`.
///
/// Every check that may send the call to torch runs first, over quiet
/// dicts and sets only, so no code runs until the first delete or store;
/// from there on the branch is torch's, step for step, with the containers
/// torch holds in locals held here too.
unsafe fn setattr_fast(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
) -> Outcome {
    if capi::PyUnicode_CheckExact(name) == 0 {
        return Outcome::Stock;
    }
    let dict = instance_dict(obj);
    if dict.is_null() || !quiet::dict(dict) {
        return Outcome::Stock;
    }
    let tp = capi::Py_TYPE(obj);
    let n = &g.names;
    let kind = classify(g, value);
    if matches!(kind, Kind::Unusual) {
        return Outcome::Stock;
    }
    let params = match optional_registry(dict, n.parameters) {
        Ok(p) => p,
        Err(o) => return o,
    };
    if matches!(kind, Kind::Param) {
        if params.is_null() {
            capi::PyErr_SetString(
                capi::PyExc_AttributeError,
                c"cannot assign parameters before Module.__init__() call".as_ptr(),
            );
            return Outcome::Error;
        }
        let [bufs, mods, np] = match exact_attrs(
            tp,
            dict,
            [
                (n.buffers, false),
                (n.modules, false),
                (n.non_persistent, true),
            ],
        ) {
            Ok(v) => v,
            Err(o) => return o,
        };
        if native_method(obj, n.register_parameter, g.orig.register_parameter) {
            match no_reg_hooks(g, n.global_param_reg_hooks) {
                Ok(true) => {}
                Ok(false) => return Outcome::Stock,
                Err(o) => return o,
            }
        }
        // remove_from(self.__dict__, self._buffers, self._modules,
        // self._non_persistent_buffers_set)
        let [d, bufs, mods, np] = match hold([dict, bufs, mods, np]) {
            Ok(v) => v,
            Err(o) => return o,
        };
        let removed = remove_from([&d, &bufs, &mods], &np, name);
        drop((d, bufs, mods, np));
        if removed.is_err() {
            return Outcome::Error;
        }
        // self.register_parameter(name, value): looked up now, after any
        // finalizer the removal ran.
        let native = native_method(obj, n.register_parameter, g.orig.register_parameter);
        return dispatch_register_parameter(g, obj, name, value, native);
    }
    if !params.is_null() {
        match in_quiet(params, name) {
            Ok(true) => {
                if value != capi::Py_None() {
                    return raise_typename(
                        g,
                        capi::PyExc_TypeError,
                        c"cannot assign '",
                        value,
                        &[
                            Part::Lit(c"' as parameter '"),
                            Part::Obj(name),
                            Part::Lit(c"' (torch.nn.Parameter or None expected)"),
                        ],
                    );
                }
                let native = native_method(obj, n.register_parameter, g.orig.register_parameter);
                return dispatch_register_parameter(g, obj, name, value, native);
            }
            Ok(false) => {}
            Err(o) => return o,
        }
    }
    let modules = match optional_registry(dict, n.modules) {
        Ok(m) => m,
        Err(o) => return o,
    };
    if matches!(kind, Kind::Module) {
        if modules.is_null() {
            capi::PyErr_SetString(
                capi::PyExc_AttributeError,
                c"cannot assign module before Module.__init__() call".as_ptr(),
            );
            return Outcome::Error;
        }
        let [ps, bufs, np] = match exact_attrs(
            tp,
            dict,
            [
                (n.parameters, false),
                (n.buffers, false),
                (n.non_persistent, true),
            ],
        ) {
            Ok(v) => v,
            Err(o) => return o,
        };
        match no_reg_hooks(g, n.global_module_reg_hooks) {
            Ok(true) => {}
            Ok(false) => return Outcome::Stock,
            Err(o) => return o,
        }
        // `modules` is torch's local, read before the removal.
        let [modules, d, ps, bufs, np] = match hold([modules, dict, ps, bufs, np]) {
            Ok(v) => v,
            Err(o) => return o,
        };
        let removed = remove_from([&d, &ps, &bufs], &np, name);
        drop((d, ps, bufs, np));
        if removed.is_err() {
            return Outcome::Error;
        }
        return store_child(g, obj, &modules, name, value);
    }
    if !modules.is_null() {
        match in_quiet(modules, name) {
            Ok(true) => {
                if value != capi::Py_None() {
                    return raise_typename(
                        g,
                        capi::PyExc_TypeError,
                        c"cannot assign '",
                        value,
                        &[
                            Part::Lit(c"' as child module '"),
                            Part::Obj(name),
                            Part::Lit(c"' (torch.nn.Module or None expected)"),
                        ],
                    );
                }
                match no_reg_hooks(g, n.global_module_reg_hooks) {
                    Ok(true) => {}
                    Ok(false) => return Outcome::Stock,
                    Err(o) => return o,
                }
                let Ok([modules]) = hold([modules]) else {
                    return Outcome::Stock;
                };
                return store_child(g, obj, &modules, name, value);
            }
            Ok(false) => {}
            Err(o) => return o,
        }
    }
    let buffers = match optional_registry(dict, n.buffers) {
        Ok(b) => b,
        Err(o) => return o,
    };
    if !buffers.is_null() {
        match in_quiet(buffers, name) {
            // A buffer slot: torch's type check and register_buffer dispatch.
            Ok(true) => return Outcome::Stock,
            Ok(false) => {}
            Err(o) => return o,
        }
    }
    if capi::PyObject_GenericSetAttr(obj, name, value) < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}

/// The end of both module branches of `__setattr__`: the global module
/// registration hooks (read now: a finalizer may have added one), then
/// `modules[name] = value` into the `_modules` torch read first.
unsafe fn store_child(
    g: &Globals,
    obj: *mut capi::PyObject,
    modules: &Owned,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
) -> Outcome {
    let value = run_reg_hooks(g, g.names.global_module_reg_hooks, obj, name, value);
    let Some(value) = Owned::from_owned_ptr(value) else {
        return Outcome::Error;
    };
    if capi::PyDict_SetItem(modules.as_ptr(), name, value.as_ptr()) < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}

/// `Module.__delattr__(self, name)`: `name in self._parameters`, then
/// `_buffers`, then `_modules` (quiet dicts, read up front: no code runs
/// until the delete), the delete, and for a buffer
/// `self._non_persistent_buffers_set.discard(name)` read after it, as torch
/// reads it (the deleted value's finalizer may have replaced the set).
unsafe fn delattr_fast(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Outcome {
    if capi::PyUnicode_CheckExact(name) == 0 {
        return Outcome::Stock;
    }
    let dict = instance_dict(obj);
    if dict.is_null() {
        return Outcome::Stock;
    }
    let tp = capi::Py_TYPE(obj);
    let n = &g.names;
    let [ps, bufs, mods] = match exact_attrs(
        tp,
        dict,
        [
            (n.parameters, false),
            (n.buffers, false),
            (n.modules, false),
        ],
    ) {
        Ok(v) => v,
        Err(o) => return o,
    };
    for (reg, is_buf) in [(ps, false), (bufs, true), (mods, false)] {
        match in_quiet(reg, name) {
            Ok(true) => {
                // Held across the delete, as `self._buffers` is by torch's
                // expression while `del` runs.
                let Ok([reg]) = hold([reg]) else {
                    return Outcome::Stock;
                };
                if capi::PyDict_DelItem(reg.as_ptr(), name) < 0 {
                    return Outcome::Error;
                }
                drop(reg);
                if is_buf {
                    return discard_non_persistent(obj, n.non_persistent, name);
                }
                return Outcome::Done;
            }
            Ok(false) => {}
            Err(o) => return o,
        }
    }
    if capi::PyObject_GenericSetAttr(obj, name, std::ptr::null_mut()) < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}

/// `self._non_persistent_buffers_set.discard(name)`, the set read now.
unsafe fn discard_non_persistent(
    obj: *mut capi::PyObject,
    set_name: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Outcome {
    let Some(set) = Owned::from_owned_ptr(attr_of(obj, set_name)) else {
        return Outcome::Error;
    };
    if capi::PySet_CheckExact(set.as_ptr()) != 0 {
        if capi::PySet_Discard(set.as_ptr(), name) < 0 {
            return Outcome::Error;
        }
        return Outcome::Done;
    }
    status(capi::PyObject_CallMethod(
        set.as_ptr(),
        c"discard".as_ptr(),
        c"O".as_ptr(),
        name,
    ))
}

/// Native `Module.__setattr__(self, name, value)` / `Module.__delattr__(self,
/// name)` for a fast instance; Stock means "run torch's function".
pub unsafe fn setattr_native(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
) -> Outcome {
    if value.is_null() {
        delattr_fast(g, obj, name)
    } else {
        setattr_fast(g, obj, name, value)
    }
}
