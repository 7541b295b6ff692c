//! `load_state_dict`'s tree walk, in linear time, and the common case of
//! `_load_from_state_dict` natively.
//!
//! The walk is torch's nested `load()`: per module, its local metadata, its
//! `_load_from_state_dict(local, prefix, local_metadata, True, missing,
//! unexpected, errors)`, then each child with the entries of `local` under
//! `prefix + name + "."`, then the module's load post-hooks. torch rebuilds
//! each child's dict by scanning the whole parent dict (quadratic in width);
//! here the parent dict is split once into per-child buckets (same entries,
//! same order), rebuilt whenever the parent dict or the children change while
//! children load, and torch's scan is used whenever a key or a name is not a
//! plain `str`.
//!
//! `_load_from_state_dict` runs natively for a module whose class resolves it
//! (and `set_extra_state`) to torch's, without load pre-hooks, `assign` (the
//! argument, or a true `assign_to_params_buffers` in its local metadata),
//! the swap-tensors flag or an active torch-function/dispatch mode, with
//! exact registries, and where every entry to copy is an exact tensor of the
//! same shape as a non-meta exact parameter or buffer. It then does what
//! torch's code does in that case: `param.copy_(input)` under `no_grad`,
//! missing and unexpected keys in torch's order. Everything it reads before
//! deciding is read without running code (quiet dicts and sets, exact str
//! keys), so the decision is unobservable; anything else calls the module's
//! own `_load_from_state_dict`, before anything of it was touched, from a
//! frame that reads as torch's `load` (see `fastmodule._methods.loading`), so that
//! what it warns with `stacklevel=2` is attributed as in torch.
use super::buckets::build_buckets;
use super::load_from_state_dict::{exact_dict, native_load_from_state_dict};
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::recursion::{Depth, Recursion};
use crate::instance::attributes::{data_attr, exact_str, instance_dict, truthy};
use crate::instance::qualified_names::{self, Kind};
use crate::instance::registries::Items;
use crate::state::load_state_dict_plan::Replay;
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;
use pyo3::exceptions::{PyAssertionError, PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::sync::OnceLock;

pub(super) struct Config {
    /// torch's `nn.Module._load_from_state_dict` and `set_extra_state`.
    pub(super) load_from_state_dict: Py<PyAny>,
    pub(super) set_extra_state: Py<PyAny>,
    pub(super) incompatible_keys: Py<PyAny>,
    /// `copy_error(key, param, input, exc) -> str`: torch's message.
    pub(super) copy_error: Py<PyAny>,
    /// `copy_one(key, param, input, error_msgs)`: torch's step for one pair
    /// (no swap, no assign), for a pair no longer plain when it is copied.
    pub(super) copy_one: Py<PyAny>,
    /// `load_tail(module, state_dict, prefix, local_state, missing,
    /// unexpected)`: torch's extra-state step and strict unexpected-key scan.
    pub(super) load_tail: Py<PyAny>,
    /// `load_call(module, state_dict, prefix, local_metadata, strict,
    /// missing, unexpected, errors)`: `module._load_from_state_dict(...)`
    /// called from a frame with torch's file, globals and line.
    pub(super) load_call: Py<PyAny>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

pub fn init(config: &Bound<'_, PyDict>) -> PyResult<()> {
    let get = |k: &str| -> PyResult<Py<PyAny>> {
        config
            .get_item(k)?
            .map(|v| v.unbind())
            .ok_or_else(|| PyRuntimeError::new_err(format!("fastmodule: load config lacks {k}")))
    };
    let c = Config {
        load_from_state_dict: get("load_from_state_dict")?,
        set_extra_state: get("set_extra_state")?,
        incompatible_keys: get("incompatible_keys")?,
        copy_error: get("copy_error")?,
        copy_one: get("copy_one")?,
        load_tail: get("load_tail")?,
        load_call: get("load_call")?,
    };
    let _ = CONFIG.set(c);
    Ok(())
}

pub(super) struct Ctx<'py> {
    pub(super) g: &'static Globals,
    pub(super) cfg: &'static Config,
    pub(super) metadata: Bound<'py, PyAny>,
    pub(super) assign: Bound<'py, PyAny>,
    pub(super) assigning: bool,
    pub(super) missing: Bound<'py, PyAny>,
    pub(super) unexpected: Bound<'py, PyAny>,
    pub(super) errors: Bound<'py, PyAny>,
    pub(super) post_hook_text: Bound<'py, PyAny>,
}

pub(super) unsafe fn is_dict_or_odict(g: &Globals, o: *mut capi::PyObject) -> bool {
    let t = capi::Py_TYPE(o);
    t == std::ptr::addr_of_mut!(capi::PyDict_Type) || t == g.odict
}

/// Is `o` a dict or an `OrderedDict` whose method `name` (which torch's code
/// calls as `o.<name>(...)`) is `dict`'s own, read without running code? An
/// `OrderedDict` has an instance `__dict__`, where an attribute of that name
/// would be what torch's call finds (the classes themselves are immutable).
///
/// # Safety
/// GIL held; `name` an exact str.
pub(crate) unsafe fn plain_mapping(
    g: &Globals,
    o: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> bool {
    let t = capi::Py_TYPE(o);
    if t == std::ptr::addr_of_mut!(capi::PyDict_Type) {
        return true;
    }
    if t != g.odict {
        return false;
    }
    let d = instance_dict(o);
    d.is_null() || (crate::cpython::quiet::dict(d) && capi::PyDict_Contains(d, name) == 0)
}

/// `load(module, state_dict)` of torch's `load_state_dict`, from the root
/// (`fastmodule._core.load_tree`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn load_tree<'py>(
    py: Python<'py>,
    module: &Bound<'py, PyAny>,
    state_dict: &Bound<'py, PyAny>,
    metadata: &Bound<'py, PyAny>,
    assign: &Bound<'py, PyAny>,
    missing: &Bound<'py, PyAny>,
    unexpected: &Bound<'py, PyAny>,
    errors: &Bound<'py, PyAny>,
    post_hook_text: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let g = crate::torch_api::originals::require(py)?;
    let cfg = config()?;
    let ctx = Ctx {
        g,
        cfg,
        metadata: metadata.clone(),
        assign: assign.clone(),
        assigning: assign.is_truthy()?,
        missing: missing.clone(),
        unexpected: unexpected.clone(),
        errors: errors.clone(),
        post_hook_text: post_hook_text.clone(),
    };
    let plannable = plain_load(py, g, state_dict, metadata, ctx.assigning)?;
    let prefix = PyString::new(py, "");
    load(py, &ctx, module, state_dict, prefix.as_any())?;
    if plannable {
        let orig = crate::state::load_state_dict_plan::Originals {
            load_from_state_dict: cfg.load_from_state_dict.as_ptr(),
            set_extra_state: cfg.set_extra_state.as_ptr(),
        };
        crate::state::load_state_dict_plan::record(g, &orig, module);
    }
    Ok(())
}

/// The plain case a recorded plan can load (crate::state::load_state_dict_plan): nothing
/// assigned, a dict or `OrderedDict`, metadata that is None or one of those
/// (their `keys`/`get`, which torch calls, `dict`'s), torch's swap flag off,
/// no mode active.
pub(super) fn plain_load(
    py: Python<'_>,
    g: &Globals,
    state_dict: &Bound<'_, PyAny>,
    metadata: &Bound<'_, PyAny>,
    assigning: bool,
) -> PyResult<bool> {
    // torch copies the dict with `OrderedDict(state_dict)`, which calls an
    // `OrderedDict`'s `keys()`; its loads call the metadata's `get`.
    if assigning
        || !unsafe { plain_mapping(g, state_dict.as_ptr(), intern!(py, "keys").as_ptr()) }
        || !(metadata.is_none()
            || unsafe { plain_mapping(g, metadata.as_ptr(), intern!(py, "get").as_ptr()) })
    {
        return Ok(false);
    }
    let rt = crate::torch_api::runtime::get()?;
    Ok(rt.swap.is_original(py)? && !rt.swap.get(py)? && !rt.modes_active(py)?)
}

/// torch's `load_state_dict` walk from `module`'s recorded plan, when the
/// call is the plain case and the caller's dict holds exactly the keys the
/// plan expects: true when done (copy failures reported in `errors`, keys in
/// `missing`/`unexpected` where a module changed during the load), false
/// when nothing was done. For a dict or `OrderedDict`, torch's private copy
/// of it (`OrderedDict(state_dict)`) is unobservable when no hook or
/// override receives it: the checks read the caller's dict, and a plain
/// copy is kept for modules that must be loaded live.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn load_replay<'py>(
    py: Python<'py>,
    module: &Bound<'py, PyAny>,
    state_dict: &Bound<'py, PyAny>,
    metadata: &Bound<'py, PyAny>,
    assign: &Bound<'py, PyAny>,
    missing: &Bound<'py, PyAny>,
    unexpected: &Bound<'py, PyAny>,
    errors: &Bound<'py, PyAny>,
    post_hook_text: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let g = crate::torch_api::originals::require(py)?;
    let cfg = config()?;
    if !plain_load(py, g, state_dict, metadata, assign.is_truthy()?)? {
        return Ok(false);
    }
    let Some(replay) =
        crate::state::load_state_dict_plan::replay(py, g, module, state_dict, metadata)
    else {
        return Ok(false);
    };
    let replay = replay?;
    let ctx = Ctx {
        g,
        cfg,
        metadata: metadata.clone(),
        assign: assign.clone(),
        assigning: false,
        missing: missing.clone(),
        unexpected: unexpected.clone(),
        errors: errors.clone(),
        post_hook_text: post_hook_text.clone(),
    };
    let mut k = 0;
    let mut grad = NoGrad::default();
    let done = replay_module(
        py,
        &ctx,
        &replay,
        &mut grad,
        &mut k,
        module,
        &replay.prefix(0),
    );
    let back = grad.leave();
    done.and(back).map(|()| true)
}

