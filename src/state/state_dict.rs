//! `state_dict()`'s tree walk: torch's pre-order walk of `_modules` and each
//! module's `_save_to_state_dict` natively where the class's methods are
//! torch's; a walk of an unchanged tree replays its recorded plan
//! (`state_dict_plan`).
use super::load_state_dict::but_last;
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::recursion::{Depth, Recursion};
use crate::instance::dispatch::{is_native, original, Method};
use crate::instance::qualified_names::{self, Kind};
use crate::instance::registries::Items;
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// torch's `state_dict(destination=, prefix=, keep_vars=)` body for `module`
/// (the positional-argument handling is the Python wrapper's).
pub fn save_tree<'py>(
    py: Python<'py>,
    g: &'static Globals,
    module: &Bound<'py, PyAny>,
    destination: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    keep_vars: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Routed)?;
    let metadata_name = intern!(py, "_metadata");
    let destination = if destination.is_none() {
        let odict = unsafe { Bound::from_borrowed_ptr(py, g.odict as *mut capi::PyObject) };
        let d = odict.call0()?;
        d.setattr(metadata_name, odict.call0()?)?;
        d
    } else {
        destination.clone()
    };
    let local_metadata = PyDict::new(py);
    local_metadata.set_item(
        intern!(py, "version"),
        module.getattr(intern!(py, "_version"))?,
    )?;
    let mut md = std::ptr::null_mut();
    match unsafe {
        capi::PyObject_GetOptionalAttr(destination.as_ptr(), metadata_name.as_ptr(), &mut md)
    } {
        1 => {
            let md = unsafe { Bound::from_owned_ptr(py, md) };
            md.set_item(
                qualified_names::name(Kind::ButLast, prefix, prefix, || but_last(prefix))?,
                &local_metadata,
            )?;
        }
        0 => {}
        _ => return Err(PyErr::fetch(py)),
    }
    let pre = module.getattr(intern!(py, "_state_dict_pre_hooks"))?;
    if !matches!(unsafe { hook_dict_len(pre.as_ptr(), g.odict) }, Some(0)) {
        for hook in pre.call_method0(intern!(py, "values"))?.try_iter()? {
            hook?.call1((module, prefix, keep_vars))?;
        }
    }
    if is_native(g, module, Method::SaveToStateDict) {
        save_own(py, g, module, &destination, prefix, keep_vars)?;
    } else {
        module.call_method1(
            intern!(py, "_save_to_state_dict"),
            (&destination, prefix, keep_vars),
        )?;
    }
    let dot = intern!(py, ".");
    let mut items = Items::of(module, intern!(py, "_modules"))?;
    while let Some((name, child)) = items.next(py)? {
        if child.is_none() {
            continue;
        }
        let child_prefix =
            qualified_names::name(Kind::Child, prefix, &name, || prefix.add(&name)?.add(dot))?;
        if is_native(g, &child, Method::StateDict) {
            save_tree(py, g, &child, &destination, &child_prefix, keep_vars)?;
        } else {
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "destination"), &destination)?;
            kw.set_item(intern!(py, "prefix"), &child_prefix)?;
            kw.set_item(intern!(py, "keep_vars"), keep_vars)?;
            child.call_method(intern!(py, "state_dict"), (), Some(&kw))?;
        }
    }
    let post = module.getattr(intern!(py, "_state_dict_hooks"))?;
    if matches!(unsafe { hook_dict_len(post.as_ptr(), g.odict) }, Some(0)) {
        return Ok(destination);
    }
    let mut destination = destination;
    for hook in post.call_method0(intern!(py, "values"))?.try_iter()? {
        let hook = hook?;
        let result = hook.call1((module, &destination, prefix, &local_metadata))?;
        let public = match hook.getattr(intern!(py, "_from_public_api")) {
            Ok(v) => v.is_truthy()?,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => false,
            Err(e) => return Err(e),
        };
        if !public {
            if !result.is_none() {
                destination = result;
            }
        } else if !result.is_none() {
            return Err(PyRuntimeError::new_err(
                "state_dict post-hook must return None",
            ));
        }
    }
    Ok(destination)
}

/// torch's `_save_to_state_dict(destination, prefix, keep_vars)` body.
fn save_own<'py>(
    py: Python<'py>,
    g: &'static Globals,
    module: &Bound<'py, PyAny>,
    destination: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    keep_vars: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let keep = keep_vars.is_truthy()?;
    let detach = intern!(py, "detach");
    let mut params = Items::of(module, intern!(py, "_parameters"))?;
    while let Some((name, p)) = params.next(py)? {
        if p.is_none() {
            continue;
        }
        let value = if keep { p } else { p.call_method0(detach)? };
        let key = qualified_names::name(Kind::Plain, prefix, &name, || prefix.add(&name))?;
        destination.set_item(key, value)?;
    }
    let non_persistent = intern!(py, "_non_persistent_buffers_set");
    let mut buffers = Items::of(module, intern!(py, "_buffers"))?;
    while let Some((name, b)) = buffers.next(py)? {
        if b.is_none() || module.getattr(non_persistent)?.contains(&name)? {
            continue;
        }
        let value = if keep { b } else { b.call_method0(detach)? };
        let key = qualified_names::name(Kind::Plain, prefix, &name, || prefix.add(&name))?;
        destination.set_item(key, value)?;
    }
    let overridden = unsafe {
        let tp = capi::Py_TYPE(module.as_ptr());
        let name = intern!(py, "get_extra_state");
        // torch reads `self.__class__` through the class's `__getattribute__`,
        // which the class can have gained in this body's own `detach` (code
        // in a kernel): asked here, where torch reads it.
        !crate::instance::fast::plain_getattribute(g, tp)
            || crate::cpython::type_cache::type_lookup(tp, g.names.dunder_class)
                != g.orig.object_class
            || Some(crate::cpython::type_cache::type_lookup(tp, name.as_ptr()))
                != original(Method::GetExtraState)
    };
    if overridden {
        let cls = module.getattr(intern!(py, "__class__"))?;
        let ges = intern!(py, "get_extra_state");
        let torch_ges = original(Method::GetExtraState)
            .map(|p| unsafe { Bound::from_borrowed_ptr(py, p) })
            .ok_or_else(|| PyRuntimeError::new_err("fastmodule: method table not initialised"))?;
        let found = match cls.getattr(ges) {
            Ok(v) => v,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => {
                torch_ges.clone()
            }
            Err(e) => return Err(e),
        };
        if !found.is(&torch_ges) {
            let key = prefix.add(intern!(py, "_extra_state"))?;
            destination.set_item(key, module.call_method0(ges)?)?;
        }
    }
    Ok(())
}
