//! Recorded `state_dict()` walks.
//!
//! With no destination given, torch's `state_dict` builds a new
//! `OrderedDict` from a pre-order walk of `_modules` (no de-duplication:
//! a shared module is saved under each of its names). What it reads depends
//! only on the classes (none overriding `state_dict`, `_save_to_state_dict`,
//! `get_extra_state` or `__getattribute__`) and on each instance dict: its
//! three registries, its two state-dict hook dicts (empty), its
//! `_non_persistent_buffers_set` and its `_version`. A plan lists the visits
//! of a complete walk with those objects and their versions, the metadata
//! key of each visit and the key of each tensor, all read after a live walk.
//!
//! A replay first checks every visit (as `crate::plans::eager` does, plus the
//! hook dicts' sizes, which change without the instance dict) and, when it
//! detaches, that every tensor is an exact `Tensor` or `Parameter` whose
//! `detach` is torch's, with no torch function or dispatch mode active; the
//! first difference hands the call to the live walk, which then records
//! afresh. Then it builds the result from what the checks found; nothing it
//! runs itself (dict and set operations on exact builtins with str keys,
//! torch's C `detach`) runs Python code, but `detach` releases the GIL and
//! any allocation may run a finalizer, so other code can change the tree
//! meanwhile. The replay holds its own references to the plan and to every
//! object it reads, and after the build checks every visit again: unchanged
//! (versions are never reused), every read it made early is the read torch
//! makes at that module; changed, the result is dropped unseen and the live
//! walk answers (the order in which the whole call follows the change). The
//! cyclic GC is not paused: other threads would see it off. The
//! non-persistent sets are read as the walk goes, as torch does (their
//! contents change without any version), each only while it holds exact
//! strs alone (`crate::cpython::quiet::set`: else a lookup runs an
//! element's `__eq__`, which may change what torch's walk reads next); one
//! that does not, even one changed by another thread while `detach` let it
//! run, sends the call to the live walk, the replay's work dropped unseen.
use crate::cpython::capi;
use crate::cpython::recursion::room_for;
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::{plain_attr, Plain};
use crate::instance::dispatch::{is_native, original, Method};
use crate::plans::table::{refuse, refused, Table, Walk};
use crate::plans::visit::{
    concat, dict_entry, empty_hooks, hooks_empty, remembered, visit_children, Builder, Checked,
    Kind, Modules,
};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;

struct Visit {
    /// The module in `Plan::modules`.
    module: u32,
    /// The end of this visit's entries in `Plan::entries` (they start where
    /// the previous visit's end).
    entries_end: u32,
    /// `_state_dict_pre_hooks`, `_state_dict_hooks` (empty when recorded).
    hooks: crate::plans::visit::Hooks,
    /// `_non_persistent_buffers_set` (an exact set); null without buffers.
    non_persistent: *mut capi::PyObject,
    /// `self._version` (borrowed from the instance dict or the class).
    version: *mut capi::PyObject,
    /// `prefix[:-1]`, the `_metadata` key.
    metadata_key: Py<PyAny>,
}

struct Entry {
    /// Borrowed from the visit's unchanged registry.
    tensor: *mut capi::PyObject,
    /// `prefix + name`.
    key: Py<PyAny>,
    /// A buffer's name (borrowed, a key of the unchanged `_buffers`); null
    /// for a parameter.
    buffer: *mut capi::PyObject,
}

pub(crate) struct Plan {
    root: *mut capi::PyObject,
    prefix: Py<PyAny>,
    /// The modules visited, with what their checks compare.
    modules: Modules,
    visits: Vec<Visit>,
    entries: Vec<Entry>,
    max_depth: u32,
}

impl Plan {
    /// Each visit with what its module's checks compare and its entries.
    fn visited(&self) -> impl Iterator<Item = (&Visit, &Checked, &[Entry])> {
        let mut start = 0usize;
        self.visits.iter().map(move |v| {
            let end = v.entries_end as usize;
            let entries = &self.entries[start..end];
            start = end;
            (v, &self.modules[v.module as usize], entries)
        })
    }
}

