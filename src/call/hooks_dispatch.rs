//! A module call with forward hooks, step by step as torch's `_call_impl`
//! runs it, without its frames: global then per-module forward pre-hooks
//! (`with_kwargs` ones get and may replace `kwargs`), `forward`, global then
//! per-module forward hooks, and on an exception the `always_call` forward
//! hooks that did not run yet, then the exception again.
//!
//! The module call decides to come here only when no backward hook (module
//! or global) is registered and every registry is a plain dict or
//! `OrderedDict`; everything else runs torch's code. From then on every read
//! is the one `_call_impl` makes, when it makes it: the registries and their
//! `with_kwargs`/`always_call` sets are read live, the hook lists are
//! snapshots taken where torch builds its tuples (a hook added during the
//! pre-hooks is not run in this call; one added before the forward hooks
//! start is), and `forward` is the one read before any hook ran.
use crate::call::module_call::{ForwardCall, Hooks};
use crate::cpython::exceptions;
use crate::cpython::validity::{caches_on, Key};
use crate::cpython::{capi, Owned};
use crate::instance::attributes::{instance_dict, plain_attr, Plain};
use crate::torch_api::hook_support::{GlobalName, HookSupport};
use crate::torch_api::hooks::{snapshot_items, unpack_pair, Pairs};

type R<T> = Result<T, ()>;

/// `_call_impl`'s locals that its `except` block reads.
struct State {
    args: Owned,
    kwargs: Owned,
    /// None: `result` is still Python's None.
    result: Option<Owned>,
    /// `called_always_called_hooks`, made when the first id is added.
    called: Option<Owned>,
}

#[inline(always)]
unsafe fn own(p: *mut capi::PyObject) -> R<Owned> {
    Owned::from_owned_ptr(p).ok_or(())
}

/// The module being called, with what the call decision already found of its
/// hook registries: valid while its instance dict and class are unchanged
/// (their key), re-read as torch reads them otherwise.
pub struct Instance {
    slf: *mut capi::PyObject,
    tp: *mut capi::PyTypeObject,
    key: Option<Key>,
    found: Hooks,
}

/// Indexes into [`Hooks`].
const FORWARD_HOOKS: usize = 2;
const FORWARD_PRE_HOOKS: usize = 3;
const PRE_WITH_KWARGS: usize = 4;
const WITH_KWARGS: usize = 5;
const ALWAYS_CALLED: usize = 6;

impl Instance {
    /// `found` was read from `dict` (the instance dict of `slf`) and `tp` just
    /// now, by the call decision or from the call cache it validated.
    pub unsafe fn new(
        slf: *mut capi::PyObject,
        tp: *mut capi::PyTypeObject,
        dict: *mut capi::PyObject,
        found: Hooks,
    ) -> Instance {
        let key = if caches_on() && !dict.is_null() {
            Key::now(tp, dict)
        } else {
            None
        };
        Instance {
            slf,
            tp,
            key,
            found,
        }
    }

    /// `self.<name>` for the registry at `index` of [`Hooks`].
    #[inline(always)]
    unsafe fn attr(&self, index: usize, name: *mut capi::PyObject) -> R<Owned> {
        let p = self.found[index];
        if let Some(key) = self.key {
            if !p.is_null()
                && capi::Py_TYPE(self.slf) == self.tp
                && instance_dict(self.slf) == key.dict
                && Key::now(self.tp, key.dict) == Some(key)
            {
                return Ok(Owned::new_ref(p));
            }
        }
        self_attr(self.slf, name)
    }
}

/// `self.<name>`: from the instance dict when that is exactly what
/// `object.__getattribute__` finds and the class reads with it, else through
/// the object's own lookup. The class is asked here, at each read: a hook or
/// `forward` can have given it (or a mixin base) a `__getattribute__` during
/// this call, and torch's `_call_impl` reads the hook dicts through it.
unsafe fn self_attr(slf: *mut capi::PyObject, name: *mut capi::PyObject) -> R<Owned> {
    let tp = capi::Py_TYPE(slf);
    let plain = crate::torch_api::originals::globals()
        .is_some_and(|g| crate::instance::fast::plain_getattribute(g, tp));
    if plain {
        match plain_attr(tp, instance_dict(slf), name) {
            Plain::Found(v) => return Ok(Owned::new_ref(v)),
            Plain::Error => return Err(()),
            Plain::Unusual => {}
        }
    }
    own(capi::PyObject_GetAttr(slf, name))
}

