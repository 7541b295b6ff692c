//! The layer families beyond `Sequential`/`Linear`/`ReLU`: each registered by
//! `fastmodule._verified.layers` as a spec — torch's `forward` function, the objects
//! the native steps call, and a guard: every global those steps read, with
//! the object torch installed there (or its absence), and every torch Python
//! function whose body is reproduced (its code, defaults and closure cells
//! as they were at import). A call is served only while the whole guard
//! holds; the dict entries are re-read whenever one of their dicts changed.
//!
//! Attribute reads on the module (`self.p`, `self.weight`) are served only
//! where they run no code (fastmodule's `tp_getattro`, and a plain instance
//! attribute, a class value that is no descriptor, or a registry entry), so
//! a step that finds something it does not reproduce can still hand the whole
//! call to torch's `forward`, which reads them again as if for the first time.
use super::{activations, conv, dropout, embedding, norms, pooling, shape};
use crate::call::getattr::{registry_get, Reg};
use crate::cpython::capi;
use crate::cpython::function_body::Body;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::{caches_on, dict_version};
use crate::instance::attributes::{instance_dict, plain_attr, Plain};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::cell::UnsafeCell;
use std::sync::OnceLock;

pub(super) type Obj = *mut capi::PyObject;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Identity,
    Flatten,
    Gelu,
    Silu,
    Tanh,
    Sigmoid,
    Softmax,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    AlphaDropout,
    FeatureAlphaDropout,
    LayerNorm,
    RmsNorm,
    Embedding,
    Conv1d,
    Conv2d,
    BatchNorm,
    MaxPool2d,
    AdaptiveAvgPool2d,
}

/// The spec names `fastmodule._verified.layers` registers, with the names of the
/// objects each kind's native steps call (indexed by the family's constants).
const KINDS: &[(&str, Kind, &[&str])] = &[
    ("identity", Kind::Identity, &[]),
    ("flatten", Kind::Flatten, &[]),
    ("gelu", Kind::Gelu, activations::GELU),
    ("silu", Kind::Silu, activations::SILU),
    ("tanh", Kind::Tanh, activations::UNARY),
    ("sigmoid", Kind::Sigmoid, activations::UNARY),
    ("softmax", Kind::Softmax, activations::SOFTMAX),
    ("dropout", Kind::Dropout, dropout::OBJS),
    ("dropout1d", Kind::Dropout1d, dropout::OBJS),
    ("dropout2d", Kind::Dropout2d, dropout::OBJS),
    ("dropout3d", Kind::Dropout3d, dropout::OBJS),
    ("alpha_dropout", Kind::AlphaDropout, dropout::OBJS),
    (
        "feature_alpha_dropout",
        Kind::FeatureAlphaDropout,
        dropout::OBJS,
    ),
    ("layer_norm", Kind::LayerNorm, norms::NORM),
    ("rms_norm", Kind::RmsNorm, norms::NORM),
    ("embedding", Kind::Embedding, embedding::OBJS),
    ("conv1d", Kind::Conv1d, conv::OBJS),
    ("conv2d", Kind::Conv2d, conv::OBJS),
    ("batch_norm", Kind::BatchNorm, norms::BATCH),
    ("max_pool2d", Kind::MaxPool2d, pooling::MAX),
    (
        "adaptive_avg_pool2d",
        Kind::AdaptiveAvgPool2d,
        pooling::ADAPTIVE,
    ),
];

pub(super) struct Layer {
    pub(super) kind: Kind,
    forward: Obj,
    code: Obj,
    /// `forward.__globals__` (a function's globals are never rebound).
    globals: Obj,
    guard: Guard,
    /// The objects the native steps call, in the order of the kind's names.
    pub(super) o: Box<[Obj]>,
}

/// What must hold for a layer's native steps to be torch's.
struct Guard {
    /// `dict[key] is want` (`want` null: `key not in dict`).
    entries: Box<[(Obj, Obj, Obj)]>,
    /// The distinct dicts of `entries`, and their versions at the last pass.
    dicts: Box<[Obj]>,
    seen: UnsafeCell<Box<[u64]>>,
    /// `_PyType_Lookup(type, name) is want` (null: absent), checked each call.
    types: Box<[(Obj, Obj, Obj)]>,
    /// Functions whose bodies are reproduced, with their code and defaults
    /// as verified.
    funcs: Box<[Body]>,
    /// Their closure cells, with the contents they had.
    cells: Box<[(Obj, Obj)]>,
    /// `type(obj) is cls` (a module whose class could be reassigned).
    classes: Box<[(Obj, Obj)]>,
}

