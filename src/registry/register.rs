//! Registration: `Module.__setattr__`, `Module.__delattr__` and the
//! bodies of `register_parameter`, `register_buffer` and `add_module`, each a
//! branch-for-branch transcription of `torch.nn.Module`'s Python code with its
//! exact exception types and texts.
//!
//! Every fast path first checks its preconditions without side effects; when
//! one does not hold (a tensor that is not a Parameter, a registry that is not
//! an exact dict, a global registration hook, an overridden
//! `register_parameter`, ...) the whole operation goes to torch's own
//! function, so partial work is never followed by a hand-over.
use super::preconditions::{
    already_exists, attr_of, check_name, contains, is_parameter, raise_typename, run_reg_hooks,
    status, store, truth, NameMsgs, Outcome,
};
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::instance_dict;
use crate::torch_api::errors::{raise, Part};
use crate::torch_api::originals::Globals;

/// Body of `Module.register_parameter(name, param)`.
pub unsafe fn register_parameter(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    param: *mut capi::PyObject,
) -> Outcome {
    let n = &g.names;
    let dict = instance_dict(obj);
    let msgs = NameMsgs {
        before_init: c"cannot assign parameter before Module.__init__() call",
        not_str: c"parameter name should be a string. Got ",
        dot: c"parameter name can't contain \".\"",
        empty: c"parameter name can't be empty string \"\"",
    };
    match check_name(g, obj, name, dict, n.parameters, &msgs) {
        Outcome::Done => {}
        other => return other,
    }
    if param == capi::Py_None() {
        return store(obj, n.parameters, name, param);
    }
    match is_parameter(g, param) {
        Ok(true) => {}
        Ok(false) => {
            return raise_typename(
                g,
                capi::PyExc_TypeError,
                c"cannot assign '",
                param,
                &[
                    Part::Lit(c"' object to parameter '"),
                    Part::Obj(name),
                    Part::Lit(c"' (torch.nn.Parameter or None required)"),
                ],
            )
        }
        Err(()) => return Outcome::Error,
    }
    let grad_fn = capi::PyObject_GetAttr(param, n.grad_fn);
    if grad_fn.is_null() {
        return Outcome::Error;
    }
    let non_leaf = truth(grad_fn);
    capi::Py_DECREF(grad_fn);
    match non_leaf {
        Ok(false) => {}
        Ok(true) => {
            raise(
                g,
                capi::PyExc_ValueError,
                &[
                    Part::Lit(c"Cannot assign non-leaf Tensor to parameter '"),
                    Part::Obj(name),
                    Part::Lit(c"'. Model parameters must be created explicitly. To express '"),
                    Part::Obj(name),
                    Part::Lit(c"' as a function of another Tensor, compute the value in the forward() method."),
                ],
            );
            return Outcome::Error;
        }
        Err(()) => return Outcome::Error,
    }
    let value = run_reg_hooks(g, n.global_param_reg_hooks, obj, name, param);
    if value.is_null() {
        return Outcome::Error;
    }
    let r = store(obj, n.parameters, name, value);
    capi::Py_DECREF(value);
    r
}

/// Body of `Module.register_buffer(name, tensor, persistent)`.
pub unsafe fn register_buffer(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    tensor: *mut capi::PyObject,
    persistent: *mut capi::PyObject,
) -> Outcome {
    let n = &g.names;
    if persistent == capi::Py_False() {
        match capi::PyObject_IsInstance(obj, g.script_module) {
            1 => {
                capi::PyErr_SetString(
                    capi::PyExc_RuntimeError,
                    c"ScriptModule does not support non-persistent buffers".as_ptr(),
                );
                return Outcome::Error;
            }
            0 => {}
            _ => return Outcome::Error,
        }
    }
    let dict = instance_dict(obj);
    let msgs = NameMsgs {
        before_init: c"cannot assign buffer before Module.__init__() call",
        not_str: c"buffer name should be a string. Got ",
        dot: c"buffer name can't contain \".\"",
        empty: c"buffer name can't be empty string \"\"",
    };
    match check_name(g, obj, name, dict, n.buffers, &msgs) {
        Outcome::Done => {}
        other => return other,
    }
    if tensor != capi::Py_None() {
        let ok = match capi::PyObject_IsInstance(tensor, g.tensor as *mut capi::PyObject) {
            1 => true,
            0 => match crate::instance::attributes::has_attr_generic(tensor, n.torch_function) {
                Ok(b) => b,
                Err(()) => return Outcome::Error,
            },
            _ => return Outcome::Error,
        };
        if !ok {
            return raise_typename(
                g,
                capi::PyExc_TypeError,
                c"cannot assign '",
                tensor,
                &[
                    Part::Lit(c"' object to buffer '"),
                    Part::Obj(name),
                    Part::Lit(c"' (torch Tensor or None required)"),
                ],
            );
        }
    }
    let value = run_reg_hooks(g, n.global_buffer_reg_hooks, obj, name, tensor);
    if value.is_null() {
        return Outcome::Error;
    }
    let r = store(obj, n.buffers, name, value);
    capi::Py_DECREF(value);
    if !matches!(r, Outcome::Done) {
        return r;
    }
    let keep = match truth(persistent) {
        Ok(b) => b,
        Err(()) => return Outcome::Error,
    };
    let set = attr_of(obj, n.non_persistent);
    if set.is_null() {
        return Outcome::Error;
    }
    let method: &std::ffi::CStr = if keep { c"discard" } else { c"add" };
    let r = capi::PyObject_CallMethod(set, method.as_ptr(), c"O".as_ptr(), name);
    capi::Py_DECREF(set);
    status(r)
}