#[inline(always)]
unsafe fn truthy(o: &Owned) -> R<bool> {
    match capi::PyObject_IsTrue(o.as_ptr()) {
        -1 => Err(()),
        t => Ok(t == 1),
    }
}

/// `key in container`.
#[inline(always)]
unsafe fn contains(container: &Owned, key: &Owned) -> R<bool> {
    match capi::PySequence_Contains(container.as_ptr(), key.as_ptr()) {
        -1 => Err(()),
        t => Ok(t == 1),
    }
}

/// `isinstance(obj, tuple)`.
#[inline(always)]
unsafe fn is_tuple(obj: *mut capi::PyObject) -> R<bool> {
    if capi::PyTuple_Check(obj) != 0 {
        return Ok(true);
    }
    match capi::PyObject_IsInstance(obj, std::ptr::addr_of_mut!(capi::PyTuple_Type).cast()) {
        -1 => Err(()),
        t => Ok(t == 1),
    }
}

/// `hook(*args)`; None for Python's None.
#[inline(always)]
unsafe fn call_hook(hook: &Owned, args: &[*mut capi::PyObject]) -> R<Option<Owned>> {
    let r = own(capi::PyObject_Vectorcall(
        hook.as_ptr(),
        args.as_ptr(),
        args.len(),
        std::ptr::null_mut(),
    ))?;
    Ok((r.as_ptr() != capi::Py_None()).then_some(r))
}

/// `if _global_x or self._x:` then `(*_global_x.items(), *self._x.items())`:
/// the pairs to run, or None when both registries are empty. `self._x` is
/// read as often as torch reads it (once for the test unless the global one
/// is true, once more for the snapshot): a registry that is a property sees
/// the same calls.
unsafe fn hooks_to_run(
    s: &HookSupport,
    inst: &Instance,
    global: GlobalName,
    index: usize,
    name: *mut capi::PyObject,
) -> R<Option<impl Iterator<Item = (Owned, Owned)>>> {
    let global = s.global(global)?;
    if !truthy(&global)? && !truthy(&inst.attr(index, name)?)? {
        return Ok(None);
    }
    // `(*_global_x.items(), *self._x.items())`: the global registry's items
    // are taken (which may run code, for a registry that is not a plain dict
    // or OrderedDict) before `self._x` is read.
    let mut out = Pairs::new();
    snapshot_items(global.as_ptr(), s, &mut out)?;
    drop(global);
    let own = inst.attr(index, name)?;
    snapshot_items(own.as_ptr(), s, &mut out)?;
    Ok(Some(out.into_pairs()))
}

/// Run the call. `args` is the call's positional tuple, `kwargs` a fresh
/// dict of its keyword arguments (the ones hooks see and may change).
pub unsafe fn call(
    s: &HookSupport,
    inst: &Instance,
    forward: ForwardCall,
    args: Owned,
    kwargs: Owned,
) -> *mut capi::PyObject {
    let compiling = match s.compiling.now() {
        Ok(c) => c,
        Err(()) => return std::ptr::null_mut(),
    };
    let mut st = State {
        args,
        kwargs,
        result: None,
        called: None,
    };
    match inner(s, inst, &forward, &mut st) {
        Ok(r) => return r.into_ptr(),
        Err(()) if compiling => return std::ptr::null_mut(),
        Err(()) => {}
    }
    let Some(exc) = exceptions::take_raised() else {
        return std::ptr::null_mut();
    };
    if !exceptions::is_exception(&exc) {
        exceptions::reraise(exc);
        return std::ptr::null_mut();
    }
    if exceptions::while_handling(&exc, || always_called(s, inst, &mut st)).is_ok() {
        exceptions::reraise(exc);
    }
    std::ptr::null_mut()
}