impl Guard {
    #[inline(always)]
    unsafe fn pass(&self) -> bool {
        if !self.funcs.iter().all(|b| b.intact()) {
            return false;
        }
        for &(cell, want) in self.cells.iter() {
            let v = capi::PyCell_Get(cell);
            if v.is_null() {
                capi::PyErr_Clear();
                return false;
            }
            capi::Py_DECREF(v);
            if v != want {
                return false;
            }
        }
        for &(obj, cls) in self.classes.iter() {
            if capi::Py_TYPE(obj) as Obj != cls {
                return false;
            }
        }
        for &(tp, name, want) in self.types.iter() {
            if type_lookup(tp.cast(), name) != want {
                return false;
            }
        }
        let seen = &mut *self.seen.get();
        let on = caches_on();
        if on
            && self
                .dicts
                .iter()
                .zip(seen.iter())
                .all(|(&d, &v)| dict_version(d) == v)
        {
            return true;
        }
        for &(d, key, want) in self.entries.iter() {
            if want.is_null() {
                if !crate::cpython::quiet::dict(d) || capi::PyDict_Contains(d, key) != 0 {
                    capi::PyErr_Clear();
                    return false;
                }
            } else if !super::is(d, key, want) {
                return false;
            }
        }
        if on {
            for (s, &d) in seen.iter_mut().zip(self.dicts.iter()) {
                *s = dict_version(d);
            }
        }
        true
    }
}

impl Layer {
    /// Does the guard still hold? Asked again by a step that continues after
    /// a call that may have released the GIL or run Python code, where
    /// torch's code reads a guarded global or runs a guarded function.
    #[inline(always)]
    pub(super) unsafe fn guard_holds(&self) -> bool {
        self.guard.pass()
    }

    /// The globals torch's `forward` reads.
    pub(super) fn globals(&self) -> Obj {
        self.globals
    }
}

/// Interned attribute names and keyword-name tuples, and objects every family
/// uses.
pub(super) struct Common {
    pub(super) has_tf_unary: Obj,
    pub(super) has_tf_variadic: Obj,
    pub(super) tensor: Obj,
    pub(super) parameter: Obj,
    pub(super) torch: Obj,
    pub(super) zero: Obj,
    pub(super) one: Obj,
    pub(super) minus_one: Obj,
    pub(super) float_one: Obj,
    /// The global name `F` (`torch.nn.functional` in the layer modules).
    pub(super) f_global: Obj,
    pub(super) s: Strs,
    /// `torch.Tensor.dim` and `.size` as torch defines them (C methods).
    tensor_dim: Obj,
    tensor_size: Obj,
}

impl Common {
    /// Do `Tensor` and `Parameter` still resolve `dim` and `size` to torch's
    /// C methods? The native steps call them, or skip a call torch's code
    /// makes, or call one and then hand over to torch's code, which calls it
    /// again: all invisible while they are torch's. A patched one (a counting
    /// or recording tool) makes the whole call torch's `forward`, before any
    /// step, so it is called exactly as often as on stock.
    #[inline(always)]
    pub(super) unsafe fn tensor_methods_intact(&self) -> bool {
        [self.tensor, self.parameter].iter().all(|&t| {
            type_lookup(t.cast(), self.s.dim) == self.tensor_dim
                && type_lookup(t.cast(), self.s.size) == self.tensor_size
        })
    }
}

macro_rules! strs {
    ($($f:ident),* $(,)?) => {
        pub(super) struct Strs { $(pub(super) $f: Obj,)* }
        fn strs(py: Python<'_>) -> Strs {
            Strs { $($f: pyo3::types::PyString::intern(py, stringify!($f)).into_ptr(),)* }
        }
    };
}

strs!(
    p,
    training,
    inplace,
    approximate,
    dim,
    start_dim,
    end_dim,
    flatten,
    softmax,
    size,
    add_,
    normalized_shape,
    weight,
    bias,
    eps,
    padding_idx,
    max_norm,
    norm_type,
    scale_grad_by_freq,
    sparse,
    _conv_forward,
    padding_mode,
    stride,
    padding,
    dilation,
    groups,
    _check_input_dim,
    momentum,
    track_running_stats,
    num_batches_tracked,
    running_mean,
    running_var,
    kernel_size,
    ceil_mode,
    return_indices,
    output_size,
    backends,
    cudnn,
    enabled,
    zeros,
    float,
    batch_norm,
);

