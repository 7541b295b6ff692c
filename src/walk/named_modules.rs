//! `named_modules` (and `modules`) as a lazy native iterator: torch's
//! recursive generator replaced by an explicit stack (no native recursion),
//! so laziness, mutation during iteration and exceptions behave as in the
//! generator; walks of an unchanged tree replay their recorded plan
//! (`crate::plans::module_walks`).
use super::yielded::{dotted_join, pair};
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::instance::registries::{identity_hashed, join, Items, Memo};
use crate::plans::module_walks::{self, Node, NodeKind, Plan, Recorder, Reg, MODS, NO_REGS};
use crate::plans::visit::Checked;
use crate::torch_api::originals::require;
use pyo3::prelude::*;
use pyo3::types::PyIterator;
use pyo3::{PyTraverseError, PyVisit};
use std::sync::Arc;

/// What one step of the `named_modules` walk produced.
pub(super) enum Yielded<'py> {
    /// A module reached by the native walk, with its prefix.
    Pair(Bound<'py, PyAny>, Bound<'py, PyAny>),
    /// A pair yielded by an overriding `named_modules`.
    Item(Bound<'py, PyAny>),
}

enum State {
    /// Not yet checked against the memo / yielded.
    Entry,
    /// Yielded; `self._modules.items()` is read when the walk resumes, as in
    /// torch's generator.
    Resume,
    /// Walking `self._modules.items()`.
    Items(Items),
    /// A module whose `named_modules` is its own: consume its iterator.
    Delegate(Py<PyIterator>),
}

struct Frame {
    module: Py<PyAny>,
    /// The module's prefix; when `name` is set, its parent's (the join was
    /// skipped: only modules are wanted), made exact by [`exact_prefixes`]
    /// before an overriding `named_modules` below it is handed one.
    prefix: Py<PyAny>,
    /// The name under which its parent holds it, while `prefix` is not built.
    name: Option<Py<PyAny>>,
    /// `prefix + "."`, built for the first child that needs it.
    dotted: Option<Py<PyAny>>,
    state: State,
    /// The frame's node in the plan being recorded.
    node: u32,
}

/// Build every prefix the walk skipped, from the root down (each frame's
/// parent is exact by then), as torch's recursion would have built it.
fn exact_prefixes(py: Python<'_>, stack: &mut [Frame]) -> PyResult<()> {
    for i in 1..stack.len() {
        let Some(name) = stack[i].name.take() else {
            continue;
        };
        let parent = stack[i - 1].prefix.bind(py).clone();
        let joined = join(&parent, name.bind(py), false)?;
        stack[i].prefix = joined.unwrap_or(parent).unbind();
        stack[i].dotted = None;
    }
    Ok(())
}

/// A frame a replay has open: its node and `_modules`' iteration.
struct Shadow {
    node: u32,
    /// The node's depth.
    depth: u32,
    dict: Py<PyAny>,
    /// The dict's recorded version (the node's, kept here for the checks
    /// before each entry).
    version: u64,
    pos: capi::Py_ssize_t,
    /// The dict's size when opened.
    used: capi::Py_ssize_t,
    left: capi::Py_ssize_t,
}

#[derive(Clone, Copy)]
enum Phase {
    /// Nothing yielded yet.
    Start,
    /// Node `.0` was just yielded; its `_modules` is read on resuming.
    After(u32),
    /// Iterating the top shadow frame's `_modules`.
    Items,
}

/// A `named_modules` walk replaying a plan (see `crate::plans::module_walks`).
pub(super) struct Replay {
    pub(super) plan: Arc<Plan>,
    /// The root (the plan's pointer to it is borrowed): held from the
    /// walk's creation, as the live walker's first frame holds it.
    root: Py<PyAny>,
    /// The next node to take.
    next: usize,
    shadow: Vec<Shadow>,
    /// The memo's modules, in order (kept alive as the memo would).
    held: Vec<Py<PyAny>>,
    phase: Phase,
}

/// What a replay step produced.
enum Replayed<'py> {
    Pair(Bound<'py, PyAny>, Bound<'py, PyAny>),
    Done,
    /// Handed over to the live walker.
    Live,
}

