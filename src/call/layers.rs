//! torch's own `Sequential.forward`, `Linear.forward` and `ReLU.forward`
//! without their Python frames.
//!
//! Only where the result is provably torch's: the module's `forward`
//! resolves to torch's very function (checked by the caller), the call has
//! exactly one positional argument, and every global those functions read
//! (`F`, `F.linear`, `F.relu`, `torch.relu`, `has_torch_function_unary`)
//! is still the object torch installed. Then the same builtin ops run with
//! the same arguments, in the same order; `F.relu`'s `__torch_function__`
//! check runs as torch's code runs it, and a tensor or mode that needs it gets
//! `F.relu` itself. The function bodies were checked at import
//! (`fastmodule.layers`) against the names they use, so a torch whose layers
//! read differently is simply not served.
use crate::call::call_cache::{set_leaf, Entry, Leaf, LeafKind};
use crate::cpython::capi;
use crate::cpython::quiet;
use crate::cpython::validity::dict_version;
use crate::instance::attributes::{instance_dict, plain_attr, Plain};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::OnceLock;

struct Leaves {
    sequential_forward: *mut capi::PyObject,
    sequential_iter: *mut capi::PyObject,
    linear_forward: *mut capi::PyObject,
    relu_forward: *mut capi::PyObject,
    /// `torch.nn.functional` and its module dict.
    functional: *mut capi::PyObject,
    functional_dict: *mut capi::PyObject,
    /// The globals of `torch.nn.modules.linear` / `.activation`.
    linear_globals: *mut capi::PyObject,
    activation_globals: *mut capi::PyObject,
    f_linear: *mut capi::PyObject,
    f_relu: *mut capi::PyObject,
    f_relu_globals: *mut capi::PyObject,
    torch: *mut capi::PyObject,
    torch_dict: *mut capi::PyObject,
    torch_relu: *mut capi::PyObject,
    torch_relu_: *mut capi::PyObject,
    has_torch_function_unary: *mut capi::PyObject,
    names: Names,
}

struct Names {
    f: *mut capi::PyObject,
    linear: *mut capi::PyObject,
    relu: *mut capi::PyObject,
    relu_: *mut capi::PyObject,
    torch: *mut capi::PyObject,
    has_tf_unary: *mut capi::PyObject,
    weight: *mut capi::PyObject,
    bias: *mut capi::PyObject,
    inplace: *mut capi::PyObject,
    modules: *mut capi::PyObject,
    parameters: *mut capi::PyObject,
    iter: *mut capi::PyObject,
}

// SAFETY: strong references kept for the life of the process, read with the GIL.
unsafe impl Send for Leaves {}
unsafe impl Sync for Leaves {}
static LEAVES: OnceLock<Leaves> = OnceLock::new();

/// The versions of the dicts whose entries a layer's globals check read, when
/// the check last passed: while none of them changed, it passes again (any
/// insertion, deletion or rebinding moves a dict's version).
struct Checked<const N: usize>(std::cell::Cell<[u64; N]>);
// SAFETY: only touched with the GIL held.
unsafe impl<const N: usize> Sync for Checked<N> {}

impl<const N: usize> Checked<N> {
    const fn new() -> Self {
        Checked(std::cell::Cell::new([0; N]))
    }

    /// `check()` unless `dicts` are all at the versions of its last success.
    #[inline(always)]
    unsafe fn pass(&self, dicts: [*mut capi::PyObject; N], check: impl FnOnce() -> bool) -> bool {
        if !crate::cpython::validity::caches_on() {
            return check();
        }
        let now = dicts.map(|d| dict_version(d));
        if now == self.0.get() {
            return true;
        }
        if !check() {
            return false;
        }
        self.0.set(now);
        true
    }
}

static LINEAR_GLOBALS: Checked<2> = Checked::new();
static RELU_GLOBALS: Checked<4> = Checked::new();

/// `config`: see `fastmodule.layers`.
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
    };
    let _ = LEAVES.set(l);
    Ok(())
}

/// `d[key] is want` for a module dict; false (torch's function runs) unless
/// the dict is quiet, so the lookup runs no code and cannot fail.
#[inline(always)]
unsafe fn is(d: *mut capi::PyObject, key: *mut capi::PyObject, want: *mut capi::PyObject) -> bool {
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
    if func == l.linear_forward {
        linear(l, slf, input, entry)
    } else if func == l.relu_forward {
        relu(l, slf, input, entry)
    } else if func == l.sequential_forward {
        sequential(l, slf, input, entry)
    } else {
        None
    }
}

