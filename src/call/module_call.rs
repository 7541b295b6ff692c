//! Calling a module: the decision torch's `_wrapped_call_impl` and
//! `_call_impl` make, without a Python frame.
//!
//! Fast path (no `module.compile()`, not jit-tracing, no PEP 523 evaluator,
//! all 8 hook dicts empty): call `self.forward` directly, as `_call_impl`
//! does. With forward (pre-)hooks only, module or global, and the native
//! hook dispatch on: `crate::call::hooks_dispatch` runs `_call_impl`'s hook
//! logic. Anything else (backward hooks, tracing, compilation, ...) runs
//! torch's own `_wrapped_call_impl`, so it behaves as stock by construction.
//!
//! Two entry points share it: the `tp_call` slot of fastmodule classes, and
//! the vectorcall of torch's `_wrapped_call_impl` function (reached when the
//! slot was reset by a patch of `nn.Module.__call__`, or when code calls
//! `nn.Module.__call__` explicitly); the latter also re-installs the slot.
use crate::call::frames::Frames;
use crate::cpython::capi;
use crate::cpython::private_api::custom_eval_frame;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::Owned;
use crate::instance::attributes::{call_with_self, instance_dict, plain_attr, Plain};
use crate::torch_api::hook_support;
use crate::torch_api::hooks::{global_call_hooks, hook_dict_len, GlobalHooks};
use crate::torch_api::jit_tracing::is_tracing;
use crate::torch_api::originals::{globals, Globals};

enum Decision {
    Forward,
    /// Forward (pre-)hooks only: the native hook dispatch runs the call.
    Hooks,
    Stock(Why),
    Error,
}

/// Why a module call runs torch's `_wrapped_call_impl` (reported by
/// [`handover_reason`]; the call itself only needs to know that it does).
#[derive(Clone, Copy)]
pub enum Why {
    NoInstanceDict,
    UnusualClassDict,
    CallImplOverridden,
    GetattributeOverridden,
    Compiled,
    UnusualInstanceDict,
    FrameEvaluator,
    Tracer,
    JitTracing,
    BackwardHooks,
    GlobalBackwardHooks,
    UnusualHookRegistry,
    ForwardHooksOff,
    CountsFrames,
    ForwardRunsCode,
    BodyReplaced,
    TorchReplaced,
    WarnReplaced,
}

impl Why {
    /// The reason in words, for `fastmodule check`'s report.
    pub fn text(self) -> &'static str {
        match self {
            Why::NoInstanceDict => "the module has no instance __dict__",
            Why::UnusualClassDict => {
                "a class in its MRO has a key that is not a str in its __dict__ (a lookup \
                 there may run that key's __eq__)"
            }
            Why::CallImplOverridden => "its class overrides _call_impl",
            Why::GetattributeOverridden => "its class overrides __getattribute__",
            Why::Compiled => "module.compile() was used on it",
            Why::UnusualInstanceDict => {
                "its __dict__ is unusual (a key that is not a str, or a hook registry \
                 shadowed or missing)"
            }
            Why::FrameEvaluator => "a PEP 523 frame evaluator (torch.compile) is active",
            Why::Tracer => "a trace or profile function is set (debugger, profiler, coverage)",
            Why::JitTracing => "torch.jit.trace is running",
            Why::BackwardHooks => "it has backward hooks",
            Why::GlobalBackwardHooks => "global backward hooks are registered",
            Why::UnusualHookRegistry => {
                "a hook registry (its own or module.py's global one) is not a dict or \
                 OrderedDict"
            }
            Why::ForwardHooksOff => {
                "it has forward hooks (its own or global ones) and the native hook dispatch \
                 is off: fastmodule.diagnostics() says why"
            }
            Why::WarnReplaced => {
                "it has forward hooks and module.py's warnings.warn is not CPython's own \
                 (torch's _call_impl runs, with the frames a wrapper may read)"
            }
            Why::TorchReplaced => {
                "module.py's torch, torch._C or its _is_tracing is not the object torch \
                 installed (a proxy or patch sees every read)"
            }
            Why::BodyReplaced => {
                "torch's _wrapped_call_impl or _call_impl has had its __code__ or defaults \
                 replaced since import, so that code runs"
            }
            Why::ForwardRunsCode => {
                "reading its `forward` may run code (a property or another descriptor, or \
                 no class attribute): torch's _call_impl reads it before it looks at the \
                 hooks, which that code may register"
            }
            Why::CountsFrames => {
                "its forward is torch's and counts its caller's frames (a warning's \
                 stacklevel; for the softmax family only while dim is None), so torch's \
                 call frames are kept"
            }
        }
    }
}