/// Native `named_modules(memo, prefix, remove_duplicate)` generator.
#[pyclass(module = "fastmodule._core")]
pub struct NamedModules {
    /// Yield only the module of each pair (`modules()`).
    values: bool,
    stack: Vec<Frame>,
    memo: Memo,
    remove_duplicate: Py<PyAny>,
    rd: bool,
    pub(super) replay: Option<Box<Replay>>,
    pub(super) rec: Option<Box<Recorder>>,
}

pub(super) const NO_NODE: u32 = u32::MAX;

impl NamedModules {
    /// `registry`: the plan kind (0 for `named_modules`, 1/2 when driving a
    /// `_named_members` walk of `_parameters`/`_buffers`).
    pub fn new<'py>(
        _py: Python<'py>,
        module: &Bound<'py, PyAny>,
        memo: Option<Bound<'py, PyAny>>,
        prefix: &Bound<'py, PyAny>,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
        registry: u8,
    ) -> PyResult<Self> {
        let rd = remove_duplicate.is_truthy()?;
        // A caller's memo is used as is, through its own `in` and `.add`.
        let (memo, plannable) = match memo {
            Some(m) if !m.is_none() => (Memo::from_object(m), false),
            _ => (Memo::for_tree(), rd),
        };
        let mut walker = NamedModules {
            values,
            stack: vec![Frame {
                module: module.clone().unbind(),
                prefix: prefix.clone().unbind(),
                name: None,
                dotted: None,
                state: State::Entry,
                node: 0,
            }],
            memo,
            remove_duplicate: remove_duplicate.clone().unbind(),
            rd,
            replay: None,
            rec: None,
        };
        let exact = unsafe { capi::PyUnicode_CheckExact(prefix.as_ptr()) != 0 };
        if plannable && exact {
            let key = module_walks::PlanKey {
                root: module.as_ptr() as usize,
                prefix: prefix.as_ptr() as usize,
                registry,
                values,
            };
            let found = module_walks::find(&key).filter(|plan| {
                let holds = module_walks::root_holds(plan, module.as_ptr());
                if !holds {
                    module_walks::forget(plan);
                }
                holds
            });
            if let Some(plan) = found {
                module_walks::note_replay();
                walker.stack.clear();
                // The memo holds every module of a complete walk.
                let held = Vec::with_capacity(plan.nodes.len());
                walker.replay = Some(Box::new(Replay {
                    plan,
                    root: module.clone().unbind(),
                    next: 1,
                    shadow: Vec::new(),
                    held,
                    phase: Phase::Start,
                }));
            } else if let Some(seen) = unsafe { module_walks::seen_now(module.as_ptr()) } {
                let mut rec = Recorder::new(key);
                rec.plan.nodes.push(Node {
                    kind: NodeKind::Root,
                    module: module.as_ptr(),
                    depth: 0,
                    ppos: 0,
                    seen,
                    prefix: Some(prefix.clone().unbind()),
                    regs: NO_REGS,
                    reg: Reg::NONE,
                    items: (0, 0),
                });
                walker.rec = Some(Box::new(rec));
            }
        }
        Ok(walker)
    }

    /// The plan node of the pair just yielded, while replaying.
    pub(super) fn replay_node(&self) -> Option<(*const Plan, u32)> {
        match &self.replay {
            Some(r) => match r.phase {
                Phase::After(j) => Some((Arc::as_ptr(&r.plan), j)),
                _ => None,
            },
            None => None,
        }
    }

    /// The plan node of the top frame, while recording.
    pub(super) fn recording_node(&self) -> Option<u32> {
        match (&self.rec, self.stack.last()) {
            (Some(r), Some(f)) if r.ok && f.node != NO_NODE => Some(f.node),
            _ => None,
        }
    }

    fn step<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.step_pair(py)? {
            None => Ok(None),
            Some(Yielded::Pair(prefix, module)) => Ok(Some(pair(py, self.values, prefix, module)?)),
            Some(Yielded::Item(v)) if self.values => {
                let (_, m): (Bound<'py, PyAny>, Bound<'py, PyAny>) = v.extract()?;
                Ok(Some(m))
            }
            Some(Yielded::Item(v)) => Ok(Some(v)),
        }
    }

    /// One replay step: each check runs where the live walker would read
    /// what it covers; the first that fails hands over in that very state.
    fn replay_step<'py>(&mut self, py: Python<'py>) -> Replayed<'py> {
        let Some(r) = self.replay.as_mut() else {
            return Replayed::Live;
        };
        // SAFETY: the plan outlives every use below (`materialize`, which
        // drops this replay's reference, comes last).
        let plan: &Plan = unsafe { &*Arc::as_ptr(&r.plan) };
        unsafe {
            loop {
                match r.phase {
                    Phase::Start => {
                        let m = r.root.bind(py).clone();
                        if !identity_hashed(m.as_ptr()) {
                            break;
                        }
                        r.held.push(m.clone().unbind());
                        r.phase = Phase::After(0);
                        let prefix = match plan.prefix(0) {
                            Some(p) => p.bind(py).clone(),
                            None => break,
                        };
                        return Replayed::Pair(prefix, m);
                    }
                    Phase::After(j) => {
                        let n = &plan.nodes[j as usize];
                        let c = plan.checked(n);
                        if !c.seen_holds() || !c.reg_unchanged(MODS) {
                            break;
                        }
                        r.phase = Phase::Items;
                        // At its recorded version: its recorded size.
                        let mods = c.regs[MODS].0;
                        let used = crate::cpython::dicts::used(mods);
                        if used == 0 {
                            // The live walker would open it and close it in
                            // this same step: nothing to keep open.
                            continue;
                        }
                        r.shadow.push(Shadow {
                            node: j,
                            depth: n.depth,
                            dict: Bound::from_borrowed_ptr(py, mods).unbind(),
                            version: c.regs[MODS].1,
                            pos: 0,
                            used,
                            left: used,
                        });
                    }
                    Phase::Items => {
                        let depth = r.shadow.len();
                        let Some(top) = r.shadow.last_mut() else {
                            self.replay = None;
                            return Replayed::Done;
                        };
                        if crate::cpython::validity::dict_version(top.dict.as_ptr()) != top.version
                        {
                            break;
                        }
                        let i = r.next;
                        match plan.nodes.get(i) {
                            Some(n) if n.depth == top.depth + 1 => {
                                if n.kind == NodeKind::Empty {
                                    top.pos = n.ppos as capi::Py_ssize_t;
                                    top.left -= 1;
                                    r.next += 1;
                                    continue;
                                }
                                let c = plan.checked(n);
                                if !c.seen_holds()
                                    || depth as i64 >= capi::Py_GetRecursionLimit() as i64
                                    || !identity_hashed(c.module)
                                {
                                    break;
                                }
                                top.pos = n.ppos as capi::Py_ssize_t;
                                top.left -= 1;
                                r.next += 1;
                                if n.kind == NodeKind::Dup {
                                    continue;
                                }
                                let m = Bound::from_borrowed_ptr(py, c.module);
                                r.held.push(m.clone().unbind());
                                r.phase = Phase::After(i as u32);
                                let prefix = match plan.prefix(i) {
                                    Some(p) => p.bind(py).clone(),
                                    None => break,
                                };
                                return Replayed::Pair(prefix, m);
                            }
                            _ => {
                                r.shadow.pop();
                            }
                        }
                    }
                }
            }
        }
        self.materialize(py);
        Replayed::Live
    }

    /// Rebuild the live walker's state from the replay's.
    fn materialize(&mut self, py: Python<'_>) {
        let Some(r) = self.replay.take() else { return };
        let r = *r;
        let plan = r.plan;
        module_walks::forget(&plan);
        let mut stack = Vec::with_capacity(r.shadow.len() + 1);
        for s in r.shadow {
            let j = s.node as usize;
            let Some(prefix) = plan.prefix(j) else {
                continue;
            };
            let module = plan.checked(&plan.nodes[j]).module;
            stack.push(Frame {
                module: unsafe { Bound::from_borrowed_ptr(py, module) }.unbind(),
                prefix: prefix.clone_ref(py),
                name: None,
                dotted: None,
                state: State::Items(Items::resume(s.dict, s.pos, s.used, s.left)),
                node: NO_NODE,
            });
        }
        let top = match r.phase {
            Phase::Start => Some((0, State::Entry)),
            Phase::After(j) => Some((j, State::Resume)),
            Phase::Items => None,
        };
        if let Some((j, state)) = top {
            let module = plan.checked(&plan.nodes[j as usize]).module;
            if let Some(prefix) = plan.prefix(j as usize) {
                stack.push(Frame {
                    module: unsafe { Bound::from_borrowed_ptr(py, module) }.unbind(),
                    prefix: prefix.clone_ref(py),
                    name: None,
                    dotted: None,
                    state,
                    node: NO_NODE,
                });
            }
        }
        self.stack = stack;
        self.memo = if self.rd {
            Memo::from_held(r.held)
        } else {
            Memo::for_tree()
        };
    }

    /// The next `(prefix, module)` (the prefix is not built for native
    /// children when only modules are wanted), or a pair yielded by an
    /// overriding `named_modules`, as it yielded it.
    pub(super) fn step_pair<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Yielded<'py>>> {
        if self.replay.is_some() {
            match self.replay_step(py) {
                Replayed::Pair(p, m) => return Ok(Some(Yielded::Pair(p, m))),
                Replayed::Done => return Ok(None),
                Replayed::Live => {}
            }
        }
        let g = require(py)?;
        loop {
            let depth = self.stack.len() as u32;
            let Some(top) = self.stack.last_mut() else {
                if let Some(rec) = self.rec.take() {
                    rec.finish(py);
                }
                return Ok(None);
            };
            match &mut top.state {
                State::Entry => {
                    let module = top.module.bind(py).clone();
                    let node = top.node;
                    let seen = self.memo.seen_or_add(&module, self.rd)?;
                    if let Some(rec) = self.rec.as_mut() {
                        if !self.memo.is_identity() {
                            rec.ok = false;
                        } else if seen && node != NO_NODE {
                            rec.plan.nodes[node as usize].kind = NodeKind::Dup;
                        }
                    }
                    if seen {
                        self.stack.pop();
                        continue;
                    }
                    let prefix = top.prefix.bind(py).clone();
                    top.state = State::Resume;
                    return Ok(Some(Yielded::Pair(prefix, module)));
                }
                State::Resume => {
                    let module = top.module.bind(py).clone();
                    let items = Items::of(&module, intern!(py, "_modules"))?;
                    if let Some(rec) = self.rec.as_mut() {
                        match (items.dict_state(), top.node) {
                            (Some((d, _, _)), node) if node != NO_NODE => {
                                let n = &mut rec.plan.nodes[node as usize];
                                // Code ran while the module was yielded: the
                                // registry is kept only if it came from the
                                // instance dict the node recorded, unchanged
                                // (which then holds it while a replay finds
                                // that dict unchanged).
                                // A plan keeps all three registries (what
                                // every plan of the tree checks), read now.
                                let checked = unsafe {
                                    if module_walks::holds(&n.seen, module.as_ptr()) {
                                        Checked::read_seen(g, module.as_ptr(), n.seen)
                                    } else {
                                        None
                                    }
                                };
                                match checked {
                                    Some(c) if c.regs[MODS].0 == d => n.regs = c.regs,
                                    _ => rec.ok = false,
                                }
                            }
                            _ => rec.ok = false,
                        }
                    }
                    top.state = State::Items(items);
                }
                State::Items(it) => {
                    let Some((name, child)) = it.next(py)? else {
                        self.stack.pop();
                        continue;
                    };
                    let ppos = it.dict_state().map_or(0, |s| s.1);
                    if child.is_none() {
                        if let Some(rec) = self.rec.as_mut() {
                            rec.plan.nodes.push(Node {
                                kind: NodeKind::Empty,
                                module: std::ptr::null_mut(),
                                depth,
                                ppos,
                                seen: crate::cpython::validity::Key::EMPTY,
                                prefix: None,
                                regs: NO_REGS,
                                reg: Reg::NONE,
                                items: (0, 0),
                            });
                        }
                        continue;
                    }
                    let native = is_native(g, &child, Method::NamedModules);
                    if !native && self.stack.iter().any(|f| f.name.is_some()) {
                        // An override receives its real prefix (torch's
                        // recursion builds every one): join the skipped ones.
                        exact_prefixes(py, &mut self.stack)?;
                    }
                    let Some(top) = self.stack.last_mut() else {
                        continue;
                    };
                    let prefix = top.prefix.bind(py).clone();
                    // Names are only observable through named_modules (or a
                    // delegate) or when building them could fail. A recording
                    // walk builds them all: its plan may be handed back to a
                    // live walk that meets an override.
                    let skip = native && self.values && self.rec.is_none();
                    let joined = if skip {
                        None
                    } else {
                        dotted_join(py, &mut top.dotted, &prefix, &name)
                    };
                    let (sub, skipped) = match joined {
                        Some(s) => (s?, false),
                        None => match join(&prefix, &name, skip)? {
                            Some(s) => (s, false),
                            None => (prefix.clone(), true),
                        },
                    };
                    if depth as i64 >= unsafe { capi::Py_GetRecursionLimit() } as i64 {
                        // torch's nested generators would exceed the limit here.
                        return Err(pyo3::exceptions::PyRecursionError::new_err(
                            "maximum recursion depth exceeded",
                        ));
                    }
                    let mut node = NO_NODE;
                    if let Some(rec) = self.rec.as_mut() {
                        let pure = unsafe {
                            capi::PyUnicode_CheckExact(prefix.as_ptr()) != 0
                                && capi::PyUnicode_CheckExact(name.as_ptr()) != 0
                        };
                        match unsafe { module_walks::seen_now(child.as_ptr()) } {
                            Some(seen) if native && pure => {
                                node = rec.plan.nodes.len() as u32;
                                rec.plan.nodes.push(Node {
                                    kind: NodeKind::Live,
                                    module: child.as_ptr(),
                                    depth,
                                    ppos,
                                    seen,
                                    prefix: Some(sub.clone().unbind()),
                                    regs: NO_REGS,
                                    reg: Reg::NONE,
                                    items: (0, 0),
                                });
                            }
                            _ => rec.ok = false,
                        }
                    }
                    let state = if native {
                        State::Entry
                    } else {
                        // The override receives the very memo: a real set.
                        let memo = self.memo.as_set(py)?;
                        let r = call_method(
                            &child,
                            Method::NamedModules,
                            (memo, &sub, self.remove_duplicate.bind(py)),
                        )?;
                        State::Delegate(r.try_iter()?.unbind())
                    };
                    self.stack.push(Frame {
                        module: child.unbind(),
                        prefix: sub.unbind(),
                        name: skipped.then(|| name.unbind()),
                        dotted: None,
                        state,
                        node,
                    });
                }
                State::Delegate(it) => {
                    let mut it = it.bind(py).clone();
                    match it.next() {
                        Some(v) => return Ok(Some(Yielded::Item(v?))),
                        None => {
                            if let Some(e) = PyErr::take(py) {
                                return Err(e);
                            }
                            self.stack.pop();
                        }
                    }
                }
            }
        }
    }
}

#[pymethods]
impl NamedModules {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let r = self.step(py);
        if r.is_err() {
            // Like a generator that raised: finished from now on.
            self.stack.clear();
            self.replay = None;
            self.rec = None;
        }
        r
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.traverse_inner(&visit)
    }

    fn __clear__(&mut self) {
        self.stack.clear();
        self.memo.clear();
        self.replay = None;
        self.rec = None;
    }
}

impl NamedModules {
    pub(super) fn traverse_inner(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.memo.traverse(visit)?;
        visit.call(&self.remove_duplicate)?;
        for f in &self.stack {
            visit.call(&f.module)?;
            visit.call(&f.prefix)?;
            if let Some(d) = &f.dotted {
                visit.call(d)?;
            }
            match &f.state {
                State::Entry | State::Resume => {}
                State::Items(i) => i.traverse(visit)?,
                State::Delegate(i) => visit.call(i)?,
            }
        }
        if let Some(r) = &self.replay {
            visit.call(&r.root)?;
            for o in &r.held {
                visit.call(o)?;
            }
            for s in &r.shadow {
                visit.call(&s.dict)?;
            }
        }
        Ok(())
    }
}
