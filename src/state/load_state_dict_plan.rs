//! Recorded `load_state_dict` walks.
//!
//! torch's `load` recursion hands each module the entries of its parent's
//! dict under the module's prefix, runs `_load_from_state_dict` (which copies
//! each parameter and persistent buffer from `prefix + name` and scans the
//! dict for unexpected keys) and recurses into `_modules`. When no module
//! overrides `_load_from_state_dict` or `set_extra_state` and none has a
//! load hook, what that reads besides the given dict depends only on the
//! classes, the instance dicts, their registries and each
//! `_non_persistent_buffers_set`. A plan lists the visits of such a tree with
//! those objects and versions, and every parameter and buffer with its full
//! key (names without `.`, none called `_extra_state`, none both a parameter
//! and a buffer, so a key is expected exactly where torch's scan would accept
//! it and torch's `local_state` has one entry per key).
//!
//! A replay first checks, without changing anything and without running
//! code: every visit (as in `crate::plans::eager`, plus the hook dicts' sizes,
//! which change without the instance dict); every buffer's persistence, in a
//! `_non_persistent_buffers_set` of exact strs (its contents change without
//! any version, so this is checked on every call); each module's local
//! metadata (`metadata.get(prefix[:-1])`: absent, or a dict without a true
//! `assign_to_params_buffers`, read only where every key is an exact str);
//! that the given dict has only exact str keys, exactly as many as the
//! expected keys, and all of them (so no key is missing or unexpected
//! anywhere); and each pair's types, shapes and `is_meta`
//! (`crate::state::load_state_dict::plain_copy`, the live path's test). Any difference
//! hands the call to the live walk, which then records afresh. Then the
//! caller walks the tree as torch's `load` does ([`Replay`],
//! `crate::state::load_state_dict::load_replay`): `copy_` releases the GIL,
//! so another thread (or a finalizer) may change the tree between two
//! modules. Each module after the first is therefore checked again where the
//! walk reaches it (its class, dicts, registries, hook dicts, persistence
//! and local metadata: what torch's `_load_from_state_dict` reads when it
//! starts), the children's dict is read and iterated live after the
//! module's copies, and the post-hooks are read after the children, as in
//! torch; a module that changed is loaded live from there, from a copy of
//! the caller's dict taken before anything else (torch's own
//! `OrderedDict(state_dict)`). The cyclic GC is paused only during the
//! checks and that copy (no finalizer runs between them, and they release
//! nothing), and the pairs are the replay's own references while `copy_`
//! releases the GIL.
use crate::cpython::capi;
use crate::cpython::recursion::room_for;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::dict_version;
use crate::plans::table::{refuse, refused, Table, Walk};
use crate::plans::visit::{
    concat, empty_hooks, hooks_empty, remembered, visit_children, Builder, Checked, Kind, Modules,
};
use crate::state::load_state_dict::{plain_copy, CopyPair};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;
use std::cell::Cell;

struct Visit {
    /// The module in `Plan::modules`.
    module: u32,
    /// The end of this visit's entries in `Plan::entries` (they start where
    /// the previous visit's end).
    entries_end: u32,
    /// `_load_state_dict_pre_hooks`, `_load_state_dict_post_hooks`.
    hooks: crate::plans::visit::Hooks,
    /// `_non_persistent_buffers_set` (an exact set).
    non_persistent: *mut capi::PyObject,
    /// `prefix[:-1]`, the module's key in the state dict's `_metadata`.
    metadata_key: Py<PyAny>,
    /// The prefix torch's `load` passes this module (`""` at the root).
    prefix: Py<PyAny>,
    /// Its depth below the root (a subtree's visits follow it, deeper).
    depth: u32,
    /// The local metadata the last full check found here (an exact dict or
    /// null: absent) with its version (see `Plan::metadata_seen`).
    local_seen: Cell<(*mut capi::PyObject, u64)>,
}

