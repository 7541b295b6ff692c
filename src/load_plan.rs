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
//! key (names without `.`, none called `_extra_state`, so a key is expected
//! exactly where torch's scan would accept it).
//!
//! A replay first checks, without changing anything: every visit (as in
//! `crate::eager_plans`, plus the hook dicts' sizes, which change without
//! the instance dict); every buffer's persistence; that the given dict has
//! only exact str keys, exactly as many as the expected keys, and all of
//! them (so no key is missing or unexpected anywhere); and each pair's
//! types, shapes and `is_meta`, as the live path does. Any difference hands
//! the call to the live walk, which then records afresh. Then it copies each
//! pair in torch's order under `no_grad`, reporting a failed copy as torch
//! does and going on. The cyclic GC is paused during the checks (so no
//! finalizer runs between them), and the replay holds its own references
//! while `copy_` releases the GIL.
use crate::callcache::dict_version;
use crate::eager_plans::{refuse, refused, room_for, Walk};
use crate::ffi_ext::type_lookup;
use crate::lookup::{data_attr, hook_dict_len, truthy};
use crate::plans::{holds, seen_now, Seen};
use crate::state::Globals;
use pyo3::exceptions::PyException;
use pyo3::ffi;
use pyo3::prelude::*;
use std::cell::UnsafeCell;
use std::sync::Arc;

struct Visit {
    /// Borrowed (the root is the caller's; a child is a value of its
    /// parent's unchanged `_modules`).
    module: *mut ffi::PyObject,
    seen: Seen,
    /// `_parameters`, `_buffers`, `_modules` and their versions.
    regs: [(*mut ffi::PyObject, u64); 3],
    /// `_load_state_dict_pre_hooks`, `_load_state_dict_post_hooks`.
    hooks: [*mut ffi::PyObject; 2],
    /// `_non_persistent_buffers_set` (an exact set).
    non_persistent: *mut ffi::PyObject,
    entries: (u32, u32),
}

struct Entry {
    /// Borrowed from the visit's unchanged registry.
    tensor: *mut ffi::PyObject,
    /// `prefix + name` (owned; its hash is cached after the first lookup).
    key: Py<PyAny>,
    /// A buffer's name (a key of the unchanged `_buffers`); null for a
    /// parameter.
    buffer: *mut ffi::PyObject,
    /// Was the buffer persistent when recorded?
    persistent: bool,
}

struct Plan {
    root: *mut ffi::PyObject,
    visits: Vec<Visit>,
    entries: Vec<Entry>,
    max_depth: u32,
}

// SAFETY: raw pointers are only compared or dereferenced with the GIL held,
// after the checks described above.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

const SLOTS: usize = 4;
struct Table(UnsafeCell<[Option<Arc<Plan>>; SLOTS]>, UnsafeCell<usize>);
// SAFETY: read and written only with the GIL held (never on free-threaded
// builds).
unsafe impl Sync for Table {}
static TABLE: Table = Table(
    UnsafeCell::new([None, None, None, None]),
    UnsafeCell::new(0),
);

const ENABLED: bool = !cfg!(Py_GIL_DISABLED) && !cfg!(Py_3_13);

static RECORDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static REPLAYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `(load_state_dict walks recorded, replayed)` since import.
pub fn stats() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (RECORDED.load(Relaxed), REPLAYED.load(Relaxed))
}

fn slots() -> &'static mut [Option<Arc<Plan>>; SLOTS] {
    // SAFETY: GIL held by every caller; no reference outlives a call.
    unsafe { &mut *TABLE.0.get() }
}

/// Forget every plan.
pub fn clear() {
    for s in slots().iter_mut() {
        let old = s.take();
        drop(old);
    }
}

/// torch's own `_load_from_state_dict` and `set_extra_state`.
pub struct Originals {
    pub load_from_state_dict: *mut ffi::PyObject,
    pub set_extra_state: *mut ffi::PyObject,
}

/// What a replay reports into: torch's `error_msgs` list and its message for
/// a failed copy, `copy_error(key, param, input, exc)`.
pub struct Report<'a, 'py> {
    pub errors: &'a Bound<'py, PyAny>,
    pub copy_error: &'a Bound<'py, PyAny>,
}