/// Keyword-name tuples of the calls the steps make.
pub(super) struct Kw {
    pub(super) approximate: Obj,
    pub(super) inplace: Obj,
    pub(super) stacklevel: Obj,
    pub(super) pool: Obj,
}

struct Table {
    layers: Box<[Layer]>,
    common: Common,
    kw: Kw,
}
// SAFETY: strong references kept for the life of the process, read with the GIL.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}
static TABLE: OnceLock<Table> = OnceLock::new();

fn owned(o: &Bound<'_, PyAny>) -> Obj {
    o.clone().into_ptr()
}

/// `config["layers"]`: `{kind: {"forward", "objs", "guard", "types", "funcs", "classes"}}`
/// and `config["absent"]`, the marker of an entry that must be missing; see
/// `fastmodule._verified.layers`. No `layers` key: nothing beyond the first three.
pub(super) fn init(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<()> {
    let err =
        |k: &str| pyo3::exceptions::PyRuntimeError::new_err(format!("fastmodule: layers lack {k}"));
    let Some(specs) = config.get_item("layers")? else {
        return Ok(());
    };
    let specs = specs.cast::<PyDict>()?.clone();
    let absent = config.get_item("absent")?.ok_or_else(|| err("absent"))?;
    let get = |k: &str| -> PyResult<Obj> { Ok(owned(&config.get_item(k)?.ok_or_else(|| err(k))?)) };
    let tensor_type = get("tensor_type")?;
    let s = strs(py);
    // SAFETY: `tensor_type` is a type object held for the process; the
    // method descriptors found are held too.
    let (tensor_dim, tensor_size) = unsafe {
        let find = |name: Obj| {
            let v = type_lookup(tensor_type.cast(), name);
            // Not known without running code: null, which no later lookup
            // equals (the methods then never count as torch's).
            if v == crate::cpython::type_cache::unknown() {
                return std::ptr::null_mut();
            }
            if !v.is_null() {
                capi::Py_INCREF(v);
            }
            v
        };
        (find(s.dim), find(s.size))
    };
    let common = Common {
        tensor_dim,
        tensor_size,
        has_tf_unary: get("has_torch_function_unary")?,
        has_tf_variadic: get("has_torch_function_variadic")?,
        tensor: tensor_type,
        parameter: get("parameter_type")?,
        torch: get("torch")?,
        zero: 0i64.into_pyobject(py)?.into_ptr(),
        one: 1i64.into_pyobject(py)?.into_ptr(),
        minus_one: (-1i64).into_pyobject(py)?.into_ptr(),
        float_one: 1.0f64.into_pyobject(py)?.into_ptr(),
        f_global: pyo3::types::PyString::intern(py, "F").into_ptr(),
        s,
    };
    let tuple = |names: &[&str]| PyTuple::new(py, names).map(|t| t.into_ptr());
    let kw = Kw {
        approximate: tuple(&["approximate"])?,
        inplace: tuple(&["inplace"])?,
        stacklevel: tuple(&["_stacklevel"])?,
        pool: tuple(&["ceil_mode", "return_indices"])?,
    };
    let mut layers = Vec::new();
    for (name, spec) in specs.iter() {
        let name: String = name.extract()?;
        let Some(&(_, kind, obj_names)) = KINDS.iter().find(|(n, _, _)| *n == name) else {
            return Err(err(&format!(" a kind named {name}")));
        };
        let spec = spec.cast::<PyDict>()?;
        let item = |k: &str| spec.get_item(k)?.ok_or_else(|| err(&format!("{name}.{k}")));
        let forward = item("forward")?;
        let code = forward.getattr("__code__")?;
        let globals = forward.getattr("__globals__")?;
        let objs = item("objs")?;
        let objs = objs.cast::<PyDict>()?;
        let mut o = Vec::new();
        for n in obj_names {
            o.push(owned(
                &objs
                    .get_item(n)?
                    .ok_or_else(|| err(&format!("{name}.objs.{n}")))?,
            ));
        }
        let mut entries = Vec::new();
        let mut dicts: Vec<Obj> = Vec::new();
        for e in item("guard")?.cast::<PyList>()?.iter() {
            let (d, k, w): (Bound<'_, PyDict>, Bound<'_, PyAny>, Bound<'_, PyAny>) = e.extract()?;
            let k = pyo3::types::PyString::intern(py, &k.extract::<String>()?);
            let w = if w.is(&absent) {
                std::ptr::null_mut()
            } else {
                owned(&w)
            };
            let d = owned(d.as_any());
            if !dicts.contains(&d) {
                dicts.push(d);
            }
            entries.push((d, k.into_ptr(), w));
        }
        let mut types = Vec::new();
        for e in item("types")?.cast::<PyList>()?.iter() {
            let (t, k, w): (
                Bound<'_, pyo3::types::PyType>,
                Bound<'_, PyAny>,
                Bound<'_, PyAny>,
            ) = e.extract()?;
            let k = pyo3::types::PyString::intern(py, &k.extract::<String>()?);
            let w = if w.is(&absent) {
                std::ptr::null_mut()
            } else {
                owned(&w)
            };
            types.push((owned(t.as_any()), k.into_ptr(), w));
        }
        let mut funcs = Vec::new();
        let mut cells = Vec::new();
        for f in item("funcs")?.cast::<PyList>()?.iter() {
            if !f.is_instance_of::<pyo3::types::PyFunction>() {
                return Err(err(&format!("{name}: a Python function")));
            }
            // SAFETY: a Python function, held for the life of the process.
            let body = unsafe { Body::of(owned(&f)) };
            funcs.push(body.ok_or_else(|| err(&format!("{name}: a Python function")))?);
            let closure = f.getattr("__closure__")?;
            if !closure.is_none() {
                for cell in closure.cast::<PyTuple>()?.iter() {
                    let v = cell.getattr("cell_contents")?;
                    cells.push((owned(&cell), owned(&v)));
                }
            }
        }
        let mut classes = Vec::new();
        for e in item("classes")?.cast::<PyList>()?.iter() {
            let (obj, cls): (Bound<'_, PyAny>, Bound<'_, PyAny>) = e.extract()?;
            classes.push((owned(&obj), owned(&cls)));
        }
        let n = dicts.len();
        layers.push(Layer {
            kind,
            forward: owned(&forward),
            code: owned(&code),
            globals: owned(&globals),
            guard: Guard {
                entries: entries.into(),
                dicts: dicts.into(),
                seen: UnsafeCell::new(vec![u64::MAX; n].into()),
                types: types.into(),
                funcs: funcs.into(),
                cells: cells.into(),
                classes: classes.into(),
            },
            o: o.into(),
        });
    }
    let _ = TABLE.set(Table {
        layers: layers.into(),
        common,
        kw,
    });
    Ok(())
}

/// torch's `forward` function `func` for `slf(input)`, natively, if it is one
/// of the table's and its guard holds; None: the caller calls `func`.
#[inline(always)]
pub(super) unsafe fn forward(func: Obj, slf: Obj, input: Obj) -> Option<Obj> {
    let t = TABLE.get()?;
    let l = t.layers.iter().find(|l| l.forward == func)?;
    let c = &t.common;
    if capi::PyFunction_GetCode(func) != l.code
        || !l.guard.pass()
        || !c.tensor_methods_intact()
        || !super::getattr_intact()
    {
        return None;
    }
    let kw = &t.kw;
    match l.kind {
        Kind::Identity => shape::identity(input),
        Kind::Flatten => shape::flatten(c, slf, input),
        Kind::Gelu => activations::gelu(l, c, kw, slf, input),
        Kind::Silu => activations::silu(l, c, kw, slf, input),
        Kind::Tanh | Kind::Sigmoid => activations::unary(l, input),
        Kind::Softmax => activations::softmax(l, c, kw, slf, input),
        Kind::Dropout
        | Kind::Dropout1d
        | Kind::Dropout2d
        | Kind::Dropout3d
        | Kind::AlphaDropout
        | Kind::FeatureAlphaDropout => dropout::dropout(l, c, slf, input),
        Kind::LayerNorm => norms::layer_norm(l, c, slf, input),
        Kind::RmsNorm => norms::rms_norm(l, c, slf, input),
        Kind::BatchNorm => norms::batch_norm(l, c, slf, input),
        Kind::Embedding => embedding::embedding(l, c, slf, input),
        Kind::Conv1d | Kind::Conv2d => conv::conv(l, c, slf, input),
        Kind::MaxPool2d => pooling::max_pool2d(l, c, kw, slf, input),
        Kind::AdaptiveAvgPool2d => pooling::adaptive_avg_pool2d(l, c, slf, input),
    }
}

/// A strong reference, released when dropped (with the GIL, as everything here).
pub(super) struct Held(pub(super) Obj);

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: a strong reference or null, dropped with the GIL held.
        unsafe { capi::Py_XDECREF(self.0) }
    }
}

