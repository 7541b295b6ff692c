//! Recorded tree walks ("plans"): what a complete `named_modules` or
//! `_named_members` walk of a tree read, in walk order, so the next walk of
//! the unchanged tree replays it instead of reading every registry again.
//!
//! A plan is a list of nodes (every entry the walk took from a `_modules`
//! registry, `None` entries and duplicates included, plus the root) and, for
//! member walks, the entries of each node's `_parameters`/`_buffers`. Each
//! node keeps what the live walk's decisions depended on: the module's class
//! and its `tp_version_tag`, its instance dict and that dict's version, and the
//! registry dicts with their versions, sizes and `PyDict_Next` positions.
//!
//! A replay trusts a node only after checking, at the moment the live walk
//! would read them, that those are unchanged (a dict's version changes with any
//! insertion, deletion or rebinding; a class's tag with any change to it or a
//! base), and that every dict the live walk would have open still has its
//! recorded version. The first check that fails hands the walk to the live
//! walker in exactly the state it would be in at that point (open dicts and
//! their positions, the memo), so a tree mutated during iteration behaves as
//! in torch. Pointers in a plan are borrowed: each is dereferenced only after
//! the check of the object holding it passed (the root is the caller's; a
//! child is a value of its parent's unchanged registry).
//!
//! Plans are kept per (root, walk) in a small table; a replay's own strong
//! references (the memo's objects, open dicts) are the live walker's.
use crate::cpython::capi;
use crate::cpython::validity::{dict_version, Key};
use crate::instance::attributes::instance_dict;
use pyo3::prelude::*;
use std::cell::UnsafeCell;
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NodeKind {
    Root,
    Live,
    /// A `None` entry of the parent's `_modules`.
    Empty,
    /// A module already in the memo.
    Dup,
}

/// What one node's checks compare: the module's class and instance dict, with
/// their versions (the call cache's key).
pub type Seen = Key;

/// `module`'s class and instance dict now; None when a plan cannot depend on
/// them (no version tag, no exact instance dict, or one whose lookups may
/// run code).
///
/// A replay skips the instance-dict lookups torch's code makes (`self._modules`,
/// `child.named_modules`, ...), which is the same only while they run no code:
/// the dict must be quiet (`crate::cpython::quiet::dict`). It stays quiet
/// while its version is unchanged (a non-str key is an insertion), which
/// every replay checks before trusting a node.
#[inline(always)]
pub unsafe fn seen_now(module: *mut capi::PyObject) -> Option<Seen> {
    let dict = instance_dict(module);
    if dict.is_null() || !crate::cpython::quiet::dict(dict) {
        return None;
    }
    Key::now(capi::Py_TYPE(module), dict)
}

/// Are `module`'s class and instance dict still the recorded ones?
#[inline(always)]
pub unsafe fn holds(seen: &Seen, module: *mut capi::PyObject) -> bool {
    let tp = capi::Py_TYPE(module);
    tp == seen.tp
        && crate::cpython::validity::class_version(tp) == seen.tp_version
        && crate::instance::attributes::instance_dict_is(module, seen.dict)
        && dict_version(seen.dict) == seen.version
}

/// A registry dict as the walk opened it.
#[derive(Clone, Copy)]
pub struct Reg {
    pub dict: *mut capi::PyObject,
    pub version: u64,
    pub used: capi::Py_ssize_t,
}

impl Reg {
    pub const NONE: Reg = Reg {
        dict: std::ptr::null_mut(),
        version: 0,
        used: 0,
    };

    #[inline(always)]
    pub unsafe fn unchanged(&self) -> bool {
        dict_version(self.dict) == self.version
    }
}

pub struct Node {
    pub kind: NodeKind,
    /// Borrowed; null for `Empty`.
    pub module: *mut capi::PyObject,
    /// The walk's stack depth of the node's frame (root 0).
    pub depth: u32,
    /// The parent's `PyDict_Next` position after this entry.
    pub ppos: capi::Py_ssize_t,
    pub seen: Seen,
    /// The frame's prefix (owned; what the live walker put in the frame).
    pub prefix: Option<Py<PyAny>>,
    /// `_modules` as read when the walk resumed after yielding the node.
    pub mods: Reg,
    /// The member registry (member walks).
    pub reg: Reg,
    /// This node's entries in `Plan::items`.
    pub items: (u32, u32),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Live,
    Empty,
    Dup,
}

