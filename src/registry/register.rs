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
use crate::call::getattr::has_attr;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::{quiet, Owned};
use crate::instance::attributes::{dict_get, instance_dict, plain_attr, Plain};
use crate::torch_api::errors::{raise, typename, Part};
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;
use pyo3::ffi;

/// Result of a fast path: done, failed with an exception set, or "let torch do it".
pub enum Outcome {
    Done,
    Error,
    Stock,
}

/// How `Module.__setattr__` classifies a value.
enum Kind {
    Param,
    Module,
    Other,
    /// Tensors that are not Parameters (`_is_param`, `Buffer`, buffer
    /// updates) and objects whose `__class__` is not their type.
    Unusual,
}

unsafe fn classify(g: &Globals, value: *mut ffi::PyObject) -> Kind {
    let vt = ffi::Py_TYPE(value);
    // isinstance() consults __class__; only a truthful one allows type checks.
    if type_lookup(vt, g.names.dunder_class) != g.orig.object_class {
        return Kind::Unusual;
    }
    if vt == g.parameter {
        Kind::Param
    } else if ffi::PyType_IsSubtype(vt, g.parameter) != 0 {
        // isinstance() of a subclass instance runs _ParameterMeta's
        // __instancecheck__ (a `_is_param` read the class may observe).
        Kind::Unusual
    } else if ffi::PyType_IsSubtype(vt, g.tensor) != 0 {
        Kind::Unusual
    } else if ffi::PyType_IsSubtype(vt, g.nn_module) != 0 {
        Kind::Module
    } else {
        Kind::Other
    }
}

