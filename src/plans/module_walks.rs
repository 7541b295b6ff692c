//! Recorded tree walks ("plans"): what a complete `named_modules` or
//! `_named_members` walk of a tree read, in walk order, so the next walk of
//! the unchanged tree replays it instead of reading every registry again.
//!
//! A plan is a list of nodes (every entry the walk took from a `_modules`
//! registry, `None` entries and duplicates included, plus the root) and, for
//! member walks, the entries of each node's `_parameters`/`_buffers`. Each
//! node keeps what the live walk's decisions depended on: the module's class
//! and its `tp_version_tag`, its instance dict and that dict's version, and the
//! registry dicts with their versions (in the tree's
//! [`Modules`](crate::plans::visit::Modules) snapshot, which the node names by
//! index, shared with the root's other plans recorded from the same state),
//! and its depth and `PyDict_Next` position. A registry's size is not kept: a
//! dict at its recorded version has its recorded size.
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
use crate::plans::visit::{Builder, Checked, Modules, NONE};
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

/// A registry dict as the walk opened it, with its version then.
#[derive(Clone, Copy)]
pub struct Reg {
    pub dict: *mut capi::PyObject,
    pub version: u64,
}

impl Reg {
    pub const NONE: Reg = Reg {
        dict: std::ptr::null_mut(),
        version: 0,
    };
}

/// A node as the recording walk notes it.
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
    /// The three registries with their versions (`Checked::regs`), read
    /// when the walk resumed after yielding the node (and read `_modules`);
    /// null until then.
    pub regs: [(*mut capi::PyObject, u64); 3],
    /// The member registry (member walks).
    pub reg: Reg,
    /// This node's entries in `Recording::items`.
    pub items: (u32, u32),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Live,
    Empty,
    Dup,
}

/// A member entry as the recording walk notes it.
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

/// What a recording walk noted, made into a [`Plan`] when it completes.
pub struct Recording {
    pub key: PlanKey,
    pub nodes: Vec<Node>,
    pub items: Vec<Item>,
}

// SAFETY: as for `Plan`.
unsafe impl Send for Recording {}
unsafe impl Sync for Recording {}

/// One node of a kept plan.
#[derive(Clone, Copy)]
pub struct Step {
    /// The node's module in `Plan::modules` ([`NONE`] for `Empty`).
    pub module: u32,
    /// The walk's stack depth of the node's frame (root 0).
    pub depth: u32,
    /// The parent's `PyDict_Next` position after this entry.
    pub ppos: u32,
    /// The end of this node's entries in `Plan::items` (they start where the
    /// previous node's end).
    pub items_end: u32,
    pub kind: NodeKind,
}

/// One member entry of a kept plan.
#[derive(Clone, Copy)]
pub struct Member {
    /// Borrowed; null for `Empty`.
    pub value: *mut capi::PyObject,
    /// The registry's `PyDict_Next` position after this entry.
    pub pos: u32,
    pub kind: ItemKind,
}

pub struct Plan {
    pub key: PlanKey,
    /// The root's prefix (owned: `key.prefix` is its address).
    prefix: Py<PyAny>,
    /// The modules the nodes name, with what their checks compare.
    modules: Modules,
    /// `modules`' entries (read on every step of a replay; the snapshot
    /// never changes while this plan holds it).
    checked: *const Checked,
    pub nodes: Vec<Step>,
    /// Each node's frame prefix (owned); empty when every frame's is the
    /// root's (`modules()`, `parameters()`: no names are built).
    names: Vec<Option<Py<PyAny>>>,
    pub items: Vec<Member>,
    /// Each item's yielded name (owned); empty when none was built.
    item_names: Vec<Option<Py<PyAny>>>,
}

