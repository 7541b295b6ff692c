//! Is what fastmodule remembered about a dict or a class still true?
//!
//! Every cache (the call cache, the per-instance facts, every recorded plan)
//! remembers a dict's *version* and a class's *version* and trusts what it
//! read while both are unchanged. This module is the only place that says
//! what a version is:
//!
//! - A class's version is its `tp_version_tag`, a field of the public
//!   `PyTypeObject`: CPython sets it to 0 on any change to the class or a
//!   base and never reuses a tag (its own method cache and specialiser rely
//!   on that rule). 0 means "nothing can be remembered".
//! - A dict's version, on 3.11, is the dict's `ma_version_tag` (PEP 509: a
//!   process-wide counter stamped on every insertion, deletion or rebinding).
//!   From 3.12 on that field is deprecated (PEP 699) and 3.14 removes it, so
//!   there the version comes from a dict watcher (`PyDict_AddWatcher`, a
//!   public API): the first time a dict's version is asked for, the dict is
//!   watched and given a fresh number from a process-wide counter; each event
//!   CPython reports for it (added, modified, deleted, cloned, cleared) gives
//!   it a new number, and its deallocation forgets it. Numbers are never
//!   reused, so a remembered (dict, version) pair that still matches means
//!   the same dict, unchanged; a dict at a recycled address has no number or
//!   a newer one.
//!
//! From 3.13 on an object may keep its attributes in *inline values* inside
//! the object, and a materialised `__dict__` can share them. On CPython
//! 3.13.0 an attribute store into shared inline values is not reported to
//! dict watchers (nor stamped on `ma_version_tag`): a remembered instance
//! dict would look unchanged after `m.x = y`. A self-test at import decides:
//! where stores are reported, nothing more is done; where they are not,
//! [`instance_dict`]'s callers get a dict that owns its values — the
//! object's `__dict__` is set to itself (`PyObject_GenericSetDict`, what
//! `obj.__dict__ = obj.__dict__` does: same dict, same contents and order),
//! which moves the values out of the object, after which every store goes
//! through the dict and is reported; where even that cannot be verified,
//! the caches are off.
//!
//! Dict watchers are a scarce resource (8 per interpreter; Dynamo takes one):
//! fastmodule takes at most one, at import. When none is free, every dict
//! asked about gets a new number each time, so nothing remembered ever
//! matches: the caches are off and every path checks as it goes (stock
//! behaviour, only slower), and [`status`] says so.
//!
//! Everything here runs with the GIL held (caches are off on free-threaded
//! builds) and calls no Python code: the watcher callback only updates the
//! table, so it cannot re-enter a lookup in progress.
use pyo3::ffi;

/// The version of class `tp`: 0 while nothing about it can be remembered.
#[inline(always)]
pub unsafe fn class_version(tp: *mut ffi::PyTypeObject) -> u32 {
    (*tp).tp_version_tag
}

#[cfg(not(Py_3_12))]
mod dicts {
    use pyo3::ffi;

    #[allow(deprecated)]
    #[inline(always)]
    pub unsafe fn version(dict: *mut ffi::PyObject) -> u64 {
        (*(dict as *mut ffi::PyDictObject)).ma_version_tag
    }

    pub fn init(_py: pyo3::Python<'_>) -> Result<(), String> {
        Ok(())
    }

    pub fn status() -> String {
        "dict version tags (CPython 3.11)".to_owned()
    }

    #[inline(always)]
    pub unsafe fn own_values(_obj: *mut ffi::PyObject, _dict: *mut ffi::PyObject) {}

    pub fn on() -> bool {
        true
    }
}

#[cfg(Py_3_12)]
mod dicts {
    use pyo3::ffi;
    use pyo3::prelude::*;
    use std::cell::UnsafeCell;
    use std::os::raw::c_int;

    type WatchCallback = unsafe extern "C" fn(
        event: c_int,
        dict: *mut ffi::PyObject,
        key: *mut ffi::PyObject,
        new_value: *mut ffi::PyObject,
    ) -> c_int;

    extern "C" {
        fn PyDict_AddWatcher(callback: WatchCallback) -> c_int;
        fn PyDict_ClearWatcher(watcher_id: c_int) -> c_int;
    }

