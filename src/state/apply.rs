//! `_apply(fn, recurse)`: the walk behind `.to()`, `.float()`, `.half()`,
//! `.cpu()`, `.cuda()`, `.type()` and `to_empty()`.
//!
//! The tree is walked children first, as torch does, with torch's dynamic
//! dispatch (a class that overrides `_apply`, such as the RNNs, gets its own
//! method for its subtree). Each module's own tensors are converted natively
//! when the case is the common one; anything else is handed to torch's own
//! `_apply(fn, recurse=False)` for that module, before anything of it was
//! touched, or, once some of its tensors were converted, through a replaying
//! `fn` that lets torch finish the module exactly (`fastmodule._methods.conversion`).
//!
//! The native case: both `torch.__future__` conversion flags off when the
//! module's own tensors start (where torch reads the swap flag, once per
//! module), exact `dict` registries, parameters that are exact `Parameter`s
//! with exact-tensor (or no) grads, and results of `fn` that are exact tensors
//! of a compatible shallow-copy type. Then torch's code does `param.data =
//! fn(param)` (and the same for the grad) under `no_grad`, and
//! `_buffers[key] = fn(buf)`; that is what runs here.
//!
//! `fn` may release the GIL (torch's kernels do) or run Python code, so what
//! torch's code reads after it is read after it here: the overwrite flag
//! (`compute_should_use_set_data`, per tensor), `param.grad`, `out_param.grad`,
//! `self._parameters` and `self._buffers` where torch assigns into them. A
//! flag found set then replaces the parameter (or grad) as torch's code does.
//! (Still decided once per call, at the root: which closure `fn` is, what its
//! cells target and that the Tensor methods it calls are torch's, on which
//! skipping a call that changes nothing rests.)
//!
//! A conversion that changes nothing: for torch's own closures (those of
//! `float`/`double`/`half`/`bfloat16`/`cpu`/`to`), with no torch-function or
//! dispatch mode active and exact tensor types, `fn(t)` returns `t` itself
//! exactly when the tensor already has the target dtype/device; the closure is
//! then not called and the assignment of `t` to itself is skipped: neither is
//! observable.
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::load_global::load_global;
use crate::cpython::recursion::{Depth, Recursion};
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::{data_attr, instance_attr, truthy};
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::instance::registries::Items;
use crate::torch_api::originals::Globals;
use crate::walk::children::for_each_child;
use pyo3::exceptions::{PyAssertionError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::sync::OnceLock;

/// torch's callables and fastmodule's replay helper, captured at import.
struct Config {
    compatible: Py<PyAny>,
    resume: Py<PyAny>,
    /// The Tensor methods and properties torch's closures (and this walk)
    /// use, as torch defines them: (interned name, object).
    tensor_methods: Vec<(Py<PyString>, Py<PyAny>)>,
    /// torch's conversion closures: (code object, what it does).
    known: Vec<(Py<PyAny>, Known)>,
}

#[derive(Clone, Copy)]
enum Known {
    /// `lambda t: t.<float type>() if t.is_floating_point() else t`.
    FloatType(usize),
    /// `lambda t: t.cpu()`.
    Cpu,
    /// `Module.to`'s `convert`: indices of its free variables.
    To {
        format: usize,
        device: usize,
        dtype: usize,
    },
}

static CONFIG: OnceLock<(Config, Vec<Py<PyAny>>)> = OnceLock::new();

/// `config`: see `fastmodule._methods.conversion` for the keys.
pub fn init(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<()> {
    let get = |k: &str| -> PyResult<Py<PyAny>> {
        config
            .get_item(k)?
            .map(|v| v.unbind())
            .ok_or_else(|| PyRuntimeError::new_err(format!("fastmodule: apply config lacks {k}")))
    };
    let mut known = Vec::new();
    let mut dtypes = Vec::new();
    for item in config
        .get_item("known")?
        .ok_or_else(|| PyRuntimeError::new_err("fastmodule: apply config lacks known"))?
        .try_iter()?
    {
        // (code, kind, payload)
        let (code, kind, payload): (Bound<'_, PyAny>, String, Bound<'_, PyAny>) =
            item?.extract()?;
        let k = match kind.as_str() {
            "float_type" => {
                dtypes.push(payload.unbind());
                Known::FloatType(dtypes.len() - 1)
            }
            "cpu" => Known::Cpu,
            "to" => {
                let (format, device, dtype): (usize, usize, usize) = payload.extract()?;
                Known::To {
                    format,
                    device,
                    dtype,
                }
            }
            _ => continue,
        };
        known.push((code.unbind(), k));
    }
    let mut tensor_methods = Vec::new();
    for item in config
        .get_item("tensor_methods")?
        .ok_or_else(|| PyRuntimeError::new_err("fastmodule: apply config lacks tensor_methods"))?
        .try_iter()?
    {
        let (name, obj): (Bound<'_, PyString>, Bound<'_, PyAny>) = item?.extract()?;
        tensor_methods.push((PyString::intern(py, &name.to_cow()?).unbind(), obj.unbind()));
    }
    let c = Config {
        tensor_methods,
        compatible: get("compatible")?,
        resume: get("resume")?,
        known,
    };
    let _ = py;
    let _ = CONFIG.set((c, dtypes));
    Ok(())
}

/// Which device a recognised `to` targets, for the "already there" test.
enum Device<'py> {
    Any,
    Cpu,
    /// A device with an explicit index: compared with `t.device`.
    Exact(Bound<'py, PyAny>),
}

/// What a recognised closure does, resolved for this call.
enum Spec<'py> {
    /// Not recognised (or modes active): `fn` is called for every tensor.
    Unknown,
    FloatType(Bound<'py, PyAny>),
    Cpu,
    To {
        device: Device<'py>,
        dtype: Option<Bound<'py, PyAny>>,
    },
}

struct Ctx<'py> {
    cfg: &'static Config,
    rt: &'static crate::torch_api::runtime::Runtime,
    g: &'static Globals,
    fn_: Bound<'py, PyAny>,
    spec: Spec<'py>,
    /// Every module's own tensors go to torch's `_apply`: a mode is active
    /// (it must see torch's exact sequence of calls) or a flag getter was
    /// replaced (it must be called as often as torch calls it).
    delegate_all: bool,
}

impl<'py> Ctx<'py> {
    /// Both `torch.__future__` flags off, read without calling anything:
    /// Some(true); Some(false) if one is set; None where a getter must be
    /// called (it is no longer torch's own).
    fn flags_off(&self, py: Python<'py>) -> PyResult<Option<bool>> {
        Ok(
            match (self.rt.swap.peek(py)?, self.rt.overwrite.peek(py)?) {
                (Some(swap), Some(overwrite)) => Some(!swap && !overwrite),
                _ => None,
            },
        )
    }

    /// `compute_should_use_set_data`'s read of the overwrite flag, made where
    /// torch's code makes it: after `fn(tensor)` (which may have released the
    /// GIL or run Python code), once per tensor whose result is compatible.
    fn overwrite(&self, py: Python<'py>) -> PyResult<bool> {
        self.rt.overwrite.get(py)
    }

    /// Does `fn(t)` return `t` itself? Only asked for exact tensors.
    fn unchanged(&self, py: Python<'py>, t: &Bound<'py, PyAny>) -> PyResult<bool> {
        let is_float_or_complex = |dt: &Bound<'py, PyAny>| -> PyResult<bool> {
            Ok(truthy(dt.getattr(intern!(py, "is_floating_point")))?
                || truthy(dt.getattr(intern!(py, "is_complex")))?)
        };
        match &self.spec {
            Spec::Unknown => Ok(false),
            Spec::FloatType(target) => {
                let dt = data_attr(t, intern!(py, "dtype"))?;
                Ok(dt.is(target) || !truthy(dt.getattr(intern!(py, "is_floating_point")))?)
            }
            Spec::Cpu => truthy(data_attr(t, intern!(py, "is_cpu"))),
            Spec::To { device, dtype } => {
                let device_ok = match device {
                    Device::Any => true,
                    Device::Cpu => truthy(data_attr(t, intern!(py, "is_cpu")))?,
                    Device::Exact(d) => data_attr(t, intern!(py, "device"))?.eq(d)?,
                };
                if !device_ok {
                    return Ok(false);
                }
                match dtype {
                    None => Ok(true),
                    Some(target) => {
                        let dt = data_attr(t, intern!(py, "dtype"))?;
                        Ok(dt.is(target) || !is_float_or_complex(&dt)?)
                    }
                }
            }
        }
    }

    /// Would the live walk (`own_tensors`) leave `t` (a non-None entry of
    /// `_parameters` when `is_param`, else of `_buffers`) and its grad as they
    /// are, without calling `fn`? Only reads.
    fn left_as_is(&self, py: Python<'py>, t: &Bound<'py, PyAny>, is_param: bool) -> PyResult<bool> {
        if !is_param {
            return Ok(exact(t, self.g.tensor) && self.unchanged(py, t)?);
        }
        if !exact(t, self.g.parameter) {
            return Ok(false);
        }
        let grad = data_attr(t, intern!(py, "grad"))?;
        if grad.is_none() {
            return self.unchanged(py, t);
        }
        Ok(exact(&grad, self.g.tensor) && self.unchanged(py, t)? && self.unchanged(py, &grad)?)
    }

    /// `with torch.no_grad(): fn(t)`.
    fn call_no_grad(&self, py: Python<'py>, t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.rt.no_grad(py, || self.fn_.call1((t,)))
    }

    fn compatible(
        &self,
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
    ) -> PyResult<bool> {
        truthy(self.cfg.compatible.bind(py).call1((a, b)))
    }
}

