//! The two primitives every tree walk repeats per module, without going
//! through Python's iterator protocol: iterating a registry's `.items()` and
//! de-duplicating through a memo set.
//!
//! `Items` iterates an exact dict with `PyDict_Next` and reproduces the checks
//! of CPython's dict iterator (same order, same "dictionary changed size
//! during iteration" / "dictionary keys changed during iteration" errors);
//! any other registry object is iterated through its own `.items()`.
//!
//! `Memo` keeps identities in a Rust set while every member hashes by
//! identity (plain modules, torch tensors, whose `__hash__` is `id(self)`), so
//! membership is exactly what a Python set would answer; the first object that
//! could hash otherwise converts it to a real Python set.
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::{instance_dict, plain_attr, Plain};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PySet, PyString};
use pyo3::PyTraverseError;
use pyo3::PyVisit;
use std::sync::OnceLock;

pub enum Items {
    Dict {
        dict: Py<PyAny>,
        pos: capi::Py_ssize_t,
        used: capi::Py_ssize_t,
        left: capi::Py_ssize_t,
    },
    Iter(Py<PyIterator>),
}

use crate::cpython::dicts::used as ma_used;

impl Items {
    /// `module.<registry>.items()`, iterated lazily.
    pub fn of<'py>(module: &Bound<'py, PyAny>, registry: &Bound<'py, PyString>) -> PyResult<Items> {
        let py = module.py();
        unsafe {
            let m = module.as_ptr();
            let tp = capi::Py_TYPE(m);
            let dict = instance_dict(m);
            // Read natively (and possibly remembered) only from a dict whose
            // lookups run no code; any other is read below as torch reads it,
            // the lookup made (and its `__eq__` calls run) on every walk.
            // torch reads `module.<registry>` through the class's
            // `__getattribute__`: asked here, at each module, because a class
            // (or a mixin base) can gain one while a walk is suspended
            // between modules (a `named_parameters()` generator paused in a
            // for loop), after the walk decided the module was native. A
            // cached class lookup, once per module and registry.
            if !dict.is_null()
                && crate::cpython::quiet::dict(dict)
                && crate::torch_api::originals::globals()
                    .is_some_and(|g| crate::instance::fast::plain_getattribute(g, tp))
            {
                match plain_attr(tp, dict, registry.as_ptr()) {
                    Plain::Found(d) if capi::PyDict_CheckExact(d) != 0 => {
                        let used = ma_used(d);
                        return Ok(Items::Dict {
                            dict: Bound::from_borrowed_ptr(py, d).unbind(),
                            pos: 0,
                            used,
                            left: used,
                        });
                    }
                    Plain::Error => return Err(PyErr::fetch(py)),
                    _ => {}
                }
            }
        }
        let reg = module.getattr(registry)?;
        if reg.is_exact_instance_of::<pyo3::types::PyDict>() {
            // `dict.items()` iterated as CPython's iterator does.
            return Ok(Items::of_dict(&reg));
        }
        let it = reg.call_method0(intern!(py, "items"))?.try_iter()?;
        Ok(Items::Iter(it.unbind()))
    }

    /// An exact dict's iteration resumed where a recorded walk left it.
    pub fn resume(
        dict: Py<PyAny>,
        pos: capi::Py_ssize_t,
        used: capi::Py_ssize_t,
        left: capi::Py_ssize_t,
    ) -> Items {
        Items::Dict {
            dict,
            pos,
            used,
            left,
        }
    }

    /// `(dict, position, size when opened)` of an exact dict's iteration.
    pub fn dict_state(&self) -> Option<(*mut capi::PyObject, capi::Py_ssize_t, capi::Py_ssize_t)> {
        match self {
            Items::Dict {
                dict, pos, used, ..
            } => Some((dict.as_ptr(), *pos, *used)),
            Items::Iter(_) => None,
        }
    }

    /// `d.items()` for an exact dict `d` already read from the module.
    pub fn of_dict(d: &Bound<'_, PyAny>) -> Items {
        let used = unsafe { ma_used(d.as_ptr()) };
        Items::Dict {
            dict: d.clone().unbind(),
            pos: 0,
            used,
            left: used,
        }
    }

    pub fn next<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        match self {
            Items::Dict {
                dict,
                pos,
                used,
                left,
            } => unsafe {
                let d = dict.as_ptr();
                if *used != ma_used(d) {
                    return Err(PyRuntimeError::new_err(
                        "dictionary changed size during iteration",
                    ));
                }
                if *used == 0 {
                    // Empty: done, without touching the dict's key table.
                    return Ok(None);
                }
                let mut k: *mut capi::PyObject = std::ptr::null_mut();
                let mut v: *mut capi::PyObject = std::ptr::null_mut();
                if capi::PyDict_Next(d, pos, &mut k, &mut v) == 0 {
                    return Ok(None);
                }
                if *left == 0 {
                    return Err(PyRuntimeError::new_err(
                        "dictionary keys changed during iteration",
                    ));
                }
                *left -= 1;
                Ok(Some((
                    Bound::from_borrowed_ptr(py, k),
                    Bound::from_borrowed_ptr(py, v),
                )))
            },
            Items::Iter(it) => {
                let mut it = it.bind(py).clone();
                match it.next() {
                    Some(item) => Ok(Some(item?.extract()?)),
                    None => match PyErr::take(py) {
                        Some(e) => Err(e),
                        None => Ok(None),
                    },
                }
            }
        }
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Items::Dict { dict, .. } => visit.call(dict),
            Items::Iter(it) => visit.call(it),
        }
    }
}