    /// `PyDict_EVENT_DEALLOCATED` in CPython's `PyDict_WatchEvent`.
    const EVENT_DEALLOCATED: c_int = 5;

    /// The table value of a dict nothing may be remembered about.
    const UNTRUSTED: u64 = u64::MAX;

    /// An open-addressing table from dict address to version (linear probing,
    /// deletion by backward shift): a lookup is a multiply, a shift and
    /// usually one compare, which the call path pays on every module call.
    struct Table {
        /// (dict address, version) pairs side by side: a lookup touches one
        /// cache line, not two (the whole-tree checks look up thousands of
        /// dicts in a row). Address 0 marks a free slot.
        entries: Vec<(usize, u64)>,
        len: usize,
        /// The last number handed out (numbers start at 1: 0 is never a
        /// version).
        counter: u64,
        /// The watcher's id; -1 until `init` got one, -2 when none was free,
        /// -3 when the inline-values self-test failed.
        watcher: c_int,
        /// Instance dicts sharing an object's inline values must be given
        /// their own values first (see the module doc).
        detach: bool,
        /// Why the self-test failed.
        why: Option<String>,
        /// The interned name `__dict__`, kept for the life of the process.
        dunder_dict: *mut ffi::PyObject,
        /// Instance dicts marked `UNTRUSTED` so far.
        distrusted: u64,
    }

    struct Shared(UnsafeCell<Table>);
    // SAFETY: read and written only with the GIL held, by code that calls no
    // Python code while it holds a reference into the table.
    unsafe impl Sync for Shared {}
    static TABLE: Shared = Shared(UnsafeCell::new(Table {
        entries: Vec::new(),
        len: 0,
        counter: 0,
        watcher: -1,
        detach: false,
        why: None,
        dunder_dict: std::ptr::null_mut(),
        distrusted: 0,
    }));

