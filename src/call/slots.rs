//! Giving classes fastmodule's C slots.
//!
//! Nothing Python-visible changes on a class: `type(m).__call__` is still
//! `nn.Module.__call__` (what Dynamo, FX and export test for); only the C
//! slots `tp_call` and `tp_getattro` point at Rust. A slot is installed only
//! while the class's MRO resolves the matching dunders to torch's originals.
//!
//! CPython recomputes a class's slots whenever a dunder is assigned on it or
//! on a base (FX and export do so on `nn.Module` for every trace), so while a
//! patch is in place the class runs the patched Python code. Once the patch is
//! undone, the next call or registry read reaches torch's original function,
//! whose vectorcall is ours (see `crate::registry::vectorcalls`): it calls `rearm`, which puts the
//! slot back. No global hook on `type` is needed.
//!
//! `__setattr__`/`__delattr__` get no slot: CPython's `object.__setattr__`
//! (which `nn.Module.__init__` calls) refuses instances whose type has a C
//! `tp_setattro`. They are served through torch's function objects instead.
use crate::call::getattr::module_getattro;
use crate::call::module_call::module_call;
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::types;
use crate::torch_api::originals::{require, Globals};
use pyo3::prelude::*;
use pyo3::types::PyType;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Native paths that can be switched off at import, where torch's code for
/// them is not the code fastmodule verified (`fastmodule._verified.verification`): the
/// call, the attribute read, and registration (`__setattr__`, `__delattr__`,
/// `register_*`, `add_module`).
pub const CALL: u8 = 1;
pub const GETATTR: u8 = 2;
pub const REGISTRATION: u8 = 4;
static OFF: AtomicU8 = AtomicU8::new(0);

/// Switch paths off (before `methods::install`; never back on).
pub fn switch_off(paths: u8) {
    OFF.fetch_or(paths, Relaxed);
}

/// Is the native `path` (one of the constants above) on?
#[inline(always)]
pub fn on(path: u8) -> bool {
    OFF.load(Relaxed) & path == 0
}

/// Is a slot exactly `f`? (Our functions are distinct, non-merged symbols.)
macro_rules! is_fn {
    ($slot:expr, $f:expr) => {
        matches!($slot, Some(s) if std::ptr::fn_addr_eq(s, $f))
    };
}
pub(crate) use is_fn;

/// Which native paths a class uses now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Installed {
    pub call: bool,
    pub getattr: bool,
    /// `__setattr__`/`__delattr__` resolve to torch's (natively served) functions.
    pub setattr: bool,
}

#[inline(always)]
unsafe fn resolves_to(
    tp: *mut capi::PyTypeObject,
    name: *mut capi::PyObject,
    want: *mut capi::PyObject,
) -> bool {
    type_lookup(tp, name) == want
}

#[inline(always)]
unsafe fn call_ok(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    resolves_to(tp, g.names.dunder_call, g.orig.call)
}

#[inline(always)]
unsafe fn getattr_ok(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    resolves_to(tp, g.names.dunder_getattr, g.orig.getattr)
        && resolves_to(tp, g.names.dunder_getattribute, g.orig.object_getattribute)
}

/// Install whichever slots `tp`'s MRO allows and that are not in place.
#[inline(always)]
pub unsafe fn rearm(g: &Globals, tp: *mut capi::PyTypeObject) {
    if tp == g.nn_module {
        // nn.Module itself keeps CPython's slots (classes inherit them).
        return;
    }
    if on(CALL) && !is_fn!(types::call_slot(tp), module_call as capi::ternaryfunc) && call_ok(g, tp)
    {
        types::set_call_slot(tp, Some(module_call));
    }
    if on(GETATTR)
        && !is_fn!(
            types::getattro_slot(tp),
            module_getattro as capi::getattrofunc
        )
        && getattr_ok(g, tp)
    {
        types::set_getattro_slot(tp, Some(module_getattro));
    }
}

/// Which native paths `tp` uses now.
pub unsafe fn current(g: &Globals, tp: *mut capi::PyTypeObject) -> Installed {
    Installed {
        call: is_fn!(types::call_slot(tp), module_call as capi::ternaryfunc),
        getattr: is_fn!(
            types::getattro_slot(tp),
            module_getattro as capi::getattrofunc
        ),
        setattr: on(REGISTRATION)
            && resolves_to(tp, g.names.dunder_setattr, g.orig.setattr)
            && resolves_to(tp, g.names.dunder_delattr, g.orig.delattr),
    }
}

