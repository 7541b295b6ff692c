//! One module as every plan records and checks it: its class, instance dict
//! and registries with their versions ([`Checked`]), kept once per tree in a
//! [`Modules`] snapshot that the plans of one root share while they were
//! recorded from the same state; for the eager walks (`train`/`_apply`,
//! `state_dict`, `load_state_dict`) also its hook dicts, and its children in
//! registry order with their prefixes.
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::validity::dict_version;
pub use crate::instance::qualified_names::Kind;
use crate::plans::module_walks::{holds, seen_now, Seen};
use crate::torch_api::hooks::hook_dict_len;
use crate::torch_api::originals::Globals;

/// One visited module as a plan records it: its class and instance dict
/// with their versions (the call cache's key), and its `_parameters`,
/// `_buffers` and `_modules` dicts with theirs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Borrowed (the root is the caller's; a child is a value of its
    /// parent's unchanged `_modules`).
    pub module: *mut capi::PyObject,
    pub seen: Seen,
    pub regs: [(*mut capi::PyObject, u64); 3],
}

// SAFETY: a plan's raw pointers are only compared or dereferenced with the
// GIL held (plans are off on free-threaded builds), after the checks of the
// objects holding them.
unsafe impl Send for Checked {}
unsafe impl Sync for Checked {}

impl Checked {
    /// `module` now, when a plan can depend on it: an exact instance dict
    /// holding the three registries as exact dicts, found as plain entries
    /// (the class has no attribute of those names), all four quiet
    /// (`crate::cpython::quiet::dict`: a lookup by an exact str runs no
    /// code). A replay skips torch's lookups in them (`"training" in
    /// self._parameters`, `name in self._modules`), the same only while
    /// those run no code; each stays quiet while its version is unchanged.
    pub unsafe fn read(g: &Globals, module: *mut capi::PyObject) -> Option<Checked> {
        Checked::read_seen(g, module, seen_now(module)?)
    }

    /// As [`Checked::read`], for a module whose class and instance dict are
    /// known to be `seen` now (`seen_now` answered it, and both hold since).
    pub unsafe fn read_seen(
        g: &Globals,
        module: *mut capi::PyObject,
        seen: Seen,
    ) -> Option<Checked> {
        let tp = capi::Py_TYPE(module);
        let n = &g.names;
        let mut regs = [(std::ptr::null_mut(), 0); 3];
        for (slot, name) in regs.iter_mut().zip([n.parameters, n.buffers, n.modules]) {
            // The registry read the walks remember for this dict at this
            // version (`crate::instance::walk_facts`): the same entry.
            if !type_lookup(tp, name).is_null() {
                return None;
            }
            let r = crate::instance::walk_facts::dict_get(tp, seen.dict, name);
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

    /// Are the class and the instance dict as recorded (the registries not
    /// looked at)?
    #[inline(always)]
    pub unsafe fn seen_holds(&self) -> bool {
        holds(&self.seen, self.module)
    }

    /// Is registry `i` (0 `_parameters`, 1 `_buffers`, 2 `_modules`) at its
    /// recorded version? Its size is then the recorded one too.
    #[inline(always)]
    pub unsafe fn reg_unchanged(&self, i: usize) -> bool {
        dict_version(self.regs[i].0) == self.regs[i].1
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

/// The modules of one tree as its plans check them, each once, in the order a
/// walk first reached them (plans refer to them by index). Plans of one root
/// recorded from the same state share one (`crate::plans::roots::share`);
/// each plan only reads it, except `train`'s, which carries its own copy to
/// the versions its rebinding made.
pub type Modules = std::sync::Arc<Vec<Checked>>;

/// A [`Modules`] being recorded: each module once, with its index.
pub struct Builder {
    modules: Vec<Checked>,
    index: std::collections::HashMap<
        usize,
        u32,
        std::hash::BuildHasherDefault<crate::instance::registries::AddressHasher>,
    >,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            modules: Vec::new(),
            index: Default::default(),
        }
    }

    /// The index of `c`'s module, added if new; None when the module was
    /// added before with other versions (a change during the recording) or
    /// there are too many.
    pub fn add(&mut self, c: Checked) -> Option<u32> {
        match self.index.entry(c.module as usize) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let i = *e.get();
                (self.modules[i as usize] == c).then_some(i)
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                let i = u32::try_from(self.modules.len())
                    .ok()
                    .filter(|&i| i != NONE)?;
                e.insert(i);
                self.modules.push(c);
                Some(i)
            }
        }
    }

    pub fn get(&self, i: u32) -> Option<&Checked> {
        self.modules.get(i as usize)
    }

