//! The roots plans are recorded for, each watched weakly, so that a tree's
//! plans go with it: a plan holds no reference to its tree (its modules and
//! tensors are borrowed), only what it built (names, keys); when the root
//! dies, a weak reference's callback drops every plan recorded for it, in
//! every table. `fastmodule.restore(model)` drops those of a tree's roots
//! explicitly ([`forget`]).
//!
//! The weak reference is to the root's `_forward_hooks` dict, not to the
//! root: one to the module would show in `module.__weakref__` and
//! `weakref.getweakrefs(module)`, where stock shows none. torch puts weak
//! references on its hook dicts itself (each hook's `RemovableHandle` holds
//! one), and the dict dies with its module. Where it outlives the module
//! (kept elsewhere), the module's plans stay until it goes, and a new object
//! at the same address finds them stale (a plan checks every module's dicts
//! by version tags, which are never reused); a root whose `_forward_hooks`
//! was rebound is watched again through the new dict.
//!
//! Each table that keeps plans registers itself once ([`register`], at
//! import); a root is watched ([`watch`]) before a plan for it is stored, and
//! a plan is stored only when its root can be watched (its `_forward_hooks`
//! a plain entry of a quiet instance dict that accepts weak references, as
//! torch's `OrderedDict` does; other trees are walked live).
//!
//! Everything here runs with the GIL held (plans are off on free-threaded
//! builds). A weak reference's callback may run wherever Python allocates or
//! frees (a cyclic collection, a reference dropped), so no borrow of the
//! roots or of a table is held across anything that may: a table's own
//! operations allocate nothing Python, and the roots are borrowed only
//! between such points.
use crate::cpython::capi;
use crate::plans::visit::{Checked, Modules};
use pyo3::prelude::*;
use pyo3::types::PyWeakrefReference;
use std::cell::UnsafeCell;
use std::sync::OnceLock;

/// A table of plans, as [`forget`] and the weak references' callback see it.
pub trait Rooted: Sync {
    /// Drop every plan whose root `is_gone` accepts (by address).
    fn forget_roots(&self, is_gone: &dyn Fn(usize) -> bool);
    /// Is a plan for `root` kept?
    fn has_root(&self, root: usize) -> bool;
}

struct Root {
    addr: usize,
    /// A weak reference to the root's `_forward_hooks` (see the module docs),
    /// with [`plan_root_freed`] as its callback.
    weak: Py<PyWeakrefReference>,
    /// The root's latest [`Modules`] snapshot, which a plan recorded from the
    /// same state shares (held by the plans alone).
    modules: std::sync::Weak<Vec<Checked>>,
}

struct Roots {
    roots: UnsafeCell<Vec<Root>>,
    tables: UnsafeCell<Vec<&'static dyn Rooted>>,
}
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Roots {}
static ROOTS: Roots = Roots {
    roots: UnsafeCell::new(Vec::new()),
    tables: UnsafeCell::new(Vec::new()),
};

/// Called by every function here, each borrow ended before anything that
/// may run a callback.
#[allow(clippy::mut_from_ref)]
fn roots() -> &'static mut Vec<Root> {
    // SAFETY: GIL held; no reference outlives the caller's short use.
    unsafe { &mut *ROOTS.roots.get() }
}

fn tables() -> &'static [&'static dyn Rooted] {
    // SAFETY: GIL held; written only by `register`, at import.
    unsafe { &*ROOTS.tables.get() }
}

/// Add a table of plans (once each, at import).
pub fn register(table: &'static dyn Rooted) {
    // SAFETY: GIL held.
    let tables = unsafe { &mut *ROOTS.tables.get() };
    if !tables.iter().any(|t| std::ptr::addr_eq(*t, table)) {
        tables.push(table);
    }
}

static CALLBACK: OnceLock<Py<PyAny>> = OnceLock::new();

/// The weak references' callback: the root is being freed; its plans go
/// (before its memory can be reused by another object).
#[pyfunction]
fn plan_root_freed(weak: &Bound<'_, PyAny>) {
    let w = weak.as_ptr();
    let list = roots();
    let Some(i) = list.iter().position(|r| r.weak.as_ptr() == w) else {
        return;
    };
    let root = list.swap_remove(i);
    let addr = root.addr;
    for t in tables() {
        t.forget_roots(&|r| r == addr);
    }
    crate::plans::table::forget_refusals(&|r| r == addr);
    // Released last (the caller holds `weak` until we return).
    drop(root);
    crate::instance::qualified_names::note_tree_freed();
}