/// torch's `with torch.no_grad():` around each module's copies, kept entered
/// across the copies of consecutive replayed modules (grad mode is this
/// thread's, and nothing of this thread runs between them) and left before
/// anything else runs: a module loaded live, a hook.
#[derive(Default)]
struct NoGrad<'py> {
    /// The mode to give back, while entered.
    prev: Option<Bound<'py, PyAny>>,
}

impl<'py> NoGrad<'py> {
    fn enter(&mut self, py: Python<'py>) -> PyResult<()> {
        if self.prev.is_none() {
            self.prev = Some(crate::torch_api::runtime::get()?.enter_no_grad(py)?);
        }
        Ok(())
    }

    fn leave(&mut self) -> PyResult<()> {
        match self.prev.take() {
            Some(prev) => crate::torch_api::runtime::get()?.set_grad(&prev),
            None => Ok(()),
        }
    }
}

/// torch's `load(module, ..., prefix)` for plan visit `*k` (whose module
/// `module` is), from the plan while each module reads as when checked, live
/// from the first that does not; `*k` moves past the visit's subtree. As
/// torch's `load`, it reads `module._modules` after the module's copies (which
/// release the GIL), iterates it live, and reads the load post-hooks after
/// the children.
fn replay_module<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    r: &Replay<'py>,
    grad: &mut NoGrad<'py>,
    k: &mut usize,
    module: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let this = *k;
    *k = r.subtree_end(this);
    // The first visit was checked just before (nothing ran since); a later
    // one is checked where torch's walk reaches it: copies before released
    // the GIL.
    // torch's `_load_from_state_dict` also reads the swap flag when it
    // starts: set since (or its getter replaced), the module loads live.
    // SAFETY: GIL held; `module` is ours.
    if this > 0
        && (!unsafe { r.still(this) }
            || crate::torch_api::runtime::get()?.swap.peek(py)? != Some(false))
    {
        grad.leave()?;
        return load(py, ctx, module, &r.local(prefix)?, prefix);
    }
    let _depth = Depth::enter(py, Recursion::Python)?;
    let pairs = r.pairs(this);
    if !pairs.is_empty() {
        grad.enter(py)?;
        copy_pairs(py, ctx.cfg, &ctx.errors, pairs)?;
    }
    // torch's end of `_load_from_state_dict` reads `set_extra_state` of the
    // class and `self._modules` after the copies (which released the GIL).
    // The check found torch's method and no key left unexpected; a class,
    // instance dict or `_modules` changed since gets torch's end.
    // SAFETY: GIL held; `module` is ours.
    if !unsafe { r.children_unchanged(this) } {
        grad.leave()?;
        let names = pyo3::types::PySet::empty(py)?;
        for (key, _, _) in pairs {
            names.add(key.call_method1(intern!(py, "removeprefix"), (prefix,))?)?;
        }
        ctx.cfg.load_tail.bind(py).call1((
            module,
            r.local(prefix)?,
            prefix,
            names,
            &ctx.missing,
            &ctx.unexpected,
        ))?;
    }
    // `module._modules.items()`, read now, as torch's (the recorded registry
    // where the class and instance dict are unchanged: the same read).
    // SAFETY: GIL held; `module` is ours.
    let children = match unsafe { r.modules_now(this) } {
        Some(d) => d,
        None => module.getattr(intern!(py, "_modules"))?,
    };
    let mut items = items_of(&children)?;
    let mut next = this + 1;
    while let Some((name, child)) = items.next(py)? {
        if child.is_none() {
            continue;
        }
        // The plan's next visit, if this is its module under its name.
        let planned = next < r.visits()
            && r.depth(next) == r.depth(this) + 1
            && r.module(next) == child.as_ptr()
            && (unsafe { r.children_unchanged(this) } || {
                let child_prefix = qualified_names::name(Kind::Child, prefix, &name, || {
                    prefix.add(&name)?.add(intern!(py, "."))
                })?;
                child_prefix.eq(r.prefix(next))?
            });
        if planned {
            let child_prefix = r.prefix(next);
            replay_module(py, ctx, r, grad, &mut next, &child, &child_prefix)?;
            continue;
        }
        // The tree differs from the plan here: this child and the rest of
        // this module's, live, from torch's copy.
        grad.leave()?;
        let local = r.local(prefix)?;
        load_children_from(
            py,
            ctx,
            &children,
            items,
            &local,
            prefix,
            Some((name, child)),
        )?;
        break;
    }
    // The post-hooks, read now: none while the recorded empty dict is still
    // the module's and unchanged.
    // SAFETY: as above.
    if unsafe { r.hooks_still_empty(this) } {
        return Ok(());
    }
    grad.leave()?;
    post_hooks(py, ctx, module)
}