/// Recognise torch's closure `fn` and resolve what it targets.
fn spec_of<'py>(
    py: Python<'py>,
    g: &Globals,
    cfg: &'static Config,
    dtypes: &[Py<PyAny>],
    f: &Bound<'py, PyAny>,
) -> PyResult<Spec<'py>> {
    if unsafe { capi::PyFunction_Check(f.as_ptr()) } == 0 {
        return Ok(Spec::Unknown);
    }
    // The closure's result is known only while the Tensor methods it calls
    // (and the properties read here) are torch's own.
    for (name, orig) in &cfg.tensor_methods {
        for tp in [g.tensor, g.parameter] {
            if unsafe { type_lookup(tp, name.as_ptr()) } != orig.as_ptr() {
                return Ok(Spec::Unknown);
            }
        }
    }
    let code = f.getattr(intern!(py, "__code__"))?;
    let Some(kind) = cfg
        .known
        .iter()
        .find(|(c, _)| c.bind(py).is(&code))
        .map(|(_, k)| *k)
    else {
        return Ok(Spec::Unknown);
    };
    let cell = |i: usize| -> PyResult<Bound<'py, PyAny>> {
        f.getattr(intern!(py, "__closure__"))?
            .get_item(i)?
            .getattr(intern!(py, "cell_contents"))
    };
    Ok(match kind {
        Known::FloatType(i) => match dtypes.get(i) {
            Some(d) => Spec::FloatType(d.bind(py).clone()),
            None => Spec::Unknown,
        },
        Known::Cpu => Spec::Cpu,
        Known::To {
            format,
            device,
            dtype,
        } => {
            if !cell(format)?.is_none() {
                return Ok(Spec::Unknown);
            }
            let d = cell(device)?;
            // `t.to(device)` returns `t` itself only when `t.device == device`
            // (so "cpu:0" copies a tensor on "cpu"); "cuda" without an index
            // means the current device, left to the closure.
            let indexed = !d.is_none() && !d.getattr(intern!(py, "index"))?.is_none();
            let device = if d.is_none() {
                Device::Any
            } else if indexed {
                Device::Exact(d)
            } else if d.getattr(intern!(py, "type"))?.eq("cpu")? {
                Device::Cpu
            } else {
                return Ok(Spec::Unknown);
            };
            let dt = cell(dtype)?;
            Spec::To {
                device,
                dtype: if dt.is_none() { None } else { Some(dt) },
            }
        }
    })
}