/// `isinstance(obj, Parameter)`, honouring `_ParameterMeta.__instancecheck__`
/// (which isinstance() skips only for an exact Parameter).
unsafe fn is_parameter(g: &Globals, obj: *mut ffi::PyObject) -> Result<bool, ()> {
    if ffi::Py_TYPE(obj) == g.parameter {
        return Ok(true);
    }
    match ffi::PyObject_IsInstance(obj, g.parameter as *mut ffi::PyObject) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

unsafe fn truth(obj: *mut ffi::PyObject) -> Result<bool, ()> {
    match ffi::PyObject_IsTrue(obj) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

unsafe fn contains(container: *mut ffi::PyObject, item: *mut ffi::PyObject) -> Result<bool, ()> {
    match ffi::PySequence_Contains(container, item) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

/// A borrowed registry attribute that must be a quiet dict (or set): its
/// lookups by an exact `str` run no code (see `crate::cpython::quiet`).
unsafe fn exact_attr(
    tp: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    want_set: bool,
) -> Result<*mut ffi::PyObject, Outcome> {
    match plain_attr(tp, dict, name) {
        Plain::Found(v) => {
            let ok = if want_set {
                quiet::set(v)
            } else {
                quiet::dict(v)
            };
            if ok {
                Ok(v)
            } else {
                Err(Outcome::Stock)
            }
        }
        Plain::Unusual => Err(Outcome::Stock),
        Plain::Error => Err(Outcome::Error),
    }
}

/// Several registry attributes at once, each a quiet dict (or set when the
/// flag says so); Err(Stock) when any is unusual, Err(Error) on an exception.
/// No code runs while they are read, so all are still current together.
unsafe fn exact_attrs<const N: usize>(
    tp: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyObject,
    wanted: [(*mut ffi::PyObject, bool); N],
) -> Result<[*mut ffi::PyObject; N], Outcome> {
    let mut out = [std::ptr::null_mut(); N];
    let mut unusual = false;
    for (slot, (name, want_set)) in out.iter_mut().zip(wanted) {
        match exact_attr(tp, dict, name, want_set) {
            Ok(v) => *slot = v,
            Err(Outcome::Error) => return Err(Outcome::Error),
            Err(_) => unusual = true,
        }
    }
    if unusual {
        Err(Outcome::Stock)
    } else {
        Ok(out)
    }
}

/// `remove_from(...)` of `Module.__setattr__`: for three exact dicts and one
/// exact set, `if name in d: del d[name]` (`d.discard(name)` for the set).
/// The containers are held, as torch's call holds its arguments: a delete
/// runs the old value's finalizer, which may replace them on the module
/// (torch goes on with the ones it was given) or make their lookups run
/// code (the same lookups run here as there).
unsafe fn remove_from(dicts: [&Owned; 3], set: &Owned, name: *mut ffi::PyObject) -> Result<(), ()> {
    for d in dicts {
        match ffi::PyDict_Contains(d.as_ptr(), name) {
            1 => {
                if ffi::PyDict_DelItem(d.as_ptr(), name) < 0 {
                    return Err(());
                }
            }
            0 => {}
            _ => return Err(()),
        }
    }
    match ffi::PySet_Contains(set.as_ptr(), name) {
        1 => {
            if ffi::PySet_Discard(set.as_ptr(), name) < 0 {
                return Err(());
            }
        }
        0 => {}
        _ => return Err(()),
    }
    Ok(())
}

/// New references to live objects read while no code could run (a null
/// among them: nothing taken, torch's code runs).
unsafe fn hold<const N: usize>(objs: [*mut ffi::PyObject; N]) -> Result<[Owned; N], Outcome> {
    if objs.iter().any(|p| p.is_null()) {
        return Err(Outcome::Stock);
    }
    Ok(objs.map(|p| Owned::from_borrowed(std::ptr::NonNull::new_unchecked(p))))
}

/// A global registration-hook dict, or Err(Stock) when it is not a plain
/// (Ordered)dict or the module's globals are not quiet.
unsafe fn reg_hooks(g: &Globals, which: *mut ffi::PyObject) -> Result<*mut ffi::PyObject, Outcome> {
    if !quiet::dict(g.module_globals) {
        return Err(Outcome::Stock);
    }
    let h = dict_get(g.module_globals, which);
    if h.is_null() {
        return Err(if ffi::PyErr_Occurred().is_null() {
            Outcome::Stock
        } else {
            Outcome::Error
        });
    }
    match hook_dict_len(h, g.odict) {
        Some(_) => Ok(h),
        None => Err(Outcome::Stock),
    }
}

/// `for hook in <hooks>.values(): out = hook(self, name, value); value = out
/// or value`, with `<hooks>` the module global `which` read as torch's code
/// reads it (a NameError where it is gone). Returns a new reference to the
/// final value, or null with an exception set.
unsafe fn run_reg_hooks(
    g: &Globals,
    which: *mut ffi::PyObject,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let hooks = match reg_hooks(g, which) {
        // Empty: the loop would not run.
        Ok(h) if matches!(hook_dict_len(h, g.odict), Some(0)) => {
            ffi::Py_INCREF(value);
            return value;
        }
        Ok(h) => Owned::from_borrowed(std::ptr::NonNull::new_unchecked(h)),
        Err(Outcome::Error) => return std::ptr::null_mut(),
        Err(_) => {
            let h = ffi::PyObject_GetItem(g.module_globals, which);
            match Owned::from_owned_ptr(h) {
                Some(h) => h,
                None => {
                    if ffi::PyErr_ExceptionMatches(ffi::PyExc_KeyError) != 0 {
                        ffi::PyErr_Clear();
                        ffi::PyErr_Format(
                            ffi::PyExc_NameError,
                            c"name '%U' is not defined".as_ptr(),
                            which,
                        );
                    }
                    return std::ptr::null_mut();
                }
            }
        }
    };
    ffi::Py_INCREF(value);
    let mut value = value;
    let values = ffi::PyObject_CallMethod(hooks.as_ptr(), c"values".as_ptr(), std::ptr::null());
    drop(hooks);
    let it = if values.is_null() {
        values
    } else {
        ffi::PyObject_GetIter(values)
    };
    ffi::Py_XDECREF(values);
    if it.is_null() {
        ffi::Py_DECREF(value);
        return it;
    }
    loop {
        let hook = ffi::PyIter_Next(it);
        if hook.is_null() {
            break;
        }
        let out = ffi::PyObject_CallFunctionObjArgs(
            hook,
            obj,
            name,
            value,
            std::ptr::null_mut::<ffi::PyObject>(),
        );
        ffi::Py_DECREF(hook);
        if out.is_null() {
            ffi::Py_DECREF(it);
            ffi::Py_DECREF(value);
            return out;
        }
        if out == ffi::Py_None() {
            ffi::Py_DECREF(out);
        } else {
            ffi::Py_DECREF(value);
            value = out;
        }
    }
    ffi::Py_DECREF(it);
    if !ffi::PyErr_Occurred().is_null() {
        ffi::Py_DECREF(value);
        return std::ptr::null_mut();
    }
    value
}

fn status(r: *mut ffi::PyObject) -> Outcome {
    if r.is_null() {
        Outcome::Error
    } else {
        unsafe { ffi::Py_DECREF(r) };
        Outcome::Done
    }
}

/// `KeyError/TypeError` helpers shared by the three register functions.
unsafe fn raise_typename(
    g: &Globals,
    exc: *mut ffi::PyObject,
    before: &std::ffi::CStr,
    obj: *mut ffi::PyObject,
    after: &[Part<'_>],
) -> Outcome {
    let t = typename(g, obj);
    if t.is_null() {
        return Outcome::Error;
    }
    let mut parts = vec![Part::Lit(before), Part::Obj(t)];
    parts.extend_from_slice(after);
    raise(g, exc, &parts);
    ffi::Py_DECREF(t);
    Outcome::Error
}

/// The name checks shared by register_parameter and register_buffer, in
/// stock order; `reg` is the registry name, `msgs` the texts for it.
unsafe fn check_name(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    dict: *mut ffi::PyObject,
    reg: *mut ffi::PyObject,
    msgs: &NameMsgs,
) -> Outcome {
    match if dict.is_null() {
        Ok(false)
    } else {
        contains(dict, reg)
    } {
        Ok(true) => {}
        Ok(false) => {
            ffi::PyErr_SetString(ffi::PyExc_AttributeError, msgs.before_init.as_ptr());
            return Outcome::Error;
        }
        Err(()) => return Outcome::Error,
    }
    if ffi::PyUnicode_Check(name) == 0 {
        return raise_typename(g, ffi::PyExc_TypeError, msgs.not_str, name, &[]);
    }
    match contains(name, g.names.dot) {
        Ok(true) => {
            raise(g, ffi::PyExc_KeyError, &[Part::Lit(msgs.dot)]);
            return Outcome::Error;
        }
        Ok(false) => {}
        Err(()) => return Outcome::Error,
    }
    match ffi::PyObject_RichCompareBool(name, g.names.empty, ffi::Py_EQ) {
        1 => {
            raise(g, ffi::PyExc_KeyError, &[Part::Lit(msgs.empty)]);
            return Outcome::Error;
        }
        0 => {}
        _ => return Outcome::Error,
    }
    match already_exists(g, obj, name, reg) {
        Ok(false) => Outcome::Done,
        Ok(true) => {
            raise(
                g,
                ffi::PyExc_KeyError,
                &[
                    Part::Lit(c"attribute '"),
                    Part::Obj(name),
                    Part::Lit(c"' already exists"),
                ],
            );
            Outcome::Error
        }
        Err(()) => Outcome::Error,
    }
}

struct NameMsgs {
    before_init: &'static std::ffi::CStr,
    not_str: &'static std::ffi::CStr,
    dot: &'static std::ffi::CStr,
    empty: &'static std::ffi::CStr,
}

/// `self.<name>` as a new reference: the instance `__dict__` when that is
/// what `object.__getattribute__` would return, else the full lookup.
unsafe fn attr_of(obj: *mut ffi::PyObject, name: *mut ffi::PyObject) -> *mut ffi::PyObject {
    if let Plain::Found(v) = plain_attr(ffi::Py_TYPE(obj), instance_dict(obj), name) {
        ffi::Py_INCREF(v);
        return v;
    }
    if !ffi::PyErr_Occurred().is_null() {
        return std::ptr::null_mut();
    }
    ffi::PyObject_GetAttr(obj, name)
}

/// `hasattr(self, name) and name not in self.<reg>`.
unsafe fn already_exists(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    reg: *mut ffi::PyObject,
) -> Result<bool, ()> {
    if !has_attr(g, obj, name)? {
        return Ok(false);
    }
    let r = attr_of(obj, reg);
    if r.is_null() {
        return Err(());
    }
    let inside = contains(r, name);
    ffi::Py_DECREF(r);
    Ok(!inside?)
}

/// `self.<reg>[name] = value`.
unsafe fn store(
    obj: *mut ffi::PyObject,
    reg: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> Outcome {
    let r = attr_of(obj, reg);
    if r.is_null() {
        return Outcome::Error;
    }
    let rc = ffi::PyObject_SetItem(r, name, value);
    ffi::Py_DECREF(r);
    if rc < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}

/// Body of `Module.register_parameter(name, param)`.
pub unsafe fn register_parameter(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    param: *mut ffi::PyObject,
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
    if param == ffi::Py_None() {
        return store(obj, n.parameters, name, param);
    }
    match is_parameter(g, param) {
        Ok(true) => {}
        Ok(false) => {
            return raise_typename(
                g,
                ffi::PyExc_TypeError,
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
    let grad_fn = ffi::PyObject_GetAttr(param, n.grad_fn);
    if grad_fn.is_null() {
        return Outcome::Error;
    }
    let non_leaf = truth(grad_fn);
    ffi::Py_DECREF(grad_fn);
    match non_leaf {
        Ok(false) => {}
        Ok(true) => {
            raise(
                g,
                ffi::PyExc_ValueError,
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
    ffi::Py_DECREF(value);
    r
}

/// Body of `Module.register_buffer(name, tensor, persistent)`.
pub unsafe fn register_buffer(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    tensor: *mut ffi::PyObject,
    persistent: *mut ffi::PyObject,
) -> Outcome {
    let n = &g.names;
    if persistent == ffi::Py_False() {
        match ffi::PyObject_IsInstance(obj, g.script_module) {
            1 => {
                ffi::PyErr_SetString(
                    ffi::PyExc_RuntimeError,
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
    if tensor != ffi::Py_None() {
        let ok = match ffi::PyObject_IsInstance(tensor, g.tensor as *mut ffi::PyObject) {
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
                ffi::PyExc_TypeError,
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
    ffi::Py_DECREF(value);
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
    let r = ffi::PyObject_CallMethod(set, method.as_ptr(), c"O".as_ptr(), name);
    ffi::Py_DECREF(set);
    status(r)
}

/// Body of `Module.add_module(name, module)`.
pub unsafe fn add_module(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    module: *mut ffi::PyObject,
) -> Outcome {
    let n = &g.names;
    if module != ffi::Py_None() {
        match ffi::PyObject_IsInstance(module, g.nn_module as *mut ffi::PyObject) {
            1 => {}
            0 => {
                return raise_typename(
                    g,
                    ffi::PyExc_TypeError,
                    c"",
                    module,
                    &[Part::Lit(c" is not a Module subclass")],
                )
            }
            _ => return Outcome::Error,
        }
    }
    if ffi::PyUnicode_Check(name) == 0 {
        return raise_typename(
            g,
            ffi::PyExc_TypeError,
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
                ffi::PyExc_KeyError,
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
                ffi::PyExc_KeyError,
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
    match ffi::PyObject_RichCompareBool(name, n.empty, ffi::Py_EQ) {
        1 => {
            raise(
                g,
                ffi::PyExc_KeyError,
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
    ffi::Py_DECREF(value);
    r
}

/// Does `self.<method>` resolve to torch's own implementation?
/// Only then may a fast path run its body natively instead of calling it.
#[inline(always)]
pub unsafe fn native_method(
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    orig: *mut ffi::PyObject,
) -> bool {
    type_lookup(ffi::Py_TYPE(obj), name) == orig
}

/// `self.register_parameter(name, value)` as stock dispatches it.
unsafe fn dispatch_register_parameter(
    g: &Globals,
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
    native: bool,
) -> Outcome {
    if native {
        register_parameter(g, obj, name, value)
    } else {
        status(ffi::PyObject_CallMethodObjArgs(
            obj,
            g.names.register_parameter,
            name,
            value,
            std::ptr::null_mut::<ffi::PyObject>(),
        ))
    }
}

/// Is a global registration hook dict empty? Err(Stock) when unusual.
unsafe fn no_reg_hooks(g: &Globals, which: *mut ffi::PyObject) -> Result<bool, Outcome> {
    let h = reg_hooks(g, which)?;
    Ok(matches!(hook_dict_len(h, g.odict), Some(0)))
}

/// `self.__dict__.get(<registry>)` of a quiet instance dict (no code runs):
/// Ok(null) for a missing or None entry, Err(Stock) unless it is a quiet dict.
unsafe fn optional_registry(
    dict: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> Result<*mut ffi::PyObject, Outcome> {
    let r = dict_get(dict, name);
    if r.is_null() {
        return if ffi::PyErr_Occurred().is_null() {
            Ok(r)
        } else {
            Err(Outcome::Error)
        };
    }
    if r == ffi::Py_None() {
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
unsafe fn in_quiet(reg: *mut ffi::PyObject, name: *mut ffi::PyObject) -> Result<bool, Outcome> {
    match ffi::PyDict_Contains(reg, name) {
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
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> Outcome {
    if ffi::PyUnicode_CheckExact(name) == 0 {
        return Outcome::Stock;
    }
    let dict = instance_dict(obj);
    if dict.is_null() || !quiet::dict(dict) {
        return Outcome::Stock;
    }
    let tp = ffi::Py_TYPE(obj);
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
            ffi::PyErr_SetString(
                ffi::PyExc_AttributeError,
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
                if value != ffi::Py_None() {
                    return raise_typename(
                        g,
                        ffi::PyExc_TypeError,
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
            ffi::PyErr_SetString(
                ffi::PyExc_AttributeError,
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
                if value != ffi::Py_None() {
                    return raise_typename(
                        g,
                        ffi::PyExc_TypeError,
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
    if ffi::PyObject_GenericSetAttr(obj, name, value) < 0 {
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
    obj: *mut ffi::PyObject,
    modules: &Owned,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> Outcome {
    let value = run_reg_hooks(g, g.names.global_module_reg_hooks, obj, name, value);
    let Some(value) = Owned::from_owned_ptr(value) else {
        return Outcome::Error;
    };
    if ffi::PyDict_SetItem(modules.as_ptr(), name, value.as_ptr()) < 0 {
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
unsafe fn delattr_fast(g: &Globals, obj: *mut ffi::PyObject, name: *mut ffi::PyObject) -> Outcome {
    if ffi::PyUnicode_CheckExact(name) == 0 {
        return Outcome::Stock;
    }
    let dict = instance_dict(obj);
    if dict.is_null() {
        return Outcome::Stock;
    }
    let tp = ffi::Py_TYPE(obj);
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
                if ffi::PyDict_DelItem(reg.as_ptr(), name) < 0 {
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
    if ffi::PyObject_GenericSetAttr(obj, name, std::ptr::null_mut()) < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}

/// `self._non_persistent_buffers_set.discard(name)`, the set read now.
unsafe fn discard_non_persistent(
    obj: *mut ffi::PyObject,
    set_name: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> Outcome {
    let Some(set) = Owned::from_owned_ptr(attr_of(obj, set_name)) else {
        return Outcome::Error;
    };
    if ffi::PySet_CheckExact(set.as_ptr()) != 0 {
        if ffi::PySet_Discard(set.as_ptr(), name) < 0 {
            return Outcome::Error;
        }
        return Outcome::Done;
    }
    status(ffi::PyObject_CallMethod(
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
    obj: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> Outcome {
    if value.is_null() {
        delattr_fast(g, obj, name)
    } else {
        setattr_fast(g, obj, name, value)
    }
}