/// `load(root, state_dict)` from `root`'s plan: Some(result) when the plan
/// held and the given dict matches it exactly (the load is done), None when
/// the caller must walk live (nothing was done). `state_dict` is the exact
/// `OrderedDict` torch's `load_state_dict` copied; the caller checked that
/// nothing is assigned, the metadata is None or a plain dict, torch's
/// `swap_tensors` flag is off and no mode is active.
pub fn replay<'py>(
    py: Python<'py>,
    g: &Globals,
    root: &Bound<'py, PyAny>,
    state_dict: &Bound<'py, PyAny>,
    report: Report<'_, 'py>,
) -> Option<PyResult<()>> {
    if !ENABLED {
        return None;
    }
    let r = root.as_ptr();
    let i = slots()
        .iter()
        .position(|p| p.as_ref().is_some_and(|p| p.root == r))?;
    let plan = Arc::clone(slots()[i].as_ref()?);
    // SAFETY: GIL held; restored on every path.
    let gc_was_enabled = unsafe { ffi::PyGC_Disable() } != 0;
    let checked = unsafe { check(py, g, &plan, state_dict) };
    if gc_was_enabled {
        unsafe { ffi::PyGC_Enable() };
    }
    let pairs = match checked {
        Check::Pairs(p) => p,
        Check::Stale => {
            slots()[i] = None;
            return None;
        }
        Check::Differs => return None,
        Check::Error(e) => return Some(Err(e)),
    };
    REPLAYED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if pairs.is_empty() {
        return Some(Ok(()));
    }
    let copy = pyo3::intern!(py, "copy_");
    let append = pyo3::intern!(py, "append");
    let rt = match crate::runtime::get() {
        Ok(rt) => rt,
        Err(e) => return Some(Err(e)),
    };
    Some(rt.no_grad(py, || {
        for (key, param, input) in &pairs {
            if let Err(e) = param.call_method1(copy, (input,)) {
                if !e.is_instance_of::<PyException>(py) {
                    return Err(e);
                }
                // torch reports it in error_msgs and goes on.
                let msg = report.copy_error.call1((key, param, input, e.value(py)))?;
                report.errors.call_method1(append, (msg,))?;
            }
        }
        Ok(())
    }))
}

type Pair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

enum Check<'py> {
    /// Everything matches: the (key, param, input) copies, in torch's order.
    Pairs(Vec<Pair<'py>>),
    /// The tree changed: drop the plan.
    Stale,
    /// The tree holds, but this call is not the plain case.
    Differs,
    Error(PyErr),
}