/// torch.Tensor.__hash__ (it returns `id(self)`) and the interned name
/// "__hash__", captured once (as addresses of immortal-by-convention objects).
static TENSOR_HASH: OnceLock<(usize, usize)> = OnceLock::new();

pub fn init(py: Python<'_>) -> PyResult<()> {
    let torch = py.import("torch")?;
    let h = torch
        .getattr("Tensor")?
        .getattr("__dict__")?
        .get_item("__hash__")?;
    let name = PyString::intern(py, "__hash__");
    let _ = TENSOR_HASH.set((h.into_ptr() as usize, name.into_ptr() as usize));
    Ok(())
}

/// Are two optional CPython slot functions the same function?
fn same_fn<F: Copy + PartialEq>(a: Option<F>, b: Option<F>) -> bool {
    // Both come from CPython's own tables: equal addresses mean equal slots.
    a == b
}

/// Does `obj` hash and compare by identity in a set? Answered per class and
/// remembered while the class's `tp_version_tag` is unchanged (assigning
/// `__hash__`/`__eq__` on it or a base resets the tag).
#[inline(always)]
pub unsafe fn identity_hashed(obj: *mut capi::PyObject) -> bool {
    let tp = capi::Py_TYPE(obj);
    let version = crate::cpython::validity::class_version(tp);
    let slot = &mut (*HASH_KIND.0.get())[((tp as usize) >> 4) & (HASH_KINDS - 1)];
    if version != 0 && slot.0 == tp && slot.1 == version {
        return slot.2;
    }
    let answer = identity_hashed_uncached(tp);
    let version = crate::cpython::validity::class_version(tp);
    if version != 0 {
        *slot = (tp, version, answer);
    }
    answer
}

