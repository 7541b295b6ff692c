//! One module as the recorded eager walks (`train`/`_apply`, `state_dict`,
//! `load_state_dict`) record and check it: its class, instance dict and
//! registries with their versions ([`Checked`]), its hook dicts, and its
//! children in registry order with their prefixes.
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::dict_version;
use crate::plans::module_walks::{holds, seen_now, Seen};
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;

/// One visited module as a plan records it: its class and instance dict
/// with their versions (the call cache's key), and its `_parameters`,
/// `_buffers` and `_modules` dicts with theirs.
#[derive(Clone, Copy)]
pub struct Checked {
    /// Borrowed (the root is the caller's; a child is a value of its
    /// parent's unchanged `_modules`).
    pub module: *mut capi::PyObject,
    pub seen: Seen,
    pub regs: [(*mut capi::PyObject, u64); 3],
}

impl Checked {
    /// `module` now, when a plan can depend on it: an exact instance dict
    /// holding the three registries as exact dicts, found as plain entries
    /// (the class has no attribute of those names), all four quiet
    /// (`crate::cpython::quiet::dict`: a lookup by an exact str runs no
    /// code). A replay skips torch's lookups in them (`"training" in
    /// self._parameters`, `name in self._modules`), the same only while
    /// those run no code; each stays quiet while its version is unchanged.
    pub unsafe fn read(g: &Globals, module: *mut capi::PyObject) -> Option<Checked> {
        let seen = seen_now(module)?;
        let tp = capi::Py_TYPE(module);
        let n = &g.names;
        let mut regs = [(std::ptr::null_mut(), 0); 3];
        for (slot, name) in regs.iter_mut().zip([n.parameters, n.buffers, n.modules]) {
            let r = dict_entry(tp, seen.dict, name);
            if r.is_null() || !crate::cpython::quiet::dict(r) {
                return None;
            }
            *slot = (r, dict_version(r));
        }
        Some(Checked { module, seen, regs })
    }

    /// Are the class, the instance dict and the registries as recorded?
    /// Dereferences `module` only after its holder was checked (visit order).
    #[inline(always)]
    pub unsafe fn holds(&self) -> bool {
        holds(&self.seen, self.module) && self.regs.iter().all(|&(d, v)| dict_version(d) == v)
    }

    pub fn parameters(&self) -> *mut capi::PyObject {
        self.regs[0].0
    }

    pub fn buffers(&self) -> *mut capi::PyObject {
        self.regs[1].0
    }

    pub fn modules(&self) -> *mut capi::PyObject {
        self.regs[2].0
    }
}

/// An attribute torch reads with `self.<name>`, when a plain entry of the
/// instance dict (the class has no attribute of that name); borrowed, null
/// otherwise.
pub unsafe fn dict_entry(
    tp: *mut capi::PyTypeObject,
    dict: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    if !type_lookup(tp, name).is_null() {
        return std::ptr::null_mut();
    }
    capi::PyDict_GetItemWithError(dict, name)
}

/// The two hook dicts `names` of a checked module, when plain entries that
/// are empty dicts or `OrderedDict`s (their sizes change without the
/// instance dict: a replay checks them with [`hooks_empty`]).
pub unsafe fn empty_hooks(
    g: &Globals,
    c: &Checked,
    names: [*mut capi::PyObject; 2],
) -> Option<[*mut capi::PyObject; 2]> {
    let tp = capi::Py_TYPE(c.module);
    let mut hooks = [std::ptr::null_mut(); 2];
    for (slot, name) in hooks.iter_mut().zip(names) {
        let h = dict_entry(tp, c.seen.dict, name);
        if h.is_null() || hook_dict_len(h, g.odict) != Some(0) {
            return None;
        }
        *slot = h;
    }
    Some(hooks)
}

/// Are hook dicts recorded by [`empty_hooks`] still empty?
#[inline(always)]
pub unsafe fn hooks_empty(g: &Globals, hooks: &[*mut capi::PyObject; 2]) -> bool {
    hooks.iter().all(|&h| hook_dict_len(h, g.odict) == Some(0))
}

/// `a + b` for exact strs (None on failure, with an exception set).
pub unsafe fn concat<'py>(
    a: &pyo3::Bound<'py, pyo3::PyAny>,
    b: *mut capi::PyObject,
) -> Option<pyo3::Bound<'py, pyo3::PyAny>> {
    pyo3::Bound::from_owned_ptr_or_opt(a.py(), capi::PyUnicode_Concat(a.as_ptr(), b))
}

/// `checked`'s children in registry order, as torch's recursive `state_dict`
/// and `load` take them: None entries skipped, each child visited with the
/// prefix `prefix + name + "."`. False as soon as `name_ok` refuses a name,
/// a prefix cannot be built, or `visit` returns false.
pub unsafe fn visit_children<'py>(
    g: &Globals,
    checked: &Checked,
    prefix: &pyo3::Bound<'py, pyo3::PyAny>,
    name_ok: impl Fn(*mut capi::PyObject) -> bool,
    mut visit: impl FnMut(&pyo3::Bound<'py, pyo3::PyAny>, &pyo3::Bound<'py, pyo3::PyAny>) -> bool,
) -> bool {
    let py = prefix.py();
    let (mut pos, mut name, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    while capi::PyDict_Next(checked.modules(), &mut pos, &mut name, &mut value) != 0 {
        if value == capi::Py_None() {
            continue;
        }
        if !name_ok(name) {
            return false;
        }
        let Some(child_prefix) = concat(prefix, name).and_then(|p| concat(&p, g.names.dot)) else {
            return false;
        };
        let child = pyo3::Bound::from_borrowed_ptr(py, value);
        if !visit(&child, &child_prefix) {
            return false;
        }
    }
    true
}