/// The 4 per-module hook registries, in `_call_impl`'s order, then the 3
/// sets of hook ids the hook dispatch asks about (null where one is not
/// found plainly: the dispatch then reads it as torch does); borrowed.
pub type Hooks = [*mut capi::PyObject; 7];

/// What depends only on the instance `__dict__` and the class (so the call
/// cache may remember it): the class runs torch's `_call_impl` and
/// `object.__getattribute__` (the attribute reads `_wrapped_call_impl` and
/// `_call_impl` make), `_compiled_call_impl` is None, and where the hook
/// registries are. Err carries the reason to hand over. Reads only a quiet
/// instance dict (`plain_attr`), so no code runs meanwhile.
#[inline(always)]
unsafe fn resolve(
    g: &Globals,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
) -> Result<Hooks, Decision> {
    if dict.is_null() {
        return Err(Decision::Stock(Why::NoInstanceDict));
    }
    let n = &g.names;
    let call_impl = type_lookup(tp, n.call_impl);
    if call_impl == crate::cpython::type_cache::unknown() {
        return Err(Decision::Stock(Why::UnusualClassDict));
    }
    if call_impl != g.orig.call_impl {
        return Err(Decision::Stock(Why::CallImplOverridden));
    }
    if type_lookup(tp, n.dunder_getattribute) != g.orig.object_getattribute {
        return Err(Decision::Stock(Why::GetattributeOverridden));
    }
    match plain_attr(tp, dict, n.compiled_call_impl) {
        Plain::Found(v) if v == capi::Py_None() => {}
        Plain::Found(_) => return Err(Decision::Stock(Why::Compiled)),
        Plain::Error => return Err(Decision::Error),
        Plain::Unusual => return Err(Decision::Stock(Why::UnusualInstanceDict)),
    }
    // `self._call_impl(*args, **kwargs)`: a function is a non-data
    // descriptor, so an instance-dict entry of that name (one module's call
    // wrapped by a tool) is what torch calls. The dict is quiet (checked by
    // the read above).
    if !crate::instance::walk_facts::dict_get(tp, dict, n.call_impl).is_null() {
        return Err(Decision::Stock(Why::CallImplOverridden));
    }
    if !capi::PyErr_Occurred().is_null() {
        return Err(Decision::Error);
    }
    let mut hooks: Hooks = [std::ptr::null_mut(); 7];
    for (slot, &name) in hooks.iter_mut().zip(n.instance_hooks.iter()) {
        match plain_attr(tp, dict, name) {
            Plain::Found(h) => *slot = h,
            Plain::Error => return Err(Decision::Error),
            Plain::Unusual => return Err(Decision::Stock(Why::UnusualInstanceDict)),
        }
    }
    for (slot, &name) in hooks[4..].iter_mut().zip(n.hook_sets.iter()) {
        match plain_attr(tp, dict, name) {
            Plain::Found(h) => *slot = h,
            Plain::Error => return Err(Decision::Error),
            Plain::Unusual => {}
        }
    }
    Ok(hooks)
}