/// `slf.<name>` when reading it runs no code: Some(new reference), Some(null)
/// with an exception set, or None (the read might run code, or would fail:
/// torch's `forward` then reads it itself).
pub(super) unsafe fn read(slf: Obj, name: Obj) -> Option<Obj> {
    let tp = capi::Py_TYPE(slf);
    if !crate::call::slots::is_fn!(
        crate::cpython::types::getattro_slot(tp),
        crate::call::getattr::module_getattro as capi::getattrofunc
    ) {
        return None;
    }
    let dict = instance_dict(slf);
    match plain_attr(tp, dict, name) {
        Plain::Found(v) => {
            capi::Py_INCREF(v);
            Some(v)
        }
        Plain::Error => Some(std::ptr::null_mut()),
        Plain::Unusual => {
            if !type_lookup(tp, name).is_null() || crate::cpython::tracer::active() {
                return None;
            }
            let g = crate::torch_api::originals::globals()?;
            match registry_get(g, slf, name) {
                Reg::Found(v) => {
                    capi::Py_INCREF(v);
                    Some(v)
                }
                Reg::Error => Some(std::ptr::null_mut()),
                Reg::Missing | Reg::Unusual => None,
            }
        }
    }
}

/// `let x = get!(slf, name);`: a [`Held`] read, or the caller returns
/// (None: torch's `forward` runs; Some(null): the read's exception).
macro_rules! get {
    ($slf:expr, $name:expr) => {
        match $crate::call::layers::table::read($slf, $name) {
            Some(v) if v.is_null() => return Some(std::ptr::null_mut()),
            Some(v) => $crate::call::layers::table::Held(v),
            None => return None,
        }
    };
}
pub(super) use get;

