//! `named_children` and `children` as native iterators, and the helpers the
//! eager walks use to follow torch's dispatch through them
//! (`for child in self.children()`, `for p in self.parameters()`), natively
//! while the module's methods are torch's and through Python otherwise.
use super::named_members::NamedMembers;
use super::named_modules::NamedModules;
use super::yielded::pair;
use crate::cpython::interned::intern;
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::instance::registries::{Items, Memo};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyIterator, PyString};
use pyo3::{PyTraverseError, PyVisit};

/// Native `named_children()` generator.
#[pyclass(module = "fastmodule._core")]
pub struct NamedChildren {
    values: bool,
    items: Option<Items>,
    module: Option<Py<PyAny>>,
    memo: Memo,
}

impl NamedChildren {
    pub fn new(module: &Bound<'_, PyAny>, values: bool) -> PyResult<Self> {
        Ok(NamedChildren {
            values,
            items: None,
            module: Some(module.clone().unbind()),
            memo: Memo::new(),
        })
    }

    pub fn step<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some(m) = self.module.take() {
            // The generator body starts on the first next(): read _modules now.
            self.items = Some(Items::of(m.bind(py), intern!(py, "_modules"))?);
        }
        let Some(it) = &mut self.items else {
            return Ok(None);
        };
        while let Some((name, child)) = it.next(py)? {
            if child.is_none() || self.memo.seen_or_add(&child, true)? {
                continue;
            }
            return Ok(Some(pair(py, self.values, name, child)?));
        }
        Ok(None)
    }
}

#[pymethods]
impl NamedChildren {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let r = self.step(py);
        if !matches!(r, Ok(Some(_))) {
            self.items = None;
            self.module = None;
        }
        r
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.memo.traverse(&visit)?;
        if let Some(i) = &self.items {
            i.traverse(&visit)?;
        }
        if let Some(m) = &self.module {
            visit.call(m)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.items = None;
        self.module = None;
        self.memo.clear();
    }
}

/// Yields the second item of each pair of another iterator (`children()`
/// over an overriding `named_children`, and the like).
#[pyclass(module = "fastmodule._core")]
pub struct Values {
    inner: Option<Py<PyIterator>>,
}

#[pymethods]
impl Values {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(it) = &self.inner else {
            return Ok(None);
        };
        let mut it = it.bind(py).clone();
        match it.next() {
            Some(v) => {
                let (_, m): (Bound<'py, PyAny>, Bound<'py, PyAny>) = v?.extract()?;
                Ok(Some(m))
            }
            None => {
                self.inner = None;
                match PyErr::take(py) {
                    Some(e) => Err(e),
                    None => Ok(None),
                }
            }
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(i) = &self.inner {
            visit.call(i)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.inner = None;
    }
}

pub(crate) fn values_of<'py>(
    py: Python<'py>,
    it: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(Bound::new(
        py,
        Values {
            inner: Some(it.try_iter()?.unbind()),
        },
    )?
    .into_any())
}

/// Bodies of torch's methods, each with `self` already dispatched to it.
/// They call other methods of `self` and of children through `dispatch`.
pub mod body {
    use super::*;

    pub fn named_modules<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        memo: Option<Bound<'py, PyAny>>,
        prefix: &Bound<'py, PyAny>,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(
            py,
            NamedModules::new(py, module, memo, prefix, remove_duplicate, values, 0)?,
        )?
        .into_any())
    }

    pub fn named_children<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(py, NamedChildren::new(module, values)?)?.into_any())
    }

    /// `_named_members(lambda m: m.<registry>.items(), prefix, recurse, remove_duplicate)`.
    pub fn named_members<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        registry: &'static str,
        prefix: &Bound<'py, PyAny>,
        recurse: &Bound<'py, PyAny>,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = recurse.is_truthy()?;
        Ok(Bound::new(
            py,
            NamedMembers::new(py, module, registry, prefix, r, remove_duplicate, values)?,
        )?
        .into_any())
    }
}

/// torch's `children` body: `for _, m in self.named_children(): yield m`.
pub(crate) fn children_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::NamedChildren) {
        return body::named_children(py, module, true);
    }
    values_of(py, call_method(module, Method::NamedChildren, ())?)
}

/// `self.children()` as torch's code calls it.
pub fn children<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::Children) {
        return children_body(py, g, module);
    }
    call_method(module, Method::Children, ())
}

/// `for child in self.children(): f(child)`, without a Python iterator when
/// `children`/`named_children` are torch's.
pub(crate) fn for_each_child<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if is_native(g, module, Method::Children) && is_native(g, module, Method::NamedChildren) {
        let mut nc = NamedChildren::new(module, true)?;
        while let Some(child) = nc.step(py)? {
            f(&child)?;
        }
        return Ok(());
    }
    for child in children(py, g, module)?.try_iter()? {
        f(&child?)?;
    }
    Ok(())
}

/// `for p in self.parameters(): f(p)`, natively when the whole dispatch chain
/// (`parameters` → `named_parameters` → `_named_members`) is torch's. The
/// first `skip` parameters a replay yields are not passed to `f`: the caller
/// knows `f` would do nothing for them (`crate::walk::zero_grad`).
pub(crate) fn for_each_parameter<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mut skip: usize,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if is_native(g, module, Method::Parameters)
        && is_native(g, module, Method::NamedParameters)
        && is_native(g, module, Method::NamedMembers)
    {
        let prefix = PyString::new(py, "");
        let t = PyBool::new(py, true).to_owned().into_any();
        let mut nm = NamedMembers::new(py, module, "_parameters", prefix.as_any(), true, &t, true)?;
        while let Some(p) = nm.step(py)? {
            // Still replaying: nothing ran since the caller's pass.
            if skip > 0 && nm.replay.is_some() {
                skip -= 1;
                continue;
            }
            skip = 0;
            f(&p)?;
        }
        return Ok(());
    }
    for p in parameters(py, g, module)?.try_iter()? {
        f(&p?)?;
    }
    Ok(())
}

/// `self.named_parameters(...)`/`named_buffers(...)` as torch's code calls it.
// The arguments are torch's, plus the walk's context.
#[allow(clippy::too_many_arguments)]
pub(crate) fn named_registry<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    which: Method,
    prefix: &Bound<'py, PyAny>,
    recurse: &Bound<'py, PyAny>,
    remove_duplicate: &Bound<'py, PyAny>,
    values: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let registry = if which == Method::NamedParameters {
        "_parameters"
    } else {
        "_buffers"
    };
    if is_native(g, module, which) && is_native(g, module, Method::NamedMembers) {
        return body::named_members(
            py,
            module,
            registry,
            prefix,
            recurse,
            remove_duplicate,
            values,
        );
    }
    // The caller passes exactly what torch's code passes: `recurse=` only.
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "recurse"), recurse)?;
    let it = module.call_method(which.name(), (), Some(&kw))?;
    if values {
        values_of(py, it)
    } else {
        Ok(it)
    }
}

/// `self.parameters()` as torch's code calls it.
pub fn parameters<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::Parameters) {
        // parameters(recurse=True): `for _, p in self.named_parameters(recurse=recurse)`.
        let prefix = PyString::new(py, "");
        let t = PyBool::new(py, true).to_owned().into_any();
        return named_registry(
            py,
            g,
            module,
            Method::NamedParameters,
            prefix.as_any(),
            &t,
            &t,
            true,
        );
    }
    call_method(module, Method::Parameters, ())
}
