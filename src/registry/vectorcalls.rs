//! torch's own `nn.Module._wrapped_call_impl` (`__call__`), `__getattr__`,
//! `__setattr__`, `__delattr__`, `register_parameter`, `register_buffer`,
//! `add_module` and `register_module`, served natively.
//!
//! A C-level `tp_setattro` cannot be used: CPython's `object.__setattr__`
//! refuses to run on an instance whose type has one ("can't apply this
//! __setattr__"), and `nn.Module.__init__` calls exactly that. Replacing the
//! methods on the class would change what Dynamo, FSDP2 and patching tools see.
//! Instead we keep torch's function objects and replace only their vectorcall
//! entry point (`PyFunction_SetVectorcall`, made for this): when the first
//! argument is a fastmodule instance and the call is well-formed, the body runs
//! in Rust; every other call (stock modules, odd arguments, the rare branches)
//! goes to the function's original vectorcall, i.e. torch's Python code.
//!
//! Where the entry point is consulted differs by version. CPython 3.11
//! inlines Python-to-Python calls without it, so there only calls from C
//! (the type slots `m.x = v`, `m(x)`, `m.attr` go through, C extensions)
//! reach it, and a stock module runs exactly as before. From 3.12 on, a
//! function whose vectorcall is not CPython's own is called as a C function
//! from Python code too (a C stack level, `sys.monitoring` C_RETURN/C_RAISE
//! events). The four functions the type slots call (`__call__`, `__getattr__`,
//! `__setattr__`, `__delattr__`) keep fastmodule's entry point there as well —
//! it is what makes `m.x = v` native — so only an explicit Python call of one
//! of them (`super().__setattr__(name, value)`) differs; the four
//! registration functions, called from Python code almost only, keep
//! CPython's entry point from 3.12 on (their Python body with native
//! attribute reads costs about what the native body does).
use super::preconditions::Outcome;
use super::register::{add_module, native_method, register_buffer, register_parameter};
use super::setattr::setattr_native;
use crate::cpython::capi;
use crate::cpython::vectorcall::{set_vectorcall, VECTORCALL_INLINED};
use crate::instance::fast::is_fast_instance;
use crate::torch_api::originals::{globals, require, Globals};
use pyo3::prelude::*;
use std::sync::OnceLock;

#[derive(Clone, Copy)]
enum Which {
    WrappedCallImpl,
    GetAttr,
    SetAttr,
    DelAttr,
    RegisterParameter,
    RegisterBuffer,
    AddModule,
    RegisterModule,
}

const ALL: [Which; 8] = [
    Which::WrappedCallImpl,
    Which::GetAttr,
    Which::SetAttr,
    Which::DelAttr,
    Which::RegisterParameter,
    Which::RegisterBuffer,
    Which::AddModule,
    Which::RegisterModule,
];

impl Which {
    fn index(self) -> usize {
        self as usize
    }
    /// Does this function get fastmodule's entry point (see the module
    /// documentation)?
    fn routed(self) -> bool {
        match self {
            Which::WrappedCallImpl | Which::GetAttr | Which::SetAttr | Which::DelAttr => true,
            Which::RegisterParameter
            | Which::RegisterBuffer
            | Which::AddModule
            | Which::RegisterModule => VECTORCALL_INLINED,
        }
    }
    /// The path (`crate::call::slots::CALL`, ...) this function's native body serves.
    fn path(self) -> u8 {
        match self {
            Which::WrappedCallImpl => crate::call::slots::CALL,
            Which::GetAttr => crate::call::slots::GETATTR,
            Which::SetAttr
            | Which::DelAttr
            | Which::RegisterParameter
            | Which::RegisterBuffer
            | Which::AddModule
            | Which::RegisterModule => crate::call::slots::REGISTRATION,
        }
    }
    fn function(self, g: &Globals) -> *mut capi::PyObject {
        let o = &g.orig;
        match self {
            Which::WrappedCallImpl => o.call,
            Which::GetAttr => o.getattr,
            Which::SetAttr => o.setattr,
            Which::DelAttr => o.delattr,
            Which::RegisterParameter => o.register_parameter,
            Which::RegisterBuffer => o.register_buffer,
            Which::AddModule => o.add_module,
            Which::RegisterModule => o.register_module,
        }
    }
}