/// `module._apply(fn, recurse)` with `_apply` resolved to torch's.
pub fn root<'py>(
    py: Python<'py>,
    g: &'static Globals,
    module: &Bound<'py, PyAny>,
    f: &Bound<'py, PyAny>,
    recurse: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let Some((cfg, dtypes)) = CONFIG.get() else {
        return Err(PyRuntimeError::new_err(
            "fastmodule: conversion not initialised",
        ));
    };
    let rt = crate::torch_api::runtime::get()?;
    let delegate_all =
        rt.modes_active(py)? || !rt.swap.is_original(py)? || !rt.overwrite.is_original(py)?;
    let spec = if delegate_all {
        Spec::Unknown
    } else {
        spec_of(py, g, cfg, dtypes, f)?
    };
    let ctx = Ctx {
        cfg,
        rt,
        g,
        fn_: f.clone(),
        spec,
        delegate_all,
    };
    let recurse = recurse.is_truthy()?;
    // A recognised conversion with both flags off: a recorded walk of an
    // unchanged tree whose every tensor the conversion leaves as it is
    // changes nothing (see crate::plans::eager). The flags are read again
    // after the replay's checks, which ran no `fn` (nothing released the GIL
    // in between) and no Python code (the replay pauses the cyclic GC, so no
    // finalizer ran): both off then, torch's walk would have read them off at
    // every module and tensor.
    let plannable =
        recurse && !matches!(ctx.spec, Spec::Unknown) && ctx.flags_off(py)? == Some(true);
    if plannable
        && crate::plans::eager::apply_is_noop(py, module, |t, is_param| {
            ctx.left_as_is(py, t, is_param)
        })
        .is_some()
        && ctx.flags_off(py)? == Some(true)
    {
        return Ok(module.clone());
    }
    let out = body(py, &ctx, module, recurse)?;
    if plannable {
        crate::plans::eager::record(g, crate::plans::table::Walk::Apply, module, None);
    }
    Ok(out)
}