// SAFETY: a plan's raw pointers are only compared or dereferenced with the
// GIL held, after the checks described above.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Plan {
    /// What the checks of node `n` (a node of this plan, not `Empty`)
    /// compare.
    #[inline(always)]
    pub fn checked(&self, n: &Step) -> &Checked {
        debug_assert!((n.module as usize) < self.modules.len());
        // SAFETY: every index but `Empty`'s was given by the snapshot's
        // builder, which holds that many modules (`Recording::compact`).
        unsafe { &*self.checked.add(n.module as usize) }
    }

    /// The frame prefix of node `j`.
    #[inline(always)]
    pub fn prefix(&self, j: usize) -> Option<&Py<PyAny>> {
        if self.names.is_empty() {
            Some(&self.prefix)
        } else {
            self.names[j].as_ref()
        }
    }

    /// Node `j`'s entries in `items`.
    #[inline(always)]
    pub fn items_of(&self, j: usize) -> (u32, u32) {
        let start = if j == 0 {
            0
        } else {
            self.nodes[j - 1].items_end
        };
        (start, self.nodes[j].items_end)
    }

    /// The name yielded with item `k`, where the walk built one.
    #[inline(always)]
    pub fn item_name(&self, k: usize) -> Option<&Py<PyAny>> {
        self.item_names.get(k).and_then(Option::as_ref)
    }

    /// The member registry of `c` (a node's module) this plan walks, and its
    /// index in `Checked::regs`.
    #[inline(always)]
    pub fn reg_index(&self) -> usize {
        if self.key.registry == 2 {
            1
        } else {
            0
        }
    }

    /// The member registry this plan walks of node `n`'s module.
    #[inline(always)]
    pub fn reg(&self, c: &Checked) -> *mut capi::PyObject {
        c.regs[self.reg_index()].0
    }

    /// Is that registry at its recorded version?
    #[inline(always)]
    pub unsafe fn reg_unchanged(&self, c: &Checked) -> bool {
        c.reg_unchanged(self.reg_index())
    }
}

/// `_modules` in `Checked::regs`.
pub const MODS: usize = 2;

/// A node's registries before they are read.
pub const NO_REGS: [(*mut capi::PyObject, u64); 3] = [(std::ptr::null_mut(), 0); 3];

impl Recording {
    /// The plan this complete recording describes, when every module it
    /// noted is still as noted (a dict that changed during the walk makes
    /// the recording unusable) and can be kept in a snapshot (its three
    /// registries exact, quiet dicts of its instance dict: see
    /// `crate::plans::visit::Checked::read`). Only dereferences what the
    /// recording walk's memo keeps alive, or what an unchanged dict holds;
    /// runs no Python code.
    unsafe fn compact(self, py: Python<'_>) -> Option<Plan> {
        let root_prefix = self.nodes.first()?.prefix.as_ref()?.clone_ref(py);
        let member = if self.key.registry == 2 { 1 } else { 0 };
        let mut modules = Builder::new();
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut items_end = 0u32;
        let mut own_names = false;
        for n in &self.nodes {
            let module = match n.kind {
                NodeKind::Empty => NONE,
                NodeKind::Dup => {
                    let i = modules.index_of(n.module)?;
                    if modules.get(i)?.seen != n.seen {
                        return None;
                    }
                    i
                }
                NodeKind::Root | NodeKind::Live => {
                    let c = Checked {
                        module: n.module,
                        seen: n.seen,
                        regs: n.regs,
                    };
                    // Read at the node's resumption; all unchanged since.
                    if c.regs[MODS].0.is_null()
                        || !c.holds()
                        || (self.key.registry != 0
                            && (n.reg.dict != c.regs[member].0
                                || n.reg.version != c.regs[member].1))
                    {
                        return None;
                    }
                    if !n.prefix.as_ref().is_some_and(|p| p.is(&root_prefix)) {
                        own_names = true;
                    }
                    // Each module is taken once (the memo's later takes are
                    // `Dup`).
                    modules.add_new(c)?
                }
            };
            if n.items != (0, 0) {
                if n.items.0 != items_end {
                    return None;
                }
                items_end = n.items.1;
            }
            nodes.push(Step {
                module,
                depth: n.depth,
                ppos: u32::try_from(n.ppos).ok()?,
                items_end,
                kind: n.kind,
            });
        }
        if items_end as usize != self.items.len() {
            return None;
        }
        let mut items = Vec::with_capacity(self.items.len());
        for it in &self.items {
            items.push(Member {
                value: it.value,
                pos: u32::try_from(it.pos).ok()?,
                kind: it.kind,
            });
        }
        // Collected into new vectors of their own size (`into_iter().collect()`
        // would keep the recording's larger allocations).
        let mut names = Vec::new();
        if own_names {
            names.reserve_exact(self.nodes.len());
            names.extend(self.nodes.into_iter().map(|n| match n.kind {
                NodeKind::Root | NodeKind::Live => n.prefix,
                NodeKind::Empty | NodeKind::Dup => None,
            }));
        }
        let mut item_names = Vec::new();
        if self.items.iter().any(|it| it.name.is_some()) {
            item_names.reserve_exact(self.items.len());
            item_names.extend(self.items.into_iter().map(|it| it.name));
        }
        let modules = modules.finish(self.key.root);
        Some(Plan {
            key: self.key,
            prefix: root_prefix,
            checked: modules.as_ptr(),
            modules,
            nodes,
            names,
            items,
            item_names,
        })
    }
}