struct Entry {
    /// Borrowed from the visit's unchanged registry.
    tensor: *mut capi::PyObject,
    /// `prefix + name` (owned; its hash is cached after the first lookup).
    key: Py<PyAny>,
    /// A buffer's name (a key of the unchanged `_buffers`); null for a
    /// parameter.
    buffer: *mut capi::PyObject,
}

pub(crate) struct Plan {
    root: *mut capi::PyObject,
    /// The modules visited, with what their checks compare.
    modules: Modules,
    visits: Vec<Visit>,
    entries: Vec<Entry>,
    /// For each entry: was it (a buffer) persistent when recorded?
    persistent: Vec<bool>,
    max_depth: u32,
    /// The `_metadata` dict (address, version) whose local metadata the last
    /// check found plain, every local one an exact dict or absent; (0, 0)
    /// when none. While it and each `Visit::local_seen` keep their versions
    /// (unique per change: a new binding or key is a new version), the
    /// lookups would find the same, so they are not made again.
    metadata_seen: Cell<(usize, u64)>,
}

pub(crate) static TABLE: Table<Plan> = Table::new();

impl Plan {
    /// Each visit with what its module's checks compare and its entries'
    /// range in `entries`.
    fn visited(&self) -> impl Iterator<Item = (&Visit, &Checked, std::ops::Range<usize>)> {
        let mut start = 0usize;
        self.visits.iter().map(move |v| {
            let end = v.entries_end as usize;
            let range = start..end;
            start = end;
            (v, &self.modules[v.module as usize], range)
        })
    }
}

/// A plan being recorded.
struct Recording {
    modules: Builder,
    visits: Vec<Visit>,
    entries: Vec<Entry>,
    persistent: Vec<bool>,
    max_depth: u32,
}

impl crate::plans::table::Root for Plan {
    fn root(&self) -> usize {
        self.root as usize
    }
}

/// torch's own `_load_from_state_dict` and `set_extra_state`.
pub struct Originals {
    pub load_from_state_dict: *mut capi::PyObject,
    pub set_extra_state: *mut capi::PyObject,
}

/// The copies of `load(root, state_dict)`, in torch's order, from `root`'s
/// plan: Some when the plan held and the given dict matches it exactly (no
/// key missing or unexpected, every pair torch's common case), None when the
/// caller must walk live (nothing was done). `state_dict` is a dict or
/// `OrderedDict`; the caller checked that nothing is assigned, the metadata
/// is None or a dict or `OrderedDict`, torch's `swap_tensors` flag is off
/// and no mode is active, and makes the copies
/// (`crate::state::load_state_dict::load_replay`).
pub fn replay<'py>(
    py: Python<'py>,
    g: &'static Globals,
    root: &Bound<'py, PyAny>,
    state_dict: &Bound<'py, PyAny>,
    metadata: &Bound<'py, PyAny>,
) -> Option<PyResult<Replay<'py>>> {
    let r = root.as_ptr();
    let (i, plan) = TABLE.find(|p| p.root == r)?;
    // The checks run no code and release nothing (see the module docs), and
    // neither does the copy of the caller's dict.
    let gc = crate::cpython::gc::GcPause::new();
    let checked = unsafe { check(py, g, &plan, state_dict, metadata) };
    let checked = match checked {
        // torch's own copy (`OrderedDict(state_dict)`), taken before
        // anything of the load: what a module loaded live below reads even
        // if the caller's dict changes meanwhile.
        Check::Pairs(pairs, ends) => {
            match unsafe {
                Bound::from_owned_ptr_or_err(py, capi::PyDict_Copy(state_dict.as_ptr()))
            } {
                Ok(snapshot) => Ok((pairs, ends, snapshot)),
                Err(e) => Err(Check::Error(e)),
            }
        }
        other => Err(other),
    };
    drop(gc);
    let (pairs, ends, snapshot) = match checked {
        Ok(x) => x,
        Err(Check::Stale) => {
            TABLE.forget(i);
            return None;
        }
        Err(Check::Error(e)) => return Some(Err(e)),
        Err(_) => return None,
    };
    TABLE.note_replay();
    let md_version = if metadata.is_none() {
        0
    } else {
        unsafe { dict_version(metadata.as_ptr()) }
    };
    Some(Ok(Replay {
        g,
        plan,
        pairs,
        ends,
        snapshot,
        metadata: metadata.clone(),
        md_version,
    }))
}