/// A plan being recorded.
struct Recording {
    modules: Builder,
    visits: Vec<Visit>,
    entries: Vec<Entry>,
    max_depth: u32,
}

pub(crate) static TABLE: Table<Plan> = Table::new();

impl crate::plans::table::Root for Plan {
    fn root(&self) -> usize {
        self.root as usize
    }
}

fn same_str(a: &Bound<'_, PyAny>, b: &Py<PyAny>) -> bool {
    // Both exact str: the comparison runs no code and cannot fail.
    a.as_ptr() == b.as_ptr() || unsafe { capi::PyUnicode_Compare(a.as_ptr(), b.as_ptr()) == 0 }
}

/// Is `t` an exact tensor whose `detach()` is torch's C method (which, with
/// no mode active, runs no Python code)?
unsafe fn plain_detach(g: &Globals, t: *mut capi::PyObject, detach: *mut capi::PyObject) -> bool {
    let tp = capi::Py_TYPE(t);
    if tp != g.tensor && tp != g.parameter {
        return false;
    }
    let base = crate::cpython::types::base(g.tensor);
    let found = type_lookup(tp, detach);
    !base.is_null()
        && !found.is_null()
        && found == type_lookup(base, detach)
        && capi::Py_TYPE(found) == std::ptr::addr_of_mut!(capi::PyMethodDescr_Type)
}

