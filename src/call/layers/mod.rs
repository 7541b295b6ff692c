//! torch's own layer forwards without their Python frames: `Sequential`,
//! `Linear`, `ReLU` (this file's `Leaves`, with per-instance reads remembered
//! on the call cache entry) and the families of [`table`] (`Identity`,
//! `Flatten`, activations, dropouts, norms, `Embedding`, convolutions,
//! pooling).
//!
//! Only where the result is provably torch's: the module's `forward`
//! resolves to torch's very function (checked by the caller) whose code and
//! defaults are still those verified at import (checked here, on every
//! call: a `__code__` swapped in by a hot-reload tool runs), the call has
//! exactly one positional argument, and every global those functions read
//! is still the object torch installed (re-checked on every call, cached by
//! the dict versions). Then the same builtin ops run with the same
//! arguments, in the same order; a `__torch_function__` input or mode, or any
//! value the native step does not reproduce exactly, gets torch's own Python
//! function for that step. The function bodies were checked at import
//! (`fastmodule._verified.layers`) against the names they use, so a torch whose layers
//! read differently is simply not served.
mod activations;
mod containers;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod norms;
mod pooling;
mod shape;
mod table;

use crate::call::call_cache::{set_leaf, Entry, Leaf, LeafKind};
use crate::cpython::capi;
use crate::cpython::function_body::Body;
use crate::cpython::quiet;
use crate::instance::attributes::instance_dict;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::OnceLock;

pub(super) struct Leaves {
    pub(super) sequential_forward: *mut capi::PyObject,
    pub(super) sequential_iter: *mut capi::PyObject,
    pub(super) linear_forward: *mut capi::PyObject,
    pub(super) relu_forward: *mut capi::PyObject,
    /// `torch.nn.functional` and its module dict.
    pub(super) functional: *mut capi::PyObject,
    pub(super) functional_dict: *mut capi::PyObject,
    /// The globals of `torch.nn.modules.linear` / `.activation`.
    pub(super) linear_globals: *mut capi::PyObject,
    pub(super) activation_globals: *mut capi::PyObject,
    pub(super) f_linear: *mut capi::PyObject,
    pub(super) f_relu: *mut capi::PyObject,
    pub(super) f_relu_globals: *mut capi::PyObject,
    pub(super) torch: *mut capi::PyObject,
    pub(super) torch_dict: *mut capi::PyObject,
    pub(super) torch_relu: *mut capi::PyObject,
    pub(super) torch_relu_: *mut capi::PyObject,
    pub(super) has_torch_function_unary: *mut capi::PyObject,
    pub(super) names: Names,
    pub(super) bodies: Bodies,
}

/// The bodies of the Python functions reproduced here, as verified: a
/// function whose `__code__` or defaults were replaced since is called.
pub(super) struct Bodies {
    pub(super) linear_forward: Body,
    pub(super) relu_forward: Body,
    pub(super) sequential_forward: Body,
    pub(super) sequential_iter: Body,
    pub(super) f_relu: Body,
}

pub(super) struct Names {
    pub(super) f: *mut capi::PyObject,
    pub(super) linear: *mut capi::PyObject,
    pub(super) relu: *mut capi::PyObject,
    pub(super) relu_: *mut capi::PyObject,
    pub(super) torch: *mut capi::PyObject,
    pub(super) has_tf_unary: *mut capi::PyObject,
    pub(super) weight: *mut capi::PyObject,
    pub(super) bias: *mut capi::PyObject,
    pub(super) inplace: *mut capi::PyObject,
    pub(super) modules: *mut capi::PyObject,
    pub(super) parameters: *mut capi::PyObject,
    pub(super) iter: *mut capi::PyObject,
}

// SAFETY: strong references kept for the life of the process, read with the GIL.
unsafe impl Send for Leaves {}
unsafe impl Sync for Leaves {}
static LEAVES: OnceLock<Leaves> = OnceLock::new();

pub(super) use crate::cpython::validity::Checked;

/// `config`: see `fastmodule._verified.layers`.
pub fn init(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<()> {
    let get = |k: &str| -> PyResult<*mut capi::PyObject> {
        Ok(config
            .get_item(k)?
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err(format!("fastmodule: layers lack {k}"))
            })?
            .into_ptr())
    };
    let intern = |s: &str| pyo3::types::PyString::intern(py, s).into_ptr();
    let body = |k: &str| -> PyResult<Body> {
        // SAFETY: `get` returned a strong reference, kept for the process.
        unsafe { Body::of(get(k)?) }.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "fastmodule: layers' {k} is not a Python function"
            ))
        })
    };
    let bodies = Bodies {
        linear_forward: body("linear_forward")?,
        relu_forward: body("relu_forward")?,
        sequential_forward: body("sequential_forward")?,
        sequential_iter: body("sequential_iter")?,
        f_relu: body("f_relu")?,
    };
    let l = Leaves {
        sequential_forward: get("sequential_forward")?,
        sequential_iter: get("sequential_iter")?,
        linear_forward: get("linear_forward")?,
        relu_forward: get("relu_forward")?,
        functional: get("functional")?,
        functional_dict: get("functional_dict")?,
        linear_globals: get("linear_globals")?,
        activation_globals: get("activation_globals")?,
        f_linear: get("f_linear")?,
        f_relu: get("f_relu")?,
        f_relu_globals: get("f_relu_globals")?,
        torch: get("torch")?,
        torch_dict: get("torch_dict")?,
        torch_relu: get("torch_relu")?,
        torch_relu_: get("torch_relu_")?,
        has_torch_function_unary: get("has_torch_function_unary")?,
        names: Names {
            f: intern("F"),
            linear: intern("linear"),
            relu: intern("relu"),
            relu_: intern("relu_"),
            torch: intern("torch"),
            has_tf_unary: intern("has_torch_function_unary"),
            weight: intern("weight"),
            bias: intern("bias"),
            inplace: intern("inplace"),
            modules: intern("_modules"),
            parameters: intern("_parameters"),
            iter: intern("__iter__"),
        },
        bodies,
    };
    crate::call::containers::init_builtins(
        py,
        &config.get_item("sequential_iter")?.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("fastmodule: layers lack sequential_iter")
        })?,
    )?;
    let _ = LEAVES.set(l);
    table::init(py, config)
}