/// A plan being recorded by a live walk; `ok` turns false at the first thing
/// a plan cannot represent.
pub struct Recorder {
    pub ok: bool,
    pub plan: Recording,
}

impl Recorder {
    pub fn new(key: PlanKey) -> Recorder {
        Recorder {
            ok: true,
            plan: Recording {
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
        // SAFETY: the root is alive: the recording walk's memo holds it.
        let root = unsafe { Bound::from_borrowed_ptr(py, self.plan.key.root as *mut _) };
        // Watched first: that allocates (and may run another root's callback).
        if !crate::plans::roots::watch(&root) {
            return;
        }
        let plan = unsafe { self.plan.compact(py) };
        // SAFETY: clearing what a lookup of the compaction may have raised.
        unsafe { capi::PyErr_Clear() };
        if let Some(plan) = plan {
            store(Arc::new(plan));
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

/// Start loading what the checks of node `n` read: its entry of the
/// snapshot, the module's header and managed-dict slots, its instance dict
/// and its registry dicts. Each is a chain of dependent loads otherwise,
/// missed one after the other on a tree larger than the cache.
#[inline(always)]
fn prefetch_node(plan: &Plan, n: &Step) {
    let Some(c) = plan.modules.get(n.module as usize) else {
        return;
    };
    prefetch(c);
    let m = c.module as *const u8;
    prefetch(m);
    prefetch(m.wrapping_sub(32));
    prefetch(c.seen.dict);
    prefetch(c.regs[MODS].0);
    prefetch(plan.reg(c));
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
    let mut start = 0usize;
    for (i, n) in plan.nodes.iter().enumerate() {
        if let Some(ahead) = plan.nodes.get(i + AHEAD) {
            prefetch_node(plan, ahead);
        }
        let end = n.items_end as usize;
        let items = start..end;
        start = end;
        // The replay's checks of an entry taken from a parent's `_modules`.
        if n.kind == NodeKind::Empty {
            continue;
        }
        let c = plan.checked(n);
        if n.kind != NodeKind::Root
            && (!c.seen_holds() || n.depth as i64 >= limit || !identity_hashed(c.module))
        {
            return false;
        }
        if n.kind == NodeKind::Dup {
            continue;
        }
        // Its `_modules` and member registry, as the walk resumes at it.
        if !c.reg_unchanged(MODS) || !plan.reg_unchanged(c) {
            return false;
        }
        for k in items {
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
    let c = plan.checked(n);
    unsafe {
        c.module == root
            && holds(&c.seen, root)
            && c.reg_unchanged(MODS)
            && (plan.key.registry == 0 || plan.reg_unchanged(c))
    }
}
