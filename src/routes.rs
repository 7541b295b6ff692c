//! torch's whole-tree methods (`named_parameters`, `state_dict`,
//! `load_state_dict`, `_apply`, `train`, ...) on `torch.nn.Module` itself,
//! routed to fastmodule's native bodies for fast instances: instances of
//! `fastmodule.Module` subclasses and of classes accelerated in place.
//!
//! As for the registration functions (see `methods`), torch's function
//! objects stay where they are; only their vectorcall entry point changes.
//! A call with a fast instance first runs fastmodule's body (the same one
//! `fastmodule.Module`'s method runs, with torch's signature); anything else,
//! or any call while a PEP 523 frame evaluator (Dynamo) is installed, runs
//! torch's code. CPython 3.11 inlines Python-to-Python calls without the
//! vectorcall, so there only calls made from C (native walks, C extensions)
//! are routed; from 3.12 on, every call is.
use crate::ffi_ext::custom_eval_frame;
use crate::register::is_fast_instance;
use crate::state::{globals, require};
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::OnceLock;

struct Route {
    func: *mut ffi::PyObject,
    original: ffi::vectorcallfunc,
    body: *mut ffi::PyObject,
    name: String,
    /// A copy of torch's function that is not routed: torch's code, for
    /// fastmodule's own calls of it.
    code: *mut ffi::PyObject,
}
struct Routes(Vec<Route>);
// SAFETY: strong references, used with the GIL held.
unsafe impl Send for Routes {}
unsafe impl Sync for Routes {}
static ROUTES: OnceLock<Routes> = OnceLock::new();

unsafe extern "C" fn routed(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let Some(routes) = ROUTES.get() else {
        return crate::errors::not_initialised();
    };
    let Some(route) = routes.0.iter().find(|r| r.func == callable) else {
        return crate::errors::not_initialised();
    };
    let nargs = ffi::PyVectorcall_NARGS(nargsf) as usize;
    if let Some(g) = globals() {
        if nargs >= 1 && !custom_eval_frame() && is_fast_instance(g, *args) {
            return ffi::PyObject_Vectorcall(route.body, args, nargsf, kwnames);
        }
    }
    (route.original)(callable, args, nargsf, kwnames)
}

/// torch's own code for `nn.Module.<name>`: the unrouted copy if the function
/// is routed, else the function itself (as installed now).
pub fn torch_code<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    if let Some(routes) = ROUTES.get() {
        if let Some(r) = routes.0.iter().find(|r| r.name == name) {
            return Ok(unsafe { Bound::from_borrowed_ptr(py, r.code) });
        }
    }
    let g = require(py)?;
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut ffi::PyObject) };
    nn_module.getattr("__dict__")?.get_item(name)
}

/// Route `torch.nn.Module.<name>` to `bodies[name]` for fast instances (once);
/// `copies[name]` is the unrouted copy of torch's function.
pub fn install(
    py: Python<'_>,
    bodies: &Bound<'_, PyDict>,
    copies: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let g = require(py)?;
    if ROUTES.get().is_some() {
        return Ok(());
    }
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut ffi::PyObject) };
    let nn_dict = nn_module.getattr("__dict__")?;
    let mut routes = Vec::new();
    for (name, body) in bodies.iter() {
        let func = nn_dict.get_item(&name)?;
        if unsafe { ffi::PyFunction_Check(func.as_ptr()) } == 0 {
            continue;
        }
        let f = func.as_ptr() as *mut ffi::PyFunctionObject;
        let Some(original) = (unsafe { (*f).vectorcall }) else {
            return Err(PyRuntimeError::new_err(
                "torch.nn.Module method has no vectorcall",
            ));
        };
        let Some(code) = copies.get_item(&name)? else {
            continue;
        };
        routes.push(Route {
            func: func.into_ptr(),
            original,
            body: body.into_ptr(),
            name: name.extract()?,
            code: code.into_ptr(),
        });
    }
    let funcs: Vec<*mut ffi::PyObject> = routes.iter().map(|r| r.func).collect();
    let _ = ROUTES.set(Routes(routes));
    for f in funcs {
        unsafe { crate::methods::set_vectorcall(f as *mut ffi::PyFunctionObject, routed) };
    }
    Ok(())
}
