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
//! frame that reads as torch's `load` (see `fastmodule.loading`), so that
//! what it warns with `stacklevel=2` is attributed as in torch.
use crate::cpython::recursion::{Depth, Recursion};
use crate::instance::attributes::{data_attr, exact_str, instance_attr, instance_dict, truthy};
use crate::instance::dispatch::{is_native, original, Method};
use crate::instance::qualified_names::{self, Kind};
use crate::instance::registries::Items;
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;
use pyo3::exceptions::{PyAssertionError, PyException, PyRuntimeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySet, PyString};
use std::sync::OnceLock;

struct Config {
    /// torch's `nn.Module._load_from_state_dict` and `set_extra_state`.
    load_from_state_dict: Py<PyAny>,
    set_extra_state: Py<PyAny>,
    incompatible_keys: Py<PyAny>,
    /// `copy_error(key, param, input, exc) -> str`: torch's message.
    copy_error: Py<PyAny>,
    /// `load_call(module, state_dict, prefix, local_metadata, strict,
    /// missing, unexpected, errors)`: `module._load_from_state_dict(...)`
    /// called from a frame with torch's file, globals and line.
    load_call: Py<PyAny>,
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
        load_call: get("load_call")?,
    };
    let _ = CONFIG.set(c);
    Ok(())
}

struct Ctx<'py> {
    g: &'static Globals,
    cfg: &'static Config,
    metadata: Bound<'py, PyAny>,
    assign: Bound<'py, PyAny>,
    assigning: bool,
    missing: Bound<'py, PyAny>,
    unexpected: Bound<'py, PyAny>,
    errors: Bound<'py, PyAny>,
    post_hook_text: Bound<'py, PyAny>,
}