pub struct Item {
    pub kind: ItemKind,
    /// Borrowed; null for `Empty`.
    pub value: *mut capi::PyObject,
    pub pos: capi::Py_ssize_t,
    /// The yielded name (owned), where the walk built one.
    pub name: Option<Py<PyAny>>,
}

/// Which walk a plan records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PlanKey {
    pub root: usize,
    pub prefix: usize,
    /// 0: `named_modules`; 1: `_parameters`; 2: `_buffers`.
    pub registry: u8,
    pub values: bool,
}

pub struct Plan {
    pub key: PlanKey,
    pub nodes: Vec<Node>,
    pub items: Vec<Item>,
}

// SAFETY: a plan's raw pointers are only compared or dereferenced with the
// GIL held, after the checks described above.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Plan {
    /// Is every recorded dict still at its recorded version? Run when the
    /// recording walk ends: a dict that changed during the walk makes the
    /// recording unusable. Only dereferences what the recording walk's memo
    /// keeps alive, or what an unchanged dict holds.
    unsafe fn still_valid(&self) -> bool {
        for n in &self.nodes {
            if n.kind == NodeKind::Empty {
                continue;
            }
            if !holds(&n.seen, n.module) {
                return false;
            }
            for r in [&n.mods, &n.reg] {
                if !r.dict.is_null() && !r.unchanged() {
                    return false;
                }
            }
        }
        true
    }
}

/// A plan being recorded by a live walk; `ok` turns false at the first thing
/// a plan cannot represent.
pub struct Recorder {
    pub ok: bool,
    pub plan: Plan,
}

impl Recorder {
    pub fn new(key: PlanKey) -> Recorder {
        Recorder {
            ok: true,
            plan: Plan {
                key,
                nodes: Vec::new(),
                items: Vec::new(),
            },
        }
    }

    /// Keep the recording if it is complete and nothing it read changed.
    pub fn finish(self, py: Python<'_>) {
        if !self.ok || !crate::cpython::validity::caches_on() {
            return;
        }
        if unsafe { self.plan.still_valid() } {
            // SAFETY: the root is alive: the recording walk's memo holds it.
            let root = unsafe { Bound::from_borrowed_ptr(py, self.plan.key.root as *mut _) };
            if crate::plans::roots::watch(&root) {
                store(Arc::new(self.plan));
            }
        }
    }
}

/// Plans kept, and walks that started from a plan (for tests and `fastmodule`'s
/// own diagnostics).
static RECORDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static REPLAYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `(plans kept, walks started from a plan)` since import.
pub fn stats() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (RECORDED.load(Relaxed), REPLAYED.load(Relaxed))
}

/// Count a walk that starts from a plan.
pub fn note_replay() {
    REPLAYED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

const SLOTS: usize = 8;

pub struct Table(UnsafeCell<[Option<Arc<Plan>>; SLOTS]>, UnsafeCell<usize>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Table {}
pub static TABLE: Table = Table(
    UnsafeCell::new([None, None, None, None, None, None, None, None]),
    UnsafeCell::new(0),
);

impl crate::plans::roots::Rooted for Table {
    fn forget_roots(&self, is_gone: &dyn Fn(usize) -> bool) {
        // SAFETY: GIL held; each old plan is released after its slot is
        // consistent (releasing names runs no code).
        unsafe {
            let slots = &mut *self.0.get();
            for s in slots.iter_mut() {
                if s.as_ref().is_some_and(|p| is_gone(p.key.root)) {
                    let old = s.take();
                    drop(old);
                }
            }
        }
    }

    fn has_root(&self, root: usize) -> bool {
        // SAFETY: GIL held.
        unsafe { (*self.0.get()).iter().flatten().any(|p| p.key.root == root) }
    }
}

/// The plan recorded for `key`, if any (it may be stale: replays check).
pub fn find(key: &PlanKey) -> Option<Arc<Plan>> {
    if !crate::cpython::validity::caches_on() {
        return None;
    }
    unsafe {
        (*TABLE.0.get())
            .iter()
            .flatten()
            .find(|p| p.key == *key)
            .cloned()
    }
}

fn store(plan: Arc<Plan>) {
    RECORDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    unsafe {
        let slots = &mut *TABLE.0.get();
        let i = match slots
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.key == plan.key))
        {
            Some(i) => i,
            None => {
                let next = &mut *TABLE.1.get();
                let i = *next;
                *next = (i + 1) % SLOTS;
                i
            }
        };
        // The old plan's names are released after the slot is consistent.
        let old = slots[i].replace(plan);
        drop(old);
    }
}

