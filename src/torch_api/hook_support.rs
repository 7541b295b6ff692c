//! What the native dispatch of forward hooks needs from torch and from
//! fastmodule's Python side, handed over once at import by
//! `fastmodule._verified.hook_dispatch` (only after torch's `_call_impl` and the
//! functions it calls were verified). Until then, or if it never comes,
//! a module call with hooks runs torch's `_call_impl`.
use crate::cpython::validity::Checked;
use crate::cpython::{capi, Owned};
use crate::torch_api::compiling::{self, Compiling};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::sync::OnceLock;

pub struct HookSupport {
    pub compiling: Compiling,
    /// `torch.nn.modules.module.__dict__`: its globals (the global hook
    /// dicts) and where its warnings are registered.
    pub module_globals: *mut capi::PyObject,
    /// `lambda f, args, kwargs: f(*args, **kwargs)`, for arguments a hook
    /// replaced with something other than an exact tuple and dict.
    pub star_call: *mut capi::PyObject,
    /// `a, b = pair` as a statement does it, returning `(a, b)`.
    pub unpack_pair: *mut capi::PyObject,
    /// Where `_call_impl`'s `warnings.warn(..., stacklevel=2)` points: the
    /// line of `_wrapped_call_impl` that calls `_call_impl`.
    pub warn_filename: *mut capi::PyObject,
    pub warn_lineno: i32,
    /// `warnings.warn` as installed at import: while module.py's
    /// `warnings.warn` is still it, the warning is made in place; a patched
    /// one (`unittest.mock`, a logging bridge) is called as torch calls it.
    pub warnings_warn: *mut capi::PyObject,
    /// `("stacklevel",)`, the keyword of that call.
    pub stacklevel_kw: *mut capi::PyObject,
    /// The `warnings` module and its dict, as installed at import.
    pub warnings_module: *mut capi::PyObject,
    pub warnings_dict: *mut capi::PyObject,
    pub warn_checked: Checked<2>,
    pub two: *mut capi::PyObject,
    pub odict: *mut capi::PyTypeObject,
    pub names: Names,
}

pub struct Names {
    pub forward_pre_hooks: *mut capi::PyObject,
    pub forward_hooks: *mut capi::PyObject,
    pub forward_pre_hooks_with_kwargs: *mut capi::PyObject,
    pub forward_hooks_with_kwargs: *mut capi::PyObject,
    pub forward_hooks_always_called: *mut capi::PyObject,
    pub items: *mut capi::PyObject,
    pub dunder_name: *mut capi::PyObject,
    pub warning_registry: *mut capi::PyObject,
    pub warnings: *mut capi::PyObject,
    pub warn: *mut capi::PyObject,
}

/// The module.py globals `_call_impl` reads on the way to the forward hooks,
/// each numbered by its place in `crate::torch_api::hooks::hook_globals`'
/// answer (after the two backward-hook dicts).
#[derive(Clone, Copy)]
pub enum GlobalName {
    Hooks = 2,
    PreHooks = 3,
    WithKwargs = 4,
    AlwaysCalled = 5,
}

// SAFETY: strong references kept for the life of the process, read with the GIL.
unsafe impl Send for HookSupport {}
unsafe impl Sync for HookSupport {}

static SUPPORT: OnceLock<HookSupport> = OnceLock::new();

/// The support, once `fastmodule._verified.hook_dispatch` handed it over.
#[inline(always)]
pub fn get() -> Option<&'static HookSupport> {
    SUPPORT.get()
}

/// `config`: see `fastmodule._verified.hook_dispatch`.
pub fn init(py: Python<'_>, config: &Bound<'_, PyDict>) -> PyResult<()> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        config
            .get_item(k)?
            .ok_or_else(|| PyRuntimeError::new_err(format!("fastmodule: hook support lacks {k}")))
    };
    let ptr = |k: &str| -> PyResult<*mut capi::PyObject> { Ok(get(k)?.into_ptr()) };
    let intern = |s: &str| PyString::intern(py, s).into_ptr();
    let code =
        |k: &str| -> PyResult<*mut capi::PyObject> { Ok(get(k)?.getattr("__code__")?.into_ptr()) };
    let support = HookSupport {
        compiling: Compiling {
            module_globals: ptr("module_globals")?,
            torch: ptr("torch")?,
            torch_dict: ptr("torch_dict")?,
            compiler: ptr("compiler")?,
            compiler_dict: ptr("compiler_dict")?,
            jit: ptr("jit")?,
            jit_dict: ptr("jit_dict")?,
            is_compiling: ptr("is_compiling")?,
            is_compiling_code: code("is_compiling")?,
            is_scripting: ptr("is_scripting")?,
            is_scripting_code: code("is_scripting")?,
            known: get("is_compiling_known")?.is_truthy()?,
            checked: Checked::new(),
            names: compiling::Names {
                torch: intern("torch"),
                compiler: intern("compiler"),
                is_compiling: intern("is_compiling"),
                jit: intern("jit"),
                is_scripting: intern("is_scripting"),
                flag: intern("_is_compiling_flag"),
            },
        },
        module_globals: ptr("module_globals")?,
        star_call: ptr("star_call")?,
        unpack_pair: ptr("unpack_pair")?,
        warn_filename: ptr("warn_filename")?,
        warn_lineno: get("warn_lineno")?.extract()?,
        warnings_warn: ptr("warnings_warn")?,
        warnings_module: py.import("warnings")?.into_any().into_ptr(),
        warnings_dict: py.import("warnings")?.dict().into_any().into_ptr(),
        warn_checked: Checked::new(),
        stacklevel_kw: pyo3::types::PyTuple::new(py, ["stacklevel"])?.into_ptr(),
        two: 2i64.into_pyobject(py)?.into_ptr(),
        odict: ptr("odict")? as *mut capi::PyTypeObject,
        names: Names {
            forward_pre_hooks: intern("_forward_pre_hooks"),
            forward_hooks: intern("_forward_hooks"),
            forward_pre_hooks_with_kwargs: intern("_forward_pre_hooks_with_kwargs"),
            forward_hooks_with_kwargs: intern("_forward_hooks_with_kwargs"),
            forward_hooks_always_called: intern("_forward_hooks_always_called"),
            items: intern("items"),
            dunder_name: intern("__name__"),
            warning_registry: intern("__warningregistry__"),
            warnings: intern("warnings"),
            warn: intern("warn"),
        },
    };
    let _ = SUPPORT.set(support);
    Ok(())
}