/// A checked replay of `load`, carried out by
/// `crate::state::load_state_dict::load_replay` module by module: each
/// module after the first is checked again where torch's `load` reaches it
/// (`copy_` released the GIL before: other code may have changed it), and one
/// that changed is loaded live from there, as torch would load it then.
pub struct Replay<'py> {
    g: &'static Globals,
    plan: std::sync::Arc<Plan>,
    /// The (key, param, input) copies of every visit, in torch's order.
    pairs: Vec<CopyPair<'py>>,
    /// The end of each visit's copies in `pairs`.
    ends: Vec<u32>,
    /// torch's copy of the caller's dict (a dict in its order).
    snapshot: Bound<'py, PyAny>,
    metadata: Bound<'py, PyAny>,
    /// The metadata dict's version when checked (0 without one).
    md_version: u64,
}

impl<'py> Replay<'py> {
    pub fn visits(&self) -> usize {
        self.plan.visits.len()
    }

    /// The module of visit `k` (borrowed: compared by identity only).
    pub fn module(&self, k: usize) -> *mut capi::PyObject {
        self.plan.modules[self.plan.visits[k].module as usize].module
    }

    pub fn depth(&self, k: usize) -> u32 {
        self.plan.visits[k].depth
    }

    pub fn prefix(&self, k: usize) -> Bound<'py, PyAny> {
        self.plan.visits[k].prefix.bind(self.snapshot.py()).clone()
    }

    /// Is visit `k`'s `_modules` registry the recorded dict, unchanged? Its
    /// children are then the recorded ones, in order.
    ///
    /// # Safety
    /// GIL held; `k`'s module alive (the caller holds it).
    pub unsafe fn children_unchanged(&self, k: usize) -> bool {
        let c = &self.plan.modules[self.plan.visits[k].module as usize];
        c.seen_holds() && c.reg_unchanged(2)
    }

    /// Visit `k`'s `_modules` registry, when its class and instance dict are
    /// as recorded (so `module._modules` reads that very dict, as torch's
    /// `load` would read it now); None otherwise.
    ///
    /// # Safety
    /// GIL held; `k`'s module alive (the caller holds it).
    pub unsafe fn modules_now(&self, k: usize) -> Option<Bound<'py, PyAny>> {
        let c = &self.plan.modules[self.plan.visits[k].module as usize];
        c.seen_holds()
            .then(|| Bound::from_borrowed_ptr(self.snapshot.py(), c.modules()))
    }

    /// Are visit `k`'s class, instance dict and load hook dicts as recorded
    /// (so `module._load_state_dict_post_hooks` is still the empty dict it
    /// was)?
    ///
    /// # Safety
    /// GIL held; `k`'s module alive.
    pub unsafe fn hooks_still_empty(&self, k: usize) -> bool {
        let v = &self.plan.visits[k];
        self.plan.modules[v.module as usize].seen_holds() && hooks_empty(&v.hooks)
    }

    /// The copies of visit `k`.
    pub fn pairs(&self, k: usize) -> &[CopyPair<'py>] {
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        &self.pairs[start..self.ends[k] as usize]
    }

    /// The first visit after `k`'s subtree.
    pub fn subtree_end(&self, k: usize) -> usize {
        let d = self.plan.visits[k].depth;
        self.plan.visits[k + 1..]
            .iter()
            .position(|v| v.depth <= d)
            .map_or(self.plan.visits.len(), |i| k + 1 + i)
    }

    /// The entries of torch's copy under `prefix`, in its order: the dict
    /// torch's `load` hands the module there (`prefix` "" is the root's).
    pub fn local(&self, prefix: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = prefix.py();
        let out = pyo3::types::PyDict::new(py);
        let whole = prefix.len()? == 0;
        let startswith = crate::cpython::interned::intern!(py, "startswith");
        for kv in self
            .snapshot
            .call_method0(crate::cpython::interned::intern!(py, "items"))?
            .try_iter()?
        {
            let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = kv?.extract()?;
            if whole || k.call_method1(startswith, (prefix,))?.is_truthy()? {
                out.set_item(k, v)?;
            }
        }
        Ok(out.into_any())
    }

    /// Does visit `k` still read as when checked, where torch's `load`
    /// reaches its module (held by the caller): its class, instance dict and
    /// registries, its hook dicts, each buffer's persistence and its local
    /// metadata? Then its recorded copies are what torch's
    /// `_load_from_state_dict` does now. Runs no code.
    ///
    /// # Safety
    /// GIL held; `k`'s module alive.
    pub unsafe fn still(&self, k: usize) -> bool {
        let plan = &*self.plan;
        let v = &plan.visits[k];
        let c = &plan.modules[v.module as usize];
        if !c.holds() || !hooks_empty(&v.hooks) || !crate::cpython::quiet::set(v.non_persistent) {
            return false;
        }
        let start = if k == 0 {
            0
        } else {
            plan.visits[k - 1].entries_end as usize
        };
        for i in start..v.entries_end as usize {
            let e = &plan.entries[i];
            if !e.buffer.is_null()
                && (capi::PySet_Contains(v.non_persistent, e.buffer) == 1) == plan.persistent[i]
            {
                return false;
            }
        }
        let md = self.metadata.as_ptr();
        if md == capi::Py_None() {
            return true;
        }
        let names = AssignNames::new(self.snapshot.py());
        if !crate::state::load_state_dict::plain_mapping(self.g, md, names.get) {
            return false;
        }
        let local = if dict_version(md) == self.md_version {
            // The same entry as at the check (held by the unchanged dict).
            v.local_seen.get().0
        } else {
            if !crate::cpython::str_keys::all_str(md) {
                return false;
            }
            let l = capi::PyDict_GetItemWithError(md, v.metadata_key.as_ptr());
            if l.is_null() && !capi::PyErr_Occurred().is_null() {
                capi::PyErr_Clear();
                return false;
            }
            l
        };
        copies_in_place(self.g, &names, local)
    }
}

