//! torch's container protocol methods — `ModuleList`/`Sequential`
//! `__iter__`/`__len__`, `ModuleDict` `__iter__`/`__len__`/`keys`/`values`/
//! `items` — natively for fast instances.
//!
//! Each is a one-line view of `self._modules`; CPython reaches them from C
//! slots (`for layer in self.layers`, `len(...)`) or method calls, through
//! the function's vectorcall, which is replaced here (as for torch's other
//! functions, see `crate::registry::vectorcalls`). The bodies were checked at import
//! (`fastmodule._verified.layers`) to read exactly these names; a call that is not
//! `f(self)` on a fast instance whose `_modules` is a plain dict, or a call
//! after the function's `__code__` or defaults were replaced, runs the
//! function's own code.
use crate::cpython::capi;
use crate::cpython::function_body::Body as FunctionBody;
use crate::cpython::Owned;
use crate::instance::attributes::{instance_dict, plain_attr, Plain};
use crate::instance::fast::is_fast_instance;
use crate::torch_api::originals::globals;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::OnceLock;

#[derive(Clone, Copy)]
enum Body {
    /// `iter(self._modules.values())`
    IterValues,
    /// `iter(self._modules)`
    IterKeys,
    /// `len(self._modules)`
    Len,
    /// `self._modules.<view>()`
    View(&'static std::ffi::CStr),
}

struct Entry {
    func: *mut capi::PyObject,
    original: capi::vectorcallfunc,
    body: Body,
    /// torch's code and defaults, as verified: once replaced, the function's
    /// own entry point runs the code it has now.
    verified: FunctionBody,
}
struct Entries(Vec<Entry>);
// SAFETY: strong references, used with the GIL held.
unsafe impl Send for Entries {}
unsafe impl Sync for Entries {}
static ENTRIES: OnceLock<Entries> = OnceLock::new();
static MODULES: OnceLock<usize> = OnceLock::new();

/// What the bodies' `iter(...)`/`len(...)` find: the container module's
/// globals (which must not shadow them) and the builtins dict (which must
/// hold the builtins themselves).
struct Builtins {
    globals: *mut capi::PyObject,
    builtins: *mut capi::PyObject,
    names: [*mut capi::PyObject; 2],
    want: [*mut capi::PyObject; 2],
}
// SAFETY: strong references kept for the process, read with the GIL held.
unsafe impl Send for Builtins {}
unsafe impl Sync for Builtins {}
static BUILTINS: OnceLock<Builtins> = OnceLock::new();
static BUILTINS_CHECKED: crate::cpython::validity::Checked<2> =
    crate::cpython::validity::Checked::new();

/// Do `iter` and `len`, read as the container methods' code reads them
/// (module globals, then builtins), still find Python's own? A module global
/// of either name (a counting wrapper) is what stock calls: the methods, and
/// `Sequential.forward` iterating `self`, then run torch's code. Runs no code.
#[inline(always)]
pub fn builtins_intact() -> bool {
    let Some(b) = BUILTINS.get() else {
        return false;
    };
    // SAFETY: exact dicts held for the process; the GIL is held.
    unsafe {
        BUILTINS_CHECKED.pass([b.globals, b.builtins], || {
            b.names.iter().zip(b.want.iter()).all(|(&name, &want)| {
                crate::cpython::quiet::dict(b.globals)
                    && capi::PyDict_Contains(b.globals, name) == 0
                    && crate::cpython::quiet::dict(b.builtins)
                    && capi::PyDict_GetItemWithError(b.builtins, name) == want
            })
        })
    }
}

unsafe fn run(body: Body, d: *mut capi::PyObject) -> *mut capi::PyObject {
    match body {
        Body::IterKeys => capi::PyObject_GetIter(d),
        Body::Len => capi::PyLong_FromSsize_t(capi::PyDict_Size(d)),
        Body::IterValues => {
            let v = capi::PyObject_CallMethod(d, c"values".as_ptr(), std::ptr::null());
            if v.is_null() {
                return v;
            }
            let it = capi::PyObject_GetIter(v);
            capi::Py_DECREF(v);
            it
        }
        Body::View(name) => capi::PyObject_CallMethod(d, name.as_ptr(), std::ptr::null()),
    }
}

unsafe extern "C" fn served(
    callable: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargsf: usize,
    kwnames: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let (Some(entries), Some(&modules)) = (ENTRIES.get(), MODULES.get()) else {
        return crate::torch_api::errors::not_initialised();
    };
    let Some(e) = entries.0.iter().find(|e| e.func == callable) else {
        return crate::torch_api::errors::not_initialised();
    };
    let nargs = capi::PyVectorcall_NARGS(nargsf);
    let no_kw = kwnames.is_null() || capi::PyTuple_GET_SIZE(kwnames) == 0;
    if let Some(g) = globals() {
        if nargs == 1
            && no_kw
            && e.verified.intact()
            && builtins_intact()
            && is_fast_instance(g, *args)
            && !crate::cpython::tracer::active()
        {
            let slf = *args;
            let name = modules as *mut capi::PyObject;
            match plain_attr(capi::Py_TYPE(slf), instance_dict(slf), name) {
                Plain::Found(d) if capi::PyDict_CheckExact(d) != 0 => {
                    // Held while the body allocates (on 3.11 a collection
                    // may then run a finalizer that drops it from the module).
                    let d = Owned::new_ref(d);
                    return run(e.body, d.as_ptr());
                }
                Plain::Error => return std::ptr::null_mut(),
                _ => {}
            }
        }
    }
    (e.original)(callable, args, nargsf, kwnames)
}

/// Remember where torch's container code (`f`, one of its functions) finds
/// `iter` and `len` (once).
pub fn init_builtins(py: Python<'_>, f: &Bound<'_, PyAny>) -> PyResult<()> {
    if BUILTINS.get().is_some() {
        return Ok(());
    }
    let builtins = py.import("builtins")?;
    let get = |n: &str| -> PyResult<*mut capi::PyObject> { Ok(builtins.getattr(n)?.into_ptr()) };
    let _ = BUILTINS.set(Builtins {
        globals: f.getattr("__globals__")?.into_ptr(),
        builtins: f.getattr("__builtins__")?.into_ptr(),
        names: [
            pyo3::types::PyString::intern(py, "iter").into_ptr(),
            pyo3::types::PyString::intern(py, "len").into_ptr(),
        ],
        want: [get("iter")?, get("len")?],
    });
    Ok(())
}

/// `config`: `{"name": function}` for the names below (see `fastmodule._verified.layers`).
pub fn init(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<()> {
    if ENTRIES.get().is_some() {
        return Ok(());
    }
    let bodies: [(&str, Body); 9] = [
        ("ModuleList.__iter__", Body::IterValues),
        ("Sequential.__iter__", Body::IterValues),
        ("ModuleDict.__iter__", Body::IterKeys),
        ("ModuleList.__len__", Body::Len),
        ("Sequential.__len__", Body::Len),
        ("ModuleDict.__len__", Body::Len),
        ("ModuleDict.keys", Body::View(c"keys")),
        ("ModuleDict.values", Body::View(c"values")),
        ("ModuleDict.items", Body::View(c"items")),
    ];
    let mut entries = Vec::new();
    for (name, body) in bodies {
        let Some(f) = config.get_item(name)? else {
            continue;
        };
        if unsafe { capi::PyFunction_Check(f.as_ptr()) } == 0 {
            continue;
        }
        let func = f.as_ptr() as *mut capi::PyFunctionObject;
        let Some(original) = (unsafe { crate::cpython::vectorcall::vectorcall_of(func) }) else {
            return Err(PyRuntimeError::new_err(
                "torch container method has no vectorcall",
            ));
        };
        let func = f.into_ptr();
        // SAFETY: a Python function (checked above), held for the process.
        let Some(verified) = (unsafe { FunctionBody::of(func) }) else {
            continue;
        };
        entries.push(Entry {
            func,
            original,
            body,
            verified,
        });
    }
    let _ = MODULES.set(pyo3::types::PyString::intern(py, "_modules").into_ptr() as usize);
    if let Some(f) = config.get_item("Sequential.__iter__")? {
        init_builtins(py, &f)?;
    }
    let funcs: Vec<*mut capi::PyObject> = entries.iter().map(|e| e.func).collect();
    let _ = ENTRIES.set(Entries(entries));
    for f in funcs {
        unsafe {
            crate::cpython::vectorcall::set_vectorcall(f as *mut capi::PyFunctionObject, served)
        };
    }
    Ok(())
}