fn body<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    recurse: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Python)?;
    if recurse {
        for_each_child(py, ctx.g, module, |child| {
            if is_native(ctx.g, child, Method::ApplyFn) {
                body(py, ctx, child, true)?;
            } else {
                call_method(child, Method::ApplyFn, (&ctx.fn_,))?;
            }
            Ok(())
        })?;
    }
    own_tensors(py, ctx, module)?;
    Ok(module.clone())
}

/// torch's `_apply(fn, recurse=False)` for `module`.
fn delegate<'py>(py: Python<'py>, ctx: &Ctx<'py>, module: &Bound<'py, PyAny>) -> PyResult<()> {
    let code = crate::torch_api::torch_code::torch_code(py, Method::ApplyFn.name())?;
    code.call1((module, &ctx.fn_, false))?;
    Ok(())
}

/// Let torch finish `module`: its first `answered` calls of `fn` return their
/// argument (those tensors are already converted), the next returns `result`
/// when given (that call was made already).
fn resume<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    answered: usize,
    result: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    let resume = ctx.cfg.resume.bind(py);
    match result {
        Some(r) => resume.call1((module, &ctx.fn_, answered, r))?,
        None => resume.call1((module, &ctx.fn_, answered))?,
    };
    Ok(())
}

/// An exact dict registry of `module`, or None.
fn registry<'py>(
    module: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(instance_attr(module, name)?.filter(|d| d.is_exact_instance_of::<PyDict>()))
}

/// Do lookups by an exact str in `module`'s instance dict run no code?
fn quiet_instance_dict(module: &Bound<'_, PyAny>) -> bool {
    unsafe {
        let d = crate::instance::attributes::instance_dict(module.as_ptr());
        !d.is_null() && crate::cpython::quiet::dict(d)
    }
}

fn exact(t: &Bound<'_, PyAny>, tp: *mut capi::PyTypeObject) -> bool {
    unsafe { capi::Py_TYPE(t.as_ptr()) == tp }
}

/// The local variables of torch's `_apply` that hold tensors, in the order
/// CPython releases them when the frame ends (the order of the code's
/// variables; Rust drops fields in declaration order). Each is rebound where
/// torch's code rebinds it, so a finalizer of an old tensor (a replaced
/// buffer, say) runs when it runs on stock: after the dict iterator has read
/// the next item, or when the module's `_apply` returns.
#[derive(Default)]
struct Locals<'py> {
    key: Option<Bound<'py, PyAny>>,
    param: Option<Bound<'py, PyAny>>,
    param_applied: Option<Bound<'py, PyAny>>,
    param_grad: Option<Bound<'py, PyAny>>,
    out_param: Option<Bound<'py, PyAny>>,
    grad_applied: Option<Bound<'py, PyAny>>,
    buf: Option<Bound<'py, PyAny>>,
}

fn own_tensors<'py>(py: Python<'py>, ctx: &Ctx<'py>, module: &Bound<'py, PyAny>) -> PyResult<()> {
    let mut locals = Locals::default();
    own_tensors_with(py, ctx, module, &mut locals)
}