/// The checks that read live state on every call: a PEP 523 evaluator, a
/// trace or profile function (debuggers, profilers and coverage then see
/// torch's frames), jit tracing, and what the 8 hook registries hold: all
/// empty (the fast path), forward (pre-)hooks only in plain dicts (the
/// native hook dispatch, when it is on), anything else (torch's code).
#[inline(always)]
unsafe fn live(g: &Globals, hooks: &Hooks) -> Decision {
    if custom_eval_frame() {
        return Decision::Stock(Why::FrameEvaluator);
    }
    // The call path reproduces these two functions: not once their code is
    // another (a hot-reload tool, a test double), which stock then runs.
    if !g.orig.call_intact() {
        return Decision::Stock(Why::BodyReplaced);
    }
    if !g.torch_reads_intact() {
        return Decision::Stock(Why::TorchReplaced);
    }
    if crate::cpython::tracer::active() {
        return Decision::Stock(Why::Tracer);
    }
    match is_tracing(g) {
        Ok(false) => {}
        Ok(true) => return Decision::Stock(Why::JitTracing),
        Err(()) => return Decision::Error,
    }
    // `hooks` is in `_call_impl`'s order: the two backward registries first.
    let mut forward_hooks = false;
    for (i, &h) in hooks[..4].iter().enumerate() {
        match hook_dict_len(h, g.odict) {
            Some(0) => {}
            Some(_) if i >= 2 => forward_hooks = true,
            Some(_) => return Decision::Stock(Why::BackwardHooks),
            None => return Decision::Stock(Why::UnusualHookRegistry),
        }
    }
    match global_call_hooks(g) {
        Ok(GlobalHooks::None) => {}
        Ok(GlobalHooks::Forward) => forward_hooks = true,
        Ok(GlobalHooks::Backward) => return Decision::Stock(Why::GlobalBackwardHooks),
        Ok(GlobalHooks::Unusual) => return Decision::Stock(Why::UnusualHookRegistry),
        Err(()) => return Decision::Error,
    }
    match (forward_hooks, hook_support::get()) {
        (false, _) => Decision::Forward,
        (true, Some(s)) if s.warn_intact() => Decision::Hooks,
        (true, Some(_)) => Decision::Stock(Why::WarnReplaced),
        (true, None) => Decision::Stock(Why::ForwardHooksOff),
    }
}

/// The positional/keyword arguments of the module call, in either calling
/// convention, so neither path copies them.
#[derive(Clone, Copy)]
enum Args {
    /// `tp_call`: self separately, an args tuple and a kwargs dict (or null).
    Tuple(*mut capi::PyObject, *mut capi::PyObject),
    /// vectorcall of `_wrapped_call_impl`: `args[0]` is self.
    Vector(*const *mut capi::PyObject, usize, *mut capi::PyObject),
}

impl Args {
    /// `func(self, *args, **kwargs)`.
    #[inline(always)]
    unsafe fn call_with_self(
        self,
        func: *mut capi::PyObject,
        slf: *mut capi::PyObject,
    ) -> *mut capi::PyObject {
        match self {
            Args::Tuple(a, k) => call_with_self(func, slf, a, k),
            Args::Vector(v, n, kw) => capi::PyObject_Vectorcall(func, v, n, kw),
        }
    }
    /// The only argument of a call with one positional argument and no
    /// keywords.
    #[inline(always)]
    unsafe fn single(self) -> Option<*mut capi::PyObject> {
        match self {
            Args::Tuple(a, k) => {
                let no_kw = k.is_null() || capi::PyDict_Size(k) == 0;
                (no_kw && capi::PyTuple_GET_SIZE(a) == 1).then(|| capi::PyTuple_GET_ITEM(a, 0))
            }
            Args::Vector(v, n, kw) => {
                let no_kw = kw.is_null() || capi::PyTuple_GET_SIZE(kw) == 0;
                (no_kw && n == 2).then(|| *v.add(1))
            }
        }
    }