unsafe fn is_dict_or_odict(g: &Globals, o: *mut ffi::PyObject) -> bool {
    let t = ffi::Py_TYPE(o);
    t == std::ptr::addr_of_mut!(ffi::PyDict_Type) || t == g.odict
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
    o: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> bool {
    let t = ffi::Py_TYPE(o);
    if t == std::ptr::addr_of_mut!(ffi::PyDict_Type) {
        return true;
    }
    if t != g.odict {
        return false;
    }
    let d = instance_dict(o);
    d.is_null() || (crate::cpython::quiet::dict(d) && ffi::PyDict_Contains(d, name) == 0)
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
fn plain_load(
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
/// plan expects: true when done (copy failures reported in `errors`), false
/// when nothing was done. For a dict or `OrderedDict`, torch's private copy
/// of it (`OrderedDict(state_dict)`) is unobservable when no hook or
/// override receives it, so the plan reads the caller's dict itself.
#[pyfunction]
pub fn load_replay<'py>(
    py: Python<'py>,
    module: &Bound<'py, PyAny>,
    state_dict: &Bound<'py, PyAny>,
    metadata: &Bound<'py, PyAny>,
    assign: &Bound<'py, PyAny>,
    errors: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let g = crate::torch_api::originals::require(py)?;
    let cfg = config()?;
    if !plain_load(py, g, state_dict, metadata, assign.is_truthy()?)? {
        return Ok(false);
    }
    match crate::state::load_state_dict_plan::replay(py, g, module, state_dict, metadata) {
        Some(copies) => copy_all(py, cfg, errors, &copies?).map(|()| true),
        None => Ok(false),
    }
}

fn config() -> PyResult<&'static Config> {
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
        let tp = ffi::Py_TYPE(t.as_ptr());
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
fn copy_all<'py>(
    py: Python<'py>,
    cfg: &Config,
    errors: &Bound<'py, PyAny>,
    copies: &[CopyPair<'py>],
) -> PyResult<()> {
    if copies.is_empty() {
        return Ok(());
    }
    let copy = intern!(py, "copy_");
    crate::torch_api::runtime::get()?.no_grad(py, || {
        for (key, param, input) in copies {
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
    })
}

/// `prefix[:-1]`, with the very slice object Python builds for it.
pub(crate) fn but_last<'py>(prefix: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = prefix.py();
    unsafe {
        let stop = Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromLong(-1))?;
        let slice = Bound::from_owned_ptr_or_err(
            py,
            ffi::PySlice_New(ffi::Py_None(), stop.as_ptr(), ffi::Py_None()),
        )?;
        prefix.get_item(slice)
    }
}

/// `{} if metadata is None else metadata.get(prefix[:-1], {})`, where None
/// stands for torch's fresh `{}` (built only if torch's code receives it).
fn local_metadata<'py>(
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
        let v = unsafe { ffi::PyDict_GetItemWithError(md, key.as_ptr()) };
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

fn load<'py>(
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
    // The post-hooks, with the live key lists.
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
type Version = Option<(u64, u64)>;

fn version(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<Version> {
    let odict = crate::torch_api::originals::require(py)
        .map(|g| g.odict)
        .ok();
    crate::cpython::dicts::dict_version_of(py, d, odict)
}

fn load_children<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<()> {
    // `module._modules.items()`: one read of `_modules`, as torch's.
    let children = module.getattr(intern!(py, "_modules"))?;
    let mut items = if exact_dict(&children) {
        Items::of_dict(&children)
    } else {
        Items::Iter(
            children
                .call_method0(intern!(py, "items"))?
                .try_iter()?
                .unbind(),
        )
    };
    let mut buckets: Option<Bound<'py, PyDict>> = None;
    let mut seen: Option<(Version, Version)> = None;
    let dot = intern!(py, ".");
    while let Some((name, child)) = items.next(py)? {
        if child.is_none() {
            continue;
        }
        let child_prefix =
            qualified_names::name(Kind::Child, prefix, &name, || prefix.add(&name)?.add(dot))?;
        // Rebuild if a hook changed the parent's dict (entries or order) or
        // the children while earlier children loaded.
        let versions = (version(py, local)?, version(py, &children)?);
        let usable = versions.0.is_some() && versions.1.is_some();
        if !usable || buckets.is_none() || seen != Some(versions) {
            buckets = if usable {
                build_buckets(py, local, prefix, &children)?
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

/// The bytes of an exact, compact ASCII str (None for any other str; always
/// None on 3.14, whose str state layout pyo3 does not describe: the callers
/// then take their general path).
#[cfg(Py_3_14)]
unsafe fn ascii_bytes<'a>(_s: *mut ffi::PyObject) -> Option<&'a [u8]> {
    None
}

/// The bytes of an exact, compact ASCII str (None for any other str).
#[cfg(not(Py_3_14))]
unsafe fn ascii_bytes<'a>(s: *mut ffi::PyObject) -> Option<&'a [u8]> {
    if ffi::PyUnicode_CheckExact(s) == 0 || ffi::PyUnicode_IS_ASCII(s) == 0 {
        return None;
    }
    let len = ffi::PyUnicode_GET_LENGTH(s) as usize;
    Some(std::slice::from_raw_parts(
        ffi::PyUnicode_1BYTE_DATA(s),
        len,
    ))
}

/// FNV-1a over a child name's bytes (names are short; no DoS concern: the
/// table is built from the module's own registry).
#[derive(Default)]
struct NameHasher(u64);

impl std::hash::Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0 ^ 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }
}

type NameSet<'a> = std::collections::HashSet<&'a [u8], std::hash::BuildHasherDefault<NameHasher>>;

type NameTable<'a> =
    std::collections::HashMap<&'a [u8], usize, std::hash::BuildHasherDefault<NameHasher>>;

/// Split `local` by child name: `{name: {key: value}}` for keys
/// `prefix + name + "." + ...` where `name` is a child's name (keys under any
/// other head are never asked for); None when torch's own scan must decide.
fn build_buckets<'py>(
    py: Python<'py>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    children: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    // A key that is not an exact str is torch's scan's to meet; checked
    // first, by reading the table: iterating an `OrderedDict` looks each key
    // up, which runs a colliding key's `__eq__`.
    if !exact_str(prefix)
        || (unsafe { ffi::PyDict_Check(local.as_ptr()) } != 0
            && !unsafe { crate::cpython::str_keys::all_str(local.as_ptr()) })
    {
        return Ok(None);
    }
    let mut names: Vec<Bound<'py, PyAny>> = Vec::new();
    for name in children.try_iter()? {
        let name = name?;
        if !exact_str(&name) {
            return Ok(None);
        }
        let n = name.as_ptr();
        let len = unsafe { ffi::PyUnicode_GET_LENGTH(n) };
        match unsafe { ffi::PyUnicode_FindChar(n, '.' as u32, 0, len, 1) } {
            -2 => return Err(PyErr::fetch(py)),
            -1 => {}
            _ => return Ok(None),
        }
        names.push(name);
    }
    // Child names by their bytes, where the prefix and every name are ASCII:
    // a key's head is then found without building it as a str.
    let prefix_bytes = unsafe { ascii_bytes(prefix.as_ptr()) };
    let mut table = NameTable::default();
    let mut by_bytes = prefix_bytes.is_some();
    for (i, n) in names.iter().enumerate() {
        match unsafe { ascii_bytes(n.as_ptr()) } {
            Some(b) => {
                table.insert(b, i);
            }
            None => by_bytes = false,
        }
    }
    let out = PyDict::new(py);
    let mut buckets: Vec<Option<Bound<'py, PyAny>>> = vec![None; names.len()];
    let start = prefix.len()? as isize;
    let mut add = |key: &Bound<'py, PyAny>, value: &Bound<'py, PyAny>| -> PyResult<bool> {
        if !exact_str(key) {
            return Ok(false);
        }
        unsafe {
            let k = key.as_ptr();
            if let (true, Some(p), Some(kb)) = (by_bytes, prefix_bytes, ascii_bytes(k)) {
                if !kb.starts_with(p) {
                    return Ok(true);
                }
                let rest = &kb[p.len()..];
                let Some(dot) = rest.iter().position(|&c| c == b'.') else {
                    return Ok(true);
                };
                let Some(&i) = table.get(&rest[..dot]) else {
                    return Ok(true);
                };
                let bucket = match &buckets[i] {
                    Some(b) => b,
                    None => {
                        let b = PyDict::new(py).into_any();
                        out.set_item(&names[i], &b)?;
                        buckets[i].insert(b)
                    }
                };
                bucket.set_item(key, value)?;
                return Ok(true);
            }
            let len = ffi::PyUnicode_GET_LENGTH(k);
            if ffi::PyUnicode_Tailmatch(k, prefix.as_ptr(), 0, len, -1) != 1 {
                return Ok(true);
            }
            let dot = ffi::PyUnicode_FindChar(k, '.' as u32, start, len, 1);
            if dot == -2 {
                return Err(PyErr::fetch(py));
            }
            if dot < 0 {
                return Ok(true);
            }
            let head = Bound::from_owned_ptr_or_err(py, ffi::PyUnicode_Substring(k, start, dot))?;
            let bucket = match out.get_item(&head)? {
                Some(b) => b,
                None => {
                    let b = PyDict::new(py).into_any();
                    out.set_item(&head, &b)?;
                    // Found again by bytes for a later ASCII key.
                    if let Some(i) = names.iter().position(|n| n.eq(&head).unwrap_or(false)) {
                        buckets[i] = Some(b.clone());
                    }
                    b
                }
            };
            bucket.set_item(key, value)?;
            Ok(true)
        }
    };
    if exact_dict(local) {
        // An exact dict iterates in its own order, with no code run.
        let d = local.as_ptr();
        let mut pos: ffi::Py_ssize_t = 0;
        let mut k: *mut ffi::PyObject = std::ptr::null_mut();
        let mut v: *mut ffi::PyObject = std::ptr::null_mut();
        while unsafe { ffi::PyDict_Next(d, &mut pos, &mut k, &mut v) } != 0 {
            let (key, value) = unsafe {
                (
                    Bound::from_borrowed_ptr(py, k),
                    Bound::from_borrowed_ptr(py, v),
                )
            };
            if !add(&key, &value)? {
                return Ok(None);
            }
        }
    } else {
        for kv in local.call_method0(intern!(py, "items"))?.try_iter()? {
            let (key, value): (Bound<'py, PyAny>, Bound<'py, PyAny>) = kv?.extract()?;
            if !add(&key, &value)? {
                return Ok(None);
            }
        }
    }
    Ok(Some(out))
}

fn exact_dict(o: &Bound<'_, PyAny>) -> bool {
    unsafe { ffi::PyDict_CheckExact(o.as_ptr()) != 0 }
}

/// May torch's `_load_from_state_dict` of `module` be run natively?
fn native_allowed<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let g = ctx.g;
    unsafe {
        let m = module.as_ptr();
        let tp = ffi::Py_TYPE(m);
        let lfsd = intern!(py, "_load_from_state_dict");
        let ses = intern!(py, "set_extra_state");
        if crate::cpython::type_cache::type_lookup(tp, lfsd.as_ptr())
            != ctx.cfg.load_from_state_dict.as_ptr()
            || crate::cpython::type_cache::type_lookup(tp, ses.as_ptr())
                != ctx.cfg.set_extra_state.as_ptr()
            || crate::cpython::type_cache::type_lookup(tp, g.names.dunder_class)
                != g.orig.object_class
        {
            return Ok(false);
        }
        // Every read below, and the native body's, is a lookup by an exact
        // str in this dict: none may run code (torch's code makes them).
        let d = instance_dict(m);
        if d.is_null()
            || !crate::cpython::quiet::dict(d)
            || ffi::PyDict_Contains(d, lfsd.as_ptr()) != 0
        {
            return Ok(false);
        }
    }
    match instance_attr(module, intern!(py, "_load_state_dict_pre_hooks"))? {
        Some(h) if matches!(unsafe { hook_dict_len(h.as_ptr(), g.odict) }, Some(0)) => {}
        _ => return Ok(false),
    }
    // A replaced flag getter is torch's code's to call (as often as it does).
    let rt = crate::torch_api::runtime::get()?;
    if !rt.swap.is_original(py)? || rt.swap.get(py)? || rt.modes_active(py)? {
        return Ok(false);
    }
    Ok(true)
}

/// torch's `_load_from_state_dict` for the common case; Ok(false) when the
/// module is not the common case (nothing was done).
fn native_load_from_state_dict<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let g = ctx.g;
    if !exact_str(prefix)
        || !unsafe { is_dict_or_odict(g, local.as_ptr()) }
        || !native_allowed(py, ctx, module)?
    {
        return Ok(false);
    }
    let (Some(params), Some(buffers), Some(non_persistent), Some(modules)) = (
        instance_attr(module, intern!(py, "_parameters"))?,
        instance_attr(module, intern!(py, "_buffers"))?,
        instance_attr(module, intern!(py, "_non_persistent_buffers_set"))?,
        instance_attr(module, intern!(py, "_modules"))?,
    ) else {
        return Ok(false);
    };
    // Quiet registries, set and dict (torch's `in` tests and lookups in them
    // run no code), and exact str names: nothing below runs code before the
    // copies, so handing over to torch's code up to there is unobservable.
    let quiet = unsafe {
        crate::cpython::quiet::dict(params.as_ptr())
            && crate::cpython::quiet::dict(buffers.as_ptr())
            && crate::cpython::quiet::dict(modules.as_ptr())
            && crate::cpython::quiet::set(non_persistent.as_ptr())
            && crate::cpython::str_keys::all_str(local.as_ptr())
    };
    if !quiet {
        return Ok(false);
    }
    let non_persistent = non_persistent.cast::<PySet>()?;
    // local_state: parameters, then persistent buffers, without None.
    let local_state = PyDict::new(py);
    for (k, v) in params.cast::<PyDict>()?.iter() {
        if !v.is_none() {
            local_state.set_item(k, v)?;
        }
    }
    for (k, v) in buffers.cast::<PyDict>()?.iter() {
        if !v.is_none() && !non_persistent.contains(&k)? {
            local_state.set_item(k, v)?;
        }
    }
    let is_tensor = |t: &Bound<'py, PyAny>| unsafe {
        let tp = ffi::Py_TYPE(t.as_ptr());
        tp == g.tensor || tp == g.parameter
    };
    let mut copies: Vec<CopyPair<'py>> = Vec::new();
    let mut missing: Vec<Bound<'py, PyAny>> = Vec::new();
    for (name, param) in local_state.iter() {
        if !exact_str(&name) || !is_tensor(&param) {
            return Ok(false);
        }
        let key = qualified_names::name(Kind::Plain, prefix, &name, || prefix.add(&name))?;
        match local.get_item(&key) {
            Ok(input) => {
                if !plain_copy(g, &param, &input)? {
                    return Ok(false);
                }
                copies.push((key, param, input));
            }
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(py) => missing.push(key),
            Err(e) => return Err(e),
        }
    }
    // Unexpected keys: those under `prefix` that name neither a child nor an
    // entry of local_state (torch's strict scan).
    let extra = intern!(py, "_extra_state");
    let extra_state_key = qualified_names::name(Kind::Plain, prefix, extra, || prefix.add(extra))?;
    let mut unexpected: Vec<Bound<'py, PyAny>> = Vec::new();
    let start = prefix.len()? as isize;
    // Where the prefix, the extra-state key and every child and local_state name
    // are ASCII strs, an ASCII key's head is looked up by its bytes, without
    // building it as a str (the same membership: str equality is byte equality).
    let ascii_names = |d: &Bound<'py, PyAny>| -> Option<NameSet<'py>> {
        let mut set = NameSet::default();
        let mut pos: ffi::Py_ssize_t = 0;
        let mut k: *mut ffi::PyObject = std::ptr::null_mut();
        let mut v: *mut ffi::PyObject = std::ptr::null_mut();
        // SAFETY: exact dicts, iterated without running code; the names
        // outlive the scan (the dicts hold them and are not changed by it).
        unsafe {
            while ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) != 0 {
                set.insert(ascii_bytes(k)?);
            }
        }
        Some(set)
    };
    let by_bytes = unsafe {
        match (
            ascii_bytes(prefix.as_ptr()),
            ascii_bytes(extra_state_key.as_ptr()),
        ) {
            (Some(p), Some(x)) => {
                match (ascii_names(&modules), ascii_names(local_state.as_any())) {
                    (Some(m), Some(l)) => Some((p, x, m, l)),
                    _ => None,
                }
            }
            _ => None,
        }
    };
    for key in local.try_iter()? {
        let key = key?;
        if !exact_str(&key) {
            return Ok(false);
        }
        unsafe {
            let k = key.as_ptr();
            if let (Some((p, x, mods, own)), Some(kb)) = (&by_bytes, ascii_bytes(k)) {
                if !kb.starts_with(p) || kb == *x {
                    continue;
                }
                let rest = &kb[p.len()..];
                let known = match rest.iter().position(|&c| c == b'.') {
                    Some(dot) => mods.contains(&rest[..dot]),
                    None => own.contains(rest),
                };
                if !known {
                    unexpected.push(key.clone());
                }
                continue;
            }
            let len = ffi::PyUnicode_GET_LENGTH(k);
            if ffi::PyUnicode_Tailmatch(k, prefix.as_ptr(), 0, len, -1) != 1
                || key.eq(&extra_state_key)?
            {
                continue;
            }
            let dot = ffi::PyUnicode_FindChar(k, '.' as u32, start, len, 1);
            if dot == -2 {
                return Err(PyErr::fetch(py));
            }
            let known = if dot >= 0 {
                let head =
                    Bound::from_owned_ptr_or_err(py, ffi::PyUnicode_Substring(k, start, dot))?;
                modules.contains(&head)?
            } else {
                let rest =
                    Bound::from_owned_ptr_or_err(py, ffi::PyUnicode_Substring(k, start, len))?;
                local_state.contains(&rest)?
            };
            if !known {
                unexpected.push(key.clone());
            }
        }
    }
    // From here on this is torch's code path: copy under no_grad.
    copy_all(py, ctx.cfg, &ctx.errors, &copies)?;
    let append = intern!(py, "append");
    for key in missing {
        ctx.missing.call_method1(append, (key,))?;
    }
    if local.contains(&extra_state_key)? {
        ctx.unexpected.call_method1(append, (extra_state_key,))?;
    }
    for key in unexpected {
        ctx.unexpected.call_method1(append, (key,))?;
    }
    Ok(true)
}

