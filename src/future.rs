//! `torch.__future__`'s conversion flags, read as torch's code reads them
//! (`torch.__future__.get_<flag>()`), but without a Python frame while the
//! getter installed there is torch's own `return <global>`.
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

pub struct Flag {
    getter: Py<PyAny>,
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
            name: name.unbind(),
            globals: globals.unbind(),
            global,
        })
    }

    /// Is `torch.__future__.get_<flag>` still torch's own getter? (If not,
    /// callers leave the reading to torch's code, which calls it.)
    pub fn is_original(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self
            .globals
            .bind(py)
            .get_item(self.name.bind(py))?
            .is_some_and(|f| f.is(self.getter.bind(py))))
    }

    /// `bool(torch.__future__.get_<flag>())`.
    pub fn get(&self, py: Python<'_>) -> PyResult<bool> {
        let globals = self.globals.bind(py);
        let current = globals.get_item(self.name.bind(py))?;
        if let (Some(cur), Some(global)) = (&current, &self.global) {
            if cur.is(self.getter.bind(py)) {
                if let Some(v) = globals.get_item(global.bind(py))? {
                    return v.is_truthy();
                }
            }
        }
        match current {
            Some(f) => f.call0()?.is_truthy(),
            None => self.getter.bind(py).call0()?.is_truthy(),
        }
    }
}