/// `root.state_dict(prefix=prefix, keep_vars=keep)` with no destination,
/// from its plan: Some(result) when the plan held, None when the caller must
/// walk live. `prefix` is an exact str.
pub fn replay<'py>(
    py: Python<'py>,
    g: &Globals,
    root: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    keep: bool,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let r = root.as_ptr();
    let (i, plan) = TABLE.find(|p| p.root == r && same_str(prefix, &p.prefix))?;
    let detach = crate::cpython::interned::intern!(py, "detach");
    if !keep {
        match crate::torch_api::runtime::get().and_then(|rt| rt.modes_active(py)) {
            Ok(false) => {}
            Ok(true) => return None,
            Err(e) => return Some(Err(e)),
        }
    }
    // SAFETY: see the module docs (checked in visit order).
    let ok = unsafe {
        room_for(plan.max_depth)
            && plan.visited().all(|(v, c, entries)| {
                c.holds()
                    && hooks_empty(&v.hooks)
                    && (keep
                        || entries
                            .iter()
                            .all(|e| plain_detach(g, e.tensor, detach.as_ptr())))
            })
    };
    if !ok {
        TABLE.forget(i);
        return None;
    }
    // A set whose lookups may run code: torch's walk runs it, live (the plan
    // still holds).
    if !plan.visits.iter().all(|v| {
        v.non_persistent.is_null() || unsafe { crate::cpython::quiet::set(v.non_persistent) }
    }) {
        return None;
    }
    // Our own references, taken before anything can run: `detach` releases
    // the GIL, and another thread may then change the tree (its changes come
    // after this call's reads, as one of the orders torch's walk allows) or
    // drop this plan (`plan` is our own reference).
    let mut held: Vec<Bound<'py, PyAny>> = Vec::with_capacity(plan.entries.len() * 2);
    // SAFETY: every pointer is held by an object the checks above found
    // unchanged, and nothing ran since.
    unsafe {
        for v in &plan.visits {
            held.push(Bound::from_borrowed_ptr(py, v.version));
            if !v.non_persistent.is_null() {
                held.push(Bound::from_borrowed_ptr(py, v.non_persistent));
            }
        }
        for e in &plan.entries {
            held.push(Bound::from_borrowed_ptr(py, e.tensor));
            if !e.buffer.is_null() {
                held.push(Bound::from_borrowed_ptr(py, e.buffer));
            }
        }
    }
    // No pause of the cyclic GC: `detach` lets other threads run, which
    // would see it off. A finalizer or another thread that changes the tree
    // meanwhile is found by the check after the build.
    let out = unsafe { build(py, g, &plan, keep) };
    // torch's walk reads each module's registries and hook dicts when it
    // reaches the module; the build used what the checks above found. The
    // same objects at the same versions now (nothing changed in between:
    // versions are never reused) make the two the same; anything changed
    // while `detach` let other code run sends the call to the live walk, as
    // if it had run after that change (the detached tensors are dropped
    // unseen: no mode was active to see them made).
    // SAFETY: in visit order, each module dereferenced only after its
    // holder was found unchanged; the plan is our own reference.
    let still = unsafe {
        plan.visited()
            .all(|(v, c, _)| c.holds() && hooks_empty(&v.hooks))
    };
    drop(held);
    if !still {
        TABLE.forget_plan(&plan);
        return None;
    }
    match out {
        Ok(Some(d)) => {
            TABLE.note_replay();
            Some(Ok(d))
        }
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

/// The state dict the checked plan describes; None when a
/// non-persistent set stopped being quiet (nothing observable was done).
unsafe fn build<'py>(
    py: Python<'py>,
    g: &Globals,
    plan: &Plan,
    keep: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let odict = Bound::from_borrowed_ptr(py, g.odict as *mut capi::PyObject);
    let destination = odict.call0()?;
    let metadata = odict.call0()?;
    destination.setattr(
        crate::cpython::interned::intern!(py, "_metadata"),
        &metadata,
    )?;
    let version_name = crate::cpython::interned::intern!(py, "version");
    let detach = crate::cpython::interned::intern!(py, "detach");
    for (v, _, entries) in plan.visited() {
        let local = pyo3::types::PyDict::new(py);
        local.set_item(version_name, Bound::from_borrowed_ptr(py, v.version))?;
        metadata.set_item(v.metadata_key.bind(py), local)?;
        for e in entries {
            if !e.buffer.is_null() {
                // Checked at each lookup: `detach` may have let another
                // thread run since the last.
                if !crate::cpython::quiet::set(v.non_persistent) {
                    return Ok(None);
                }
                match capi::PySet_Contains(v.non_persistent, e.buffer) {
                    0 => {}
                    1 => continue,
                    _ => return Err(PyErr::fetch(py)),
                }
            }
            let t = Bound::from_borrowed_ptr(py, e.tensor);
            let value = if keep { t } else { t.call_method0(detach)? };
            destination.set_item(e.key.bind(py), value)?;
        }
    }
    Ok(Some(destination))
}

/// After a live `root.state_dict(prefix=prefix)` with no destination
/// completed: record the walk it would take now, if a plan can describe it.
pub fn record(g: &Globals, root: &Bound<'_, PyAny>, prefix: &Bound<'_, PyAny>) {
    let key = (root.as_ptr(), Walk::StateDict);
    if !crate::plans::table::enabled()
        || unsafe { capi::PyUnicode_CheckExact(prefix.as_ptr()) } == 0
        || refused(key)
    {
        return;
    }
    let mut rec = Recording {
        modules: Builder::new(),
        visits: Vec::new(),
        entries: Vec::new(),
        max_depth: 0,
    };
    // Nothing the recording allocates may run a finalizer meanwhile.
    let gc = crate::cpython::gc::GcPause::new();
    let ok = unsafe { visit(g, root, prefix, 0, &mut rec) };
    drop(gc);
    // SAFETY: clearing what a lookup of the recording may have raised.
    unsafe { capi::PyErr_Clear() };
    if !ok || !crate::plans::roots::watch(root) {
        refuse(key);
        return;
    }
    let r = root.as_ptr();
    let mut plan = Plan {
        root: r,
        prefix: prefix.clone().unbind(),
        modules: rec.modules.finish(r as usize),
        visits: rec.visits,
        entries: rec.entries,
        max_depth: rec.max_depth,
    };
    if !plan.visited().all(|(_, c, _)| unsafe { c.holds() }) {
        refuse(key);
        return;
    }
    plan.visits.shrink_to_fit();
    plan.entries.shrink_to_fit();
    TABLE.store(root, |p| p.root == r && same_str(prefix, &p.prefix), plan);
}

