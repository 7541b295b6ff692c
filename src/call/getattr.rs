//! `tp_getattro` for fastmodule classes: `object.__getattribute__`, then
//! `nn.Module.__getattr__`'s registry lookup (`_parameters`, `_buffers`,
//! `_modules`, in that order) without a Python frame and without building the
//! AttributeError that the failed normal lookup would raise on 3.11.
use crate::cpython::capi;
use crate::cpython::private_api::_PyObject_GenericGetAttrWithDict;
use crate::cpython::quiet;
use crate::instance::attributes::{dict_get, instance_dict};
use crate::torch_api::errors::{no_attribute, not_initialised};
use crate::torch_api::originals::{globals, Globals};

pub enum Reg {
    /// Borrowed value from one of the registries.
    Found(*mut capi::PyObject),
    Missing,
    /// A registry that is not an exact dict: let torch's `__getattr__` answer.
    Unusual,
    Error,
}

/// The three registry lookups of `nn.Module.__getattr__`, for an exact-str
/// `name`. Only over quiet dicts (the instance dict and each registry read):
/// then no lookup runs code and the borrowed results stay valid. Anything
/// else is Unusual: torch's `__getattr__` runs, with its own lookups.
#[inline(always)]
pub unsafe fn registry_get(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Reg {
    if capi::PyUnicode_CheckExact(name) == 0 {
        return Reg::Unusual;
    }
    let dict = instance_dict(obj);
    if dict.is_null() {
        return Reg::Missing;
    }
    if !quiet::dict(dict) {
        return Reg::Unusual;
    }
    let n = &g.names;
    for key in [n.parameters, n.buffers, n.modules] {
        let reg = dict_get(dict, key);
        if reg.is_null() {
            if !capi::PyErr_Occurred().is_null() {
                return Reg::Error;
            }
            continue;
        }
        if !quiet::dict(reg) {
            return Reg::Unusual;
        }
        let v = capi::PyDict_GetItemWithError(reg, name);
        if !v.is_null() {
            return Reg::Found(v);
        }
        if !capi::PyErr_Occurred().is_null() {
            return Reg::Error;
        }
    }
    Reg::Missing
}

/// The `tp_getattro` slot.
pub unsafe extern "C" fn module_getattro(
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    if capi::PyUnicode_Check(name) == 0 {
        // object.__getattribute__ raises the stock TypeError.
        return capi::PyObject_GenericGetAttr(obj, name);
    }
    let r = _PyObject_GenericGetAttrWithDict(obj, name, std::ptr::null_mut(), 1);
    if !r.is_null() || !capi::PyErr_Occurred().is_null() {
        return r;
    }
    let Some(g) = globals() else {
        return not_initialised();
    };
    // Under a tracer or profiler torch's `__getattr__` runs, with its frame;
    // after its `__code__` was replaced, the code it has now.
    let reg = if crate::cpython::tracer::active()
        || !g.orig.getattr_intact()
        || crate::instance::fast::switched_off()
    {
        Reg::Unusual
    } else {
        registry_get(g, obj, name)
    };
    match reg {
        Reg::Found(v) => {
            capi::Py_INCREF(v);
            v
        }
        Reg::Missing => no_attribute(g, obj, name),
        Reg::Unusual => capi::PyObject_CallFunctionObjArgs(
            g.orig.getattr,
            obj,
            name,
            std::ptr::null_mut::<capi::PyObject>(),
        ),
        Reg::Error => std::ptr::null_mut(),
    }
}

/// `hasattr(obj, name)`: Ok(bool), or Err(()) with an exception set.
pub unsafe fn has_attr(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Result<bool, ()> {
    let own = crate::call::slots::is_fn!(
        crate::cpython::types::getattro_slot(capi::Py_TYPE(obj)),
        module_getattro as capi::getattrofunc
    );
    if own
        && capi::PyUnicode_Check(name) != 0
        && g.orig.getattr_intact()
        && !crate::instance::fast::switched_off()
    {
        let r = _PyObject_GenericGetAttrWithDict(obj, name, std::ptr::null_mut(), 1);
        if !r.is_null() {
            capi::Py_DECREF(r);
            return Ok(true);
        }
        if !capi::PyErr_Occurred().is_null() {
            return Err(());
        }
        return match registry_get(g, obj, name) {
            Reg::Found(_) => Ok(true),
            // torch's `__getattr__` would build its message (reading the
            // class name) before the raise `hasattr` catches.
            Reg::Missing => crate::torch_api::errors::missed(g, obj, name).map(|()| false),
            Reg::Error => Err(()),
            Reg::Unusual => {
                // torch's own __getattr__ decides; only AttributeError means "no".
                let v = capi::PyObject_CallFunctionObjArgs(
                    g.orig.getattr,
                    obj,
                    name,
                    std::ptr::null_mut::<capi::PyObject>(),
                );
                if !v.is_null() {
                    capi::Py_DECREF(v);
                    Ok(true)
                } else if capi::PyErr_ExceptionMatches(capi::PyExc_AttributeError) != 0 {
                    capi::PyErr_Clear();
                    Ok(false)
                } else {
                    Err(())
                }
            }
        };
    }
    crate::instance::attributes::has_attr_generic(obj, name)
}

/// Native body of `nn.Module.__getattr__(self, name)` for a fastmodule
/// instance (reached through torch's function when the slot is not in place);
/// None means "run torch's function".
pub unsafe fn getattr_native(
    g: &Globals,
    slf: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Option<*mut capi::PyObject> {
    crate::call::slots::rearm(g, capi::Py_TYPE(slf));
    if !g.orig.getattr_intact() || crate::instance::fast::switched_off() {
        return None;
    }
    match registry_get(g, slf, name) {
        Reg::Found(v) => {
            capi::Py_INCREF(v);
            Some(v)
        }
        Reg::Missing => Some(no_attribute(g, slf, name)),
        Reg::Unusual => None,
        Reg::Error => Some(std::ptr::null_mut()),
    }
}