    #[inline(always)]
    fn slot_of(key: usize, mask: usize) -> usize {
        // Dicts are 16-byte aligned; Fibonacci hashing spreads neighbours.
        ((key as u64 >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as usize & mask
    }

    impl Table {
        #[inline(always)]
        fn next(&mut self) -> u64 {
            self.counter += 1;
            self.counter
        }

        #[inline(always)]
        fn find(&self, key: usize) -> Option<usize> {
            if self.entries.is_empty() {
                return None;
            }
            let mask = self.entries.len() - 1;
            let mut i = slot_of(key, mask);
            loop {
                let k = self.entries[i].0;
                if k == key {
                    return Some(i);
                }
                if k == 0 {
                    return None;
                }
                i = (i + 1) & mask;
            }
        }

        fn insert(&mut self, key: usize, value: u64) {
            if (self.len + 1) * 2 > self.entries.len() {
                self.grow();
            }
            let mask = self.entries.len() - 1;
            let mut i = slot_of(key, mask);
            while self.entries[i].0 != 0 {
                if self.entries[i].0 == key {
                    self.entries[i].1 = value;
                    return;
                }
                i = (i + 1) & mask;
            }
            self.entries[i] = (key, value);
            self.len += 1;
        }

        fn grow(&mut self) {
            self.resize((self.entries.len() * 2).max(MIN_ENTRIES));
        }

        /// After the dicts of a large tree died: back to the size the live
        /// dicts need (at most a quarter full), so that the table holds what
        /// the largest tree alive needs, not the largest tree ever seen. A
        /// table at least eight times too large is resized; the hysteresis
        /// keeps a tree that is made and freed repeatedly from resizing on
        /// every round.
        fn shrink_if_sparse(&mut self) {
            if self.entries.len() > MIN_ENTRIES && self.len * 8 < self.entries.len() {
                self.resize((self.len * 4).next_power_of_two().max(MIN_ENTRIES));
            }
        }

        fn resize(&mut self, size: usize) {
            let old = std::mem::replace(&mut self.entries, vec![(0, 0); size]);
            self.len = 0;
            for (k, v) in old {
                if k != 0 {
                    self.insert(k, v);
                }
            }
        }

        fn remove(&mut self, key: usize) {
            let Some(mut hole) = self.find(key) else {
                return;
            };
            let mask = self.entries.len() - 1;
            self.len -= 1;
            // Backward shift: move later members of the run into the hole
            // when their home slot does not lie between the hole and them.
            let mut i = hole;
            loop {
                i = (i + 1) & mask;
                let k = self.entries[i].0;
                if k == 0 {
                    break;
                }
                let home = slot_of(k, mask);
                let stays = if hole <= i {
                    hole < home && home <= i
                } else {
                    hole < home || home <= i
                };
                if !stays {
                    self.entries[hole] = self.entries[i];
                    hole = i;
                }
            }
            self.entries[hole] = (0, 0);
            self.shrink_if_sparse();
        }
    }

    /// The smallest table (16 KiB), never shrunk below.
    const MIN_ENTRIES: usize = 1024;

    /// What CPython calls before it changes or frees a watched dict.
    unsafe extern "C" fn on_event(
        event: c_int,
        dict: *mut ffi::PyObject,
        _key: *mut ffi::PyObject,
        _new_value: *mut ffi::PyObject,
    ) -> c_int {
        let t = &mut *TABLE.0.get();
        if event == EVENT_DEALLOCATED {
            t.remove(dict as usize);
        } else if let Some(i) = t.find(dict as usize) {
            if t.entries[i].1 != UNTRUSTED {
                let v = t.next();
                t.entries[i].1 = v;
            }
        }
        0
    }

    /// The version of `dict` (any object: a non-dict gets a new number each
    /// time, so nothing about it is ever remembered).
    #[inline(always)]
    pub unsafe fn version(dict: *mut ffi::PyObject) -> u64 {
        let t = &mut *TABLE.0.get();
        if let Some(i) = t.find(dict as usize) {
            let v = t.entries[i].1;
            if t.watcher >= 0 && v != UNTRUSTED {
                return v;
            }
            return t.next();
        }
        first_version(t, dict)
    }

    #[cold]
    #[inline(never)]
    unsafe fn first_version(t: &mut Table, dict: *mut ffi::PyObject) -> u64 {
        let v = t.next();
        if t.watcher < 0 || ffi::PyDict_Check(dict) == 0 {
            return v;
        }
        if ffi::PyDict_Watch(t.watcher, dict) != 0 {
            // Only a non-dict or a bad id fail; neither can be remembered.
            ffi::PyErr_Clear();
            return v;
        }
        t.insert(dict as usize, v);
        v
    }

    /// Does `dict` share `obj`'s inline values? Inline values sit right
    /// after the object's basic size (checked by the self-test).
    #[cfg(Py_3_13)]
    #[inline(always)]
    unsafe fn shares_inline_values(obj: *mut ffi::PyObject, dict: *mut ffi::PyObject) -> bool {
        let values = (*(dict as *mut ffi::PyDictObject)).ma_values as usize;
        values != 0 && values == obj as usize + (*ffi::Py_TYPE(obj)).tp_basicsize as usize
    }

    /// See [`super::instance_dict`].
    #[inline(always)]
    pub unsafe fn own_values(obj: *mut ffi::PyObject, dict: *mut ffi::PyObject) {
        #[cfg(Py_3_13)]
        if (*TABLE.0.get()).detach && shares_inline_values(obj, dict) {
            set_dict_to_itself(obj, dict);
        }
        let _ = (obj, dict);
    }

    /// `obj.__dict__ = obj.__dict__` through the class's own `__dict__`
    /// getset (CPython's, which detaches the values: `PyObject_GenericSetDict`
    /// does not), found without running code and called only if it is a C
    /// getset. Setting the same dict frees nothing. Should it not apply (a
    /// class with a `__dict__` of its own) or fail, the dict stays shared and
    /// its stores unreported: it is marked so that nothing about it is ever
    /// remembered (each version asked is new).
    #[cfg(Py_3_13)]
    #[cold]
    #[inline(never)]
    unsafe fn set_dict_to_itself(obj: *mut ffi::PyObject, dict: *mut ffi::PyObject) {
        let t = &mut *TABLE.0.get();
        let name = t.dunder_dict;
        // `type_lookup` runs no code (a class dict with a key that is not a
        // str gives its "unknown", not a getset: the dict is distrusted).
        let descr = crate::cpython::type_cache::type_lookup(ffi::Py_TYPE(obj), name);
        let getset = std::ptr::addr_of_mut!(ffi::PyGetSetDescr_Type);
        let ok = !descr.is_null()
            && ffi::Py_TYPE(descr) == getset
            && ffi::PyObject_GenericSetAttr(obj, name, dict) == 0
            && !shares_inline_values(obj, dict);
        if !ok {
            ffi::PyErr_Clear();
            distrust(t, dict);
        }
    }

    /// Never remember anything about `dict` while it lives (watched, so its
    /// deallocation clears the mark).
    #[cfg(Py_3_13)]
    unsafe fn distrust(t: &mut Table, dict: *mut ffi::PyObject) {
        if t.watcher < 0 || ffi::PyDict_Watch(t.watcher, dict) != 0 {
            ffi::PyErr_Clear();
            return;
        }
        t.insert(dict as usize, UNTRUSTED);
        t.distrusted += 1;
    }

    /// Is every store into the attributes of an instance like `obj` reported
    /// for its materialised `dict`? Tried on a fresh probe object: a store
    /// before and after `own_values`.
    fn self_test(py: Python<'_>) -> Result<(), String> {
        let probe = py
            .eval(c"type('_fastmodule_probe', (), {})()", None, None)
            .map_err(|e| format!("probe object: {e}"))?;
        let x = crate::cpython::interned::intern!(py, "x");
        let stored = |v: i64| -> Result<(), String> {
            probe.setattr(x, v).map_err(|e| format!("probe store: {e}"))
        };
        stored(1)?;
        let dunder_dict = crate::cpython::interned::intern!(py, "__dict__");
        let dict = probe
            .getattr(dunder_dict)
            .map_err(|e| format!("probe __dict__: {e}"))?;
        let reported = |dict: *mut ffi::PyObject, v: i64| -> Result<bool, String> {
            let before = unsafe { version(dict) };
            stored(v)?;
            Ok(unsafe { version(dict) } != before)
        };
        if reported(dict.as_ptr(), 2)? {
            return Ok(());
        }
        #[cfg(Py_3_13)]
        if unsafe { shares_inline_values(probe.as_ptr(), dict.as_ptr()) } {
            unsafe { (*TABLE.0.get()).detach = true };
            unsafe { own_values(probe.as_ptr(), dict.as_ptr()) };
            let same = probe
                .getattr(dunder_dict)
                .is_ok_and(|d| d.as_ptr() == dict.as_ptr());
            if same
                && !unsafe { shares_inline_values(probe.as_ptr(), dict.as_ptr()) }
                && reported(dict.as_ptr(), 3)?
            {
                return Ok(());
            }
        }
        Err("attribute stores are not reported to dict watchers on this CPython".to_owned())
    }

    /// Take one dict-watcher slot (once per process) and check that it sees
    /// every change an instance dict can undergo.
    pub fn init(py: Python<'_>) -> Result<(), String> {
        let t = unsafe { &mut *TABLE.0.get() };
        if t.watcher != -1 {
            return Ok(());
        }
        let id = unsafe { PyDict_AddWatcher(on_event) };
        if id < 0 {
            t.watcher = -2;
            unsafe { ffi::PyErr_Clear() };
            return Err("no free dict-watcher slot".to_owned());
        }
        t.watcher = id;
        t.dunder_dict = crate::cpython::interned::intern!(py, "__dict__")
            .clone()
            .into_ptr();
        if let Err(why) = self_test(py) {
            let t = unsafe { &mut *TABLE.0.get() };
            t.watcher = -3;
            t.why = Some(why.clone());
            unsafe { PyDict_ClearWatcher(id) };
            unsafe { ffi::PyErr_Clear() };
            return Err(why);
        }
        Ok(())
    }

    pub fn status() -> String {
        let t = unsafe { &*TABLE.0.get() };
        match t.watcher {
            -1 => "off: not initialised".to_owned(),
            -2 => "off: all 8 dict-watcher slots were taken when fastmodule was \
                   imported (caches and plans are off; behaviour is stock)"
                .to_owned(),
            -3 => format!(
                "off: {} (caches and plans are off; behaviour is stock)",
                t.why
                    .as_deref()
                    .unwrap_or("an instance dict's stores are not reported")
            ),
            id if t.detach => format!(
                "dict watcher {id} (instance dicts own their values: this CPython \
                 does not report stores into shared inline values; {} could not \
                 and are never trusted)",
                t.distrusted
            ),
            id => format!("dict watcher {id}"),
        }
    }

    pub fn on() -> bool {
        unsafe { (*TABLE.0.get()).watcher >= 0 }
    }
}

/// The version of `dict`: equal to a remembered one only if it is the same
/// dict and nothing in it changed since.
#[inline(always)]
pub unsafe fn dict_version(dict: *mut ffi::PyObject) -> u64 {
    dicts::version(dict)
}

/// What an instance-keyed entry (here and in `crate::instance::walk_facts`) describes: one
/// instance dict at one version tag, seen through one class at one
/// `tp_version_tag`. Tags are never reused, so a key that still matches means
/// neither has changed since the entry was made.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub dict: *mut ffi::PyObject,
    pub version: u64,
    pub tp: *mut ffi::PyTypeObject,
    pub tp_version: u32,
}

impl Key {
    pub const EMPTY: Key = Key {
        dict: std::ptr::null_mut(),
        version: 0,
        tp: std::ptr::null_mut(),
        tp_version: 0,
    };