enum Check<'py> {
    /// Everything matches: the (key, param, input) copies, in torch's order,
    /// and the end of each visit's in them.
    Pairs(Vec<CopyPair<'py>>, Vec<u32>),
    /// The tree changed: drop the plan.
    Stale,
    /// The tree holds, but this call is not the plain case.
    Differs,
    Error(PyErr),
}

/// The interned names [`copies_in_place`] reads (borrowed, immortal by
/// interning).
pub(crate) struct AssignNames {
    get: *mut capi::PyObject,
    assign: *mut capi::PyObject,
}

impl AssignNames {
    pub(crate) fn new(py: Python<'_>) -> AssignNames {
        AssignNames {
            get: crate::cpython::interned::intern!(py, "get").as_ptr(),
            assign: crate::cpython::interned::intern!(py, "assign_to_params_buffers").as_ptr(),
        }
    }
}

/// Would torch's `_load_from_state_dict` find no true
/// `assign_to_params_buffers` in `local_metadata` (borrowed; null: absent,
/// torch's fresh `{}`), read without running code? False where it cannot
/// tell so (not a dict or `OrderedDict` with `dict`'s `get`, a key that is
/// not an exact str).
///
/// # Safety
/// GIL held.
pub(crate) unsafe fn copies_in_place(
    g: &Globals,
    names: &AssignNames,
    local_metadata: *mut capi::PyObject,
) -> bool {
    if local_metadata.is_null() {
        return true;
    }
    if !crate::state::load_state_dict::plain_mapping(g, local_metadata, names.get)
        || !crate::cpython::str_keys::all_str(local_metadata)
    {
        return false;
    }
    // `dict.get` (`OrderedDict`'s is the same): only strs compared, so
    // nothing runs and nothing can fail.
    let v = capi::PyDict_GetItemWithError(local_metadata, names.assign);
    if v.is_null() {
        return capi::PyErr_Occurred().is_null();
    }
    v == capi::Py_False()
}