/// `inner()`.
unsafe fn inner(
    s: &HookSupport,
    inst: &Instance,
    forward: &ForwardCall,
    st: &mut State,
) -> R<Owned> {
    let slf = inst.slf;
    let n = &s.names;
    let pre = hooks_to_run(
        s,
        inst,
        GlobalName::PreHooks,
        FORWARD_PRE_HOOKS,
        n.forward_pre_hooks,
    )?;
    for (id, hook) in pre.into_iter().flatten() {
        pre_hook(s, inst, st, &id, &hook)?;
    }

    let result = forward.call(s, slf, &st.args, &st.kwargs)?;
    st.result = Some(result);

    let post = hooks_to_run(s, inst, GlobalName::Hooks, FORWARD_HOOKS, n.forward_hooks)?;
    for (id, hook) in post.into_iter().flatten() {
        post_hook(s, inst, st, &id, &hook)?;
    }
    Ok(st
        .result
        .take()
        .unwrap_or_else(|| Owned::new_ref(capi::Py_None())))
}

/// One forward pre-hook of `inner()`'s loop.
unsafe fn pre_hook(
    s: &HookSupport,
    inst: &Instance,
    st: &mut State,
    id: &Owned,
    hook: &Owned,
) -> R<()> {
    let slf = inst.slf;
    let with_kwargs = inst.attr(PRE_WITH_KWARGS, s.names.forward_pre_hooks_with_kwargs)?;
    if contains(&with_kwargs, id)? {
        drop(with_kwargs);
        let r = call_hook(hook, &[slf, st.args.as_ptr(), st.kwargs.as_ptr()])?;
        let Some(r) = r else { return Ok(()) };
        if is_tuple(r.as_ptr())? && capi::PyObject_Size(r.as_ptr()) == 2 {
            let (a, k) = unpack_pair(r.as_ptr(), s)?;
            st.args = a;
            st.kwargs = k;
            return Ok(());
        }
        if capi::PyErr_Occurred().is_null() {
            bad_pre_hook_return(&r);
        }
        return Err(());
    }
    drop(with_kwargs);
    let Some(r) = call_hook(hook, &[slf, st.args.as_ptr()])? else {
        return Ok(());
    };
    st.args = if is_tuple(r.as_ptr())? {
        r
    } else {
        own(capi::PyTuple_Pack(1, r.as_ptr()))?
    };
    Ok(())
}

/// torch's RuntimeError for a `with_kwargs` pre-hook's result that is
/// neither None nor a pair (set as the current exception).
unsafe fn bad_pre_hook_return(r: &Owned) {
    let Ok(text) = own(capi::PyObject_Format(r.as_ptr(), std::ptr::null_mut())) else {
        return;
    };
    let Ok(message) = own(capi::PyUnicode_FromFormat(
        c"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got %U."
            .as_ptr(),
        text.as_ptr(),
    )) else {
        return;
    };
    capi::PyErr_SetObject(capi::PyExc_RuntimeError, message.as_ptr());
}

#[inline(always)]
unsafe fn result_ptr(st: &State) -> *mut capi::PyObject {
    st.result.as_ref().map_or(capi::Py_None(), Owned::as_ptr)
}

/// `called_always_called_hooks.add(hook_id)`.
unsafe fn mark_called(st: &mut State, id: &Owned) -> R<()> {
    if st.called.is_none() {
        st.called = Some(own(capi::PySet_New(std::ptr::null_mut()))?);
    }
    let set = st
        .called
        .as_ref()
        .map_or(std::ptr::null_mut(), Owned::as_ptr);
    if capi::PySet_Add(set, id.as_ptr()) < 0 {
        return Err(());
    }
    Ok(())
}

/// One forward hook of `inner()`'s loop.
unsafe fn post_hook(
    s: &HookSupport,
    inst: &Instance,
    st: &mut State,
    id: &Owned,
    hook: &Owned,
) -> R<()> {
    let slf = inst.slf;
    let n = &s.names;
    let always = contains(
        &inst.attr(ALWAYS_CALLED, n.forward_hooks_always_called)?,
        id,
    )? || contains(&s.global(GlobalName::AlwaysCalled)?, id)?;
    if always {
        mark_called(st, id)?;
    }
    let with_kwargs = contains(&inst.attr(WITH_KWARGS, n.forward_hooks_with_kwargs)?, id)?
        || contains(&s.global(GlobalName::WithKwargs)?, id)?;
    let r = if with_kwargs {
        call_hook(
            hook,
            &[slf, st.args.as_ptr(), st.kwargs.as_ptr(), result_ptr(st)],
        )?
    } else {
        call_hook(hook, &[slf, st.args.as_ptr(), result_ptr(st)])?
    };
    if r.is_some() {
        st.result = r;
    }
    Ok(())
}