    /// The positional arguments as a tuple and the keyword arguments as a
    /// fresh dict, as `_call_impl(self, *args, **kwargs)` receives them.
    unsafe fn tuple_and_dict(self) -> Result<(Owned, Owned), ()> {
        let new = |p| Owned::from_owned_ptr(p).ok_or(());
        match self {
            Args::Tuple(a, k) => {
                let kwargs = if k.is_null() {
                    capi::PyDict_New()
                } else {
                    capi::PyDict_Copy(k)
                };
                Ok((Owned::new_ref(a), new(kwargs)?))
            }
            Args::Vector(v, n, kw) => {
                let t = new(capi::PyTuple_New((n - 1) as capi::Py_ssize_t))?;
                for i in 1..n {
                    let x = *v.add(i);
                    capi::Py_INCREF(x);
                    capi::PyTuple_SET_ITEM(t.as_ptr(), (i - 1) as capi::Py_ssize_t, x);
                }
                let d = new(capi::PyDict_New())?;
                let nkw = if kw.is_null() {
                    0
                } else {
                    capi::PyTuple_GET_SIZE(kw) as usize
                };
                for j in 0..nkw {
                    let key = capi::PyTuple_GET_ITEM(kw, j as capi::Py_ssize_t);
                    if capi::PyDict_SetItem(d.as_ptr(), key, *v.add(n + j)) < 0 {
                        return Err(());
                    }
                }
                Ok((t, d))
            }
        }
    }

    /// `func(*args, **kwargs)`.
    unsafe fn call(self, func: *mut capi::PyObject) -> *mut capi::PyObject {
        match self {
            Args::Tuple(a, k) => capi::PyObject_Call(func, a, k),
            // No PY_VECTORCALL_ARGUMENTS_OFFSET: the array is our caller's.
            Args::Vector(v, n, kw) => capi::PyObject_Vectorcall(func, v.add(1), n - 1, kw),
        }
    }
}

/// Where `self.forward` comes from, found as `object.__getattribute__`
/// would find it (borrowed; `resolve` found the instance dict quiet, so the
/// lookups run no code and the class attribute stays valid across them).
enum Found {
    /// The instance `__dict__`'s `forward`.
    Instance(*mut capi::PyObject),
    /// The class's Python function `forward`.
    ClassFunction(*mut capi::PyObject),
    /// Anything else: only `getattr(self, "forward")` can tell, and that
    /// read may run code (a descriptor's `__get__`, `__getattr__`). torch's
    /// `_call_impl` makes it before it reads the hook dicts (and the tracing
    /// state): the native call, which has read them already, hands such a
    /// call to torch's `_wrapped_call_impl` before anything of it ran.
    Generic,
}

unsafe fn find_forward(
    g: &Globals,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
) -> Result<Found, ()> {
    let name = g.names.forward;
    let descr = type_lookup(tp, name);
    let data_descr = !descr.is_null()
        && crate::cpython::types::descr_slots(capi::Py_TYPE(descr))
            .1
            .is_some();
    if !data_descr {
        let inst = capi::PyDict_GetItemWithError(dict, name);
        if !inst.is_null() {
            return Ok(Found::Instance(inst));
        }
        if !capi::PyErr_Occurred().is_null() {
            return Err(());
        }
        if !descr.is_null() && capi::PyFunction_Check(descr) != 0 {
            return Ok(Found::ClassFunction(descr));
        }
    }
    Ok(Found::Generic)
}

/// Why a call stops before `forward` runs.
enum Stop {
    /// torch's `_wrapped_call_impl` runs it: its forward needs torch's frames.
    HandOver,
    /// A Python exception is set.
    Raised,
}

