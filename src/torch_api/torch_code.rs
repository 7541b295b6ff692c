//! torch's own code of `nn.Module`'s methods, for fastmodule's own calls of
//! it: where a method is routed to fastmodule's body
//! (`crate::routes::whole_tree`), an unrouted copy of torch's function kept
//! at routing time; else the function as installed now.
use super::originals::require;
use crate::cpython::capi;
use pyo3::prelude::*;
use std::sync::OnceLock;

/// `(name, unrouted copy)` of each routed method: strong references.
struct Copies(Vec<(String, *mut capi::PyObject)>);
// SAFETY: strong references, used with the GIL held.
unsafe impl Send for Copies {}
unsafe impl Sync for Copies {}
static COPIES: OnceLock<Copies> = OnceLock::new();

/// Keep the unrouted copies (new references) of the routed methods (once).
pub fn keep(copies: Vec<(String, *mut capi::PyObject)>) {
    let _ = COPIES.set(Copies(copies));
}

/// torch's own code for `nn.Module.<name>`: the unrouted copy if the function
/// is routed, else the function itself (as installed now).
pub fn torch_code<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    if let Some(copies) = COPIES.get() {
        if let Some((_, code)) = copies.0.iter().find(|(n, _)| n == name) {
            return Ok(unsafe { Bound::from_borrowed_ptr(py, *code) });
        }
    }
    let g = require(py)?;
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut capi::PyObject) };
    nn_module.getattr("__dict__")?.get_item(name)
}
