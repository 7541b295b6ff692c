//! torch's whole-tree methods (`named_parameters`, `state_dict`,
//! `load_state_dict`, `_apply`, `train`, ...) on `torch.nn.Module` itself,
//! routed to fastmodule's native bodies for fast instances: instances of
//! `fastmodule.Module` subclasses and of classes accelerated in place.
//!
//! The route is a statement in front of torch's code
//! (`fastmodule._verified.inline_routes`), whose check [`route_check`] answers. On
//! CPython 3.11, which calls a Python function called from C through its
//! vectorcall but inlines calls from Python code without it, torch's function
//! objects also get fastmodule's vectorcall entry point ([`routed`], as for the
//! registration functions, see `crate::registry::vectorcalls`): a call with a fast instance made
//! from C runs fastmodule's body without torch's frame; anything else, or any
//! call while a PEP 523 frame evaluator (Dynamo) is installed, runs torch's
//! code. From 3.12 on, a function whose vectorcall is not CPython's own is
//! called as a C function even from Python code (one C stack level per call,
//! `sys.monitoring` C_RETURN/C_RAISE events), which would change how every
//! stock module runs; there torch's functions keep CPython's entry point and
//! only the prefix routes.
use crate::cpython::capi;
use crate::cpython::function_body::Body;
use crate::cpython::private_api::custom_eval_frame;
use crate::instance::fast::is_fast_instance;
use crate::torch_api::originals::{globals, require};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::sync::OnceLock;

struct Route {
    func: *mut capi::PyObject,
    original: capi::vectorcallfunc,
    body: *mut capi::PyObject,
}
struct Routes(Vec<Route>);
// SAFETY: strong references, used with the GIL held.
unsafe impl Send for Routes {}
unsafe impl Sync for Routes {}
static ROUTES: OnceLock<Routes> = OnceLock::new();

/// `torch.compiler`'s module globals and the name of the flag that
/// `torch.compiler.is_compiling()` returns when called eagerly (set while
/// non-strict `torch.export` traces).
static COMPILING: OnceLock<(Py<PyDict>, Py<PyString>)> = OnceLock::new();

/// Is `torch.compiler.is_compiling()` true (eagerly: its flag)? Read without
/// running code: where the module's dict is not one whose lookups by an exact
/// `str` run none, or the flag cannot be read, the answer is "yes" (torch's
/// code then runs, stock by construction).
#[inline(always)]
unsafe fn compiling() -> bool {
    let Some((namespace, name)) = COMPILING.get() else {
        return true;
    };
    if !crate::cpython::quiet::dict(namespace.as_ptr()) {
        return true;
    }
    let flag = capi::PyDict_GetItemWithError(namespace.as_ptr(), name.as_ptr());
    if flag.is_null() {
        if capi::PyErr_Occurred().is_null() {
            return false; // this torch has no such flag
        }
        capi::PyErr_Clear(); // not raised by a quiet lookup; be safe anyway
        return true;
    }
    flag != capi::Py_False()
}

/// torch's `nn.Module` methods whose bodies the whole-tree paths reproduce,
/// as they were once routed (see [`seal`]).
static SEALED: OnceLock<Vec<(String, Body)>> = OnceLock::new();

/// Record the bodies of `nn.Module.<name>` for `names` as they are now (after
/// `fastmodule._verified.inline_routes` put its statement in front of torch's code).
pub fn seal(py: Python<'_>, names: &[String]) -> PyResult<()> {
    let g = require(py)?;
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut capi::PyObject) };
    let nn_dict = nn_module.getattr("__dict__")?;
    let mut bodies = Vec::new();
    for name in names {
        let Ok(f) = nn_dict.get_item(name) else {
            continue;
        };
        // SAFETY: the function is kept alive by the pointer taken here.
        if let Some(b) = unsafe { Body::of(f.into_ptr()) } {
            bodies.push((name.clone(), b));
        }
    }
    let _ = SEALED.set(bodies);
    Ok(())
}

/// Are all those methods still running the code they were routed with? A
/// `__code__` replaced since (hot reload, a test double) is what stock runs at
/// every module, so the whole-tree paths stand aside and torch's code, the
/// replacement included, runs the call.
#[inline(always)]
unsafe fn sealed_intact() -> bool {
    SEALED
        .get()
        .is_none_or(|b| b.iter().all(|(_, b)| b.intact()))
}

/// Is torch's `nn.Module.<name>` (one of those sealed) still running the code
/// it was routed with? True for a name not sealed.
pub fn method_intact(name: &str) -> bool {
    // SAFETY: the GIL is held (called from Python).
    SEALED
        .get()
        .and_then(|b| b.iter().find(|(n, _)| n == name))
        .is_none_or(|(_, b)| unsafe { b.intact() })
}