/// A class function `forward` just found for a native call: the call cache
/// remembers it, with what it needs of torch's call frames (its entry, or
/// null); Err before any code of the call ran.
///
/// `forward` (borrowed from the class), `dict` and `hooks` (borrowed from
/// the instance) are read while no code ran since the decision. A code
/// object not classified yet is classified here by Python code, during
/// which a finalizer (the cyclic GC runs on allocations) may change the
/// class or the instance dict and free what was read: then the call hands
/// over to torch's `_wrapped_call_impl`, which reads everything afresh, and
/// nothing read before is used (the next call finds the answer remembered).
unsafe fn remember_forward(
    slf: *mut capi::PyObject,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    hooks: &Hooks,
    forward: *mut capi::PyObject,
    hooked: bool,
) -> Result<*mut crate::call::call_cache::Entry, Stop> {
    let Some(frames) = crate::call::frames::known(forward) else {
        crate::call::frames::of(forward).map_err(|()| Stop::Raised)?;
        return Err(Stop::HandOver);
    };
    let entry = crate::call::call_cache::store(tp, dict, *hooks, forward, frames);
    if crate::call::frames::needed(frames, slf, hooked) {
        return Err(Stop::HandOver);
    }
    Ok(entry)
}

/// `self.forward(*args, **kwargs)` with `self.forward` resolved as
/// `object.__getattribute__` would, but without creating a bound method;
/// None (before any code ran) for a forward that needs torch's call frames
/// or whose read may run code.
/// Out of line: the first call of an instance (the next are cached).
#[inline(never)]
unsafe fn call_forward(
    g: &Globals,
    slf: *mut capi::PyObject,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    args: Args,
    hooks: &Hooks,
) -> Option<*mut capi::PyObject> {
    match find_forward(g, tp, dict) {
        Ok(Found::Instance(inst)) => {
            capi::Py_INCREF(inst);
            let r = args.call(inst);
            capi::Py_DECREF(inst);
            Some(r)
        }
        Ok(Found::ClassFunction(descr)) => {
            match remember_forward(slf, tp, dict, hooks, descr, false) {
                Ok(entry) => Some(call_function(descr, slf, args, entry)),
                Err(Stop::HandOver) => None,
                Err(Stop::Raised) => Some(std::ptr::null_mut()),
            }
        }
        // Read before the hook dicts by torch's code (see `Found::Generic`).
        Ok(Found::Generic) => None,
        Err(()) => Some(std::ptr::null_mut()),
    }
}

/// `forward_call` of `_call_impl`: `self.forward`, read once before any
/// hook runs (a class function is kept unbound and called with `self`).
pub enum ForwardCall {
    Function(Owned),
    Object(Owned),
}

impl ForwardCall {
    /// `forward_call(*args, **kwargs)`: an exact tuple and dict directly
    /// (torch's layers without their frames, as the fast path); anything a
    /// hook put in their place through the star-call itself.
    pub unsafe fn call(
        &self,
        s: &hook_support::HookSupport,
        slf: *mut capi::PyObject,
        args: &Owned,
        kwargs: &Owned,
    ) -> Result<Owned, ()> {
        let (a, k) = (args.as_ptr(), kwargs.as_ptr());
        let plain = capi::PyTuple_CheckExact(a) != 0 && capi::PyDict_CheckExact(k) != 0;
        let r = match self {
            ForwardCall::Function(f) if plain => {
                let k = if capi::PyDict_Size(k) == 0 {
                    std::ptr::null_mut()
                } else {
                    k
                };
                call_function(f.as_ptr(), slf, Args::Tuple(a, k), std::ptr::null_mut())
            }
            ForwardCall::Object(o) if plain => capi::PyObject_Call(o.as_ptr(), a, k),
            ForwardCall::Function(f) => {
                let Some(get) = crate::cpython::types::descr_slots(capi::Py_TYPE(f.as_ptr())).0
                else {
                    return Err(());
                };
                let bound = Owned::from_owned_ptr(get(f.as_ptr(), slf, capi::Py_TYPE(slf).cast()))
                    .ok_or(())?;
                star_call(s, &bound, a, k)
            }
            ForwardCall::Object(o) => star_call(s, o, a, k),
        };
        Owned::from_owned_ptr(r).ok_or(())
    }
}

