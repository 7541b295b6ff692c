//! `apply(fn)`: `fn` on every module, children first, following each
//! child's own `apply` where its class overrides it.
use super::children::for_each_child;
use crate::cpython::recursion::{Depth, Recursion};
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;

pub(crate) fn apply_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    f: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Python)?;
    for_each_child(py, g, module, |child| {
        if is_native(g, child, Method::Apply) {
            apply_body(py, g, child, f)?;
        } else {
            call_method(child, Method::Apply, (f,))?;
        }
        Ok(())
    })?;
    f.call1((module,))?;
    Ok(module.clone())
}