struct Saved([capi::vectorcallfunc; 8]);
static SAVED: OnceLock<Saved> = OnceLock::new();

/// The function's original vectorcall (torch's Python code).
#[inline(always)]
unsafe fn original(
    which: Which,
    callable: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargsf: usize,
    kwnames: *mut capi::PyObject,
) -> *mut capi::PyObject {
    match SAVED.get() {
        Some(s) => (s.0[which.index()])(callable, args, nargsf, kwnames),
        None => crate::torch_api::errors::not_initialised(),
    }
}

/// Match positional/keyword arguments against `params`; None for anything
/// but a well-formed call (torch's function then raises the exact error).
unsafe fn bind<const N: usize>(
    args: *const *mut capi::PyObject,
    nargs: usize,
    kwnames: *mut capi::PyObject,
    params: [&std::ffi::CStr; N],
    defaults: [*mut capi::PyObject; N],
) -> Option<[*mut capi::PyObject; N]> {
    if nargs > N {
        return None;
    }
    let mut out = defaults;
    for (i, slot) in out.iter_mut().enumerate().take(nargs) {
        *slot = *args.add(i);
    }
    if !kwnames.is_null() {
        let nk = capi::PyTuple_GET_SIZE(kwnames) as usize;
        for j in 0..nk {
            let key = capi::PyTuple_GET_ITEM(kwnames, j as capi::Py_ssize_t);
            let i = params
                .iter()
                .position(|p| capi::PyUnicode_CompareWithASCIIString(key, p.as_ptr()) == 0)?;
            if i < nargs {
                return None;
            }
            out[i] = *args.add(nargs + j);
        }
    }
    if out.iter().any(|p| p.is_null()) {
        return None;
    }
    Some(out)
}

fn none_or_null(o: Outcome) -> Option<*mut capi::PyObject> {
    match o {
        Outcome::Done => unsafe {
            let none = capi::Py_None();
            capi::Py_INCREF(none);
            Some(none)
        },
        Outcome::Error => Some(std::ptr::null_mut()),
        Outcome::Stock => None,
    }
}

/// The native body for a fast instance, or None to run torch's code.
unsafe fn native(
    g: &Globals,
    which: Which,
    slf: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargs: usize,
    kwnames: *mut capi::PyObject,
) -> Option<*mut capi::PyObject> {
    let null = std::ptr::null_mut();
    match which {
        Which::WrappedCallImpl => {
            crate::call::module_call::wrapped_call_impl(g, args.sub(1), nargs + 1, kwnames)
        }
        Which::GetAttr => {
            let [name] = bind(args, nargs, kwnames, [c"name"], [null])?;
            crate::call::getattr::getattr_native(g, slf, name)
        }
        Which::SetAttr => {
            let [name, value] = bind(args, nargs, kwnames, [c"name", c"value"], [null, null])?;
            none_or_null(setattr_native(g, slf, name, value))
        }
        Which::DelAttr => {
            let [name] = bind(args, nargs, kwnames, [c"name"], [null])?;
            none_or_null(setattr_native(g, slf, name, null))
        }
        Which::RegisterParameter => {
            let [name, param] = bind(args, nargs, kwnames, [c"name", c"param"], [null, null])?;
            none_or_null(register_parameter(g, slf, name, param))
        }
        Which::RegisterBuffer => {
            let [name, tensor, persistent] = bind(
                args,
                nargs,
                kwnames,
                [c"name", c"tensor", c"persistent"],
                [null, null, capi::Py_True()],
            )?;
            none_or_null(register_buffer(g, slf, name, tensor, persistent))
        }
        Which::AddModule => {
            let [name, module] = bind(args, nargs, kwnames, [c"name", c"module"], [null, null])?;
            none_or_null(add_module(g, slf, name, module))
        }
        Which::RegisterModule => {
            let [name, module] = bind(args, nargs, kwnames, [c"name", c"module"], [null, null])?;
            // `register_module` is `self.add_module(name, module)`: dispatch it.
            if native_method(slf, g.names.add_module, g.orig.add_module) {
                none_or_null(add_module(g, slf, name, module))
            } else {
                Some(capi::PyObject_CallMethodObjArgs(
                    slf,
                    g.names.add_module,
                    name,
                    module,
                    null,
                ))
            }
        }
    }
}