/// Is `md` the `_metadata` dict `plan`'s last check found plain, with it and
/// every local metadata dict unchanged since? Each local dict is held by
/// `md`, unchanged.
unsafe fn metadata_as_seen(plan: &Plan, md: *mut capi::PyObject) -> bool {
    plan.metadata_seen.get() == (md as usize, dict_version(md))
        && plan.visits.iter().all(|v| {
            let (local, version) = v.local_seen.get();
            local.is_null() || dict_version(local) == version
        })
}

/// Each module's `local_metadata` (`metadata.get(prefix[:-1], {})`) leaves
/// `_load_from_state_dict` copying in place, read without running code.
/// `md` is a dict or an `OrderedDict` with `dict`'s `get`.
unsafe fn metadata_plain(
    py: Python<'_>,
    g: &Globals,
    plan: &Plan,
    md: *mut capi::PyObject,
) -> Result<bool, PyErr> {
    if metadata_as_seen(plan, md) {
        return Ok(true);
    }
    plan.metadata_seen.set((0, 0));
    if !crate::cpython::str_keys::all_str(md) {
        return Ok(false);
    }
    let names = AssignNames::new(py);
    let mut exact = true;
    for v in &plan.visits {
        let local = capi::PyDict_GetItemWithError(md, v.metadata_key.as_ptr());
        if local.is_null() && !capi::PyErr_Occurred().is_null() {
            return Err(PyErr::fetch(py));
        }
        if !copies_in_place(g, &names, local) {
            return Ok(false);
        }
        // An `OrderedDict`'s answer also depends on its instance `__dict__`:
        // not remembered.
        exact &= local.is_null() || capi::PyDict_CheckExact(local) != 0;
        let version = if local.is_null() {
            0
        } else {
            dict_version(local)
        };
        v.local_seen.set((local, version));
    }
    if exact {
        plan.metadata_seen.set((md as usize, dict_version(md)));
    }
    Ok(true)
}

