//! `torch.compiler.is_compiling()`, which `_call_impl` asks before running
//! hooks (when it is true, an exception skips the `always_call` hooks).
//!
//! torch's function is `return False if torch.jit.is_scripting() else
//! _is_compiling_flag` (checked at import: `fastmodule._verified.hook_dispatch`). While
//! every name on that way is still torch's object — `torch` in module.py's
//! globals, `torch.compiler`, its `is_compiling` (same code, same globals),
//! `torch.jit.is_scripting` (same code, `return False`) — the answer is
//! `_is_compiling_flag` read from `torch.compiler`'s globals, as the function
//! returns it. Otherwise, or when `fastmodule._verified.hook_dispatch` found another
//! shape, the very expression `torch.compiler.is_compiling()` runs.
use crate::cpython::validity::Checked;
use crate::cpython::{capi, Owned};

pub struct Compiling {
    /// `torch.nn.modules.module.__dict__`, where `torch` is looked up.
    pub module_globals: *mut capi::PyObject,
    pub torch: *mut capi::PyObject,
    pub torch_dict: *mut capi::PyObject,
    pub compiler: *mut capi::PyObject,
    pub compiler_dict: *mut capi::PyObject,
    pub jit: *mut capi::PyObject,
    pub jit_dict: *mut capi::PyObject,
    pub is_compiling: *mut capi::PyObject,
    pub is_compiling_code: *mut capi::PyObject,
    pub is_scripting: *mut capi::PyObject,
    pub is_scripting_code: *mut capi::PyObject,
    /// Whether the shape above was found at import (else always the call).
    pub known: bool,
    /// The four module dicts on the way (module.py's globals, `torch`,
    /// `torch.compiler`, `torch.jit`) as of the last time every object on it
    /// was torch's (the functions' code is checked on every call).
    pub checked: Checked<4>,
    pub names: Names,
}

pub struct Names {
    pub torch: *mut capi::PyObject,
    pub compiler: *mut capi::PyObject,
    pub is_compiling: *mut capi::PyObject,
    pub jit: *mut capi::PyObject,
    pub is_scripting: *mut capi::PyObject,
    pub flag: *mut capi::PyObject,
}

/// `d[key] is expected` for a module dict, without running code: module
/// dicts are str-keyed, and a non-quiet one is not trusted.
#[inline(always)]
unsafe fn holds(
    d: *mut capi::PyObject,
    key: *mut capi::PyObject,
    expected: *mut capi::PyObject,
) -> bool {
    crate::cpython::quiet::dict(d) && capi::PyDict_GetItemWithError(d, key) == expected
}

/// `mod.attr` reads `mod.__dict__[attr]` (a plain module object).
#[inline(always)]
unsafe fn plain_module(m: *mut capi::PyObject) -> bool {
    capi::PyModule_CheckExact(m) != 0
}

impl Compiling {
    /// Is every object on the way to the flag torch's own?
    #[inline(always)]
    unsafe fn unchanged(&self) -> bool {
        let n = &self.names;
        holds(self.module_globals, n.torch, self.torch)
            && plain_module(self.torch)
            && holds(self.torch_dict, n.compiler, self.compiler)
            && plain_module(self.compiler)
            && holds(self.compiler_dict, n.is_compiling, self.is_compiling)
            && holds(self.compiler_dict, n.torch, self.torch)
            && holds(self.torch_dict, n.jit, self.jit)
            && plain_module(self.jit)
            && holds(self.jit_dict, n.is_scripting, self.is_scripting)
    }

    /// `bool(torch.compiler.is_compiling())` as module.py evaluates it;
    /// Err(()) with the exception set.
    pub unsafe fn now(&self) -> Result<bool, ()> {
        let torch_code = self.known
            && capi::PyFunction_GetCode(self.is_compiling) == self.is_compiling_code
            && capi::PyFunction_GetCode(self.is_scripting) == self.is_scripting_code;
        let dicts = [
            self.module_globals,
            self.torch_dict,
            self.compiler_dict,
            self.jit_dict,
        ];
        if torch_code && self.checked.pass(dicts, || self.unchanged()) {
            let f = capi::PyDict_GetItemWithError(self.compiler_dict, self.names.flag);
            if !f.is_null() && capi::PyBool_Check(f) != 0 {
                return Ok(f == capi::Py_True());
            }
        }
        if !capi::PyErr_Occurred().is_null() {
            return Err(());
        }
        let r = self.call()?;
        match capi::PyObject_IsTrue(r.as_ptr()) {
            -1 => Err(()),
            t => Ok(t == 1),
        }
    }

    /// `torch.compiler.is_compiling()` as written: `torch` from module.py's
    /// globals (then builtins), two attribute reads, the call.
    unsafe fn call(&self) -> Result<Owned, ()> {
        let torch =
            crate::cpython::load_global::load_global(self.module_globals, self.names.torch)?;
        let compiler =
            Owned::from_owned_ptr(capi::PyObject_GetAttr(torch.as_ptr(), self.names.compiler))
                .ok_or(())?;
        let f = Owned::from_owned_ptr(capi::PyObject_GetAttr(
            compiler.as_ptr(),
            self.names.is_compiling,
        ))
        .ok_or(())?;
        Owned::from_owned_ptr(capi::PyObject_CallNoArgs(f.as_ptr())).ok_or(())
    }
}