/// Install on `cls`, which must derive from `fastmodule.Module`.
pub fn install_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<Installed> {
    let g = require(py)?;
    let tp = cls.as_ptr() as *mut capi::PyTypeObject;
    if unsafe { capi::PyType_IsSubtype(tp, g.fast_module) } == 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{} is not a subclass of fastmodule.Module",
            cls.name()?
        )));
    }
    unsafe {
        rearm(g, tp);
        Ok(current(g, tp))
    }
}

/// Accelerate `cls` (any `torch.nn.Module` subclass) in place.
pub fn accelerate_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<Installed> {
    let g = require(py)?;
    let tp = cls.as_ptr() as *mut capi::PyTypeObject;
    if unsafe { capi::PyType_IsSubtype(tp, g.nn_module) } == 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{} is not a subclass of torch.nn.Module",
            cls.name()?
        )));
    }
    crate::instance::accelerated::add(cls)?;
    unsafe {
        // (nn.Module itself keeps CPython's slots: every class created later
        // would inherit ours, beyond what `restore_class` can take back.)
        rearm(g, tp);
        Ok(current(g, tp))
    }
}

/// Capture nn.Module's own slots (at import, before any installation): for
/// a class whose `__call__`/`__getattr__` are nn.Module's Python functions
/// they are what CPython computes.
pub fn capture_generic(g: &Globals) {
    let _ = GENERIC_SLOTS.set(unsafe {
        (
            types::call_slot(g.nn_module),
            types::getattro_slot(g.nn_module),
        )
    });
}

static GENERIC_SLOTS: std::sync::OnceLock<(Option<capi::ternaryfunc>, Option<capi::getattrofunc>)> =
    std::sync::OnceLock::new();

/// Put CPython's slots back on `tp` where ours are installed.
unsafe fn uninstall(tp: *mut capi::PyTypeObject) {
    let Some(&(call, getattro)) = GENERIC_SLOTS.get() else {
        return;
    };
    if is_fn!(types::call_slot(tp), module_call as capi::ternaryfunc) {
        types::set_call_slot(tp, call);
    }
    if is_fn!(
        types::getattro_slot(tp),
        module_getattro as capi::getattrofunc
    ) {
        types::set_getattro_slot(tp, getattro);
    }
}

/// Undo `accelerate_class`: the class leaves the set and its slots go back
/// to what CPython computes from its MRO.
pub fn restore_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<bool> {
    let g = require(py)?;
    let tp = cls.as_ptr() as *mut capi::PyTypeObject;
    if unsafe { capi::PyType_IsSubtype(tp, g.fast_module) } != 0 {
        // fastmodule.Module subclasses are fast by construction.
        return Ok(false);
    }
    let was = crate::instance::accelerated::remove(cls)?;
    // Our slots are installed only while `__call__`/`__getattr__` resolve to
    // nn.Module's Python functions; for such a class CPython's own slots are
    // the generic ones nn.Module carries. Subclasses created while `cls` was
    // accelerated inherited ours: they get CPython's back too, unless they
    // are fast in their own right.
    unsafe { uninstall(tp) };
    let mut stack = vec![cls.clone()];
    while let Some(c) = stack.pop() {
        for sub in c
            .call_method0(crate::cpython::interned::intern!(py, "__subclasses__"))?
            .try_iter()?
        {
            let sub = sub?.cast_into::<PyType>()?;
            let stp = sub.as_ptr() as *mut capi::PyTypeObject;
            let fast = unsafe { capi::PyType_IsSubtype(stp, g.fast_module) } != 0
                || crate::instance::accelerated::contains(stp);
            if !fast {
                unsafe { uninstall(stp) };
                stack.push(sub);
            }
        }
    }
    Ok(was)
}

/// Is `cls` accelerated in place?
pub fn is_accelerated(cls: &Bound<'_, PyType>) -> bool {
    crate::instance::accelerated::contains(cls.as_ptr() as *mut capi::PyTypeObject)
}

/// Which native paths `cls` uses now.
pub fn installed(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<Installed> {
    let g = require(py)?;
    Ok(unsafe { current(g, cls.as_ptr() as *mut capi::PyTypeObject) })
}
