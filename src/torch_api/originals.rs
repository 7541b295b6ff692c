//! Process-wide references captured once at import: torch's own functions and
//! types (the "originals" a fast path must match), interned attribute names,
//! and the registry of classes that carry fastmodule's slots.
//!
//! Every pointer is a strong reference kept for the life of the process, so
//! the hot paths can read them without reference counting.
use crate::cpython::capi;
use crate::cpython::function_body::Body;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyType};
use std::sync::OnceLock;

/// Interned attribute names used on the hot paths.
pub struct Names {
    pub parameters: *mut capi::PyObject,
    pub buffers: *mut capi::PyObject,
    pub modules: *mut capi::PyObject,
    pub non_persistent: *mut capi::PyObject,
    pub compiled_call_impl: *mut capi::PyObject,
    pub call_impl: *mut capi::PyObject,
    pub forward: *mut capi::PyObject,
    /// The 4 per-module hook dicts `_call_impl` tests.
    pub instance_hooks: [*mut capi::PyObject; 4],
    /// The per-module sets of forward-hook ids `_call_impl` asks about
    /// (`_forward_pre_hooks_with_kwargs`, `_forward_hooks_with_kwargs`,
    /// `_forward_hooks_always_called`).
    pub hook_sets: [*mut capi::PyObject; 3],
    /// The module-level hook globals `_call_impl` reads: the 4 dicts it
    /// tests, then the 2 forward-hook id dicts (`with_kwargs`,
    /// `always_called`) the hook dispatch asks about.
    pub global_hooks: [*mut capi::PyObject; 6],
    pub global_param_reg_hooks: *mut capi::PyObject,
    pub global_module_reg_hooks: *mut capi::PyObject,
    pub global_buffer_reg_hooks: *mut capi::PyObject,
    pub register_parameter: *mut capi::PyObject,
    pub add_module: *mut capi::PyObject,
    pub dunder_class: *mut capi::PyObject,
    pub dunder_name: *mut capi::PyObject,
    pub dunder_call: *mut capi::PyObject,
    pub dunder_getattr: *mut capi::PyObject,
    pub dunder_getattribute: *mut capi::PyObject,
    pub dunder_setattr: *mut capi::PyObject,
    pub dunder_delattr: *mut capi::PyObject,
    pub torch_function: *mut capi::PyObject,
    pub grad_fn: *mut capi::PyObject,
    pub empty: *mut capi::PyObject,
    pub dot: *mut capi::PyObject,
}

/// torch's original implementations; a class gets a Rust slot only while its
/// MRO resolves the matching dunder to exactly one of these.
pub struct Originals {
    pub call: *mut capi::PyObject,
    /// `nn.Module._call_impl`, which `_wrapped_call_impl` looks up on `self`.
    pub call_impl: *mut capi::PyObject,
    pub getattr: *mut capi::PyObject,
    pub setattr: *mut capi::PyObject,
    pub delattr: *mut capi::PyObject,
    pub register_parameter: *mut capi::PyObject,
    pub register_buffer: *mut capi::PyObject,
    pub add_module: *mut capi::PyObject,
    pub register_module: *mut capi::PyObject,
    pub object_getattribute: *mut capi::PyObject,
    pub object_class: *mut capi::PyObject,
    /// `type.__dict__["__name__"]`: what `type(obj).__name__` calls when the
    /// metaclass resolves `__name__` to it (a getter that runs no code).
    pub type_name: *mut capi::PyObject,
    /// The bodies of the Python functions above, as captured at import, in
    /// [`Originals::BODIES`]' order (see [`Originals::intact`]).
    pub bodies: [Option<Body>; 9],
}

impl Originals {
    const CALL: usize = 0;
    const CALL_IMPL: usize = 1;
    const GETATTR: usize = 2;
    const SETATTR: usize = 3;

    /// The functions whose bodies are captured, by index.
    fn bodies_of(&self) -> [*mut capi::PyObject; 9] {
        [
            self.call,
            self.call_impl,
            self.getattr,
            self.setattr,
            self.delattr,
            self.register_parameter,
            self.register_buffer,
            self.add_module,
            self.register_module,
        ]
    }

    #[inline(always)]
    fn body_intact(&self, i: usize) -> bool {
        // SAFETY: called with the GIL held, as everything here.
        self.bodies[i]
            .as_ref()
            .is_none_or(|b| unsafe { b.intact() })
    }

    /// Is `f` (one of the functions above) still running the code and
    /// defaults it had at import? A body replaced since (`__code__`
    /// reassigned) is what stock runs, so the native path stands aside. True
    /// for anything that is not one of them.
    #[inline(always)]
    pub fn intact(&self, f: *mut capi::PyObject) -> bool {
        self.bodies_of()
            .iter()
            .position(|&g| g == f)
            .is_none_or(|i| self.body_intact(i))
    }