/// `d[key] is want` for a module dict; false (torch's function runs) unless
/// the dict is quiet, so the lookup runs no code and cannot fail.
#[inline(always)]
pub(super) unsafe fn is(
    d: *mut capi::PyObject,
    key: *mut capi::PyObject,
    want: *mut capi::PyObject,
) -> bool {
    if !quiet::dict(d) {
        return false;
    }
    let v = capi::PyDict_GetItemWithError(d, key);
    if v.is_null() {
        capi::PyErr_Clear();
        return false;
    }
    v == want
}

/// torch's `forward` function `func` for `slf(input)`, natively; None when
/// it is not one served here (the caller then calls `func`).
#[inline(always)]
pub unsafe fn forward(
    func: *mut capi::PyObject,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    let l = LEAVES.get()?;
    // Each by identity and by body: code swapped in since runs as Python.
    if func == l.linear_forward {
        if !l.bodies.linear_forward.intact() || !getattr_intact() {
            return None;
        }
        linear::linear(l, slf, input, entry)
    } else if func == l.relu_forward {
        if !l.bodies.relu_forward.intact() {
            return None;
        }
        activations::relu(l, slf, input, entry)
    } else if func == l.sequential_forward {
        if !l.bodies.sequential_forward.intact()
            || !l.bodies.sequential_iter.intact()
            || !crate::call::containers::builtins_intact()
        {
            return None;
        }
        containers::sequential(l, slf, input, entry)
    } else {
        table::forward(func, slf, input)
    }
}

/// The steps read registered attributes (`self.weight`) as torch's
/// `__getattr__` does, or remember such reads: not once it has another body.
#[inline(always)]
pub(super) fn getattr_intact() -> bool {
    crate::torch_api::originals::globals().is_some_and(|g| g.orig.getattr_intact())
}

/// The cached reads of `kind` on a just-validated entry.
#[inline(always)]
pub(super) unsafe fn cached(
    entry: *mut Entry,
    kind: LeafKind,
) -> Option<(*mut capi::PyObject, *mut capi::PyObject)> {
    if entry.is_null() {
        return None;
    }
    (*entry).leaf.get(kind)
}

/// Does `obj.<name>` resolve through fastmodule's `tp_getattro` with no class
/// attribute and no instance attribute of that name, so that it is exactly
/// `nn.Module.__getattr__`'s registry lookup? `dict` must be quiet.
#[inline(always)]
pub(super) unsafe fn registry_only(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> bool {
    own_getattro_no_class_attr(tp, name) && capi::PyDict_Contains(dict, name) == 0
}

/// fastmodule's `tp_getattro`, and no class attribute `name`: `obj.<name>` is
/// the instance attribute if there is one, else the registry lookup.
#[inline(always)]
pub(super) unsafe fn own_getattro_no_class_attr(
    tp: *mut capi::PyTypeObject,
    name: *mut capi::PyObject,
) -> bool {
    crate::call::slots::is_fn!(
        crate::cpython::types::getattro_slot(tp),
        crate::call::getattr::module_getattro as capi::getattrofunc
    ) && crate::cpython::type_cache::type_lookup(tp, name).is_null()
}

/// `self.<name>` remembered on the call cache entry when it is a plain
/// instance attribute (no class attribute of that name, fastmodule's
/// `tp_getattro`).
pub(super) unsafe fn remember_plain(
    slf: *mut capi::PyObject,
    entry: *mut Entry,
    name: *mut capi::PyObject,
    value: *mut capi::PyObject,
    kind: LeafKind,
) {
    if entry.is_null() {
        return;
    }
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    // Only quiet dicts: the lookups below then run no code.
    if dict.is_null() || !quiet::dict(dict) || !own_getattro_no_class_attr(tp, name) {
        return;
    }
    let v = capi::PyDict_GetItemWithError(dict, name);
    if v != value {
        capi::PyErr_Clear();
        return;
    }
    let leaf = Leaf {
        kind,
        reg: std::ptr::null_mut(),
        reg_version: 0,
        a: value,
        b: std::ptr::null_mut(),
    };
    set_leaf(entry, tp, dict, leaf);
}

/// Is `slf.<name>` None, or not readable without running code (torch's code
/// then reads it itself)? Runs no Python code and leaves no exception set.
pub unsafe fn attr_is_none_or_unknown(slf: *mut capi::PyObject, name: *mut capi::PyObject) -> bool {
    match table::read(slf, name) {
        None => true,
        Some(v) if v.is_null() => {
            capi::PyErr_Clear();
            true
        }
        Some(v) => {
            let none = v == capi::Py_None();
            capi::Py_DECREF(v);
            none
        }
    }
}
