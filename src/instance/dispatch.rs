//! Which code a module runs for each of torch's methods the walks follow
//! (`named_modules`, `train`, `state_dict`, ...): torch's original, run
//! natively, while the module's class resolves the method to it (or to
//! fastmodule's wrapper of it, with torch's entry unpatched) and no instance
//! attribute shadows it; otherwise the module's own method, called through
//! Python exactly where torch's code would call it.
use super::attributes::instance_dict;
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::type_cache::type_lookup;
use crate::torch_api::originals::{require, Globals};
use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::sync::OnceLock;

/// The methods whose dispatch the walks follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    NamedModules,
    NamedChildren,
    Children,
    Modules,
    NamedMembers,
    NamedParameters,
    Parameters,
    NamedBuffers,
    Buffers,
    Train,
    Eval,
    RequiresGrad,
    ZeroGrad,
    Apply,
    /// `_apply(fn, recurse)`: what `.to()`, `.float()`, `.cuda()`, ... run.
    ApplyFn,
    GetSubmodule,
    SetSubmodule,
    GetParameter,
    GetBuffer,
    StateDict,
    /// Not wrapped: only its original is compared against.
    SaveToStateDict,
    GetExtraState,
}

pub const METHODS: [Method; 22] = [
    Method::NamedModules,
    Method::NamedChildren,
    Method::Children,
    Method::Modules,
    Method::NamedMembers,
    Method::NamedParameters,
    Method::Parameters,
    Method::NamedBuffers,
    Method::Buffers,
    Method::Train,
    Method::Eval,
    Method::RequiresGrad,
    Method::ZeroGrad,
    Method::Apply,
    Method::ApplyFn,
    Method::GetSubmodule,
    Method::SetSubmodule,
    Method::GetParameter,
    Method::GetBuffer,
    Method::StateDict,
    Method::SaveToStateDict,
    Method::GetExtraState,
];

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::NamedModules => "named_modules",
            Method::NamedChildren => "named_children",
            Method::Children => "children",
            Method::Modules => "modules",
            Method::NamedMembers => "_named_members",
            Method::NamedParameters => "named_parameters",
            Method::Parameters => "parameters",
            Method::NamedBuffers => "named_buffers",
            Method::Buffers => "buffers",
            Method::Train => "train",
            Method::Eval => "eval",
            Method::RequiresGrad => "requires_grad_",
            Method::ZeroGrad => "zero_grad",
            Method::Apply => "apply",
            Method::ApplyFn => "_apply",
            Method::GetSubmodule => "get_submodule",
            Method::SetSubmodule => "set_submodule",
            Method::GetParameter => "get_parameter",
            Method::GetBuffer => "get_buffer",
            Method::StateDict => "state_dict",
            Method::SaveToStateDict => "_save_to_state_dict",
            Method::GetExtraState => "get_extra_state",
        }
    }
}

/// torch's function, fastmodule's wrapper (if any) and the interned name.
struct Entry {
    name: *mut capi::PyObject,
    orig: *mut capi::PyObject,
    wrapper: *mut capi::PyObject,
}
struct Table([Entry; 22]);
// SAFETY: strong references, read with the GIL held.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}
static TABLE: OnceLock<Table> = OnceLock::new();

/// Capture torch's methods and fastmodule's wrappers (by name on `fast_module`).
pub fn init(py: Python<'_>, fast_module: &Bound<'_, PyAny>) -> PyResult<()> {
    let g = require(py)?;
    if TABLE.get().is_some() {
        return Ok(());
    }
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut capi::PyObject) };
    let nn_dict = nn_module.getattr(intern!(py, "__dict__"))?;
    let fast_dict = fast_module.getattr(intern!(py, "__dict__"))?;
    let mut entries = Vec::with_capacity(METHODS.len());
    for m in METHODS {
        let orig = nn_dict.get_item(m.name())?;
        let wrapper = fast_dict.get_item(m.name()).ok();
        entries.push(Entry {
            name: PyString::intern(py, m.name()).into_ptr(),
            orig: orig.into_ptr(),
            wrapper: wrapper.map_or(std::ptr::null_mut(), |w| w.into_ptr()),
        });
    }
    let arr: [Entry; 22] = entries
        .try_into()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("fastmodule: method table size"))?;
    let _ = TABLE.set(Table(arr));
    Ok(())
}

fn entry(m: Method) -> Option<&'static Entry> {
    TABLE.get().map(|t| &t.0[m as usize])
}

/// torch's own `nn.Module.<m>` as captured at import (borrowed).
pub fn original(m: Method) -> Option<*mut capi::PyObject> {
    entry(m).map(|e| e.orig)
}

/// Does `obj.<m>` resolve to torch's own method (directly, or through
/// fastmodule's wrapper while torch's entry is unpatched)?
pub fn is_native(g: &Globals, obj: &Bound<'_, PyAny>, m: Method) -> bool {
    let Some(e) = entry(m) else { return false };
    unsafe {
        let tp = capi::Py_TYPE(obj.as_ptr());
        // The native bodies read the instance dict where torch's code reads
        // through the class's `__getattribute__`.
        if !super::fast::plain_getattribute(g, tp) {
            return false;
        }
        let d = instance_dict(obj.as_ptr());
        if !d.is_null() && super::walk_facts::known_native(tp, d, m as u32) {
            return true;
        }
        let found = type_lookup(tp, e.name);
        let ok = found == e.orig
            || (!e.wrapper.is_null()
                && found == e.wrapper
                && type_lookup(g.nn_module, e.name) == e.orig);
        if !ok {
            return false;
        }
        // An instance attribute of that name would shadow the method.
        if d.is_null() {
            return true;
        }
        // A lookup in a dict whose keys compare with `__eq__` runs code (and
        // may fail): then the caller calls the method through Python, whose
        // attribute lookup is torch's own, made once, as torch makes it.
        if !crate::cpython::quiet::dict(d) {
            return false;
        }
        let version = crate::cpython::validity::dict_version(d);
        if capi::PyDict_Contains(d, e.name) != 0 {
            return false;
        }
        super::walk_facts::note_native(tp, d, m as u32, version);
        true
    }
}

/// `obj.<m>(*args)` through Python, as torch's code would call it.
pub(crate) fn call_method<'py, A: PyCallArgs<'py>>(
    obj: &Bound<'py, PyAny>,
    m: Method,
    args: A,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    match entry(m) {
        // The table's interned name: no string built per call.
        Some(e) => {
            let name =
                unsafe { Bound::from_borrowed_ptr(py, e.name).cast_into_unchecked::<PyString>() };
            obj.call_method1(name, args)
        }
        None => obj.call_method1(PyString::intern(py, m.name()), args),
    }
}

/// `torch.nn.Module.<m>` as currently installed (for the wrappers' fallback).
pub fn torch_method<'py>(py: Python<'py>, m: Method) -> PyResult<Bound<'py, PyAny>> {
    crate::torch_api::torch_code::torch_code(py, m.name())
}
