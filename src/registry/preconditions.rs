//! What the registration bodies share: the outcome of a fast path, the
//! classification of a value (Parameter, Module, tensor, other), the checks
//! each makes before touching anything (name checks, registration hooks,
//! registries that are exact dicts), and the small steps they repeat with
//! torch's exact exception texts.
use crate::call::getattr::has_attr;
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::{quiet, Owned};
use crate::instance::attributes::{dict_get, instance_dict, plain_attr, Plain};
use crate::torch_api::errors::{raise, typename, Part};
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;

/// Result of a fast path: done, failed with an exception set, or "let torch do it".
pub enum Outcome {
    Done,
    Error,
    Stock,
}

/// How `Module.__setattr__` classifies a value.
pub(super) enum Kind {
    Param,
    Module,
    Other,
    /// Tensors that are not Parameters (`_is_param`, `Buffer`, buffer
    /// updates) and objects whose `__class__` is not their type.
    Unusual,
}

pub(super) unsafe fn classify(g: &Globals, value: *mut capi::PyObject) -> Kind {
    let vt = capi::Py_TYPE(value);
    // isinstance() consults __class__; only a truthful one allows type checks.
    if type_lookup(vt, g.names.dunder_class) != g.orig.object_class {
        return Kind::Unusual;
    }
    if vt == g.parameter {
        Kind::Param
    } else if capi::PyType_IsSubtype(vt, g.parameter) != 0 {
        // isinstance() of a subclass instance runs _ParameterMeta's
        // __instancecheck__ (a `_is_param` read the class may observe).
        Kind::Unusual
    } else if capi::PyType_IsSubtype(vt, g.tensor) != 0 {
        Kind::Unusual
    } else if capi::PyType_IsSubtype(vt, g.nn_module) != 0 {
        Kind::Module
    } else {
        Kind::Other
    }
}