pub(super) fn config() -> PyResult<&'static Config> {
    CONFIG
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("fastmodule: loading not initialised"))
}

/// One copy of torch's `_load_from_state_dict`: (key, param, input).
pub(crate) type CopyPair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// Does the native path take `param.copy_(input)` as torch's common case:
/// both exact tensors, equal shapes, `param` not on the meta device (else
/// torch's own code runs, with its checks and messages)?
pub(crate) fn plain_copy(
    g: &Globals,
    param: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let py = param.py();
    let is_tensor = |t: &Bound<'_, PyAny>| unsafe {
        let tp = capi::Py_TYPE(t.as_ptr());
        tp == g.tensor || tp == g.parameter
    };
    let shape = intern!(py, "shape");
    Ok(is_tensor(param)
        && is_tensor(input)
        && data_attr(param, shape)?.eq(data_attr(input, shape)?)?
        && !truthy(data_attr(param, intern!(py, "is_meta")))?)
}

/// torch's copies under `no_grad`, in order; a failed one is reported in
/// `error_msgs` as torch reports it, and the rest still run.
pub(super) fn copy_all<'py>(
    py: Python<'py>,
    cfg: &Config,
    errors: &Bound<'py, PyAny>,
    copies: &[CopyPair<'py>],
) -> PyResult<()> {
    if copies.is_empty() {
        return Ok(());
    }
    crate::torch_api::runtime::get()?.no_grad(py, || copy_pairs(py, cfg, errors, copies))
}