/// torch's `state_dict(destination=, prefix=, keep_vars=)` body for `module`
/// (the positional-argument handling is the Python wrapper's).
pub fn save_tree<'py>(
    py: Python<'py>,
    g: &'static Globals,
    module: &Bound<'py, PyAny>,
    destination: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    keep_vars: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Routed)?;
    let metadata_name = intern!(py, "_metadata");
    let destination = if destination.is_none() {
        let odict = unsafe { Bound::from_borrowed_ptr(py, g.odict as *mut ffi::PyObject) };
        let d = odict.call0()?;
        d.setattr(metadata_name, odict.call0()?)?;
        d
    } else {
        destination.clone()
    };
    let local_metadata = PyDict::new(py);
    local_metadata.set_item(
        intern!(py, "version"),
        module.getattr(intern!(py, "_version"))?,
    )?;
    let mut md = std::ptr::null_mut();
    match unsafe {
        ffi::compat::PyObject_GetOptionalAttr(destination.as_ptr(), metadata_name.as_ptr(), &mut md)
    } {
        1 => {
            let md = unsafe { Bound::from_owned_ptr(py, md) };
            md.set_item(
                qualified_names::name(Kind::ButLast, prefix, prefix, || but_last(prefix))?,
                &local_metadata,
            )?;
        }
        0 => {}
        _ => return Err(PyErr::fetch(py)),
    }
    let pre = module.getattr(intern!(py, "_state_dict_pre_hooks"))?;
    if !matches!(unsafe { hook_dict_len(pre.as_ptr(), g.odict) }, Some(0)) {
        for hook in pre.call_method0(intern!(py, "values"))?.try_iter()? {
            hook?.call1((module, prefix, keep_vars))?;
        }
    }
    if is_native(g, module, Method::SaveToStateDict) {
        save_own(py, g, module, &destination, prefix, keep_vars)?;
    } else {
        module.call_method1(
            intern!(py, "_save_to_state_dict"),
            (&destination, prefix, keep_vars),
        )?;
    }
    let dot = intern!(py, ".");
    let mut items = Items::of(module, intern!(py, "_modules"))?;
    while let Some((name, child)) = items.next(py)? {
        if child.is_none() {
            continue;
        }
        let child_prefix =
            qualified_names::name(Kind::Child, prefix, &name, || prefix.add(&name)?.add(dot))?;
        if is_native(g, &child, Method::StateDict) {
            save_tree(py, g, &child, &destination, &child_prefix, keep_vars)?;
        } else {
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "destination"), &destination)?;
            kw.set_item(intern!(py, "prefix"), &child_prefix)?;
            kw.set_item(intern!(py, "keep_vars"), keep_vars)?;
            child.call_method(intern!(py, "state_dict"), (), Some(&kw))?;
        }
    }
    let post = module.getattr(intern!(py, "_state_dict_hooks"))?;
    if matches!(unsafe { hook_dict_len(post.as_ptr(), g.odict) }, Some(0)) {
        return Ok(destination);
    }
    let mut destination = destination;
    for hook in post.call_method0(intern!(py, "values"))?.try_iter()? {
        let hook = hook?;
        let result = hook.call1((module, &destination, prefix, &local_metadata))?;
        let public = match hook.getattr(intern!(py, "_from_public_api")) {
            Ok(v) => v.is_truthy()?,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => false,
            Err(e) => return Err(e),
        };
        if !public {
            if !result.is_none() {
                destination = result;
            }
        } else if !result.is_none() {
            return Err(PyRuntimeError::new_err(
                "state_dict post-hook must return None",
            ));
        }
    }
    Ok(destination)
}