/// `isinstance(obj, Parameter)`, honouring `_ParameterMeta.__instancecheck__`
/// (which isinstance() skips only for an exact Parameter).
pub(super) unsafe fn is_parameter(g: &Globals, obj: *mut capi::PyObject) -> Result<bool, ()> {
    if capi::Py_TYPE(obj) == g.parameter {
        return Ok(true);
    }
    match capi::PyObject_IsInstance(obj, g.parameter as *mut capi::PyObject) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

pub(super) unsafe fn truth(obj: *mut capi::PyObject) -> Result<bool, ()> {
    match capi::PyObject_IsTrue(obj) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

pub(super) unsafe fn contains(
    container: *mut capi::PyObject,
    item: *mut capi::PyObject,
) -> Result<bool, ()> {
    match capi::PySequence_Contains(container, item) {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(()),
    }
}

/// A borrowed registry attribute that must be a quiet dict (or set): its
/// lookups by an exact `str` run no code (see `crate::cpython::quiet`).
pub(super) unsafe fn exact_attr(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
    want_set: bool,
) -> Result<*mut capi::PyObject, Outcome> {
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
pub(super) unsafe fn exact_attrs<const N: usize>(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    wanted: [(*mut capi::PyObject, bool); N],
) -> Result<[*mut capi::PyObject; N], Outcome> {
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
pub(super) unsafe fn remove_from(
    dicts: [&Owned; 3],
    set: &Owned,
    name: *mut capi::PyObject,
) -> Result<(), ()> {
    for d in dicts {
        match capi::PyDict_Contains(d.as_ptr(), name) {
            1 => {
                if capi::PyDict_DelItem(d.as_ptr(), name) < 0 {
                    return Err(());
                }
            }
            0 => {}
            _ => return Err(()),
        }
    }
    match capi::PySet_Contains(set.as_ptr(), name) {
        1 => {
            if capi::PySet_Discard(set.as_ptr(), name) < 0 {
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
pub(super) unsafe fn hold<const N: usize>(
    objs: [*mut capi::PyObject; N],
) -> Result<[Owned; N], Outcome> {
    if objs.iter().any(|p| p.is_null()) {
        return Err(Outcome::Stock);
    }
    Ok(objs.map(|p| Owned::new_ref(p)))
}

/// A global registration-hook dict, or Err(Stock) when it is not a plain
/// (Ordered)dict or the module's globals are not quiet.
pub(super) unsafe fn reg_hooks(
    g: &Globals,
    which: *mut capi::PyObject,
) -> Result<*mut capi::PyObject, Outcome> {
    if !quiet::dict(g.module_globals) {
        return Err(Outcome::Stock);
    }
    let h = dict_get(g.module_globals, which);
    if h.is_null() {
        return Err(if capi::PyErr_Occurred().is_null() {
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
pub(super) unsafe fn run_reg_hooks(
    g: &Globals,
    which: *mut capi::PyObject,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let hooks = match reg_hooks(g, which) {
        // Empty: the loop would not run.
        Ok(h) if matches!(hook_dict_len(h, g.odict), Some(0)) => {
            capi::Py_INCREF(value);
            return value;
        }
        Ok(h) => Owned::new_ref(h),
        Err(Outcome::Error) => return std::ptr::null_mut(),
        Err(_) => {
            let h = capi::PyObject_GetItem(g.module_globals, which);
            match Owned::from_owned_ptr(h) {
                Some(h) => h,
                None => {
                    if capi::PyErr_ExceptionMatches(capi::PyExc_KeyError) != 0 {
                        capi::PyErr_Clear();
                        capi::PyErr_Format(
                            capi::PyExc_NameError,
                            c"name '%U' is not defined".as_ptr(),
                            which,
                        );
                    }
                    return std::ptr::null_mut();
                }
            }
        }
    };
    capi::Py_INCREF(value);
    let mut value = value;
    let values = capi::PyObject_CallMethod(hooks.as_ptr(), c"values".as_ptr(), std::ptr::null());
    drop(hooks);
    let it = if values.is_null() {
        values
    } else {
        capi::PyObject_GetIter(values)
    };
    capi::Py_XDECREF(values);
    if it.is_null() {
        capi::Py_DECREF(value);
        return it;
    }
    loop {
        let hook = capi::PyIter_Next(it);
        if hook.is_null() {
            break;
        }
        let out = capi::PyObject_CallFunctionObjArgs(
            hook,
            obj,
            name,
            value,
            std::ptr::null_mut::<capi::PyObject>(),
        );
        capi::Py_DECREF(hook);
        if out.is_null() {
            capi::Py_DECREF(it);
            capi::Py_DECREF(value);
            return out;
        }
        if out == capi::Py_None() {
            capi::Py_DECREF(out);
        } else {
            capi::Py_DECREF(value);
            value = out;
        }
    }
    capi::Py_DECREF(it);
    if !capi::PyErr_Occurred().is_null() {
        capi::Py_DECREF(value);
        return std::ptr::null_mut();
    }
    value
}

pub(super) fn status(r: *mut capi::PyObject) -> Outcome {
    if r.is_null() {
        Outcome::Error
    } else {
        unsafe { capi::Py_DECREF(r) };
        Outcome::Done
    }
}

/// `KeyError/TypeError` helpers shared by the three register functions.
pub(super) unsafe fn raise_typename(
    g: &Globals,
    exc: *mut capi::PyObject,
    before: &std::ffi::CStr,
    obj: *mut capi::PyObject,
    after: &[Part<'_>],
) -> Outcome {
    let t = typename(g, obj);
    if t.is_null() {
        return Outcome::Error;
    }
    let mut parts = vec![Part::Lit(before), Part::Obj(t)];
    parts.extend_from_slice(after);
    raise(g, exc, &parts);
    capi::Py_DECREF(t);
    Outcome::Error
}

/// The name checks shared by register_parameter and register_buffer, in
/// stock order; `reg` is the registry name, `msgs` the texts for it.
pub(super) unsafe fn check_name(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    dict: *mut capi::PyObject,
    reg: *mut capi::PyObject,
    msgs: &NameMsgs,
) -> Outcome {
    // `reg in self.__dict__`: the dict is held across the lookup, as torch's
    // expression holds `self.__dict__` (a key that compares with `__eq__` may
    // replace the instance dict, which would free it mid-lookup).
    match if dict.is_null() {
        Ok(false)
    } else {
        let held = Owned::new_ref(dict);
        contains(held.as_ptr(), reg)
    } {
        Ok(true) => {}
        Ok(false) => {
            capi::PyErr_SetString(capi::PyExc_AttributeError, msgs.before_init.as_ptr());
            return Outcome::Error;
        }
        Err(()) => return Outcome::Error,
    }
    if capi::PyUnicode_Check(name) == 0 {
        return raise_typename(g, capi::PyExc_TypeError, msgs.not_str, name, &[]);
    }
    match contains(name, g.names.dot) {
        Ok(true) => {
            raise(g, capi::PyExc_KeyError, &[Part::Lit(msgs.dot)]);
            return Outcome::Error;
        }
        Ok(false) => {}
        Err(()) => return Outcome::Error,
    }
    match capi::PyObject_RichCompareBool(name, g.names.empty, capi::Py_EQ) {
        1 => {
            raise(g, capi::PyExc_KeyError, &[Part::Lit(msgs.empty)]);
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
                capi::PyExc_KeyError,
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

pub(super) struct NameMsgs {
    pub(super) before_init: &'static std::ffi::CStr,
    pub(super) not_str: &'static std::ffi::CStr,
    pub(super) dot: &'static std::ffi::CStr,
    pub(super) empty: &'static std::ffi::CStr,
}

/// `self.<name>` as a new reference: the instance `__dict__` when that is
/// what `object.__getattribute__` would return, else the full lookup.
pub(super) unsafe fn attr_of(
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    if let Plain::Found(v) = plain_attr(capi::Py_TYPE(obj), instance_dict(obj), name) {
        capi::Py_INCREF(v);
        return v;
    }
    if !capi::PyErr_Occurred().is_null() {
        return std::ptr::null_mut();
    }
    capi::PyObject_GetAttr(obj, name)
}

/// `hasattr(self, name) and name not in self.<reg>`.
pub(super) unsafe fn already_exists(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
    reg: *mut capi::PyObject,
) -> Result<bool, ()> {
    if !has_attr(g, obj, name)? {
        return Ok(false);
    }
    let r = attr_of(obj, reg);
    if r.is_null() {
        return Err(());
    }
    let inside = contains(r, name);
    capi::Py_DECREF(r);
    Ok(!inside?)
}

/// `self.<reg>[name] = value`.
pub(super) unsafe fn store(
    obj: *mut capi::PyObject,
    reg: *mut capi::PyObject,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
) -> Outcome {
    let r = attr_of(obj, reg);
    if r.is_null() {
        return Outcome::Error;
    }
    let rc = capi::PyObject_SetItem(r, name, value);
    capi::Py_DECREF(r);
    if rc < 0 {
        Outcome::Error
    } else {
        Outcome::Done
    }
}