    /// `__getattr__`, which the attribute read reproduces, intact.
    #[inline(always)]
    pub fn getattr_intact(&self) -> bool {
        self.body_intact(Self::GETATTR)
    }

    /// `__setattr__`, which the native assignments (and the `training`
    /// rebinding of a replayed `train()`) reproduce, intact.
    #[inline(always)]
    pub fn setattr_intact(&self) -> bool {
        self.body_intact(Self::SETATTR)
    }

    /// `_wrapped_call_impl` and `_call_impl`, which the native module call
    /// reproduces, both intact.
    #[inline(always)]
    pub fn call_intact(&self) -> bool {
        self.body_intact(Self::CALL) && self.body_intact(Self::CALL_IMPL)
    }
}

pub struct Globals {
    pub nn_module: *mut capi::PyTypeObject,
    pub fast_module: *mut capi::PyTypeObject,
    pub parameter: *mut capi::PyTypeObject,
    pub tensor: *mut capi::PyTypeObject,
    pub script_module: *mut capi::PyObject,
    pub odict: *mut capi::PyTypeObject,
    pub orig: Originals,
    /// `torch.nn.modules.module.__dict__`: the global hook dicts are read from
    /// it on every call, as `_call_impl` does.
    pub module_globals: *mut capi::PyObject,
    pub typename: *mut capi::PyObject,
    pub is_tracing_py: *mut capi::PyObject,
    pub names: Names,
    /// What `_call_impl`'s `torch._C._is_tracing()` reads, in order: module.py's
    /// globals, `torch`'s dict, `torch._C`'s dict, each dict with the key and
    /// the object torch installed there.
    pub tracing_reads: [(
        *mut capi::PyObject,
        *mut capi::PyObject,
        *mut capi::PyObject,
    ); 3],
    tracing_checked: crate::cpython::validity::Checked<3>,
}

impl Globals {
    /// Does `_call_impl`'s `torch._C._is_tracing` still read torch's own
    /// objects? A proxy in module.py's `torch` (or a replaced `torch._C` or
    /// `_is_tracing`) sees stock's reads, so the native call stands aside.
    /// Runs no code; remembered by the three dicts' versions.
    #[inline(always)]
    pub fn torch_reads_intact(&self) -> bool {
        let r = &self.tracing_reads;
        // SAFETY: exact dicts held for the process; the GIL is held.
        unsafe {
            self.tracing_checked.pass([r[0].0, r[1].0, r[2].0], || {
                r.iter().all(|&(d, k, want)| {
                    crate::cpython::quiet::dict(d) && capi::PyDict_GetItemWithError(d, k) == want
                })
            })
        }
    }
}

// SAFETY: every field is an immortal-by-convention strong reference that is
// only dereferenced with the GIL held.
unsafe impl Send for Globals {}
unsafe impl Sync for Globals {}

static GLOBALS: OnceLock<Globals> = OnceLock::new();

#[inline(always)]
pub fn globals() -> Option<&'static Globals> {
    GLOBALS.get()
}

/// The globals, or a RuntimeError when `fastmodule._core` was not initialised.
pub fn require(py: Python<'_>) -> PyResult<&'static Globals> {
    let _ = py;
    GLOBALS
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("fastmodule._core is not initialised"))
}

fn intern(py: Python<'_>, s: &str) -> *mut capi::PyObject {
    PyString::intern(py, s).into_ptr()
}

fn class_entry(cls: &Bound<'_, PyType>, name: &str) -> PyResult<*mut capi::PyObject> {
    // Read the class __dict__ itself (not getattr) so a descriptor's __get__
    // does not run: we want the very object the MRO lookup returns.
    let d = cls.getattr("__dict__")?;
    Ok(d.get_item(name)?.into_ptr())
}