fn callback(py: Python<'_>) -> PyResult<&'static Py<PyAny>> {
    if let Some(c) = CALLBACK.get() {
        return Ok(c);
    }
    let f = wrap_pyfunction!(plan_root_freed, py)?.into_any().unbind();
    Ok(CALLBACK.get_or_init(|| f))
}

/// The object whose life stands for `root`'s (see the module docs): its
/// `_forward_hooks`, a plain entry of its instance dict when that dict is
/// quiet (the lookup runs no code); None otherwise.
fn lifetime_of<'py>(root: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let py = root.py();
    let name = crate::cpython::interned::intern!(py, "_forward_hooks");
    // SAFETY: GIL held; the dict is borrowed only for the lookup (a quiet
    // dict's lookup with an exact str runs no code), the entry held at once.
    unsafe {
        let d = crate::instance::attributes::dict_as_is(root.as_ptr());
        if d.is_null() || !crate::cpython::quiet::dict(d) {
            return None;
        }
        let v = capi::PyDict_GetItemWithError(d, name.as_ptr());
        if v.is_null() {
            capi::PyErr_Clear();
            return None;
        }
        Some(Bound::from_borrowed_ptr(py, v))
    }
}

/// Watch `root` (call before storing a plan for it): false when it cannot
/// be (see the module docs; the plan is then not kept), with no exception
/// left set.
pub fn watch(root: &Bound<'_, PyAny>) -> bool {
    let addr = root.as_ptr() as usize;
    let Some(target) = lifetime_of(root) else {
        return false;
    };
    if let Some(r) = roots().iter().find(|r| r.addr == addr) {
        if r.weak
            .bind(root.py())
            .upgrade()
            .is_some_and(|t| t.is(&target))
        {
            return true;
        }
        // Watched through another dict: a freed module's, still alive, or
        // this root's before `_forward_hooks` was rebound. Its plans go
        // (stale or re-recorded) and the root is watched anew.
        let gone = std::collections::HashSet::from([addr]);
        forget(&gone);
    }
    let py = root.py();
    // The callback is made (once) before the pause: nothing that may let
    // another thread run belongs inside one.
    let Ok(callback) = callback(py) else {
        return false;
    };
    // Made with nothing borrowed, and with the cyclic GC paused: no finalizer
    // runs (which could change the tree whose plan the caller checks next).
    let gc = crate::cpython::gc::GcPause::new();
    let weak = PyWeakrefReference::new_with(&target, callback.bind(py));
    drop(gc);
    drop(target);
    let weak = match weak {
        Ok(w) => w.unbind(),
        // The error was taken into the `PyErr`, dropped here.
        Err(_) => return false,
    };
    // Unused roots go first: the root pushed here has no plan yet (the caller
    // stores it after this returns), so releasing after the push would drop
    // it again and leave its plan unwatched.
    release_unused();
    let list = roots();
    if list.iter().any(|r| r.addr == addr) {
        drop(weak);
        return true;
    }
    list.push(Root {
        addr,
        weak,
        modules: std::sync::Weak::new(),
    });
    true
}

/// `modules` as a snapshot for a plan of `root` (watched): the root's
/// latest one where it is the same (same modules in the same order, each
/// with the same class, dicts and versions), else a new one, now the latest.
pub fn share(root: usize, modules: Vec<Checked>) -> Modules {
    let Some(r) = roots().iter_mut().find(|r| r.addr == root) else {
        return Modules::new(modules);
    };
    if let Some(latest) = r.modules.upgrade() {
        if *latest == modules {
            return latest;
        }
    }
    let new = Modules::new(modules);
    r.modules = Modules::downgrade(&new);
    new
}

/// `modules` (a plan of `root` carried it to new versions) is the root's
/// latest snapshot.
pub fn note_latest(root: usize, modules: &Modules) {
    if let Some(r) = roots().iter_mut().find(|r| r.addr == root) {
        r.modules = Modules::downgrade(modules);
    }
}

/// Stop watching roots no table keeps a plan for (a plan replaced by another
/// root's), once there are more than a few.
fn release_unused() {
    if roots().len() <= 32 {
        return;
    }
    let unused: Vec<Root> = {
        let list = roots();
        let (keep, unused): (Vec<Root>, Vec<Root>) = std::mem::take(list)
            .into_iter()
            .partition(|r| tables().iter().any(|t| t.has_root(r.addr)));
        *list = keep;
        unused
    };
    // Dropping a weak reference runs no callback.
    drop(unused);
}

/// Drop every plan recorded for a root in `addrs` (and stop watching it):
/// `restore(model)` for the modules of its tree.
pub fn forget(addrs: &std::collections::HashSet<usize>) {
    let gone = |r: usize| addrs.contains(&r);
    for t in tables() {
        t.forget_roots(&gone);
    }
    crate::plans::table::forget_refusals(&gone);
    let unused: Vec<Root> = {
        let list = roots();
        let (unused, keep): (Vec<Root>, Vec<Root>) =
            std::mem::take(list).into_iter().partition(|r| gone(r.addr));
        *list = keep;
        unused
    };
    drop(unused);
}

/// Drop every plan of every table, and stop watching every root.
pub fn forget_all() {
    for t in tables() {
        t.forget_roots(&|_| true);
    }
    crate::plans::table::forget_refusals(&|_| true);
    let unused = std::mem::take(roots());
    drop(unused);
}

/// How many roots are watched (for tests).
pub fn watched() -> usize {
    roots().len()
}
