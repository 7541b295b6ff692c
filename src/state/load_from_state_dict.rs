//! The common case of `_load_from_state_dict`, natively: exact registries,
//! exact same-shape tensors, no hooks, modes or `assign`; the decision is
//! made from reads that run no code, and anything else calls the module's
//! own `_load_from_state_dict` before anything of it was touched.
use super::buckets::NameSet;
use super::load_state_dict::{copy_all, is_dict_or_odict, plain_copy, CopyPair, Ctx};
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::strs::ascii_bytes;
use crate::instance::attributes::{exact_str, instance_attr, instance_dict};
use crate::instance::qualified_names::{self, Kind};
use crate::torch_api::hooks::hook_dict_len;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySet};

pub(super) fn exact_dict(o: &Bound<'_, PyAny>) -> bool {
    unsafe { capi::PyDict_CheckExact(o.as_ptr()) != 0 }
}

/// Does `module`'s class still read `self.__class__.set_extra_state` as
/// torch's own method, through `object.__getattribute__` (no code runs)?
fn tail_plain(ctx: &Ctx<'_>, module: &Bound<'_, PyAny>) -> bool {
    let g = ctx.g;
    let py = module.py();
    unsafe {
        let tp = capi::Py_TYPE(module.as_ptr());
        crate::instance::fast::plain_getattribute(g, tp)
            && crate::cpython::type_cache::type_lookup(tp, g.names.dunder_class)
                == g.orig.object_class
            && crate::cpython::type_cache::type_lookup(tp, intern!(py, "set_extra_state").as_ptr())
                == ctx.cfg.set_extra_state.as_ptr()
    }
}

/// May torch's `_load_from_state_dict` of `module` be run natively?
pub(super) fn native_allowed<'py>(
    py: Python<'py>,
    ctx: &Ctx<'py>,
    module: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let g = ctx.g;
    unsafe {
        let m = module.as_ptr();
        let tp = capi::Py_TYPE(m);
        let lfsd = intern!(py, "_load_from_state_dict");
        let ses = intern!(py, "set_extra_state");
        if crate::cpython::type_cache::type_lookup(tp, lfsd.as_ptr())
            != ctx.cfg.load_from_state_dict.as_ptr()
            || crate::cpython::type_cache::type_lookup(tp, ses.as_ptr())
                != ctx.cfg.set_extra_state.as_ptr()
            || crate::cpython::type_cache::type_lookup(tp, g.names.dunder_class)
                != g.orig.object_class
            || !crate::instance::fast::plain_getattribute(g, tp)
        {
            return Ok(false);
        }
        // Every read below, and the native body's, is a lookup by an exact
        // str in this dict: none may run code (torch's code makes them).
        let d = instance_dict(m);
        if d.is_null()
            || !crate::cpython::quiet::dict(d)
            || capi::PyDict_Contains(d, lfsd.as_ptr()) != 0
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
pub(super) fn native_load_from_state_dict<'py>(
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
        let tp = capi::Py_TYPE(t.as_ptr());
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
    // From here on this is torch's code path: copy under no_grad.
    copy_all(py, ctx.cfg, &ctx.errors, &copies)?;
    let append = intern!(py, "append");
    for key in missing {
        ctx.missing.call_method1(append, (key,))?;
    }
    // torch's end reads `self.__class__.set_extra_state` and `self._modules`
    // after the copies, which released the GIL: read now. Anything but
    // torch's method and a quiet registry dict is torch's end to run.
    let torch_end = || -> PyResult<bool> {
        let tail = ctx.cfg.load_tail.bind(py);
        tail.call1((
            module,
            local,
            prefix,
            &local_state,
            &ctx.missing,
            &ctx.unexpected,
        ))?;
        Ok(true)
    };
    let modules = match instance_attr(module, intern!(py, "_modules"))? {
        Some(m)
            if tail_plain(ctx, module)
                && exact_dict(&m)
                && unsafe { crate::cpython::quiet::dict(m.as_ptr()) } =>
        {
            m
        }
        _ => return torch_end(),
    };
    // Unexpected keys: those under `prefix` that name neither a child nor an
    // entry of local_state (torch's strict scan).
    // Made for the lookup and dropped (not remembered: one per module, kept
    // for no later use).
    let extra = intern!(py, "_extra_state");
    let extra_state_key = prefix.add(extra)?;
    let mut unexpected: Vec<Bound<'py, PyAny>> = Vec::new();
    let start = prefix.len()? as isize;
    // Where the prefix, the extra-state key and every child and local_state name
    // are ASCII strs, an ASCII key's head is looked up by its bytes, without
    // building it as a str (the same membership: str equality is byte equality).
    // The iteration first: creating the iterator allocates a GC-tracked
    // object, and a collection there runs finalizers (which may delete a
    // child, freeing its name); nothing below allocates one until the scan
    // ends.
    let keys = local.try_iter()?;
    // The names whose bytes the sets below point into, held for as long as
    // the sets are used (a finalizer may still remove them from the dicts).
    let mut held: Vec<Bound<'py, PyAny>> = Vec::new();
    let ascii_names =
        |d: &Bound<'py, PyAny>, held: &mut Vec<Bound<'py, PyAny>>| -> Option<NameSet<'py>> {
            let mut set = NameSet::default();
            let mut pos: capi::Py_ssize_t = 0;
            let mut k: *mut capi::PyObject = std::ptr::null_mut();
            let mut v: *mut capi::PyObject = std::ptr::null_mut();
            // SAFETY: exact dicts, iterated without running code; each name is
            // held (`held`) before its bytes are kept.
            unsafe {
                while capi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) != 0 {
                    let bytes = ascii_bytes(k)?;
                    held.push(Bound::from_borrowed_ptr(py, k));
                    set.insert(bytes);
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
                let m = ascii_names(&modules, &mut held);
                let l = ascii_names(local_state.as_any(), &mut held);
                match (m, l) {
                    (Some(m), Some(l)) => Some((p, x, m, l)),
                    _ => None,
                }
            }
            _ => None,
        }
    };
    for key in keys {
        let key = key?;
        if !exact_str(&key) {
            // Not reached (the keys were all exact strs when checked, and
            // the dict is torch's private copy): torch's end, from the start.
            return torch_end();
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
            let len = capi::PyUnicode_GET_LENGTH(k);
            if capi::PyUnicode_Tailmatch(k, prefix.as_ptr(), 0, len, -1) != 1
                || key.eq(&extra_state_key)?
            {
                continue;
            }
            let dot = capi::PyUnicode_FindChar(k, '.' as u32, start, len, 1);
            if dot == -2 {
                return Err(PyErr::fetch(py));
            }
            let known = if dot >= 0 {
                let head =
                    Bound::from_owned_ptr_or_err(py, capi::PyUnicode_Substring(k, start, dot))?;
                modules.contains(&head)?
            } else {
                let rest =
                    Bound::from_owned_ptr_or_err(py, capi::PyUnicode_Substring(k, start, len))?;
                local_state.contains(&rest)?
            };
            if !known {
                unexpected.push(key.clone());
            }
        }
    }
    drop(held);
    if local.contains(&extra_state_key)? {
        ctx.unexpected.call_method1(append, (extra_state_key,))?;
    }
    for key in unexpected {
        ctx.unexpected.call_method1(append, (key,))?;
    }
    Ok(true)
}