/// `f(*args[..n], **dict(zip(kwnames, args[n..])))`.
#[inline(always)]
pub(super) unsafe fn call(f: Obj, args: &[Obj], kwnames: Obj) -> Obj {
    let nkw = if kwnames.is_null() {
        0
    } else {
        capi::PyTuple_GET_SIZE(kwnames) as usize
    };
    capi::PyObject_Vectorcall(f, args.as_ptr(), args.len() - nkw, kwnames)
}

/// Is `x` exactly a `torch.Tensor` or `nn.Parameter` (whose methods are
/// torch's C methods, running no Python code)?
#[inline(always)]
pub(super) unsafe fn plain_tensor(c: &Common, x: Obj) -> bool {
    let tp = capi::Py_TYPE(x) as Obj;
    tp == c.tensor || tp == c.parameter
}

/// `has_torch_function_unary(x)` / `has_torch_function_variadic(*xs)`:
/// Ok(answer), Err(()) with an exception set.
#[inline(always)]
pub(super) unsafe fn has_tf(c: &Common, xs: &[Obj]) -> Result<bool, ()> {
    let f = if xs.len() == 1 {
        c.has_tf_unary
    } else {
        c.has_tf_variadic
    };
    let r = capi::PyObject_Vectorcall(f, xs.as_ptr(), xs.len(), std::ptr::null_mut());
    if r.is_null() {
        return Err(());
    }
    let t = capi::PyObject_IsTrue(r);
    capi::Py_DECREF(r);
    match t {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(()),
    }
}

/// `torch.backends.cudnn.enabled`, read as the bytecode reads it.
pub(super) unsafe fn cudnn_enabled(c: &Common) -> Obj {
    let backends = Held(capi::PyObject_GetAttr(c.torch, c.s.backends));
    if backends.0.is_null() {
        return std::ptr::null_mut();
    }
    let cudnn = Held(capi::PyObject_GetAttr(backends.0, c.s.cudnn));
    if cudnn.0.is_null() {
        return std::ptr::null_mut();
    }
    capi::PyObject_GetAttr(cudnn.0, c.s.enabled)
}

/// The exact float `x`'s value, if it is one.
#[inline(always)]
pub(super) unsafe fn exact_float(x: Obj) -> Option<f64> {
    (capi::PyFloat_CheckExact(x) != 0).then(|| capi::PyFloat_AS_DOUBLE(x))
}

/// `x`'s truth (`if x:`), as the bytecode tests it: Ok(answer) or Err(()).
#[inline(always)]
pub(super) unsafe fn truth(x: Obj) -> Result<bool, ()> {
    match capi::PyObject_IsTrue(x) {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(()),
    }
}

pub(super) fn none() -> Obj {
    // SAFETY: the None singleton's address.
    unsafe { capi::Py_None() }
}
