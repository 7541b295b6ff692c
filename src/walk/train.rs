//! `train(mode)` / `eval()`: the eager walk through `children()` that sets
//! `training` with `Module.__setattr__`'s semantics at every module; a tree
//! walked before replays its recorded plan (`crate::plans::eager`).
//! Recursion is native, guarded like torch's Python recursion
//! (`crate::cpython::recursion`).
use super::children::for_each_child;
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::recursion::{Depth, Recursion};
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::instance_dict;
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::torch_api::originals::Globals;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBool;

/// Is the instance dict `dict` quiet, and each registry it holds under
/// `_parameters`, `_buffers`, `_modules` (read without running code)?
unsafe fn quiet_with_registries(g: &Globals, dict: *mut capi::PyObject) -> bool {
    use crate::cpython::quiet;
    let n = &g.names;
    quiet::dict(dict)
        && [n.parameters, n.buffers, n.modules]
            .into_iter()
            .all(|name| {
                let r = capi::PyDict_GetItemWithError(dict, name);
                r.is_null() || quiet::dict(r)
            })
}

/// `module.training = mode` as `Module.__setattr__` does it.
fn set_training(
    py: Python<'_>,
    g: &Globals,
    module: &Bound<'_, PyAny>,
    mode: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let name = intern!(py, "training");
    unsafe {
        // torch's __setattr__ body runs natively for any module whose class
        // resolves it to torch's function (a bool is never a Parameter,
        // Module or tensor).
        let tp = capi::Py_TYPE(module.as_ptr());
        if type_lookup(tp, g.names.dunder_setattr) == g.orig.setattr
            && g.orig.intact(g.orig.setattr)
            && crate::instance::fast::object_after_nn_module(g, tp)
        {
            let dict = instance_dict(module.as_ptr());
            if !dict.is_null() {
                match crate::instance::walk_facts::set_training(
                    module.as_ptr(),
                    tp,
                    dict,
                    name.as_ptr(),
                    mode.as_ptr(),
                ) {
                    Some(Ok(())) => return Ok(()),
                    Some(Err(())) => return Err(PyErr::fetch(py)),
                    None => {}
                }
            }
            return match crate::registry::setattr::setattr_native(
                g,
                module.as_ptr(),
                name.as_ptr(),
                mode.as_ptr(),
            ) {
                crate::registry::preconditions::Outcome::Done => {
                    // Remembered only where the lookups remembering makes,
                    // and those the next `set_training` skips (`"training"
                    // in` each registry), run no code: stock makes them all.
                    let dict = instance_dict(module.as_ptr());
                    if !dict.is_null() && quiet_with_registries(g, dict) {
                        crate::instance::walk_facts::note_training(g, tp, dict, name.as_ptr());
                    }
                    Ok(())
                }
                crate::registry::preconditions::Outcome::Error => Err(PyErr::fetch(py)),
                crate::registry::preconditions::Outcome::Stock => module.setattr(name, mode),
            };
        }
    }
    module.setattr(name, mode)
}

/// torch's `train` body for `module`.
fn train_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mode: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Routed)?;
    // bool cannot be subclassed: the exact check is isinstance(mode, bool).
    if !mode.is_exact_instance_of::<PyBool>() {
        return Err(PyValueError::new_err(
            "training mode is expected to be boolean",
        ));
    }
    set_training(py, g, module, mode)?;
    for_each_child(py, g, module, |child| {
        if is_native(g, child, Method::Train) {
            train_body(py, g, child, mode)?;
        } else {
            call_method(child, Method::Train, (mode,))?;
        }
        Ok(())
    })?;
    Ok(module.clone())
}

/// torch's `train` body for a walk's root: from its recorded plan when that
/// still holds, else live (then recorded).
pub(crate) fn train_root<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mode: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let name = intern!(py, "training");
    if mode.is_exact_instance_of::<PyBool>() {
        if let Some(done) = crate::plans::eager::replay_train(py, g, name, module, mode) {
            done?;
            return Ok(module.clone());
        }
    }
    let out = train_body(py, g, module, mode)?;
    crate::plans::eager::record(g, crate::plans::table::Walk::Train, module, Some(mode));
    Ok(out)
}