/// The copies of [`copy_all`], with grad mode already off.
fn copy_pairs<'py>(
    py: Python<'py>,
    cfg: &Config,
    errors: &Bound<'py, PyAny>,
    copies: &[CopyPair<'py>],
) -> PyResult<()> {
    let copy = intern!(py, "copy_");
    let g = crate::torch_api::originals::require(py)?;
    for (key, param, input) in copies {
        // torch checks each pair (type, shape, meta) just before its copy;
        // an earlier copy released the GIL, and another thread may have
        // changed either tensor since the pairs were checked: a pair no
        // longer plain takes torch's step (its messages, 0-dim case, warning).
        if !plain_copy(g, param, input)? {
            cfg.copy_one.bind(py).call1((key, param, input, errors))?;
            continue;
        }
        if let Err(e) = param.call_method1(copy, (input,)) {
            if !e.is_instance_of::<PyException>(py) {
                return Err(e);
            }
            let msg = cfg
                .copy_error
                .bind(py)
                .call1((key, param, input, e.value(py)))?;
            errors.call_method1(intern!(py, "append"), (msg,))?;
        }
    }
    Ok(())
}

/// `prefix[:-1]`, with the very slice object Python builds for it.
pub(crate) fn but_last<'py>(prefix: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = prefix.py();
    unsafe {
        let stop = Bound::from_owned_ptr_or_err(py, capi::PyLong_FromLong(-1))?;
        let slice = Bound::from_owned_ptr_or_err(
            py,
            capi::PySlice_New(capi::Py_None(), stop.as_ptr(), capi::Py_None()),
        )?;
        prefix.get_item(slice)
    }
}

