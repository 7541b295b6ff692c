//! Recorded eager walks: `train()`/`eval()`, and `_apply` with a conversion
//! that changes nothing (`.float()` on a float32 model, `.to(device)` on a
//! model already there).
//!
//! Both recurse through `children()`: the modules they visit, in order,
//! depend only on the classes (none overriding the walked method, `children`
//! or `named_children`, or hashing its instances other than by identity) and
//! on the instance dicts and their three registries (`_modules` gives the
//! children; `train`'s `__setattr__` looks `training` up in `_parameters`
//! and `_buffers`; `_apply` converts their tensors). A plan lists the
//! modules a complete walk visits, each once in the order first visited (a
//! module shared by two parents is visited again with the same outcome),
//! with its class and `tp_version_tag`, its instance dict and that dict's
//! version, the three registry dicts with their versions (the tree's
//! snapshot, `crate::plans::visit::Modules`) and, for `_apply`, the tensors
//! each visit converts, all read after the walk.
//!
//! A replay first checks every visited module (a dict's version changes with
//! any insertion, deletion or rebinding; a class's tag with any change to it
//! or a base); the first difference hands the call to the live walk, which
//! then records afresh. For `train`, the checks pass only if torch's walk would
//! visit the same modules and find each `training` a bool (every visited
//! module's `training` was `mode` when recorded): rebinding a bool in a
//! quiet instance dict (`crate::cpython::quiet::dict`: required of every
//! dict a plan reads when recorded, and kept while its version holds) runs
//! no code, so checking everything first and then setting is the same as
//! torch's interleaving. A dict with a key that compares with `__eq__` would
//! run it during the set, while the replay holds the plan's borrowed
//! pointers: such a tree is not recorded (`crate::plans::visit::Checked`).
//! Setting the other mode updates the recorded versions (in the plan's own
//! copy of the snapshot), so an alternating `train()`/`eval()` keeps its
//! plan. For
//! `_apply`, the caller then asks of every tensor whether the conversion
//! leaves it (and its grad) as it is, which reads but changes nothing: if all
//! do, the whole walk is a no-op; otherwise it runs live from the start.
//!
//! Pointers are borrowed and dereferenced in visit order, each only after the
//! visit holding it (its parent, whose unchanged `_modules` keeps it alive)
//! passed its checks. The table, the module checks and the refusals are
//! `crate::plans::table`'.
use crate::cpython::capi;
use crate::cpython::recursion::room_for;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::dict_version;
use crate::instance::dispatch::{is_native, Method};
use crate::plans::table::{refuse, refused, Table, Walk};
use crate::plans::visit::{Builder, Checked, Modules};
use crate::torch_api::originals::Globals;
use pyo3::prelude::*;
use pyo3::types::PyString;

pub(crate) struct Plan {
    root: *mut capi::PyObject,
    walk: Walk,
    /// The modules visited (each once, in the order first visited), with
    /// what their checks compare.
    modules: Modules,
    /// `_apply`: for each visit, where its non-None parameters end and where
    /// its buffers end in `tensors` (they start where the previous visit's
    /// end; borrowed from the unchanged registries).
    splits: Vec<(u32, u32)>,
    tensors: Vec<*mut capi::PyObject>,
    /// The deepest visit's depth below the root.
    max_depth: u32,
    /// `train`: every visited module's `training` (`Py_True` or `Py_False`).
    mode: *mut capi::PyObject,
}

/// A plan being recorded.
struct Recording {
    walk: Walk,
    modules: Builder,
    splits: Vec<(u32, u32)>,
    tensors: Vec<*mut capi::PyObject>,
    max_depth: u32,
    mode: *mut capi::PyObject,
}

pub(crate) static TABLE: Table<Plan> = Table::new();

impl crate::plans::table::Root for Plan {
    fn root(&self) -> usize {
        self.root as usize
    }
}

/// The slot and plan of `root`'s `walk`, if every visit still holds (a stale
/// plan is dropped).
fn holding(root: *mut capi::PyObject, walk: Walk) -> Option<(usize, std::sync::Arc<Plan>)> {
    let (i, plan) = TABLE.find(|p| p.root == root && p.walk == walk)?;
    // Each visited module once, in the order first visited (a module visited
    // again, shared by two parents, would be checked again with the same
    // result: nothing runs in between).
    // SAFETY: see the module docs (checked in visit order).
    if unsafe { room_for(plan.max_depth) && plan.modules.iter().all(|c| c.holds()) } {
        Some((i, plan))
    } else {
        TABLE.forget(i);
        None
    }
}