const HASH_KINDS: usize = 64;
struct HashKinds(std::cell::UnsafeCell<[(*mut capi::PyTypeObject, u32, bool); HASH_KINDS]>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for HashKinds {}
static HASH_KIND: HashKinds = HashKinds(std::cell::UnsafeCell::new(
    [(std::ptr::null_mut(), 0, false); HASH_KINDS],
));

unsafe fn identity_hashed_uncached(tp: *mut capi::PyTypeObject) -> bool {
    use crate::cpython::types::{hash_slot, object_type, richcompare_slot};
    let base = object_type();
    if same_fn(hash_slot(tp), hash_slot(base))
        && same_fn(richcompare_slot(tp), richcompare_slot(base))
    {
        return true;
    }
    // torch tensors: __hash__ is torch's `return id(self)`; with unique hashes
    // a set never consults __eq__.
    match TENSOR_HASH.get() {
        Some(&(h, name)) => type_lookup(tp, name as *mut capi::PyObject) as usize == h,
        None => false,
    }
}

/// Hashes an object address: aligned pointers, so a multiply mixes enough.
#[derive(Default)]
pub struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = ((n as u64) >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A set of object addresses: open addressing with linear probing, at most
/// half full (0 marks an empty slot; object addresses are never 0).
pub struct Addresses {
    slots: Vec<usize>,
    len: usize,
    /// The size to grow to the first time the table fills (then doubling).
    jump: usize,
}

impl Addresses {
    fn with_capacity(n: usize, expected: usize) -> Addresses {
        let size = (n.max(8) * 2).next_power_of_two();
        Addresses {
            slots: vec![0; size],
            len: 0,
            jump: (expected.max(n) * 2).next_power_of_two(),
        }
    }

    #[inline(always)]
    fn start(&self, a: usize) -> usize {
        let h = ((a as u64) >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize & (self.slots.len() - 1)
    }

    #[inline(always)]
    fn contains(&self, a: usize) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = self.start(a);
        loop {
            match self.slots[i] {
                0 => return false,
                x if x == a => return true,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Add `a`; false when it was already there.
    #[inline(always)]
    fn insert(&mut self, a: usize) -> bool {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.start(a);
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = a;
                    self.len += 1;
                    return true;
                }
                x if x == a => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    #[cold]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(self.jump);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        self.len = 0;
        for a in old.into_iter().filter(|&a| a != 0) {
            self.insert(a);
        }
    }
}

/// The size of the last whole-tree memo, so the next walk of the same tree
/// starts its set at that size instead of growing it step by step.
static TREE_MEMO_HINT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// A hint larger than this (objects) is not used.
const MAX_HINT: usize = 1 << 24;

/// How many identities a memo keeps inline (a linear scan) before it needs a
/// hash set: most modules have a handful of children, and a walk builds one
/// memo per module.
const INLINE: usize = 8;

pub enum Memo {
    /// Up to `INLINE` objects, kept alive so an address is never reused;
    /// `tree`: a whole-tree memo (sized by [`TREE_MEMO_HINT`]).
    Small(usize, [Option<Py<PyAny>>; INLINE], bool),
    /// Addresses, with the objects kept alive so an address is never reused.
    Identity(Addresses, Vec<Py<PyAny>>, bool),
    Set(Py<PySet>),
    /// A caller's memo (any object): `obj in memo` and `memo.add(obj)`.
    Object(Py<PyAny>),
}

impl Memo {
    /// A memo for one module's children.
    pub fn new() -> Memo {
        Memo::Small(0, Default::default(), false)
    }

    /// A memo for a whole tree's modules or members.
    pub fn for_tree() -> Memo {
        Memo::Small(0, Default::default(), true)
    }

    pub fn from_object(o: Bound<'_, PyAny>) -> Memo {
        Memo::Object(o.unbind())
    }

    /// The objects an identity memo holds, in insertion order.
    fn held(&self) -> Vec<&Py<PyAny>> {
        match self {
            Memo::Small(n, objs, _) => objs[..*n].iter().flatten().collect(),
            Memo::Identity(_, objs, _) => objs.iter().collect(),
            _ => Vec::new(),
        }
    }

    fn make_set(&mut self, py: Python<'_>) -> PyResult<()> {
        if matches!(self, Memo::Small(..) | Memo::Identity(..)) {
            let s = PySet::empty(py)?;
            for o in self.held() {
                s.add(o.bind(py))?;
            }
            *self = Memo::Set(s.unbind());
        }
        Ok(())
    }

    /// `obj in memo`, then `memo.add(obj)` if it was not and `add` is set:
    /// true when it was already there. One hash for an identity memo; the
    /// two calls, in that order, for any other.
    pub fn seen_or_add(&mut self, obj: &Bound<'_, PyAny>, add: bool) -> PyResult<bool> {
        if matches!(self, Memo::Small(..) | Memo::Identity(..))
            && unsafe { identity_hashed(obj.as_ptr()) }
        {
            let p = obj.as_ptr();
            if add {
                if let Memo::Identity(set, objs, _) = self {
                    // One probe: insert answers whether it was there.
                    if set.insert(p as usize) {
                        objs.push(obj.clone().unbind());
                        return Ok(false);
                    }
                    return Ok(true);
                }
            }
            let seen = match self {
                Memo::Small(n, objs, _) => objs[..*n].iter().flatten().any(|o| o.as_ptr() == p),
                Memo::Identity(set, _, _) => set.contains(p as usize),
                _ => false,
            };
            if !seen && add {
                self.add_identity(obj);
            }
            return Ok(seen);
        }
        // Anything that may hash otherwise: a real set (or the caller's memo),
        // through `in` and `.add` as torch's code calls them.
        let py = obj.py();
        self.make_set(py)?;
        let memo = match self {
            Memo::Set(s) => s.bind(py).clone().into_any(),
            Memo::Object(o) => o.bind(py).clone(),
            _ => return Ok(false),
        };
        if memo.contains(obj)? {
            return Ok(true);
        }
        if add {
            memo.call_method1(intern!(py, "add"), (obj,))?;
        }
        Ok(false)
    }

    /// Add an identity-hashed object not yet in a `Small`/`Identity` memo.
    fn add_identity(&mut self, obj: &Bound<'_, PyAny>) {
        if let Memo::Small(n, objs, tree) = self {
            if *n < INLINE {
                objs[*n] = Some(obj.clone().unbind());
                *n += 1;
                return;
            }
            // Full: move to a hash set.
            // A tree walk that outgrows the first table grows straight to the
            // size the previous whole-tree walk reached.
            let cap = 16 * INLINE;
            let mut expected = cap;
            if *tree {
                let hint = TREE_MEMO_HINT.load(std::sync::atomic::Ordering::Relaxed);
                if hint <= MAX_HINT {
                    expected = hint;
                }
            }
            let mut set = Addresses::with_capacity(cap, expected);
            let mut held = Vec::with_capacity(cap);
            for o in objs.iter_mut().filter_map(Option::take) {
                set.insert(o.as_ptr() as usize);
                held.push(o);
            }
            *self = Memo::Identity(set, held, *tree);
        }
        if let Memo::Identity(set, objs, _) = self {
            if set.insert(obj.as_ptr() as usize) {
                objs.push(obj.clone().unbind());
            }
        }
    }

    /// A whole-tree identity memo holding `objs` (distinct, identity-hashed),
    /// as if each had been added in turn.
    pub fn from_held(objs: Vec<Py<PyAny>>) -> Memo {
        let mut m = Memo::for_tree();
        if objs.len() > INLINE {
            let mut set = Addresses::with_capacity(objs.len(), objs.len());
            for o in &objs {
                set.insert(o.as_ptr() as usize);
            }
            return Memo::Identity(set, objs, true);
        }
        if let Memo::Small(n, slots, _) = &mut m {
            for o in objs {
                slots[*n] = Some(o);
                *n += 1;
            }
        }
        m
    }

    /// Does the memo still answer by identity alone (no Python `set`, no
    /// caller's object)?
    pub fn is_identity(&self) -> bool {
        matches!(self, Memo::Small(..) | Memo::Identity(..))
    }

    /// The memo as a Python object (converting it to a set), to hand to Python code.
    pub fn as_set<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.make_set(py)?;
        match self {
            Memo::Set(s) => Ok(s.bind(py).clone().into_any()),
            Memo::Object(o) => Ok(o.bind(py).clone()),
            _ => Ok(PySet::empty(py)?.into_any()),
        }
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Memo::Small(n, objs, _) => {
                for o in objs[..*n].iter().flatten() {
                    visit.call(o)?;
                }
                Ok(())
            }
            Memo::Identity(_, objs, _) => {
                for o in objs {
                    visit.call(o)?;
                }
                Ok(())
            }
            Memo::Set(s) => visit.call(s),
            Memo::Object(o) => visit.call(o),
        }
    }

    pub fn clear(&mut self) {
        *self = Memo::new();
    }
}

impl Drop for Memo {
    fn drop(&mut self) {
        if let Memo::Identity(set, _, true) = self {
            TREE_MEMO_HINT.store(set.len, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// `prefix + ("." if prefix else "") + name`, or None when only the value is
/// wanted and building the name cannot fail or run code (exact `str`s).
pub fn join<'py>(
    prefix: &Bound<'py, PyAny>,
    name: &Bound<'py, PyAny>,
    skip_if_pure: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = prefix.py();
    unsafe {
        let exact = capi::PyUnicode_CheckExact(prefix.as_ptr()) != 0
            && capi::PyUnicode_CheckExact(name.as_ptr()) != 0;
        if exact {
            if skip_if_pure {
                return Ok(None);
            }
            if capi::PyUnicode_GET_LENGTH(prefix.as_ptr()) == 0 {
                return Ok(Some(name.clone()));
            }
            let dot = intern!(py, ".");
            let a = Bound::from_owned_ptr_or_err(
                py,
                capi::PyUnicode_Concat(prefix.as_ptr(), dot.as_ptr()),
            )?;
            return Ok(Some(Bound::from_owned_ptr_or_err(
                py,
                capi::PyUnicode_Concat(a.as_ptr(), name.as_ptr()),
            )?));
        }
    }
    let sep = if prefix.is_truthy()? {
        intern!(py, ".")
    } else {
        intern!(py, "")
    };
    Ok(Some(prefix.add(sep)?.add(name)?))
}