/// `hook_id not in called_always_called_hooks`.
unsafe fn not_called(st: &State, id: &Owned) -> R<bool> {
    match &st.called {
        None => Ok(true),
        Some(set) => contains(set, id).map(|c| !c),
    }
}

/// The `except Exception:` block: the `always_call` hooks not run yet, global
/// ones then the module's, each iterated live (`.items()`, as torch does
/// there). A hook's own exception becomes a warning; Err(()) when something
/// else raised (that exception then replaces the original).
unsafe fn always_called(s: &HookSupport, inst: &Instance, st: &mut State) -> R<()> {
    let slf = inst.slf;
    let n = &s.names;
    let global = s.global(GlobalName::Hooks)?;
    for_each_item(s, &global, |id, hook| {
        let run = contains(&s.global(GlobalName::AlwaysCalled)?, id)? && not_called(st, id)?;
        if run {
            let r = call_hook(hook, &[slf, st.args.as_ptr(), result_ptr(st)]);
            settle(s, st, r, c"global module forward hook")?;
        }
        Ok(())
    })?;
    let module = inst.attr(FORWARD_HOOKS, n.forward_hooks)?;
    for_each_item(s, &module, |id, hook| {
        let run = contains(
            &inst.attr(ALWAYS_CALLED, n.forward_hooks_always_called)?,
            id,
        )? && not_called(st, id)?;
        if run {
            let with_kwargs = contains(&inst.attr(WITH_KWARGS, n.forward_hooks_with_kwargs)?, id);
            let r = with_kwargs.and_then(|k| {
                if k {
                    call_hook(
                        hook,
                        &[slf, st.args.as_ptr(), st.kwargs.as_ptr(), result_ptr(st)],
                    )
                } else {
                    call_hook(hook, &[slf, st.args.as_ptr(), result_ptr(st)])
                }
            });
            settle(s, st, r, c"module forward hook")?;
        }
        Ok(())
    })
}

/// `for hook_id, hook in registry.items(): body(...)`.
unsafe fn for_each_item(
    s: &HookSupport,
    registry: &Owned,
    mut body: impl FnMut(&Owned, &Owned) -> R<()>,
) -> R<()> {
    let items = own(capi::PyObject_CallMethodObjArgs(
        registry.as_ptr(),
        s.names.items,
        std::ptr::null_mut::<capi::PyObject>(),
    ))?;
    let it = own(capi::PyObject_GetIter(items.as_ptr()))?;
    while let Some(pair) = Owned::from_owned_ptr(capi::PyIter_Next(it.as_ptr())) {
        let (id, hook) = unpack_pair(pair.as_ptr(), s)?;
        body(&id, &hook)?;
    }
    if capi::PyErr_Occurred().is_null() {
        Ok(())
    } else {
        Err(())
    }
}

/// After an `always_call` hook in the `except` block: its result replaces
/// `result` unless None; its `Exception` becomes torch's warning
/// (`try: ... except Exception as e: warnings.warn(...)`), anything else
/// propagates.
unsafe fn settle(
    s: &HookSupport,
    st: &mut State,
    r: R<Option<Owned>>,
    which: &std::ffi::CStr,
) -> R<()> {
    match r {
        Ok(Some(v)) => {
            st.result = Some(v);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(()) => {
            let Some(e) = exceptions::take_raised() else {
                return Err(());
            };
            if !exceptions::is_exception(&e) {
                exceptions::reraise(e);
                return Err(());
            }
            exceptions::while_handling(&e, || {
                let text = own(capi::PyObject_Str(e.as_ptr()))?;
                let message = own(capi::PyUnicode_FromFormat(
                    c"%s with ``always_call=True`` raised an exception that was silenced as \
                      another error was raised in forward: %U"
                        .as_ptr(),
                    which.as_ptr(),
                    text.as_ptr(),
                ))?;
                s.warn(message.as_ptr())
            })
        }
    }
}