/// Run `train(mode)` on `root` from its plan: Some(result) when the plan held
/// (the walk is done), None when the caller must walk live. `mode` is an
/// exact bool.
pub fn replay_train(
    py: Python<'_>,
    g: &Globals,
    name: &Bound<'_, PyString>,
    root: &Bound<'_, PyAny>,
    mode: &Bound<'_, PyAny>,
) -> Option<PyResult<()>> {
    // Every rebinding below stands for a call of torch's `__setattr__`
    // (stock calls it at every module, even where `training` is already
    // `mode`). Its class lookup is covered by the visits' class versions, but
    // a replaced `__code__` or defaults changes no version: compared here, on
    // every call, before anything of the call happened, so the live walk
    // calls the new body at every module as stock does.
    if !g.orig.setattr_intact() {
        return None;
    }
    let (i, held) = holding(root.as_ptr(), Walk::Train)?;
    drop(held);
    TABLE.note_replay();
    // Updated in place below (no GIL release: no one else holds it).
    let plan = TABLE.get_mut(i)?;
    let mode = mode.as_ptr();
    if plan.mode == mode {
        return Some(Ok(()));
    }
    // Each visited module once, in the order first visited: a shared
    // module's later visits would find `mode` already there and change
    // nothing, as in torch.
    for c in plan.modules.iter() {
        // The live walk's fast `self.training = mode` (crate::instance::walk_facts): a
        // rebinding of the entry of a quiet dict, which runs no code (and
        // frees nothing: the old value is a bool), so the next visit's
        // borrowed module is still held by its parent's unchanged
        // `_modules`.
        if unsafe { capi::PyObject_GenericSetAttr(c.module, name.as_ptr(), mode) } < 0 {
            TABLE.forget(i);
            return Some(Err(PyErr::fetch(py)));
        }
    }
    // Nothing but those rebindings ran: carry the plan to the new versions
    // (its own copy of the snapshot, if other plans share it: theirs were
    // recorded at the old versions, which their checks now refuse).
    for c in Modules::make_mut(&mut plan.modules).iter_mut() {
        c.seen.version = unsafe { dict_version(c.seen.dict) };
    }
    crate::plans::roots::note_latest(plan.root as usize, &plan.modules);
    plan.mode = mode;
    Some(Ok(()))
}