fn own_tensors_with<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    locals: &mut Locals<'py>,
) -> PyResult<()> {
    let g = ctx.g;
    if ctx.delegate_all {
        return delegate(py, ctx, module);
    }
    // torch's `_apply` reads the swap flag here, once per module, after its
    // children were converted (which may have released the GIL or run
    // Python code), and the overwrite flag for each tensor (below). Either
    // set, or a getter that must be called: torch's code for this module,
    // which reads them itself (reading a flag without calling anything, as
    // here, is not observable).
    if ctx.flags_off(py)? != Some(true) {
        return delegate(py, ctx, module);
    }
    // torch reads `self._parameters` here, after the children, through the
    // class's `__getattribute__`: one the class (or a mixin base) gained
    // while the children were converted (code in `fn`, a child's `_apply`
    // override, a kernel) is torch's code's to call.
    if !unsafe { crate::instance::fast::plain_getattribute(g, capi::Py_TYPE(module.as_ptr())) } {
        return delegate(py, ctx, module);
    }
    // Reading `_buffers` ahead of torch (which reads it after the parameters)
    // and skipping its lookups are the same only in a dict whose lookups run
    // no code.
    if !quiet_instance_dict(module) {
        return delegate(py, ctx, module);
    }
    let (Some(params), Some(_)) = (
        registry(module, intern!(py, "_parameters"))?,
        registry(module, intern!(py, "_buffers"))?,
    ) else {
        return delegate(py, ctx, module);
    };
    let grad_name = intern!(py, "grad");
    let known = !matches!(ctx.spec, Spec::Unknown);
    let data = intern!(py, "data");
    let tensor_like = |t: &Bound<'py, PyAny>| exact(t, g.tensor) || exact(t, g.parameter);
    // `with torch.no_grad(): fn(t)`, or `t` itself without the call where a
    // recognised closure returns its argument (that call would only release
    // the GIL: unobservable).
    let apply = |t: &Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
        if known && ctx.unchanged(py, t)? {
            Ok(t.clone())
        } else {
            ctx.call_no_grad(py, t)
        }
    };
    // Calls of `fn` torch's code would have made so far in this module.
    let mut calls = 0usize;
    // The exact dict just read is what `self._parameters.items()` iterates
    // (nothing ran in between).
    let mut it = Items::of_dict(&params);
    while let Some((key, p)) = it.next(py)? {
        locals.key = Some(key.clone());
        locals.param = Some(p.clone());
        if p.is_none() {
            continue;
        }
        // Anything else than an exact Parameter with an exact (or no) grad
        // is torch's to handle, from this parameter on.
        if !exact(&p, g.parameter) {
            return resume(py, ctx, module, calls, None);
        }
        let applied = apply(&p)?;
        locals.param_applied = Some(applied.clone());
        calls += 1;
        // `compute_should_use_set_data(param, param_applied)`: a result of
        // another type, or one not compatible, is torch's to handle.
        let same = known && applied.is(&p);
        let compatible = same || (tensor_like(&applied) && ctx.compatible(py, &p, &applied)?);
        if !compatible {
            return resume(py, ctx, module, calls - 1, Some(&applied));
        }
        // Re-read after `fn(param)`: the overwrite flag (its getter, as torch
        // calls it here), then `param.grad`.
        let overwrite = ctx.overwrite(py)?;
        let grad = data_attr(&p, grad_name)?;
        locals.param_grad = Some(grad.clone());
        let out_param = if overwrite {
            replace_param(py, ctx, module, &key, &p, &applied)?
        } else {
            // `param.data = param_applied` (to itself: nothing to do).
            if !same {
                p.setattr(data, &applied)?;
            }
            p.clone()
        };
        locals.out_param = Some(out_param.clone());
        if grad.is_none() {
            continue;
        }
        if !exact(&grad, g.tensor) {
            return resume(py, ctx, module, calls, None);
        }
        let grad_applied = apply(&grad)?;
        locals.grad_applied = Some(grad_applied.clone());
        calls += 1;
        // `compute_should_use_set_data(param_grad, grad_applied)`.
        let same = known && grad_applied.is(&grad);
        let compatible =
            same || (tensor_like(&grad_applied) && ctx.compatible(py, &grad, &grad_applied)?);
        if !compatible {
            return resume(py, ctx, module, calls - 1, Some(&grad_applied));
        }
        // Re-read after `fn(param_grad)`: the overwrite flag, then
        // `out_param.grad`.
        if ctx.overwrite(py)? {
            replace_grad(py, &out_param, &grad, &grad_applied)?;
            continue;
        }
        let current = data_attr(&out_param, grad_name)?;
        if current.is_none() {
            return Err(PyAssertionError::new_err("out_param.grad must not be None"));
        }
        // `out_param.grad.data = grad_applied` (to itself: nothing to do).
        if !(same && current.is(&grad)) {
            current.setattr(data, &grad_applied)?;
        }
    }
    let buffers_name = intern!(py, "_buffers");
    let mut it = Items::of(module, buffers_name)?;
    while let Some((key, buf)) = it.next(py)? {
        locals.key = Some(key.clone());
        locals.buf = Some(buf.clone());
        if buf.is_none() {
            continue;
        }
        // `self._buffers[key] = buf` rebinds an entry to its own value:
        // unobservable while neither lookup can run code and `self._buffers`
        // (torch reads it again for every store) is still the dict iterated.
        // An earlier `fn(buf)` may have run code (or released the GIL) that
        // rebound it: then the store goes to the new dict, as torch's does.
        let quiet = quiet_instance_dict(module)
            && match (it.dict_state(), registry(module, buffers_name)?) {
                (Some((d, _, _)), Some(current)) => {
                    current.as_ptr() == d && unsafe { crate::cpython::quiet::dict(d) }
                }
                _ => false,
            };
        if known && quiet && exact(&buf, g.tensor) && ctx.unchanged(py, &buf)? {
            continue;
        }
        let applied = ctx.fn_.call1((&buf,))?;
        // `self._buffers[key] = ...`, reading `self._buffers` again as torch does.
        module.getattr(buffers_name)?.set_item(&key, &applied)?;
    }
    Ok(())
}

