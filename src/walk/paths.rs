//! Dotted-path access: `get_submodule`, `set_submodule`, `get_parameter`,
//! `get_buffer`.
//!
//! Each body follows torch's Python step by step: the same `hasattr` then
//! `getattr` on every atom (attribute reads can run user code, so neither is
//! merged), the same `isinstance` checks, the same messages, and
//! `self.get_submodule(...)` dispatched to an override where torch would call
//! one. A target that is not an exact `str` (whose `split` could be anything)
//! is handed to torch's own function.
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::instance::attributes::exact_str;
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::torch_api::originals::Globals;
use pyo3::call::PyCallArgs;
use pyo3::exceptions::{PyAttributeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PyString};

fn nn_module<'py>(py: Python<'py>, g: &Globals) -> Bound<'py, PyAny> {
    unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut capi::PyObject) }
}

fn parameter<'py>(py: Python<'py>, g: &Globals) -> Bound<'py, PyAny> {
    unsafe { Bound::from_borrowed_ptr(py, g.parameter as *mut capi::PyObject) }
}

/// torch's own `nn.Module.<m>(*args)`.
fn torch_own<'py, A: PyCallArgs<'py>>(
    py: Python<'py>,
    m: Method,
    args: A,
) -> PyResult<Bound<'py, PyAny>> {
    crate::torch_api::torch_code::torch_code(py, m.name())?.call1(args)
}

/// `hasattr(obj, name)`.
fn hasattr(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> PyResult<bool> {
    obj.hasattr(name)
}

/// `AttributeError(mod._get_name() + " has no attribute `" + name + "`")`.
fn no_attribute(module: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>) -> PyErr {
    let py = module.py();
    let msg = (|| -> PyResult<Bound<'_, PyAny>> {
        module
            .call_method0(intern!(py, "_get_name"))?
            .add(" has no attribute `")?
            .add(name)?
            .add("`")
    })();
    match msg {
        Ok(m) => PyAttributeError::new_err(m.unbind()),
        Err(e) => e,
    }
}

/// `AttributeError("`" + name + "` is not " + what)`.
fn not_a(name: &Bound<'_, PyAny>, what: &str) -> PyErr {
    let py = name.py();
    let msg = (|| -> PyResult<Bound<'_, PyAny>> {
        PyString::new(py, "`")
            .into_any()
            .add(name)?
            .add(format!("` is not {what}"))
    })();
    match msg {
        Ok(m) => PyAttributeError::new_err(m.unbind()),
        Err(e) => e,
    }
}

/// torch's `get_submodule` body for `module`.
pub fn get_submodule<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    target: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if !exact_str(target) {
        return torch_own(py, Method::GetSubmodule, (module, target));
    }
    let target = target.cast::<PyString>()?;
    if target.len()? == 0 {
        return Ok(module.clone());
    }
    let nn = nn_module(py, g);
    let mut m = module.clone();
    for item in target
        .call_method1(intern!(py, "split"), (".",))?
        .try_iter()?
    {
        // `str.split` of an exact str gives exact strs.
        let item = item?.cast_into::<PyString>()?;
        if !hasattr(&m, &item)? {
            return Err(no_attribute(&m, &item));
        }
        m = m.getattr(&item)?;
        if !m.is_instance(&nn)? {
            return Err(not_a(&item, "an nn.Module"));
        }
    }
    Ok(m)
}

/// `self.get_submodule(path)` as torch's code calls it.
fn dispatch_get_submodule<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    path: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::GetSubmodule) {
        get_submodule(py, g, module, path)
    } else {
        call_method(module, Method::GetSubmodule, (path,))
    }
}

/// torch's `set_submodule` body for `module`.
pub fn set_submodule<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    target: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    strict: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if !exact_str(target) {
        return torch_own(py, Method::SetSubmodule, (module, target, value, strict));
    }
    let target = target.cast::<PyString>()?;
    if target.len()? == 0 {
        return Err(PyValueError::new_err(
            "Cannot set the submodule without a target name!",
        ));
    }
    let atoms = target.call_method1(intern!(py, "split"), (".",))?;
    let nn = nn_module(py, g);
    if !value.is_instance(&nn)? {
        let msg = PyString::new(py, "`module` is not an nn.Module, found ")
            .into_any()
            .add(value.get_type().str()?)?;
        return Err(PyValueError::new_err(msg.unbind()));
    }
    let n = atoms.len()?;
    let parent = if n == 1 {
        module.clone()
    } else {
        let parent_key = PyString::new(py, ".").call_method1(
            intern!(py, "join"),
            (atoms.get_item(PySlice::new(py, 0, n as isize - 1, 1))?,),
        )?;
        dispatch_get_submodule(py, g, module, &parent_key)?
    };
    let last = atoms.get_item(n - 1)?.cast_into::<PyString>()?;
    if strict.is_truthy()? && !hasattr(&parent, &last)? {
        return Err(no_attribute(&parent, &last));
    }
    if hasattr(&parent, &last)? {
        let current = parent.getattr(&last)?;
        if !current.is_instance(&nn)? {
            return Err(not_a(&last, "an nn.Module"));
        }
    }
    parent.setattr(&last, value)?;
    Ok(py.None().into_bound(py))
}

/// torch's `get_parameter` (`buffer == false`) or `get_buffer` body.
pub fn get_member<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    target: &Bound<'py, PyAny>,
    buffer: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let which = if buffer {
        Method::GetBuffer
    } else {
        Method::GetParameter
    };
    if !exact_str(target) {
        return torch_own(py, which, (module, target));
    }
    let parts = target.call_method1(intern!(py, "rpartition"), (".",))?;
    let (path, name) = (
        parts.get_item(0)?,
        parts.get_item(2)?.cast_into::<PyString>()?,
    );
    let m = dispatch_get_submodule(py, g, module, &path)?;
    if !hasattr(&m, &name)? {
        return Err(no_attribute(&m, &name));
    }
    let value = m.getattr(&name)?;
    if buffer {
        if !m.getattr(intern!(py, "_buffers"))?.contains(&name)? {
            return Err(not_a(&name, "a buffer"));
        }
    } else if !value.is_instance(&parameter(py, g))? {
        return Err(not_a(&name, "an nn.Parameter"));
    }
    Ok(value)
}