unsafe fn check<'py>(
    py: Python<'py>,
    g: &Globals,
    plan: &Plan,
    state_dict: &Bound<'py, PyAny>,
    metadata: &Bound<'py, PyAny>,
) -> Check<'py> {
    if !room_for(plan.max_depth) {
        return Check::Differs;
    }
    for (v, c, _) in plan.visited() {
        if !c.holds() || !hooks_empty(&v.hooks) {
            return Check::Stale;
        }
    }
    // Each module's `local_metadata`, as torch's `load` gets it (the caller
    // checked the metadata is None, a dict or an `OrderedDict`).
    let md = metadata.as_ptr();
    if md != capi::Py_None() {
        match metadata_plain(py, g, plan, md) {
            Ok(true) => {}
            Ok(false) => return Check::Differs,
            Err(e) => return Check::Error(e),
        }
    }
    let sd = state_dict.as_ptr();
    let (mut pos, mut k, mut val) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while capi::PyDict_Next(sd, &mut pos, &mut k, &mut val) != 0 {
        if capi::PyUnicode_CheckExact(k) == 0 {
            return Check::Differs;
        }
    }
    let mut expected: capi::Py_ssize_t = 0;
    for (v, _, range) in plan.visited() {
        // A lookup in a set holding anything but exact strs may run code
        // (an element's `__eq__`): then torch's code makes it, live.
        if !crate::cpython::quiet::set(v.non_persistent) {
            return Check::Differs;
        }
        for k in range {
            let e = &plan.entries[k];
            if !e.buffer.is_null() {
                let non_persistent = match capi::PySet_Contains(v.non_persistent, e.buffer) {
                    0 => false,
                    1 => true,
                    _ => return Check::Error(PyErr::fetch(py)),
                };
                if non_persistent == plan.persistent[k] {
                    // Changed without a version: record afresh.
                    return Check::Stale;
                }
                if non_persistent {
                    continue;
                }
            }
            expected += 1;
        }
    }
    if capi::PyDict_Size(sd) != expected {
        return Check::Differs;
    }
    let mut pairs = Vec::with_capacity(expected as usize);
    let mut ends = Vec::with_capacity(plan.visits.len());
    let mut visit_ends = plan
        .visits
        .iter()
        .map(|v| v.entries_end as usize)
        .peekable();
    for (i, (e, &persistent)) in plan.entries.iter().zip(&plan.persistent).enumerate() {
        while visit_ends.next_if(|&end| end <= i).is_some() {
            ends.push(pairs.len() as u32);
        }
        if !e.buffer.is_null() && !persistent {
            continue;
        }
        // Str keys only: the lookup compares strings, running no code.
        let input = capi::PyDict_GetItemWithError(sd, e.key.as_ptr());
        if input.is_null() {
            if !capi::PyErr_Occurred().is_null() {
                return Check::Error(PyErr::fetch(py));
            }
            return Check::Differs;
        }
        let param = Bound::from_borrowed_ptr(py, e.tensor);
        let input = Bound::from_borrowed_ptr(py, input);
        // The live path's own test, so that the two take the same pairs.
        let same = plain_copy(g, &param, &input);
        match same {
            Ok(true) => pairs.push((e.key.bind(py).clone(), param, input)),
            Ok(false) => return Check::Differs,
            Err(err) => return Check::Error(err),
        }
    }
    ends.extend(visit_ends.map(|_| pairs.len() as u32));
    Check::Pairs(pairs, ends)
}

/// After a live load of `root` completed: record the walk, if a plan can
/// describe it.
pub fn record(g: &Globals, orig: &Originals, root: &Bound<'_, PyAny>) {
    let key = (root.as_ptr(), Walk::Load);
    if !crate::plans::table::enabled() || refused(key) {
        return;
    }
    // A plan that still holds (the last call's dict was not the plain case)
    // is kept as it is.
    let r = root.as_ptr();
    if let Some((_, p)) = TABLE.find(|p| p.root == r) {
        if p.visited()
            .all(|(v, c, _)| unsafe { c.holds() && hooks_empty(&v.hooks) })
        {
            return;
        }
    }
    let py = root.py();
    let mut rec = Recording {
        modules: Builder::new(),
        visits: Vec::new(),
        entries: Vec::new(),
        persistent: Vec::new(),
        max_depth: 0,
    };
    let prefix = pyo3::types::PyString::new(py, "");
    // Nothing the recording allocates may run a finalizer meanwhile.
    let gc = crate::cpython::gc::GcPause::new();
    let ok = unsafe { visit(g, orig, root, prefix.as_any(), 0, &mut rec) };
    drop(gc);
    // SAFETY: clearing what a lookup of the recording may have raised.
    unsafe { capi::PyErr_Clear() };
    if !ok || !crate::plans::roots::watch(root) {
        refuse(key);
        return;
    }
    let mut plan = Plan {
        root: r,
        modules: rec.modules.finish(r as usize),
        visits: rec.visits,
        entries: rec.entries,
        persistent: rec.persistent,
        max_depth: rec.max_depth,
        metadata_seen: Cell::new((0, 0)),
    };
    if !plan.visited().all(|(_, c, _)| unsafe { c.holds() }) {
        refuse(key);
        return;
    }
    plan.visits.shrink_to_fit();
    plan.entries.shrink_to_fit();
    plan.persistent.shrink_to_fit();
    TABLE.store(root, |p| p.root == r, plan);
}