/// `{} if metadata is None else metadata.get(prefix[:-1], {})`, where None
/// stands for torch's fresh `{}` (built only if torch's code receives it).
pub(super) fn local_metadata<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if ctx.metadata.is_none() {
        return Ok(None);
    }
    let key = qualified_names::name(Kind::ButLast, prefix, prefix, || but_last(prefix))?;
    let md = ctx.metadata.as_ptr();
    if exact_str(&key) && unsafe { plain_mapping(ctx.g, md, intern!(py, "get").as_ptr()) } {
        // `dict.get` (`OrderedDict`'s is the same): the very lookup torch's
        // `.get` makes, running what it runs; the value is ours at once.
        let v = unsafe { capi::PyDict_GetItemWithError(md, key.as_ptr()) };
        if v.is_null() {
            if let Some(e) = PyErr::take(py) {
                return Err(e);
            }
            return Ok(None);
        }
        return Ok(Some(unsafe { Bound::from_borrowed_ptr(py, v) }));
    }
    ctx.metadata
        .call_method1(intern!(py, "get"), (key, PyDict::new(py)))
        .map(Some)
}

pub(super) fn load<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let _depth = Depth::enter(py, Recursion::Python)?;
    let g = ctx.g;
    let mut md = local_metadata(py, ctx, prefix)?;
    if ctx.assigning {
        let m = match md {
            Some(m) => m,
            None => PyDict::new(py).into_any(),
        };
        m.set_item(intern!(py, "assign_to_params_buffers"), &ctx.assign)?;
        md = Some(m);
    }
    // What torch's `_load_from_state_dict` reads of the local metadata
    // (`assign_to_params_buffers`), read without running code: anything
    // but absent or False is torch's code's to act on.
    let in_place = !ctx.assigning
        && unsafe {
            crate::state::load_state_dict_plan::copies_in_place(
                g,
                &crate::state::load_state_dict_plan::AssignNames::new(py),
                md.as_ref().map_or(std::ptr::null_mut(), |m| m.as_ptr()),
            )
        };
    if !in_place || !native_load_from_state_dict(py, ctx, module, local, prefix)? {
        let md = match md {
            Some(m) => m,
            None => PyDict::new(py).into_any(),
        };
        ctx.cfg.load_call.bind(py).call1((
            module,
            local,
            prefix,
            md,
            true,
            &ctx.missing,
            &ctx.unexpected,
            &ctx.errors,
        ))?;
    }
    load_children(py, ctx, module, local, prefix)?;
    post_hooks(py, ctx, module)
}