/// torch's `_save_to_state_dict(destination, prefix, keep_vars)` body.
fn save_own<'py>(
    py: Python<'py>,
    g: &'static Globals,
    module: &Bound<'py, PyAny>,
    destination: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    keep_vars: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let keep = keep_vars.is_truthy()?;
    let detach = intern!(py, "detach");
    let mut params = Items::of(module, intern!(py, "_parameters"))?;
    while let Some((name, p)) = params.next(py)? {
        if p.is_none() {
            continue;
        }
        let value = if keep { p } else { p.call_method0(detach)? };
        let key = qualified_names::name(Kind::Plain, prefix, &name, || prefix.add(&name))?;
        destination.set_item(key, value)?;
    }
    let non_persistent = intern!(py, "_non_persistent_buffers_set");
    let mut buffers = Items::of(module, intern!(py, "_buffers"))?;
    while let Some((name, b)) = buffers.next(py)? {
        if b.is_none() || module.getattr(non_persistent)?.contains(&name)? {
            continue;
        }
        let value = if keep { b } else { b.call_method0(detach)? };
        let key = qualified_names::name(Kind::Plain, prefix, &name, || prefix.add(&name))?;
        destination.set_item(key, value)?;
    }
    let overridden = unsafe {
        let tp = ffi::Py_TYPE(module.as_ptr());
        let name = intern!(py, "get_extra_state");
        crate::cpython::type_cache::type_lookup(tp, g.names.dunder_class) != g.orig.object_class
            || Some(crate::cpython::type_cache::type_lookup(tp, name.as_ptr()))
                != original(Method::GetExtraState)
    };
    if overridden {
        let cls = module.getattr(intern!(py, "__class__"))?;
        let ges = intern!(py, "get_extra_state");
        let torch_ges = original(Method::GetExtraState)
            .map(|p| unsafe { Bound::from_borrowed_ptr(py, p) })
            .ok_or_else(|| PyRuntimeError::new_err("fastmodule: method table not initialised"))?;
        let found = match cls.getattr(ges) {
            Ok(v) => v,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => {
                torch_ges.clone()
            }
            Err(e) => return Err(e),
        };
        if !found.is(&torch_ges) {
            let key = prefix.add(intern!(py, "_extra_state"))?;
            destination.set_item(key, module.call_method0(ges)?)?;
        }
    }
    Ok(())
}