/// A registry name a plan can key on: an exact str, not empty, without `.`,
/// other than `_extra_state`.
unsafe fn plain_name(name: *mut capi::PyObject, extra: *mut capi::PyObject) -> bool {
    if capi::PyUnicode_CheckExact(name) == 0 {
        return false;
    }
    let len = capi::PyUnicode_GetLength(name);
    len > 0
        && capi::PyUnicode_FindChar(name, '.' as u32, 0, len, 1) == -1
        && capi::PyUnicode_Compare(name, extra) != 0
}

/// Record `module`'s visit under `prefix` and its children's, in torch's
/// order; false where the load leaves what a plan can describe. Runs no
/// Python code: only quiet dicts and sets and exact strs are read.
unsafe fn visit(
    g: &Globals,
    orig: &Originals,
    module: &Bound<'_, PyAny>,
    prefix: &Bound<'_, PyAny>,
    depth: u32,
    plan: &mut Recording,
) -> bool {
    let py = module.py();
    let m = module.as_ptr();
    let tp = capi::Py_TYPE(m);
    let lfsd = crate::cpython::interned::intern!(py, "_load_from_state_dict").as_ptr();
    let ses = crate::cpython::interned::intern!(py, "set_extra_state").as_ptr();
    let extra = crate::cpython::interned::intern!(py, "_extra_state").as_ptr();
    if type_lookup(tp, lfsd) != orig.load_from_state_dict
        || type_lookup(tp, ses) != orig.set_extra_state
        || type_lookup(tp, g.names.dunder_class) != g.orig.object_class
        || !crate::instance::fast::plain_getattribute(g, tp)
    {
        return false;
    }
    let Some(checked) = Checked::read(g, m) else {
        return false;
    };
    if capi::PyDict_Contains(checked.seen.dict, lfsd) != 0 {
        return false;
    }
    let hook_names = [
        crate::cpython::interned::intern!(py, "_load_state_dict_pre_hooks").as_ptr(),
        crate::cpython::interned::intern!(py, "_load_state_dict_post_hooks").as_ptr(),
    ];
    let Some(hooks) = empty_hooks(g, &checked, hook_names) else {
        return false;
    };
    let non_persistent =
        crate::plans::visit::dict_entry(tp, checked.seen.dict, g.names.non_persistent);
    if non_persistent.is_null() || !crate::cpython::quiet::set(non_persistent) {
        return false;
    }
    let Ok(metadata_key) = crate::instance::qualified_names::name(
        crate::instance::qualified_names::Kind::ButLast,
        prefix,
        prefix,
        || crate::state::load_state_dict::but_last(prefix),
    ) else {
        return false;
    };
    if capi::PyUnicode_CheckExact(metadata_key.as_ptr()) == 0 {
        return false;
    }
    for (reg, is_buffer) in [(checked.parameters(), false), (checked.buffers(), true)] {
        let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        while capi::PyDict_Next(reg, &mut pos, &mut name, &mut value) != 0 {
            // A name that is both a parameter and a buffer is one key of
            // torch's `local_state` (quiet registries: no code runs).
            if is_buffer && capi::PyDict_Contains(checked.parameters(), name) != 0 {
                return false;
            }
            if value == capi::Py_None() {
                continue;
            }
            if !plain_name(name, extra) {
                return false;
            }
            let persistent = !is_buffer || capi::PySet_Contains(non_persistent, name) == 0;
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
            plan.persistent.push(persistent);
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
        metadata_key: metadata_key.unbind(),
        prefix: prefix.clone().unbind(),
        depth,
        local_seen: Cell::new((std::ptr::null_mut(), 0)),
    });
    visit_children(
        g,
        &checked,
        prefix,
        |name| plain_name(name, extra),
        |child, child_prefix| visit(g, orig, child, child_prefix, depth + 1, plan),
    )
}