/// torch's branch for a parameter whose result is not set into it (the
/// overwrite flag read set):
///
/// ```python
/// if not isinstance(param, Parameter): raise AssertionError("param must be a Parameter")
/// if not param.is_leaf: raise AssertionError("param must be a leaf tensor")
/// out_param = Parameter(param_applied, param.requires_grad)
/// self._parameters[key] = out_param
/// ```
///
/// Each name read as torch's code reads it (module.py's globals, the
/// attributes of `param` and `self`); the new parameter is returned.
fn replace_param<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    param: &Bound<'py, PyAny>,
    applied: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let global = |name: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: module.py's globals, a dict held for the process.
        match unsafe { load_global(ctx.g.module_globals, name.as_ptr()) } {
            Ok(v) => Ok(unsafe { Bound::from_owned_ptr(py, v.into_ptr()) }),
            Err(()) => Err(PyErr::fetch(py)),
        }
    };
    let parameter = intern!(py, "Parameter");
    let isinstance = global(intern!(py, "isinstance"))?;
    if !isinstance.call1((param, global(parameter)?))?.is_truthy()? {
        return Err(PyAssertionError::new_err("param must be a Parameter"));
    }
    if !param.getattr(intern!(py, "is_leaf"))?.is_truthy()? {
        return Err(PyAssertionError::new_err("param must be a leaf tensor"));
    }
    let cls = global(parameter)?;
    let out = cls.call1((applied, param.getattr(intern!(py, "requires_grad"))?))?;
    module
        .getattr(intern!(py, "_parameters"))?
        .set_item(key, &out)?;
    Ok(out)
}

/// torch's branch for a grad whose result is not set into it (the overwrite
/// flag read set):
///
/// ```python
/// if not param_grad.is_leaf: raise AssertionError("param_grad must be a leaf tensor")
/// out_param.grad = grad_applied.requires_grad_(param_grad.requires_grad)
/// ```
fn replace_grad<'py>(
    py: Python<'py>,
    out_param: &Bound<'py, PyAny>,
    grad: &Bound<'py, PyAny>,
    grad_applied: &Bound<'py, PyAny>,
) -> PyResult<()> {
    if !grad.getattr(intern!(py, "is_leaf"))?.is_truthy()? {
        return Err(PyAssertionError::new_err(
            "param_grad must be a leaf tensor",
        ));
    }
    let new = grad_applied.call_method1(
        intern!(py, "requires_grad_"),
        (grad.getattr(intern!(py, "requires_grad"))?,),
    )?;
    out_param.setattr(intern!(py, "grad"), new)
}