/// Drop `plan` from the table (a replay found the tree changed: the next
/// walk records afresh instead of replaying a stale plan again).
pub fn forget(plan: &Arc<Plan>) {
    unsafe {
        let slots = &mut *TABLE.0.get();
        for s in slots.iter_mut() {
            if s.as_ref().is_some_and(|p| Arc::ptr_eq(p, plan)) {
                let old = s.take();
                drop(old);
            }
        }
    }
}

/// Ask the CPU to start loading the cache line at `p`: a hint, which never
/// faults, so `p` may be stale or null.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault.
    #[allow(unused_unsafe)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// How far ahead a scan prefetches (nodes, and members).
const AHEAD: usize = 4;

/// Start loading what the checks of `node` read: the module's header and
/// managed-dict slots, its instance dict and its registry dicts. Each is a
/// chain of dependent loads otherwise, missed one after the other on a tree
/// larger than the cache.
#[inline(always)]
fn prefetch_node(node: &Node) {
    let m = node.module as *const u8;
    prefetch(m);
    prefetch(m.wrapping_sub(32));
    prefetch(node.seen.dict);
    prefetch(node.mods.dict);
    prefetch(node.reg.dict);
}

/// The members a replay of `plan` (a values-only `_named_members` walk from
/// `root`) would yield, in order, for a walk during which nothing else runs:
/// every check the replay would make between its steps is made here once,
/// which decides the same while nothing can change the tree in between.
/// `each` gets each member (borrowed, held by its unchanged registry) and
/// returns false to stop. False when a check failed or `each` stopped; the
/// caller then walks as usual.
///
/// # Safety
/// GIL held; `each` must run no Python code.
pub unsafe fn scan_members(
    plan: &Plan,
    root: *mut capi::PyObject,
    mut each: impl FnMut(*mut capi::PyObject) -> bool,
) -> bool {
    use crate::instance::registries::identity_hashed;
    if !plan.key.values || plan.key.registry == 0 {
        return false;
    }
    if !root_holds(plan, root) || !identity_hashed(root) {
        return false;
    }
    let limit = capi::Py_GetRecursionLimit() as i64;
    for (i, n) in plan.nodes.iter().enumerate() {
        if let Some(ahead) = plan.nodes.get(i + AHEAD) {
            prefetch_node(ahead);
        }
        // The replay's checks of an entry taken from a parent's `_modules`.
        if n.kind == NodeKind::Empty {
            continue;
        }
        if n.kind != NodeKind::Root
            && (!holds(&n.seen, n.module) || n.depth as i64 >= limit || !identity_hashed(n.module))
        {
            return false;
        }
        if n.kind == NodeKind::Dup {
            continue;
        }
        // Its `_modules` and member registry, as the walk resumes at it.
        if n.mods.dict.is_null()
            || !n.mods.unchanged()
            || n.reg.dict.is_null()
            || !n.reg.unchanged()
        {
            return false;
        }
        for k in n.items.0 as usize..n.items.1 as usize {
            let it = &plan.items[k];
            if let Some(ahead) = plan.items.get(k + AHEAD) {
                prefetch(ahead.value);
            }
            if it.kind == ItemKind::Empty {
                continue;
            }
            if !identity_hashed(it.value) {
                return false;
            }
            if it.kind == ItemKind::Live && !each(it.value) {
                return false;
            }
        }
    }
    true
}

/// Does the plan's root still hold for `root` (class, instance dict and its
/// registries unchanged)? The common way a tree changes (`train()`, a new
/// attribute on the root) shows here, before a replay starts.
pub fn root_holds(plan: &Plan, root: *mut capi::PyObject) -> bool {
    let Some(n) = plan.nodes.first() else {
        return false;
    };
    unsafe {
        n.module == root
            && holds(&n.seen, root)
            && !n.mods.dict.is_null()
            && n.mods.unchanged()
            && (plan.key.registry == 0 || (!n.reg.dict.is_null() && n.reg.unchanged()))
    }
}