unsafe fn check<'py>(
    py: Python<'py>,
    g: &Globals,
    plan: &Plan,
    state_dict: &Bound<'py, PyAny>,
) -> Check<'py> {
    if !room_for(plan.max_depth) {
        return Check::Differs;
    }
    for v in &plan.visits {
        if !holds(&v.seen, v.module)
            || !v.regs.iter().all(|&(d, ver)| dict_version(d) == ver)
            || !v
                .hooks
                .iter()
                .all(|&h| hook_dict_len(h, g.odict) == Some(0))
        {
            return Check::Stale;
        }
    }
    let sd = state_dict.as_ptr();
    let (mut pos, mut k, mut val) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while ffi::PyDict_Next(sd, &mut pos, &mut k, &mut val) != 0 {
        if ffi::PyUnicode_CheckExact(k) == 0 {
            return Check::Differs;
        }
    }
    let mut expected: ffi::Py_ssize_t = 0;
    for v in &plan.visits {
        for e in &plan.entries[v.entries.0 as usize..v.entries.1 as usize] {
            if !e.buffer.is_null() {
                let non_persistent = match ffi::PySet_Contains(v.non_persistent, e.buffer) {
                    0 => false,
                    1 => true,
                    _ => return Check::Error(PyErr::fetch(py)),
                };
                if non_persistent == e.persistent {
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
    if ffi::PyDict_Size(sd) != expected {
        return Check::Differs;
    }
    let is_tensor = |t: *mut ffi::PyObject| {
        let tp = ffi::Py_TYPE(t);
        tp == g.tensor || tp == g.parameter
    };
    let shape = pyo3::intern!(py, "shape");
    let is_meta = pyo3::intern!(py, "is_meta");
    let mut pairs = Vec::with_capacity(expected as usize);
    for e in &plan.entries {
        if !e.buffer.is_null() && !e.persistent {
            continue;
        }
        // Str keys only: the lookup compares strings, running no code.
        let input = ffi::PyDict_GetItemWithError(sd, e.key.as_ptr());
        if input.is_null() {
            if !ffi::PyErr_Occurred().is_null() {
                return Check::Error(PyErr::fetch(py));
            }
            return Check::Differs;
        }
        if !is_tensor(e.tensor) || !is_tensor(input) {
            return Check::Differs;
        }
        let param = Bound::from_borrowed_ptr(py, e.tensor);
        let input = Bound::from_borrowed_ptr(py, input);
        let same = (|| -> PyResult<bool> {
            Ok(data_attr(&param, shape)?.eq(data_attr(&input, shape)?)?
                && !truthy(data_attr(&param, is_meta))?)
        })();
        match same {
            Ok(true) => pairs.push((e.key.bind(py).clone(), param, input)),
            Ok(false) => return Check::Differs,
            Err(err) => return Check::Error(err),
        }
    }
    Check::Pairs(pairs)
}

/// After a live load of `root` completed: record the walk, if a plan can
/// describe it.
pub fn record(g: &Globals, orig: &Originals, root: &Bound<'_, PyAny>) {
    if !ENABLED {
        return;
    }
    let key = (root.as_ptr(), Walk::Load);
    if refused(key) {
        return;
    }
    // A plan that still holds (the last call's dict was not the plain case)
    // is kept as it is.
    let r = root.as_ptr();
    if let Some(p) = slots().iter().flatten().find(|p| p.root == r) {
        let holds_now = p.visits.iter().all(|v| unsafe {
            holds(&v.seen, v.module)
                && v.regs.iter().all(|&(d, ver)| dict_version(d) == ver)
                && v.hooks
                    .iter()
                    .all(|&h| hook_dict_len(h, g.odict) == Some(0))
        });
        if holds_now {
            return;
        }
    }
    let py = root.py();
    let mut plan = Plan {
        root: root.as_ptr(),
        visits: Vec::new(),
        entries: Vec::new(),
        max_depth: 0,
    };
    let prefix = pyo3::types::PyString::new(py, "");
    let ok = unsafe { visit(g, orig, root, prefix.as_any(), 0, &mut plan) };
    // SAFETY: clearing what a lookup of the recording may have raised.
    unsafe { ffi::PyErr_Clear() };
    let holding = ok
        && plan.visits.iter().all(|v| unsafe {
            holds(&v.seen, v.module) && v.regs.iter().all(|&(d, ver)| dict_version(d) == ver)
        });
    if !holding {
        refuse(key);
        return;
    }
    RECORDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let slots = slots();
    let i = match slots
        .iter()
        .position(|p| p.as_ref().is_some_and(|p| p.root == plan.root))
    {
        Some(i) => i,
        None => {
            // SAFETY: GIL held.
            let next = unsafe { &mut *TABLE.1.get() };
            let i = *next;
            *next = (i + 1) % SLOTS;
            i
        }
    };
    let old = slots[i].replace(Arc::new(plan));
    drop(old);
}

/// An attribute torch reads with `self.<name>`, when a plain dict entry
/// (the class has no attribute of that name).
unsafe fn dict_entry(
    tp: *mut ffi::PyTypeObject,
    dict: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    if !type_lookup(tp, name).is_null() {
        return std::ptr::null_mut();
    }
    ffi::PyDict_GetItemWithError(dict, name)
}

/// A registry name a plan can key on: an exact str, not empty, without `.`,
/// other than `_extra_state`.
unsafe fn plain_name(name: *mut ffi::PyObject, extra: *mut ffi::PyObject) -> bool {
    if ffi::PyUnicode_CheckExact(name) == 0 {
        return false;
    }
    let len = ffi::PyUnicode_GetLength(name);
    len > 0
        && ffi::PyUnicode_FindChar(name, '.' as u32, 0, len, 1) == -1
        && ffi::PyUnicode_Compare(name, extra) != 0
}

/// Record `module`'s visit under `prefix` and its children's, in torch's
/// order; false where the load leaves what a plan can describe. Runs no
/// Python code: only exact dicts, sets and strs are read.
unsafe fn visit(
    g: &Globals,
    orig: &Originals,
    module: &Bound<'_, PyAny>,
    prefix: &Bound<'_, PyAny>,
    depth: u32,
    plan: &mut Plan,
) -> bool {
    let py = module.py();
    let m = module.as_ptr();
    let tp = ffi::Py_TYPE(m);
    let lfsd = pyo3::intern!(py, "_load_from_state_dict").as_ptr();
    let ses = pyo3::intern!(py, "set_extra_state").as_ptr();
    let extra = pyo3::intern!(py, "_extra_state").as_ptr();
    if type_lookup(tp, lfsd) != orig.load_from_state_dict
        || type_lookup(tp, ses) != orig.set_extra_state
        || type_lookup(tp, g.names.dunder_class) != g.orig.object_class
    {
        return false;
    }
    let Some(seen) = seen_now(m) else {
        return false;
    };
    if ffi::PyDict_Contains(seen.dict, lfsd) != 0 {
        return false;
    }
    let n = &g.names;
    let mut regs = [(std::ptr::null_mut(), 0); 3];
    for (slot, name) in regs.iter_mut().zip([n.parameters, n.buffers, n.modules]) {
        let r = dict_entry(tp, seen.dict, name);
        if r.is_null() || ffi::PyDict_CheckExact(r) == 0 {
            return false;
        }
        *slot = (r, dict_version(r));
    }
    let mut hooks = [std::ptr::null_mut(); 2];
    let hook_names = [
        pyo3::intern!(py, "_load_state_dict_pre_hooks"),
        pyo3::intern!(py, "_load_state_dict_post_hooks"),
    ];
    for (slot, name) in hooks.iter_mut().zip(hook_names) {
        let h = dict_entry(tp, seen.dict, name.as_ptr());
        if h.is_null() || hook_dict_len(h, g.odict) != Some(0) {
            return false;
        }
        *slot = h;
    }
    let non_persistent = dict_entry(tp, seen.dict, n.non_persistent);
    if non_persistent.is_null() || ffi::PySet_CheckExact(non_persistent) == 0 {
        return false;
    }
    let start = plan.entries.len() as u32;
    for (reg, is_buffer) in [(regs[0].0, false), (regs[1].0, true)] {
        let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        while ffi::PyDict_Next(reg, &mut pos, &mut name, &mut value) != 0 {
            if value == ffi::Py_None() {
                continue;
            }
            if !plain_name(name, extra) {
                return false;
            }
            let persistent = !is_buffer || ffi::PySet_Contains(non_persistent, name) == 0;
            let Some(key) =
                Bound::from_owned_ptr_or_opt(py, ffi::PyUnicode_Concat(prefix.as_ptr(), name))
            else {
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
                persistent,
            });
        }
    }
    plan.max_depth = plan.max_depth.max(depth);
    plan.visits.push(Visit {
        module: m,
        seen,
        regs,
        hooks,
        non_persistent,
        entries: (start, plan.entries.len() as u32),
    });
    let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while ffi::PyDict_Next(regs[2].0, &mut pos, &mut name, &mut value) != 0 {
        if value == ffi::Py_None() {
            continue;
        }
        if !plain_name(name, extra) {
            return false;
        }
        let Some(child_prefix) =
            Bound::from_owned_ptr_or_opt(py, ffi::PyUnicode_Concat(prefix.as_ptr(), name))
                .and_then(|p| {
                    Bound::from_owned_ptr_or_opt(py, ffi::PyUnicode_Concat(p.as_ptr(), g.names.dot))
                })
        else {
            return false;
        };
        let child = Bound::from_borrowed_ptr(py, value);
        if !visit(g, orig, &child, &child_prefix, depth + 1, plan) {
            return false;
        }
    }
    true
}