unsafe fn star_call(
    s: &hook_support::HookSupport,
    f: &Owned,
    a: *mut capi::PyObject,
    k: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let v = [f.as_ptr(), a, k];
    capi::PyObject_Vectorcall(s.star_call, v.as_ptr(), 3, std::ptr::null_mut())
}

/// A call with forward (pre-)hooks: `forward_call` read, the arguments as
/// `_call_impl` holds them (a tuple and a fresh kwargs dict), then
/// `crate::call::hooks_dispatch`. The call cache remembers the instance as
/// the fast path does (the hooks' contents are read live on every call).
/// None (before any code ran): torch's `_wrapped_call_impl` runs the call,
/// for a forward that needs torch's call frames. `cached`: the class
/// function `forward` and what it needs, from a valid call cache entry.
unsafe fn call_hooked(
    g: &Globals,
    slf: *mut capi::PyObject,
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    args: Args,
    hooks: &Hooks,
    cached: Option<(*mut capi::PyObject, Frames)>,
) -> Option<*mut capi::PyObject> {
    let s = hook_support::get()?;
    // What the decision found of the hook registries, keyed now, while no
    // code ran since it was read (`Instance` re-reads them once their key no
    // longer matches): reading `forward` below, a classification and the
    // argument tuple and dict (allocations, so finalizers) may run code.
    let instance = crate::call::hooks_dispatch::Instance::new(slf, tp, dict, *hooks);
    let forward = match cached {
        Some((f, frames)) => {
            if crate::call::frames::needed(frames, slf, true) {
                return None;
            }
            ForwardCall::Function(Owned::new_ref(f))
        }
        None => match find_forward(g, tp, dict) {
            Ok(Found::Instance(inst)) => ForwardCall::Object(Owned::new_ref(inst)),
            Ok(Found::ClassFunction(f)) => match remember_forward(slf, tp, dict, hooks, f, true) {
                Ok(_) => ForwardCall::Function(Owned::new_ref(f)),
                Err(Stop::HandOver) => return None,
                Err(Stop::Raised) => return Some(std::ptr::null_mut()),
            },
            // Read before the hook dicts by torch's code (see `Found::Generic`).
            Ok(Found::Generic) => return None,
            Err(()) => return Some(std::ptr::null_mut()),
        },
    };
    let Ok((a, k)) = args.tuple_and_dict() else {
        return Some(std::ptr::null_mut());
    };
    Some(crate::call::hooks_dispatch::call(
        s, &instance, forward, a, k,
    ))
}

/// `func(self, *args)` for a class-level Python function `forward`;
/// `entry` (or null) is the call cache's entry for `slf`, just validated.
#[inline(always)]
unsafe fn call_function(
    func: *mut capi::PyObject,
    slf: *mut capi::PyObject,
    args: Args,
    entry: *mut crate::call::call_cache::Entry,
) -> *mut capi::PyObject {
    // torch's own Sequential/Linear/ReLU forward, without its frame.
    if let Some(input) = args.single() {
        if let Some(r) = crate::call::layers::forward(func, slf, input, entry) {
            return r;
        }
    }
    // Keep the function alive even if the class attribute is replaced
    // during the call.
    capi::Py_INCREF(func);
    let r = args.call_with_self(func, slf);
    capi::Py_DECREF(func);
    r
}