/// The load post-hooks of `module`, read after its children loaded, with the
/// live key lists.
fn post_hooks<'py>(py: Python<'py>, ctx: &Ctx<'py>, module: &Bound<'py, PyAny>) -> PyResult<()> {
    let g = ctx.g;
    let hooks = module.getattr(intern!(py, "_load_state_dict_post_hooks"))?;
    if matches!(unsafe { hook_dict_len(hooks.as_ptr(), g.odict) }, Some(0)) {
        return Ok(());
    }
    let incompatible = ctx
        .cfg
        .incompatible_keys
        .bind(py)
        .call1((&ctx.missing, &ctx.unexpected))?;
    for hook in hooks.call_method0(intern!(py, "values"))?.try_iter()? {
        let out = hook?.call1((module, &incompatible))?;
        if !out.is_none() {
            return Err(PyAssertionError::new_err(
                ctx.post_hook_text.clone().unbind(),
            ));
        }
    }
    Ok(())
}

/// A dict's version (see `cpython::dicts::dict_version_of`); None for non-dicts.
pub(super) type Version = Option<(u64, u64)>;

pub(super) fn version(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<Version> {
    let odict = crate::torch_api::originals::require(py)
        .map(|g| g.odict)
        .ok();
    crate::cpython::dicts::dict_version_of(py, d, odict)
}

pub(super) fn load_children<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<()> {
    // `module._modules.items()`: one read of `_modules`, as torch's.
    let children = module.getattr(intern!(py, "_modules"))?;
    let items = items_of(&children)?;
    load_children_from(py, ctx, &children, items, local, prefix, None)
}

/// `children.items()` (a `_modules` read), iterated as torch's loop iterates it.
fn items_of(children: &Bound<'_, PyAny>) -> PyResult<Items> {
    if exact_dict(children) {
        return Ok(Items::of_dict(children));
    }
    let py = children.py();
    Ok(Items::Iter(
        children
            .call_method0(intern!(py, "items"))?
            .try_iter()?
            .unbind(),
    ))
}

/// The children loop of torch's `load` over `children` (the `_modules` read),
/// with `items` its iteration, after `first` (an item already taken from it).
#[allow(clippy::too_many_arguments)]
fn load_children_from<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    children: &Bound<'py, PyAny>,
    mut items: Items,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    mut first: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<()> {
    let mut buckets: Option<Bound<'py, PyDict>> = None;
    let mut seen: Option<(Version, Version)> = None;
    let dot = intern!(py, ".");
    while let Some((name, child)) = match first.take() {
        Some(item) => Some(item),
        None => items.next(py)?,
    } {
        if child.is_none() {
            continue;
        }
        let child_prefix =
            qualified_names::name(Kind::Child, prefix, &name, || prefix.add(&name)?.add(dot))?;
        // Rebuild if a hook changed the parent's dict (entries or order) or
        // the children while earlier children loaded.
        let versions = (version(py, local)?, version(py, children)?);
        let usable = versions.0.is_some() && versions.1.is_some();
        if !usable || buckets.is_none() || seen != Some(versions) {
            buckets = if usable {
                build_buckets(py, local, prefix, children)?
            } else {
                None
            };
            seen = Some(versions);
        }
        let child_local = match &buckets {
            Some(b) => {
                // A fresh dict per child, as torch builds one.
                match b.get_item(&name)? {
                    Some(d) => {
                        b.del_item(&name)?;
                        d
                    }
                    None => PyDict::new(py).into_any(),
                }
            }
            None => {
                let d = PyDict::new(py);
                let startswith = intern!(py, "startswith");
                for kv in local.call_method0(intern!(py, "items"))?.try_iter()? {
                    let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = kv?.extract()?;
                    if k.call_method1(startswith, (&child_prefix,))?.is_truthy()? {
                        d.set_item(k, v)?;
                    }
                }
                d.into_any()
            }
        };
        load(py, ctx, &child, &child_local, &child_prefix)?;
    }
    Ok(())
}