/// Is `root`'s `_apply` a no-op? Some(()) when its plan holds and
/// `unchanged(tensor, is_parameter)` is true for every tensor the walk would
/// convert; None when the caller must walk live (no plan, a stale one, or a
/// tensor to convert). `unchanged` must only read; an error it raises is
/// dropped (the live walk meets it again, in order).
pub fn apply_is_noop(
    py: Python<'_>,
    root: &Bound<'_, PyAny>,
    mut unchanged: impl FnMut(&Bound<'_, PyAny>, bool) -> PyResult<bool>,
) -> Option<()> {
    let (_, plan) = holding(root.as_ptr(), Walk::Apply)?;
    // A getter may allocate (a grad's Python object): with the cyclic GC
    // paused no finalizer runs, so the borrowed tensors stay alive.
    let gc = crate::cpython::gc::GcPause::new();
    let noop = all_left_as_is(py, &plan, &mut unchanged);
    drop(gc);
    if noop {
        TABLE.note_replay();
        return Some(());
    }
    None
}

fn all_left_as_is(
    py: Python<'_>,
    plan: &Plan,
    unchanged: &mut impl FnMut(&Bound<'_, PyAny>, bool) -> PyResult<bool>,
) -> bool {
    let mut a = 0usize;
    for &(b, c) in &plan.splits {
        let (b, c) = (b as usize, c as usize);
        for (k, &t) in plan.tensors[a..c].iter().enumerate() {
            // SAFETY: held by the visit's unchanged registry.
            let t = unsafe { Bound::from_borrowed_ptr(py, t) };
            match unchanged(&t, (a + k) < b) {
                Ok(true) => {}
                Ok(false) | Err(_) => return false,
            }
        }
        a = c;
    }
    true
}

/// After a live walk of `root` completed: record the walk it would take now,
/// if a plan can describe it. `mode`: `train`'s (Py_True/Py_False).
pub fn record(g: &Globals, walk: Walk, root: &Bound<'_, PyAny>, mode: Option<&Bound<'_, PyAny>>) {
    let key = (root.as_ptr(), walk);
    if !crate::plans::table::enabled() || refused(key) {
        return;
    }
    let py = root.py();
    let mut rec = Recording {
        walk,
        modules: Builder::new(),
        splits: Vec::new(),
        tensors: Vec::new(),
        max_depth: 0,
        mode: mode.map_or(std::ptr::null_mut(), |m| m.as_ptr()),
    };
    let training = crate::cpython::interned::intern!(py, "training").as_ptr();
    // Nothing the recording allocates may run a finalizer meanwhile.
    let gc = crate::cpython::gc::GcPause::new();
    let ok = unsafe { visit(g, training, root, 0, &mut rec) };
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
        walk,
        modules: rec.modules.finish(r as usize),
        splits: rec.splits,
        tensors: rec.tensors,
        max_depth: rec.max_depth,
        mode: rec.mode,
    };
    if !plan.modules.iter().all(|c| unsafe { c.holds() }) {
        refuse(key);
        return;
    }
    plan.splits.shrink_to_fit();
    plan.tensors.shrink_to_fit();
    TABLE.store(root, |p| p.root == r && p.walk == walk, plan);
}

/// Record `module`'s visit and its children's, in torch's order; false where
/// the walk leaves what a plan can describe. Runs no Python code: only quiet
/// dicts are read (`is_native` answers false for a dict that is not quiet,
/// without a lookup; `Checked::read` requires them), and children are
/// compared by identity.
unsafe fn visit(
    g: &Globals,
    training: *mut capi::PyObject,
    module: &Bound<'_, PyAny>,
    depth: u32,
    plan: &mut Recording,
) -> bool {
    let m = module.as_ptr();
    let tp = capi::Py_TYPE(m);
    // Children are reached through torch's walked method (the root's was
    // checked by the caller), `children` and `named_children`.
    let method = match plan.walk {
        Walk::Train => Method::Train,
        Walk::Apply => Method::ApplyFn,
        Walk::StateDict | Walk::Load => return false,
    };
    if (depth > 0 && !is_native(g, module, method))
        || !is_native(g, module, Method::Children)
        || !is_native(g, module, Method::NamedChildren)
    {
        return false;
    }
    // `train` sets `training` through torch's `__setattr__`, which rebinds a
    // plain dict entry.
    if plan.walk == Walk::Train
        && (type_lookup(tp, g.names.dunder_setattr) != g.orig.setattr
            || !g.orig.intact(g.orig.setattr)
            || !crate::instance::fast::object_after_nn_module(g, tp)
            || !type_lookup(tp, training).is_null())
    {
        return false;
    }
    let Some(checked) = Checked::read(g, m) else {
        return false;
    };
    if plan.walk == Walk::Train {
        if capi::PyDict_GetItemWithError(checked.seen.dict, training) != plan.mode {
            return false;
        }
        // Quiet dicts (`Checked::read`): no code runs.
        if checked
            .regs
            .iter()
            .any(|&(r, _)| capi::PyDict_Contains(r, training) != 0)
        {
            return false;
        }
    }
    let mut mid = plan.tensors.len() as u32;
    if plan.walk == Walk::Apply {
        for (i, reg) in [checked.parameters(), checked.buffers()]
            .into_iter()
            .enumerate()
        {
            let (mut pos, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
            while capi::PyDict_Next(reg, &mut pos, &mut key, &mut value) != 0 {
                if value != capi::Py_None() {
                    plan.tensors.push(value);
                }
            }
            if i == 0 {
                mid = plan.tensors.len() as u32;
            }
        }
    }
    plan.max_depth = plan.max_depth.max(depth);
    if plan.modules.add(checked).is_none() {
        return false;
    }
    if plan.walk == Walk::Apply {
        plan.splits.push((mid, plan.tensors.len() as u32));
    }
    let mods = checked.modules();
    let py = module.py();
    let (mut pos, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    // named_children's memo, by identity (checked per child's class).
    let mut memo: std::collections::HashSet<usize> = std::collections::HashSet::new();
    while capi::PyDict_Next(mods, &mut pos, &mut key, &mut value) != 0 {
        if value == capi::Py_None() {
            continue;
        }
        if !crate::instance::registries::identity_hashed(value) {
            return false;
        }
        if !memo.insert(value as usize) {
            continue;
        }
        let child = Bound::from_borrowed_ptr(py, value);
        if !visit(g, training, &child, depth + 1, plan) {
            return false;
        }
    }
    true
}