/// The cached reads of `kind` on a just-validated entry.
#[inline(always)]
unsafe fn cached(
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
unsafe fn registry_only(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> bool {
    own_getattro_no_class_attr(tp, name) && capi::PyDict_Contains(dict, name) == 0
}

/// fastmodule's `tp_getattro`, and no class attribute `name`: `obj.<name>` is
/// the instance attribute if there is one, else the registry lookup.
#[inline(always)]
unsafe fn own_getattro_no_class_attr(
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
unsafe fn remember_plain(
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
    set_leaf(entry, dict, leaf);
}

/// `self.weight`/`self.bias` of a Linear, remembered on the call cache entry
/// when both come straight from an exact `_parameters` dict.
unsafe fn remember_linear(
    l: &Leaves,
    slf: *mut capi::PyObject,
    entry: *mut Entry,
    w: *mut capi::PyObject,
    b: *mut capi::PyObject,
) {
    if entry.is_null() {
        return;
    }
    let n = &l.names;
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    // Only quiet dicts (the instance dict and `_parameters`): no lookup below
    // runs code, so what one read stays true for the next and for the entry.
    if dict.is_null()
        || !quiet::dict(dict)
        || !registry_only(tp, dict, n.weight)
        || !registry_only(tp, dict, n.bias)
    {
        return;
    }
    let reg = match plain_attr(tp, dict, n.parameters) {
        Plain::Found(d) if quiet::dict(d) => d,
        Plain::Error => {
            capi::PyErr_Clear();
            return;
        }
        _ => return,
    };
    if capi::PyDict_GetItemWithError(reg, n.weight) != w
        || capi::PyDict_GetItemWithError(reg, n.bias) != b
    {
        capi::PyErr_Clear();
        return;
    }
    let leaf = Leaf {
        kind: LeafKind::Linear,
        reg,
        reg_version: dict_version(reg),
        a: w,
        b,
    };
    set_leaf(entry, dict, leaf);
}

/// `F.linear(input, self.weight, self.bias)`.
unsafe fn linear(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    let n = &l.names;
    let ok = LINEAR_GLOBALS.pass([l.linear_globals, l.functional_dict], || {
        is(l.linear_globals, n.f, l.functional) && is(l.functional_dict, n.linear, l.f_linear)
    });
    if !ok {
        return None;
    }
    let (weight, bias) = match cached(entry, LeafKind::Linear) {
        // Borrowed from the unchanged `_parameters`; held across the call as
        // torch's frame would hold them.
        Some((w, b)) => {
            capi::Py_INCREF(w);
            capi::Py_INCREF(b);
            (w, b)
        }
        None => {
            let w = capi::PyObject_GetAttr(slf, n.weight);
            if w.is_null() {
                return Some(w);
            }
            let b = capi::PyObject_GetAttr(slf, n.bias);
            if b.is_null() {
                capi::Py_DECREF(w);
                return Some(b);
            }
            remember_linear(l, slf, entry, w, b);
            (w, b)
        }
    };
    let args = [input, weight, bias];
    let r = capi::PyObject_Vectorcall(l.f_linear, args.as_ptr(), 3, std::ptr::null_mut());
    capi::Py_DECREF(weight);
    capi::Py_DECREF(bias);
    Some(r)
}

/// `F.relu(input, inplace=self.inplace)`, with `F.relu`'s body.
unsafe fn relu(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    let n = &l.names;
    let dicts = [
        l.activation_globals,
        l.functional_dict,
        l.f_relu_globals,
        l.torch_dict,
    ];
    let ok = RELU_GLOBALS.pass(dicts, || {
        is(l.activation_globals, n.f, l.functional)
            && is(l.functional_dict, n.relu, l.f_relu)
            && is(l.f_relu_globals, n.has_tf_unary, l.has_torch_function_unary)
            && is(l.f_relu_globals, n.torch, l.torch)
            && is(l.torch_dict, n.relu, l.torch_relu)
            && is(l.torch_dict, n.relu_, l.torch_relu_)
    });
    if !ok {
        return None;
    }
    let inplace = match cached(entry, LeafKind::Relu) {
        Some((v, _)) => {
            capi::Py_INCREF(v);
            v
        }
        None => {
            let v = capi::PyObject_GetAttr(slf, n.inplace);
            if v.is_null() {
                return Some(v);
            }
            remember_plain(slf, entry, n.inplace, v, LeafKind::Relu);
            v
        }
    };
    let r = relu_body(l, input, inplace);
    capi::Py_DECREF(inplace);
    Some(r)
}

unsafe fn relu_body(
    l: &Leaves,
    input: *mut capi::PyObject,
    inplace: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let has = capi::PyObject_CallOneArg(l.has_torch_function_unary, input);
    if has.is_null() {
        return has;
    }
    let truth = capi::PyObject_IsTrue(has);
    capi::Py_DECREF(has);
    if truth < 0 {
        return std::ptr::null_mut();
    }
    if truth == 1 {
        // torch's own F.relu handles __torch_function__.
        let args = [input, inplace];
        let kw = capi::PyTuple_Pack(1, l.names.inplace);
        if kw.is_null() {
            return kw;
        }
        let r = capi::PyObject_Vectorcall(l.f_relu, args.as_ptr(), 1, kw);
        capi::Py_DECREF(kw);
        return r;
    }
    match capi::PyObject_IsTrue(inplace) {
        1 => capi::PyObject_CallOneArg(l.torch_relu_, input),
        0 => capi::PyObject_CallOneArg(l.torch_relu, input),
        _ => std::ptr::null_mut(),
    }
}

/// `for module in self: input = module(input)`, with `self.__iter__` being
/// torch's `iter(self._modules.values())`.
unsafe fn sequential(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    // The class (`__iter__`) and the instance dict (`_modules`) are what the
    // entry was validated against.
    let modules = match cached(entry, LeafKind::Sequential) {
        Some((d, _)) => d,
        None => {
            let tp = capi::Py_TYPE(slf);
            if crate::cpython::type_cache::type_lookup(tp, l.names.iter) != l.sequential_iter {
                return None;
            }
            let dict = instance_dict(slf);
            let d = match plain_attr(tp, dict, l.names.modules) {
                Plain::Found(d) if capi::PyDict_CheckExact(d) != 0 => d,
                Plain::Error => return Some(std::ptr::null_mut()),
                _ => return None,
            };
            if !entry.is_null() && !dict.is_null() {
                let leaf = Leaf {
                    kind: LeafKind::Sequential,
                    reg: std::ptr::null_mut(),
                    reg_version: 0,
                    a: d,
                    b: std::ptr::null_mut(),
                };
                set_leaf(entry, dict, leaf);
            }
            d
        }
    };
    // Held for the loop, as torch's frame holds `self._modules`.
    capi::Py_INCREF(modules);
    // Nested containers recurse natively: count them as torch's frames would.
    if capi::Py_EnterRecursiveCall(c" while calling a Python object".as_ptr()) != 0 {
        capi::Py_DECREF(modules);
        return Some(std::ptr::null_mut());
    }
    let r = sequential_loop(modules, input);
    capi::Py_LeaveRecursiveCall();
    capi::Py_DECREF(modules);
    Some(r)
}

unsafe fn sequential_loop(
    modules: *mut capi::PyObject,
    input: *mut capi::PyObject,
) -> *mut capi::PyObject {
    // `iter(self._modules.values())` with the dict iterator's checks (those
    // of `Items::next`), on borrowed pointers: each module is held only for
    // its own call, as the iterator hands it over.
    let used = crate::cpython::dicts::used(modules);
    let mut pos: capi::Py_ssize_t = 0;
    let mut left = used;
    capi::Py_INCREF(input);
    let mut x = input;
    loop {
        if crate::cpython::dicts::used(modules) != used {
            capi::Py_DECREF(x);
            capi::PyErr_SetString(
                capi::PyExc_RuntimeError,
                c"dictionary changed size during iteration".as_ptr(),
            );
            return std::ptr::null_mut();
        }
        let mut k: *mut capi::PyObject = std::ptr::null_mut();
        let mut v: *mut capi::PyObject = std::ptr::null_mut();
        if used == 0 || capi::PyDict_Next(modules, &mut pos, &mut k, &mut v) == 0 {
            return x;
        }
        if left == 0 {
            capi::Py_DECREF(x);
            capi::PyErr_SetString(
                capi::PyExc_RuntimeError,
                c"dictionary keys changed during iteration".as_ptr(),
            );
            return std::ptr::null_mut();
        }
        left -= 1;
        capi::Py_INCREF(v);
        let r = crate::call::module_call::call_one(v, x);
        capi::Py_DECREF(v);
        capi::Py_DECREF(x);
        if r.is_null() {
            return r;
        }
        x = r;
    }
}