/// Body of `Module.add_module(name, module)`.
pub unsafe fn add_module(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    module: *mut capi::PyObject,
) -> Outcome {
    let n = &g.names;
    if module != capi::Py_None() {
        match capi::PyObject_IsInstance(module, g.nn_module as *mut capi::PyObject) {
            1 => {}
            0 => {
                return raise_typename(
                    g,
                    capi::PyExc_TypeError,
                    c"",
                    module,
                    &[Part::Lit(c" is not a Module subclass")],
                )
            }
            _ => return Outcome::Error,
        }
    }
    if capi::PyUnicode_Check(name) == 0 {
        return raise_typename(
            g,
            capi::PyExc_TypeError,
            c"module name should be a string. Got ",
            name,
            &[],
        );
    }
    match already_exists(g, obj, name, n.modules) {
        Ok(false) => {}
        Ok(true) => {
            raise(
                g,
                capi::PyExc_KeyError,
                &[
                    Part::Lit(c"attribute '"),
                    Part::Obj(name),
                    Part::Lit(c"' already exists"),
                ],
            );
            return Outcome::Error;
        }
        Err(()) => return Outcome::Error,
    }
    match contains(name, g.names.dot) {
        Ok(true) => {
            raise(
                g,
                capi::PyExc_KeyError,
                &[
                    Part::Lit(c"module name can't contain \".\", got: "),
                    Part::Obj(name),
                ],
            );
            return Outcome::Error;
        }
        Ok(false) => {}
        Err(()) => return Outcome::Error,
    }
    match capi::PyObject_RichCompareBool(name, n.empty, capi::Py_EQ) {
        1 => {
            raise(
                g,
                capi::PyExc_KeyError,
                &[Part::Lit(c"module name can't be empty string \"\"")],
            );
            return Outcome::Error;
        }
        0 => {}
        _ => return Outcome::Error,
    }
    let value = run_reg_hooks(g, n.global_module_reg_hooks, obj, name, module);
    if value.is_null() {
        return Outcome::Error;
    }
    let r = store(obj, n.modules, name, value);
    capi::Py_DECREF(value);
    r
}

/// Does `self.<method>` resolve to torch's own implementation?
/// Only then may a fast path run its body natively instead of calling it.
/// torch's `self.<method>(...)` reads the class's `__getattribute__` and,
/// before the class's function, the instance dict: an instance attribute of
/// that name is what stock calls. Runs no code (a dict that is not quiet
/// answers "not native": the call then looks the method up as torch does).
#[inline(always)]
pub unsafe fn native_method(
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    orig: *mut capi::PyObject,
) -> bool {
    let tp = capi::Py_TYPE(obj);
    if type_lookup(tp, name) != orig {
        return false;
    }
    let Some(g) = crate::torch_api::originals::globals() else {
        return false;
    };
    if !g.orig.intact(orig) || !crate::instance::fast::plain_getattribute(g, tp) {
        return false;
    }
    let d = instance_dict(obj);
    d.is_null() || (crate::cpython::quiet::dict(d) && capi::PyDict_Contains(d, name) == 0)
}

/// `self.register_parameter(name, value)` as stock dispatches it.
pub(super) unsafe fn dispatch_register_parameter(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
    native: bool,
) -> Outcome {
    if native {
        register_parameter(g, obj, name, value)
    } else {
        status(capi::PyObject_CallMethodObjArgs(
            obj,
            g.names.register_parameter,
            name,
            value,
            std::ptr::null_mut::<capi::PyObject>(),
        ))
    }
}