/// Shared by both entry points: None means "run torch's function".
#[inline(always)]
unsafe fn fast_call(
    g: &Globals,
    slf: *mut capi::PyObject,
    args: Args,
) -> Option<*mut capi::PyObject> {
    if crate::instance::fast::switched_off() {
        return None;
    }
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    if let Some(e) = crate::call::call_cache::lookup(tp, dict) {
        let (hooks, forward, frames) = ((*e).hooks, (*e).forward, (*e).frames);
        return match live(g, &hooks) {
            // An entry stored when the call handed over has no forward yet.
            Decision::Forward if forward.is_null() => call_forward(g, slf, tp, dict, args, &hooks),
            Decision::Forward if crate::call::frames::needed(frames, slf, false) => None,
            Decision::Forward => Some(call_function(forward, slf, args, e)),
            Decision::Hooks => {
                let cached = (!forward.is_null()).then_some((forward, frames));
                call_hooked(g, slf, tp, dict, args, &hooks, cached)
            }
            Decision::Stock(_) => None,
            Decision::Error => Some(std::ptr::null_mut()),
        };
    }
    let decision = match resolve(g, tp, dict) {
        Ok(hooks) => match live(g, &hooks) {
            Decision::Forward => return call_forward(g, slf, tp, dict, args, &hooks),
            Decision::Hooks => return call_hooked(g, slf, tp, dict, args, &hooks, None),
            other => {
                // What `resolve` read holds while the dict and class are
                // unchanged: the next hand-over (a module with backward
                // hooks, say) skips it, so it costs no more than stock's.
                let null = std::ptr::null_mut();
                crate::call::call_cache::store(tp, dict, hooks, null, Frames::None);
                other
            }
        },
        Err(other) => other,
    };
    match decision {
        Decision::Error => Some(std::ptr::null_mut()),
        _ => None,
    }
}

/// Why a call of `slf` would hand over to torch's `_wrapped_call_impl` now
/// (None: it takes the native path), from the very checks the call makes;
/// Err(()) with a Python exception set. The caller has checked that `slf` is
/// a fastmodule instance whose class resolves `__call__` to torch's.
pub unsafe fn handover_reason(g: &Globals, slf: *mut capi::PyObject) -> Result<Option<Why>, ()> {
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    let decision = match resolve(g, tp, dict) {
        Ok(hooks) => live(g, &hooks),
        Err(other) => other,
    };
    let hooked = matches!(decision, Decision::Hooks);
    match decision {
        Decision::Forward | Decision::Hooks => match find_forward(g, tp, dict)? {
            Found::ClassFunction(f) => {
                let frames = crate::call::frames::of(f)?;
                Ok(crate::call::frames::needed(frames, slf, hooked).then_some(Why::CountsFrames))
            }
            Found::Instance(_) => Ok(None),
            Found::Generic => Ok(Some(Why::ForwardRunsCode)),
        },
        Decision::Stock(why) => Ok(Some(why)),
        Decision::Error => Err(()),
    }
}

/// `child(input)` for a module whose `tp_call` is fastmodule's slot, without
/// building an argument tuple (the slot's own decision, same fallback).
#[inline(always)]
pub unsafe fn call_one(
    child: *mut capi::PyObject,
    input: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let own = crate::call::slots::is_fn!(
        crate::cpython::types::call_slot(capi::Py_TYPE(child)),
        module_call as capi::ternaryfunc
    );
    if own {
        if let Some(g) = globals() {
            let args = [child, input];
            if let Some(r) = fast_call(
                g,
                child,
                Args::Vector(args.as_ptr(), 2, std::ptr::null_mut()),
            ) {
                return r;
            }
        }
    }
    capi::PyObject_CallOneArg(child, input)
}

/// The `tp_call` slot.
pub unsafe extern "C" fn module_call(
    slf: *mut capi::PyObject,
    args: *mut capi::PyObject,
    kwargs: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let Some(g) = globals() else {
        return crate::torch_api::errors::not_initialised();
    };
    match fast_call(g, slf, Args::Tuple(args, kwargs)) {
        Some(r) => r,
        None => call_with_self(g.orig.call, slf, args, kwargs),
    }
}

/// Native body of `nn.Module._wrapped_call_impl(self, *args, **kwargs)` for a
/// fastmodule instance; None means "run torch's function".
pub unsafe fn wrapped_call_impl(
    g: &Globals,
    args: *const *mut capi::PyObject,
    nargs: usize,
    kwnames: *mut capi::PyObject,
) -> Option<*mut capi::PyObject> {
    let slf = *args;
    crate::call::slots::rearm(g, capi::Py_TYPE(slf));
    fast_call(g, slf, Args::Vector(args, nargs, kwnames))
}