/// Record `module`'s visit under `prefix` and its children's, in torch's
/// order; false where the walk leaves what a plan can describe. Runs no
/// Python code: only quiet dicts and exact strs are read (`is_native`
/// answers false for a dict that is not quiet, without a lookup).
unsafe fn visit(
    g: &Globals,
    module: &Bound<'_, PyAny>,
    prefix: &Bound<'_, PyAny>,
    depth: u32,
    plan: &mut Recording,
) -> bool {
    let py = module.py();
    let m = module.as_ptr();
    let tp = capi::Py_TYPE(m);
    let extra = crate::cpython::interned::intern!(py, "get_extra_state").as_ptr();
    if (depth > 0 && !is_native(g, module, Method::StateDict))
        || !is_native(g, module, Method::SaveToStateDict)
        || type_lookup(tp, g.names.dunder_getattribute) != g.orig.object_getattribute
        || type_lookup(tp, g.names.dunder_class) != g.orig.object_class
        || Some(type_lookup(tp, extra)) != original(Method::GetExtraState)
    {
        return false;
    }
    let Some(checked) = Checked::read(g, m) else {
        return false;
    };
    let hook_names = [
        crate::cpython::interned::intern!(py, "_state_dict_pre_hooks").as_ptr(),
        crate::cpython::interned::intern!(py, "_state_dict_hooks").as_ptr(),
    ];
    let Some(hooks) = empty_hooks(g, &checked, hook_names) else {
        return false;
    };
    let version = match plain_attr(
        tp,
        checked.seen.dict,
        crate::cpython::interned::intern!(py, "_version").as_ptr(),
    ) {
        Plain::Found(v) => v,
        _ => return false,
    };
    // torch's `prefix[:-1]`.
    let Some(metadata_key) = remembered(Kind::ButLast, prefix, prefix, || {
        crate::state::load_state_dict::but_last(prefix)
            .map_err(|e| e.restore(py))
            .ok()
    })
    .filter(|k| capi::PyUnicode_CheckExact(k.as_ptr()) != 0) else {
        return false;
    };
    let mut non_persistent: *mut capi::PyObject = std::ptr::null_mut();
    for (reg, is_buffer) in [(checked.parameters(), false), (checked.buffers(), true)] {
        let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        while capi::PyDict_Next(reg, &mut pos, &mut name, &mut value) != 0 {
            if capi::PyUnicode_CheckExact(name) == 0 {
                return false;
            }
            if value == capi::Py_None() {
                continue;
            }
            if is_buffer && non_persistent.is_null() {
                non_persistent = dict_entry(tp, checked.seen.dict, g.names.non_persistent);
                if non_persistent.is_null() || capi::PySet_CheckExact(non_persistent) == 0 {
                    return false;
                }
            }
            let Some(key) = remembered(
                Kind::Plain,
                prefix,
                &Bound::from_borrowed_ptr(py, name),
                || concat(prefix, name),
            ) else {
                return false;
            };
            plan.entries.push(Entry {
                tensor: value,
                key: key.unbind(),
                buffer: if is_buffer {
                    name
                } else {
                    std::ptr::null_mut()
                },
            });
        }
    }
    plan.max_depth = plan.max_depth.max(depth);
    let Some(index) = plan.modules.add(checked) else {
        return false;
    };
    plan.visits.push(Visit {
        module: index,
        entries_end: plan.entries.len() as u32,
        hooks,
        non_persistent,
        version,
        metadata_key: metadata_key.unbind(),
    });
    visit_children(
        g,
        &checked,
        prefix,
        |name| capi::PyUnicode_CheckExact(name) != 0,
        |child, child_prefix| visit(g, child, child_prefix, depth + 1, plan),
    )
}
