//! torch's runtime state that the native `_apply` and `load_state_dict`
//! consult: grad mode, active torch-function/dispatch modes, and
//! `torch.__future__`'s conversion flags (read as torch's code reads them,
//! `torch.__future__.get_<flag>()`, but without a Python frame while the
//! getter installed there is torch's own `return <global>`).
use crate::cpython::capi;
use crate::cpython::interned::intern;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use std::sync::OnceLock;

pub struct Runtime {
    is_grad_enabled: Py<PyAny>,
    set_grad_enabled: Py<PyAny>,
    function_mode: Py<PyAny>,
    dispatch_depth: Py<PyAny>,
    pub swap: Flag,
    pub overwrite: Flag,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// `config`: see `fastmodule._methods.runtime`.
pub fn init(config: &Bound<'_, PyDict>) -> PyResult<()> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        config
            .get_item(k)?
            .ok_or_else(|| PyRuntimeError::new_err(format!("fastmodule: runtime lacks {k}")))
    };
    let r = Runtime {
        is_grad_enabled: get("is_grad_enabled")?.unbind(),
        set_grad_enabled: get("set_grad_enabled")?.unbind(),
        function_mode: get("function_mode")?.unbind(),
        dispatch_depth: get("dispatch_depth")?.unbind(),
        swap: Flag::from_getter(&get("swap_flag")?)?,
        overwrite: Flag::from_getter(&get("overwrite_flag")?)?,
    };
    let _ = RUNTIME.set(r);
    Ok(())
}

pub fn get() -> PyResult<&'static Runtime> {
    RUNTIME
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("fastmodule: runtime not initialised"))
}

impl Runtime {
    /// Is a torch-function mode or a dispatch mode active? (They observe
    /// every tensor operation, so only torch's exact code may run.)
    pub fn modes_active(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.function_mode.bind(py).call0()?.is_truthy()?
            || self.dispatch_depth.bind(py).call0()?.extract::<i64>()? != 0)
    }

    /// `torch.is_grad_enabled()`, then `torch.set_grad_enabled(False)`: the
    /// mode to give back with [`Runtime::set_grad`].
    pub fn enter_no_grad<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let prev = self.is_grad_enabled.bind(py).call0()?;
        self.set_grad_enabled.bind(py).call1((false,))?;
        Ok(prev)
    }

    /// `torch.set_grad_enabled(mode)`.
    pub fn set_grad(&self, mode: &Bound<'_, PyAny>) -> PyResult<()> {
        self.set_grad_enabled
            .bind(mode.py())
            .call1((mode,))
            .map(drop)
    }

    /// `with torch.no_grad(): f()`.
    pub fn no_grad<R>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        let prev = self.is_grad_enabled.bind(py).call0()?;
        self.set_grad_enabled.bind(py).call1((false,))?;
        let r = f();
        self.set_grad_enabled.bind(py).call1((prev,))?;
        r
    }
}

pub struct Flag {
    getter: Py<PyAny>,
    /// The getter's code as torch defines it: a getter whose `__code__` was
    /// replaced is called, not read around.
    code: Py<PyAny>,
    /// `torch.__future__`, where torch's code looks the getter up.
    module: Py<PyAny>,
    name: Py<PyString>,
    /// `torch.__future__.__dict__`.
    globals: Py<PyDict>,
    /// The global the getter returns, when its code is just that.
    global: Option<Py<PyString>>,
}

impl Flag {
    pub fn from_getter(getter: &Bound<'_, PyAny>) -> PyResult<Flag> {
        let py = getter.py();
        let globals = getter
            .getattr(intern!(py, "__globals__"))?
            .cast_into::<PyDict>()
            .map_err(|_| PyRuntimeError::new_err("fastmodule: unexpected torch.__future__"))?;
        let name = getter
            .getattr(intern!(py, "__name__"))?
            .cast_into::<PyString>()
            .map_err(|_| PyRuntimeError::new_err("fastmodule: unexpected torch.__future__"))?;
        let code = getter.getattr(intern!(py, "__code__"))?;
        let module = py.import(intern!(py, "torch.__future__"))?.into_any();
        let names = code
            .getattr(intern!(py, "co_names"))?
            .cast_into::<PyTuple>()?;
        let argc: usize = code.getattr(intern!(py, "co_argcount"))?.extract()?;
        let global = if names.len() == 1 && argc == 0 {
            Some(names.get_item(0)?.cast_into::<PyString>()?.unbind())
        } else {
            None
        };
        Ok(Flag {
            getter: getter.clone().unbind(),
            code: code.unbind(),
            module: module.unbind(),
            name: name.unbind(),
            globals: globals.unbind(),
            global,
        })
    }

    /// Is `torch.__future__.get_<flag>` still torch's own getter, with its
    /// own code? (If not, callers leave the reading to torch's code, which
    /// calls it.)
    pub fn is_original(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self
            .globals
            .bind(py)
            .get_item(self.name.bind(py))?
            .is_some_and(|f| self.own(&f)))
    }

    /// `f` is torch's getter with its code.
    fn own(&self, f: &Bound<'_, PyAny>) -> bool {
        let py = f.py();
        // SAFETY: `f` is torch's getter, a Python function.
        f.is(self.getter.bind(py))
            && unsafe { capi::PyFunction_GetCode(f.as_ptr()) } == self.code.as_ptr()
    }

    /// The flag read without a call, while the getter installed is torch's
    /// own `return <global>` (reading the global is then exactly what
    /// calling it returns, and calling it runs nothing else): Some(truth).
    /// None: the getter must be called, where torch's code calls it.
    pub fn peek(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        let Some(global) = &self.global else {
            return Ok(None);
        };
        let globals = self.globals.as_ptr();
        // SAFETY: with the GIL; `globals` is a dict held by `self`, both keys
        // are str. Borrowed results are used before anything else runs (a
        // colliding key's `__eq__` may run inside a lookup, as in the
        // getter's own `LOAD_GLOBAL`), and the value is held for its test.
        unsafe {
            let f = capi::PyDict_GetItemWithError(globals, self.name.as_ptr());
            if f != self.getter.as_ptr() || capi::PyFunction_GetCode(f) != self.code.as_ptr() {
                return match PyErr::take(py) {
                    Some(e) => Err(e),
                    None => Ok(None),
                };
            }
            let v = capi::PyDict_GetItemWithError(globals, global.as_ptr());
            if v.is_null() {
                // The getter would raise its NameError: let it.
                return match PyErr::take(py) {
                    Some(e) => Err(e),
                    None => Ok(None),
                };
            }
            if v == capi::Py_True() || v == capi::Py_False() {
                return Ok(Some(v == capi::Py_True()));
            }
            Ok(Some(Bound::from_borrowed_ptr(py, v).is_truthy()?))
        }
    }

    /// `torch.__future__.get_<flag>()`'s truth, read as torch's code reads
    /// it, at the moment the caller reproduces that read: the global while
    /// the getter is torch's own (`peek`), else whatever
    /// `torch.__future__.get_<flag>` is now, called once.
    pub fn get(&self, py: Python<'_>) -> PyResult<bool> {
        if let Some(v) = self.peek(py)? {
            return Ok(v);
        }
        self.module
            .bind(py)
            .getattr(self.name.bind(py))?
            .call0()?
            .is_truthy()
    }
}