    /// Add `c`, whose module the caller knows was not added before (a walk
    /// with a memo), without indexing it: [`Builder::index_of`] then finds it
    /// by a search. Its index, None when there are too many.
    pub fn add_new(&mut self, c: Checked) -> Option<u32> {
        let i = u32::try_from(self.modules.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.modules.push(c);
        Some(i)
    }

    /// The index of a module added before.
    pub fn index_of(&mut self, module: *mut capi::PyObject) -> Option<u32> {
        if self.index.len() < self.modules.len() {
            // Modules added by `add_new` (only one kind of adding is used per
            // builder): index them all, once.
            self.index.clear();
            self.index.reserve(self.modules.len());
            for (i, c) in self.modules.iter().enumerate() {
                self.index.insert(c.module as usize, i as u32);
            }
        }
        self.index.get(&(module as usize)).copied()
    }

    /// The snapshot for `root` (watched: see `crate::plans::roots::watch`),
    /// shared with its other plans where they recorded the same.
    pub fn finish(mut self, root: usize) -> Modules {
        self.modules.shrink_to_fit();
        crate::plans::roots::share(root, self.modules)
    }
}

/// No module (an index that is not one).
pub const NONE: u32 = u32::MAX;

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

/// Two hook dicts of a module, empty when recorded, with their versions.
#[derive(Clone, Copy)]
pub struct Hooks {
    dicts: [*mut capi::PyObject; 2],
    versions: [u64; 2],
}

/// The two hook dicts `names` of a checked module, when plain entries that
/// are empty dicts or `OrderedDict`s (they change without the instance dict:
/// a replay checks them with [`hooks_empty`]).
pub unsafe fn empty_hooks(
    g: &Globals,
    c: &Checked,
    names: [*mut capi::PyObject; 2],
) -> Option<Hooks> {
    let tp = capi::Py_TYPE(c.module);
    let mut hooks = Hooks {
        dicts: [std::ptr::null_mut(); 2],
        versions: [0; 2],
    };
    for ((slot, version), name) in hooks.dicts.iter_mut().zip(&mut hooks.versions).zip(names) {
        let h = dict_entry(tp, c.seen.dict, name);
        if h.is_null() || hook_dict_len(h, g.odict) != Some(0) {
            return None;
        }
        *slot = h;
        *version = dict_version(h);
    }
    Some(hooks)
}

/// Are hook dicts recorded by [`empty_hooks`] unchanged (so still empty)?
/// Their versions, not their sizes: a hook registered and removed again
/// since is a change (a walk in between would have called it). Dereferences
/// the dicts only after their module's check (they are held by its
/// unchanged instance dict).
#[inline(always)]
pub unsafe fn hooks_empty(hooks: &Hooks) -> bool {
    hooks
        .dicts
        .iter()
        .zip(&hooks.versions)
        .all(|(&h, &v)| dict_version(h) == v)
}

/// `a + b` for exact strs (None on failure, with an exception set).
pub unsafe fn concat<'py>(
    a: &pyo3::Bound<'py, pyo3::PyAny>,
    b: *mut capi::PyObject,
) -> Option<pyo3::Bound<'py, pyo3::PyAny>> {
    pyo3::Bound::from_owned_ptr_or_opt(a.py(), capi::PyUnicode_Concat(a.as_ptr(), b))
}

/// The `kind` name of exact strs `prefix` and `key`, the very str the live
/// walks made and remembered (`crate::instance::qualified_names`) where it is
/// still remembered, so that a plan holds no second copy; else `build`'s
/// (None on failure, with an exception set).
pub fn remembered<'py>(
    kind: Kind,
    prefix: &pyo3::Bound<'py, pyo3::PyAny>,
    key: &pyo3::Bound<'py, pyo3::PyAny>,
    build: impl FnOnce() -> Option<pyo3::Bound<'py, pyo3::PyAny>>,
) -> Option<pyo3::Bound<'py, pyo3::PyAny>> {
    crate::instance::qualified_names::name(kind, prefix, key, || {
        build().ok_or_else(|| pyo3::PyErr::fetch(prefix.py()))
    })
    .map_err(|e| e.restore(prefix.py()))
    .ok()
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
        let name = pyo3::Bound::from_borrowed_ptr(py, name);
        let Some(child_prefix) = remembered(Kind::Child, prefix, &name, || {
            concat(prefix, name.as_ptr()).and_then(|p| concat(&p, g.names.dot))
        }) else {
            return false;
        };
        let child = pyo3::Bound::from_borrowed_ptr(py, value);
        if !visit(&child, &child_prefix) {
            return false;
        }
    }
    true
}
