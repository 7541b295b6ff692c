//! `zero_grad`'s first pass: which of the parameters `self.parameters()`
//! yields, in order, have no grad, read from the recorded parameters walk
//! (`crate::plans::module_walks`) without starting the walk.
//!
//! Torch's `zero_grad` reads `p.grad` for every parameter and acts only on
//! the grads that exist. Up to the first such grad its loop only reads, and
//! reading an exact `Parameter`'s (or `Tensor`'s) `grad` through torch's C
//! getter runs no Python code when no torch-function mode is active. So those
//! reads can be made in one pass over the checked plan, with the cyclic GC
//! paused (a finalizer is code): if every grad is None the call is done,
//! exactly as torch's would be; otherwise the walk runs as usual and skips the
//! leading parameters already read, while it is still replaying the same plan
//! (nothing has run since the pass, so their grads are still None).
use super::children::for_each_parameter;
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::instance::attributes::class_data_descr;
use crate::instance::dispatch::{is_native, Method};
use crate::plans::module_walks::{self, PlanKey};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// What the pass found.
pub enum NoGrads {
    /// Every parameter's grad is None: `zero_grad` has nothing to do.
    All,
    /// The first `n` parameters' grads are None (0 when the pass could not
    /// run, or the first parameter has one).
    Leading(usize),
}

/// `p.grad` when torch's C getter is what reading it would call, as a new
/// reference (None when it is not, or the getter failed: the walk reads it
/// again and meets the same).
unsafe fn plain_grad(
    g: &Globals,
    p: *mut capi::PyObject,
    grad: *mut capi::PyObject,
) -> Option<*mut capi::PyObject> {
    let tp = capi::Py_TYPE(p);
    if tp != g.parameter && tp != g.tensor {
        return None;
    }
    let (descr, get) = class_data_descr(tp, grad)?;
    if capi::Py_TYPE(descr) != std::ptr::addr_of_mut!(capi::PyGetSetDescr_Type) {
        return None;
    }
    let r = get(descr, p, tp as *mut capi::PyObject);
    if r.is_null() {
        capi::PyErr_Clear();
        return None;
    }
    Some(r)
}

/// The pass for `root.zero_grad()`; `grad` is the interned "grad".
pub fn scan(
    py: Python<'_>,
    g: &Globals,
    root: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyString>,
) -> NoGrads {
    let native = [
        Method::Parameters,
        Method::NamedParameters,
        Method::NamedMembers,
        Method::NamedModules,
    ]
    .into_iter()
    .all(|m| is_native(g, root, m));
    if !native || !crate::plans::table::enabled() {
        return NoGrads::Leading(0);
    }
    // The walk `for_each_parameter` starts (its prefix is the empty str,
    // a singleton).
    let key = PlanKey {
        root: root.as_ptr() as usize,
        prefix: PyString::new(py, "").as_ptr() as usize,
        registry: 1,
        values: true,
    };
    let Some(plan) = module_walks::find(&key) else {
        return NoGrads::Leading(0);
    };
    // A torch-function mode sees every `grad` read.
    match crate::torch_api::runtime::get().and_then(|rt| rt.modes_active(py)) {
        Ok(false) => {}
        _ => return NoGrads::Leading(0),
    }
    let mut none = 0usize;
    let mut stopped = false;
    let gc = crate::cpython::gc::GcPause::new();
    // SAFETY: GIL held. The closure runs only torch's C getter (no Python
    // code) and drops what it read.
    let done = unsafe {
        module_walks::scan_members(&plan, root.as_ptr(), |p| {
            match plain_grad(g, p, grad.as_ptr()) {
                Some(v) if v == capi::Py_None() => {
                    capi::Py_DECREF(v);
                    none += 1;
                    true
                }
                Some(v) => {
                    // A grad: torch's loop acts from here on. The reference
                    // is a tensor's wrapper; dropping it runs no code with
                    // the GC paused (a tensor's Python object is kept by
                    // torch while it has state of its own).
                    capi::Py_DECREF(v);
                    stopped = true;
                    false
                }
                None => false,
            }
        })
    };
    drop(gc);
    if done {
        module_walks::note_replay();
        return NoGrads::All;
    }
    NoGrads::Leading(if stopped { none } else { 0 })
}

/// torch's `zero_grad(set_to_none)` body for `module`: the first pass from
/// the recorded parameters walk ([`scan`]), then the walk itself for the
/// rest.
pub fn zero_grad<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    set_to_none: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // The `_is_replica` warning is issued by the Python wrapper, so
    // that its stacklevel points at the caller as in torch.
    let grad = intern!(py, "grad");
    let skip = match scan(py, g, module, grad) {
        NoGrads::All => return Ok(py.None().into_bound(py)),
        NoGrads::Leading(n) => n,
    };
    for_each_parameter(py, g, module, skip, |p| {
        if crate::instance::attributes::data_attr(p, grad)?.is_none() {
            return Ok(());
        }
        if set_to_none.is_truthy()? {
            p.setattr(grad, py.None())?;
        } else {
            if !p.getattr(grad)?.getattr(intern!(py, "grad_fn"))?.is_none() {
                p.getattr(grad)?.call_method0(intern!(py, "detach_"))?;
            } else {
                p.getattr(grad)?
                    .call_method1(intern!(py, "requires_grad_"), (false,))?;
            }
            p.getattr(grad)?.call_method0(intern!(py, "zero_"))?;
        }
        Ok(())
    })?;
    Ok(py.None().into_bound(py))
}