pub fn init(py: Python<'_>, fast_module: &Bound<'_, PyType>) -> PyResult<()> {
    if GLOBALS.get().is_some() {
        return Ok(());
    }
    let torch = py.import("torch")?;
    let nn = py.import("torch.nn")?;
    let module_mod = py.import("torch.nn.modules.module")?;
    let nn_module = nn.getattr("Module")?.cast_into::<PyType>()?;
    if !fast_module.is_subclass(&nn_module)? {
        return Err(PyRuntimeError::new_err(
            "fastmodule.Module must subclass torch.nn.Module",
        ));
    }
    let builtins = py.import("builtins")?;
    let object = builtins.getattr("object")?.cast_into::<PyType>()?;
    let collections = py.import("collections")?;
    let odict = collections.getattr("OrderedDict")?;
    let c = torch.getattr("_C")?;
    let (is_tracing_py, tracing_name) = match c.getattr("_is_tracing") {
        Ok(f) => (f, "_is_tracing"),
        Err(_) => (c.getattr("_get_tracing_state")?, "_get_tracing_state"),
    };
    let dict_of = |m: &Bound<'_, PyAny>| -> PyResult<*mut capi::PyObject> {
        Ok(m.getattr("__dict__")?.into_ptr())
    };
    let tracing_reads = [
        (
            module_mod.getattr("__dict__")?.into_ptr(),
            intern(py, "torch"),
            torch.clone().into_any().into_ptr(),
        ),
        (
            dict_of(torch.as_any())?,
            intern(py, "_C"),
            c.clone().into_ptr(),
        ),
        (
            dict_of(&c)?,
            intern(py, tracing_name),
            is_tracing_py.clone().into_ptr(),
        ),
    ];
    let module_globals = module_mod.getattr("__dict__")?.cast_into::<PyDict>()?;

    let orig = Originals {
        call: class_entry(&nn_module, "_wrapped_call_impl")?,
        call_impl: class_entry(&nn_module, "_call_impl")?,
        getattr: class_entry(&nn_module, "__getattr__")?,
        setattr: class_entry(&nn_module, "__setattr__")?,
        delattr: class_entry(&nn_module, "__delattr__")?,
        register_parameter: class_entry(&nn_module, "register_parameter")?,
        register_buffer: class_entry(&nn_module, "register_buffer")?,
        add_module: class_entry(&nn_module, "add_module")?,
        register_module: class_entry(&nn_module, "register_module")?,
        object_getattribute: class_entry(&object, "__getattribute__")?,
        object_class: class_entry(&object, "__class__")?,
        type_name: class_entry(
            &builtins.getattr("type")?.cast_into::<PyType>()?,
            "__name__",
        )?,
        bodies: Default::default(),
    };
    let mut orig = orig;
    // SAFETY: strong references held for the process; the GIL is held.
    orig.bodies = orig.bodies_of().map(|f| unsafe { Body::of(f) });
    let names = Names {
        parameters: intern(py, "_parameters"),
        buffers: intern(py, "_buffers"),
        modules: intern(py, "_modules"),
        non_persistent: intern(py, "_non_persistent_buffers_set"),
        compiled_call_impl: intern(py, "_compiled_call_impl"),
        call_impl: intern(py, "_call_impl"),
        forward: intern(py, "forward"),
        instance_hooks: [
            intern(py, "_backward_hooks"),
            intern(py, "_backward_pre_hooks"),
            intern(py, "_forward_hooks"),
            intern(py, "_forward_pre_hooks"),
        ],
        hook_sets: [
            intern(py, "_forward_pre_hooks_with_kwargs"),
            intern(py, "_forward_hooks_with_kwargs"),
            intern(py, "_forward_hooks_always_called"),
        ],
        global_hooks: [
            intern(py, "_global_backward_pre_hooks"),
            intern(py, "_global_backward_hooks"),
            intern(py, "_global_forward_hooks"),
            intern(py, "_global_forward_pre_hooks"),
            intern(py, "_global_forward_hooks_with_kwargs"),
            intern(py, "_global_forward_hooks_always_called"),
        ],
        global_param_reg_hooks: intern(py, "_global_parameter_registration_hooks"),
        global_module_reg_hooks: intern(py, "_global_module_registration_hooks"),
        global_buffer_reg_hooks: intern(py, "_global_buffer_registration_hooks"),
        register_parameter: intern(py, "register_parameter"),
        add_module: intern(py, "add_module"),
        dunder_class: intern(py, "__class__"),
        dunder_name: intern(py, "__name__"),
        dunder_call: intern(py, "__call__"),
        dunder_getattr: intern(py, "__getattr__"),
        dunder_getattribute: intern(py, "__getattribute__"),
        dunder_setattr: intern(py, "__setattr__"),
        dunder_delattr: intern(py, "__delattr__"),
        torch_function: intern(py, "__torch_function__"),
        grad_fn: intern(py, "grad_fn"),
        empty: intern(py, ""),
        dot: intern(py, "."),
    };
    let g = Globals {
        nn_module: nn_module.into_ptr() as *mut capi::PyTypeObject,
        fast_module: fast_module.clone().into_ptr() as *mut capi::PyTypeObject,
        parameter: nn.getattr("Parameter")?.into_ptr() as *mut capi::PyTypeObject,
        tensor: torch.getattr("Tensor")?.into_ptr() as *mut capi::PyTypeObject,
        script_module: py.import("torch.jit")?.getattr("ScriptModule")?.into_ptr(),
        odict: odict.into_ptr() as *mut capi::PyTypeObject,
        orig,
        module_globals: module_globals.into_ptr(),
        typename: torch.getattr("typename")?.into_ptr(),
        is_tracing_py: is_tracing_py.into_ptr(),
        names,
        tracing_reads,
        tracing_checked: crate::cpython::validity::Checked::new(),
    };
    // A concurrent init (impossible under the GIL) would only leak references.
    let _ = GLOBALS.set(g);
    Ok(())
}