#[inline(always)]
unsafe fn entry(
    which: Which,
    callable: *mut capi::PyObject,
    args: *const *mut capi::PyObject,
    nargsf: usize,
    kwnames: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let nargs = capi::PyVectorcall_NARGS(nargsf) as usize;
    if let Some(g) = globals() {
        // Under a tracer or profiler torch's function runs, with its frame;
        // after its `__code__` was replaced, the code it has now.
        if nargs >= 1
            && is_fast_instance(g, *args)
            && !crate::cpython::tracer::active()
            && g.orig.intact(callable)
        {
            if let Some(r) = native(g, which, *args, args.add(1), nargs - 1, kwnames) {
                return r;
            }
        }
    }
    original(which, callable, args, nargsf, kwnames)
}

macro_rules! vectorcall {
    ($fn_name:ident, $which:expr) => {
        unsafe extern "C" fn $fn_name(
            callable: *mut capi::PyObject,
            args: *const *mut capi::PyObject,
            nargsf: usize,
            kwnames: *mut capi::PyObject,
        ) -> *mut capi::PyObject {
            entry($which, callable, args, nargsf, kwnames)
        }
    };
}
vectorcall!(vc_wrapped_call_impl, Which::WrappedCallImpl);
vectorcall!(vc_getattr, Which::GetAttr);
vectorcall!(vc_setattr, Which::SetAttr);
vectorcall!(vc_delattr, Which::DelAttr);
vectorcall!(vc_register_parameter, Which::RegisterParameter);
vectorcall!(vc_register_buffer, Which::RegisterBuffer);
vectorcall!(vc_add_module, Which::AddModule);
vectorcall!(vc_register_module, Which::RegisterModule);

fn ours(which: Which) -> capi::vectorcallfunc {
    match which {
        Which::WrappedCallImpl => vc_wrapped_call_impl,
        Which::GetAttr => vc_getattr,
        Which::SetAttr => vc_setattr,
        Which::DelAttr => vc_delattr,
        Which::RegisterParameter => vc_register_parameter,
        Which::RegisterBuffer => vc_register_buffer,
        Which::AddModule => vc_add_module,
        Which::RegisterModule => vc_register_module,
    }
}

/// Point torch's functions at the native entry points (once; see
/// [`Which::routed`]), except those of paths switched off.
pub fn install(py: Python<'_>) -> PyResult<()> {
    let g = require(py)?;
    if SAVED.get().is_some() {
        return Ok(());
    }
    let mut saved: Vec<capi::vectorcallfunc> = Vec::with_capacity(ALL.len());
    for w in ALL {
        let f = w.function(g);
        if unsafe { capi::PyFunction_Check(f) } == 0 {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "torch.nn.Module method is not a Python function; fastmodule cannot serve it",
            ));
        }
        let func = f as *mut capi::PyFunctionObject;
        match unsafe { crate::cpython::vectorcall::vectorcall_of(func) } {
            Some(vc) => saved.push(vc),
            None => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "torch.nn.Module method has no vectorcall",
                ))
            }
        }
    }
    let arr: [capi::vectorcallfunc; 8] = match saved.try_into() {
        Ok(a) => a,
        Err(_) => {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "fastmodule: vectorcall table size",
            ))
        }
    };
    let _ = SAVED.set(Saved(arr));
    for w in ALL
        .into_iter()
        .filter(|w| w.routed() && crate::call::slots::on(w.path()))
    {
        unsafe { set_vectorcall(w.function(g) as *mut capi::PyFunctionObject, ours(w)) };
    }
    Ok(())
}