impl HookSupport {
    /// Is module.py's `warnings.warn` (what `_call_impl`'s `except` block calls
    /// for a failing `always_call` hook) CPython's own? Else a hooked call runs
    /// torch's `_call_impl`, whose frames a wrapper (a logging bridge) may read.
    /// Runs no code; remembered by the two dicts' versions.
    #[inline(always)]
    pub fn warn_intact(&self) -> bool {
        let n = &self.names;
        // SAFETY: exact dicts held for the process; the GIL is held.
        unsafe {
            self.warn_checked
                .pass([self.module_globals, self.warnings_dict], || {
                    crate::cpython::quiet::dict(self.module_globals)
                        && capi::PyDict_GetItemWithError(self.module_globals, n.warnings)
                            == self.warnings_module
                        && crate::cpython::quiet::dict(self.warnings_dict)
                        && capi::PyDict_GetItemWithError(self.warnings_dict, n.warn)
                            == self.warnings_warn
                })
        }
    }

    /// A global of module.py, read as `_call_impl` reads it: from the
    /// remembered reads while module.py's globals are unchanged
    /// (`crate::torch_api::hooks::hook_globals`), else looked up as Python
    /// does.
    #[inline(always)]
    pub unsafe fn global(&self, which: GlobalName) -> Result<Owned, ()> {
        let Some(g) = crate::torch_api::originals::globals() else {
            crate::torch_api::errors::not_initialised();
            return Err(());
        };
        let i = which as usize;
        match crate::torch_api::hooks::hook_globals(g)? {
            Some(found) => Ok(Owned::new_ref(found[i])),
            None => {
                crate::cpython::load_global::load_global(g.module_globals, g.names.global_hooks[i])
            }
        }
    }

    /// `a, b = pair` for anything but an exact 2-tuple.
    pub unsafe fn unpack_pair_generic(
        &self,
        pair: *mut capi::PyObject,
    ) -> Result<(Owned, Owned), ()> {
        let t =
            Owned::from_owned_ptr(capi::PyObject_CallOneArg(self.unpack_pair, pair)).ok_or(())?;
        // The helper returns an exact 2-tuple.
        Ok((item(t.as_ptr(), 0), item(t.as_ptr(), 1)))
    }

    /// `warnings.warn(message, stacklevel=2)` from `_call_impl`'s `except`
    /// block. `warnings` and its `warn` are read as module.py's code reads
    /// them; while that is the `warnings.warn` of import, a UserWarning
    /// placed at `_wrapped_call_impl`'s line in module.py, registered in
    /// module.py's `__warningregistry__` (made if missing), as the call would
    /// make it from torch's frame; anything else is called as torch calls it.
    pub unsafe fn warn(&self, message: *mut capi::PyObject) -> Result<(), ()> {
        let g = self.module_globals;
        let n = &self.names;
        let module = crate::cpython::load_global::load_global(g, n.warnings)?;
        let warn =
            Owned::from_owned_ptr(capi::PyObject_GetAttr(module.as_ptr(), n.warn)).ok_or(())?;
        if warn.as_ptr() != self.warnings_warn {
            let args = [message, self.two];
            let r = capi::PyObject_Vectorcall(warn.as_ptr(), args.as_ptr(), 1, self.stacklevel_kw);
            return Owned::from_owned_ptr(r).map(drop).ok_or(());
        }
        let mut registry = capi::PyDict_GetItemWithError(g, n.warning_registry);
        if registry.is_null() {
            if !capi::PyErr_Occurred().is_null() {
                return Err(());
            }
            let fresh = Owned::from_owned_ptr(capi::PyDict_New()).ok_or(())?;
            if capi::PyDict_SetItem(g, n.warning_registry, fresh.as_ptr()) < 0 {
                return Err(());
            }
            registry = fresh.as_ptr();
        }
        let registry = Owned::new_ref(registry);
        let module = capi::PyDict_GetItemWithError(g, n.dunder_name);
        if module.is_null() && !capi::PyErr_Occurred().is_null() {
            return Err(());
        }
        let module = if module.is_null() {
            Owned::from_owned_ptr(capi::PyUnicode_FromString(c"<string>".as_ptr())).ok_or(())?
        } else {
            Owned::new_ref(module)
        };
        let r = capi::PyErr_WarnExplicitObject(
            capi::PyExc_UserWarning,
            message,
            self.warn_filename,
            self.warn_lineno,
            module.as_ptr(),
            registry.as_ptr(),
        );
        if r < 0 {
            Err(())
        } else {
            Ok(())
        }
    }
}

unsafe fn item(t: *mut capi::PyObject, i: capi::Py_ssize_t) -> Owned {
    Owned::new_ref(capi::PyTuple_GET_ITEM(t, i))
}