    /// The key of `dict` and `tp` now; None while the class has no version
    /// tag, or the dict is not quiet (nothing about them can be remembered
    /// then). A key that still matches therefore also means the dict is
    /// still quiet: its lookups by exact `str` run no code.
    #[inline(always)]
    pub unsafe fn now(tp: *mut ffi::PyTypeObject, dict: *mut ffi::PyObject) -> Option<Key> {
        let tp_version = class_version(tp);
        if tp_version == 0 || !super::quiet::dict(dict) {
            return None;
        }
        Some(Key {
            dict,
            version: dict_version(dict),
            tp,
            tp_version,
        })
    }
}

/// Set up dict versions (at import, with the GIL held). An error means the
/// caches are off for this process; fastmodule then behaves as stock.
pub fn init(py: pyo3::Python<'_>) -> Result<(), String> {
    dicts::init(py)
}

/// Ready `obj`'s instance dict `dict` (non-null) to be remembered: where
/// this CPython does not report stores into inline values shared with the
/// object, give the dict its own values (see the module doc). Calls no
/// Python code.
#[inline(always)]
pub unsafe fn own_values(obj: *mut ffi::PyObject, dict: *mut ffi::PyObject) {
    dicts::own_values(obj, dict)
}

/// How dict versions are decided here, or why caches are off.
pub fn status() -> String {
    dicts::status()
}

/// Can anything be remembered? False when no dict watcher was free.
#[inline(always)]
pub fn caches_on() -> bool {
    dicts::on() && !cfg!(Py_GIL_DISABLED)
}

/// The versions of the dicts a check read, when it last passed: while none of
/// them changed, it passes again (any insertion, deletion or rebinding moves a
/// dict's version). Used for "every global this path reads is still torch's
/// object" checks (the native layers, `torch.compiler.is_compiling`).
pub struct Checked<const N: usize>(std::cell::Cell<[u64; N]>);
// SAFETY: only touched with the GIL held.
unsafe impl<const N: usize> Sync for Checked<N> {}

impl<const N: usize> Checked<N> {
    pub const fn new() -> Self {
        Checked(std::cell::Cell::new([0; N]))
    }

    /// `check()` unless `dicts` are all at the versions of its last success.
    #[inline(always)]
    pub unsafe fn pass(
        &self,
        dicts: [*mut ffi::PyObject; N],
        check: impl FnOnce() -> bool,
    ) -> bool {
        if !caches_on() {
            return check();
        }
        let now = dicts.map(|d| dict_version(d));
        if now == self.0.get() {
            return true;
        }
        if !check() {
            return false;
        }
        self.0.set(now);
        true
    }
}
