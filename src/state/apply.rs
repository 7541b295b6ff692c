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
//! The native case: both `torch.__future__` conversion flags off, exact
//! `dict` registries, parameters that are exact `Parameter`s with exact-tensor
//! (or no) grads, and results of `fn` that are exact tensors of a compatible
//! shallow-copy type. Then torch's code does `param.data = fn(param)` (and the
//! same for the grad) under `no_grad`, and `_buffers[key] = fn(buf)`; that is
//! what runs here.
//!
//! A conversion that changes nothing: for torch's own closures (those of
//! `float`/`double`/`half`/`bfloat16`/`cpu`/`to`), with no torch-function or
//! dispatch mode active and exact tensor types, `fn(t)` returns `t` itself
//! exactly when the tensor already has the target dtype/device; the closure is
//! then not called and the assignment of `t` to itself is skipped: neither is
//! observable.
use crate::cpython::capi;
use crate::cpython::recursion::{Depth, Recursion};
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::{data_attr, instance_attr, truthy};
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::instance::registries::Items;
use crate::torch_api::originals::Globals;
use crate::walk::children::for_each_child;
use pyo3::exceptions::{PyAssertionError, PyRuntimeError};
use pyo3::intern;
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
    /// The two `torch.__future__` flags, when they can be read once per call
    /// (a recognised closure cannot change them).
    flags: Option<(bool, bool)>,
    /// Every module's own tensors go to torch's `_apply`: a mode is active
    /// (it must see torch's exact sequence of calls) or a flag getter was
    /// replaced (it must be called as often as torch calls it).
    delegate_all: bool,
}

impl<'py> Ctx<'py> {
    fn flags(&self, py: Python<'py>) -> PyResult<(bool, bool)> {
        if let Some(f) = self.flags {
            return Ok(f);
        }
        Ok((self.rt.swap.get(py)?, self.rt.overwrite.get(py)?))
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
    let mut ctx = Ctx {
        cfg,
        rt,
        g,
        fn_: f.clone(),
        spec,
        flags: None,
        delegate_all,
    };
    if !matches!(ctx.spec, Spec::Unknown) {
        ctx.flags = Some(ctx.flags(py)?);
    }
    let recurse = recurse.is_truthy()?;
    // A recognised conversion with both flags off: a recorded walk of an
    // unchanged tree whose every tensor the conversion leaves as it is
    // changes nothing (see crate::plans::eager).
    let plannable = recurse && ctx.flags == Some((false, false));
    if plannable
        && crate::plans::eager::apply_is_noop(py, module, |t, is_param| {
            ctx.left_as_is(py, t, is_param)
        })
        .is_some()
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
    let (swap, overwrite) = ctx.flags(py)?;
    if swap || overwrite {
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
    // Calls of `fn` torch's code would have made so far in this module.
    let mut calls = 0usize;
    // The exact dict just read is what `self._parameters.items()` iterates
    // (nothing ran in between).
    let mut it = Items::of_dict(&params);
    while let Some((key, p)) = it.next(py)? {
        locals.key = Some(key);
        locals.param = Some(p.clone());
        if p.is_none() {
            continue;
        }
        // Anything else than an exact Parameter with an exact (or no) grad
        // is torch's to handle, from this parameter on.
        if !exact(&p, g.parameter) {
            return resume(py, ctx, module, calls, None);
        }
        if known {
            let grad = data_attr(&p, grad_name)?;
            if !grad.is_none() && !exact(&grad, g.tensor) {
                return resume(py, ctx, module, calls, None);
            }
            if ctx.unchanged(py, &p)? && (grad.is_none() || ctx.unchanged(py, &grad)?) {
                calls += if grad.is_none() { 1 } else { 2 };
                // What torch's locals would hold: `fn` returned its argument.
                locals.param_applied = Some(p.clone());
                locals.param_grad = Some(grad.clone());
                locals.out_param = Some(p.clone());
                if !grad.is_none() {
                    locals.grad_applied = Some(grad);
                }
                continue;
            }
        }
        let applied = ctx.call_no_grad(py, &p)?;
        locals.param_applied = Some(applied.clone());
        calls += 1;
        let grad = data_attr(&p, grad_name)?;
        locals.param_grad = Some(grad.clone());
        if !(known && applied.is(&p)) {
            if tensor_like(&applied) && ctx.compatible(py, &p, &applied)? {
                p.setattr(data, &applied)?;
            } else {
                return resume(py, ctx, module, calls - 1, Some(&applied));
            }
        }
        locals.out_param = Some(p.clone());
        if grad.is_none() {
            continue;
        }
        if !exact(&grad, g.tensor) {
            return resume(py, ctx, module, calls, None);
        }
        let grad_applied = ctx.call_no_grad(py, &grad)?;
        locals.grad_applied = Some(grad_applied.clone());
        calls += 1;
        if known && grad_applied.is(&grad) {
            continue;
        }
        if tensor_like(&grad_applied) && ctx.compatible(py, &grad, &grad_applied)? {
            let current = data_attr(&p, grad_name)?;
            if current.is_none() {
                return Err(PyAssertionError::new_err("out_param.grad must not be None"));
            }
            current.setattr(data, &grad_applied)?;
        } else {
            return resume(py, ctx, module, calls - 1, Some(&grad_applied));
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
        // unobservable while neither lookup can run code.
        let quiet = quiet_instance_dict(module)
            && it
                .dict_state()
                .is_some_and(|(d, _, _)| unsafe { crate::cpython::quiet::dict(d) });
        if known && quiet && exact(&buf, g.tensor) && ctx.unchanged(py, &buf)? {
            continue;
        }
        let applied = ctx.fn_.call1((&buf,))?;
        // `self._buffers[key] = ...`, reading `self._buffers` again as torch does.
        module.getattr(buffers_name)?.set_item(&key, &applied)?;
    }
    Ok(())
}