/// The router's question for a call of torch's method with `slf` first: run
/// fastmodule's body (a fast instance, no PEP 523 frame evaluator installed,
/// not `torch.compiler.is_compiling()`, no trace or profile function set on
/// this thread: debuggers, profilers and coverage see torch's frames, and
/// torch's whole-tree methods as routed)?
#[inline(always)]
unsafe fn to_body(slf: *mut capi::PyObject) -> bool {
    globals().is_some_and(|g| {
        is_fast_instance(g, slf)
            && !custom_eval_frame()
            && !compiling()
            && !crate::cpython::tracer::active()
            && sealed_intact()
    })
}

unsafe extern "C" fn routed(
    callable: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargsf: usize,
    kwnames: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let Some(routes) = ROUTES.get() else {
        return crate::torch_api::errors::not_initialised();
    };
    let Some(route) = routes.0.iter().find(|r| r.func == callable) else {
        return crate::torch_api::errors::not_initialised();
    };
    if capi::PyVectorcall_NARGS(nargsf) >= 1 && to_body(*args) {
        return capi::PyObject_Vectorcall(route.body, args, nargsf, kwnames);
    }
    (route.original)(callable, args, nargsf, kwnames)
}

/// The eager answer of `fastmodule._verified.inline_routes`' check `_fastmodule_route(self)`:
/// [`to_body`]. The Python function it is installed on answers `False`, which
/// is what Dynamo sees when it traces torch's prefixed code.
unsafe extern "C" fn route_check(
    _callable: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargsf: usize,
    kwnames: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let fast = capi::PyVectorcall_NARGS(nargsf) == 1
        && (kwnames.is_null() || capi::PyTuple_GET_SIZE(kwnames) == 0)
        && to_body(*args);
    let out = if fast {
        capi::Py_True()
    } else {
        capi::Py_False()
    };
    capi::Py_IncRef(out);
    out
}

/// Make the Python function `func` answer with [`route_check`] when called
/// eagerly (its own code is what tracers see), and keep `namespace[flag]`
/// equal to "some class is accelerated in place".
pub fn install_check(
    func: &Bound<'_, PyAny>,
    namespace: &Bound<'_, PyDict>,
    flag: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<()> {
    if unsafe { capi::PyFunction_Check(func.as_ptr()) } == 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "install_route_check expects a Python function",
        ));
    }
    unsafe {
        crate::cpython::vectorcall::set_vectorcall(
            func.as_ptr() as *mut capi::PyFunctionObject,
            route_check,
        )
    };
    crate::instance::accelerated::keep_flag(namespace, flag);
    let py = namespace.py();
    let compiler = py.import("torch.compiler")?.dict().unbind();
    let _ = COMPILING.set((
        compiler,
        PyString::intern(py, "_is_compiling_flag").unbind(),
    ));
    crate::instance::accelerated::note_accelerated(py, crate::instance::accelerated::any())
}

/// Record `bodies[name]` for `torch.nn.Module.<name>` and `copies[name]`, the
/// unrouted copy of torch's function (once); on 3.11 route the function's
/// vectorcall to the body for fast instances (see the module documentation).
pub fn install(
    py: Python<'_>,
    bodies: &Bound<'_, PyDict>,
    copies: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let g = require(py)?;
    if ROUTES.get().is_some() {
        return Ok(());
    }
    let nn_module = unsafe { Bound::from_borrowed_ptr(py, g.nn_module as *mut capi::PyObject) };
    let nn_dict = nn_module.getattr("__dict__")?;
    let mut routes = Vec::new();
    let mut copies_taken = Vec::new();
    for (name, body) in bodies.iter() {
        let func = nn_dict.get_item(&name)?;
        if unsafe { capi::PyFunction_Check(func.as_ptr()) } == 0 {
            continue;
        }
        let f = func.as_ptr() as *mut capi::PyFunctionObject;
        let Some(original) = (unsafe { crate::cpython::vectorcall::vectorcall_of(f) }) else {
            return Err(PyRuntimeError::new_err(
                "torch.nn.Module method has no vectorcall",
            ));
        };
        let Some(code) = copies.get_item(&name)? else {
            continue;
        };
        copies_taken.push((name.extract::<String>()?, code.into_ptr()));
        routes.push(Route {
            func: func.into_ptr(),
            original,
            body: body.into_ptr(),
        });
    }
    let funcs: Vec<*mut capi::PyObject> = routes.iter().map(|r| r.func).collect();
    let _ = ROUTES.set(Routes(routes));
    crate::torch_api::torch_code::keep(copies_taken);
    if crate::cpython::vectorcall::VECTORCALL_INLINED {
        for f in funcs {
            unsafe {
                crate::cpython::vectorcall::set_vectorcall(f as *mut capi::PyFunctionObject, routed)
            };
        }
    }
    Ok(())
}
