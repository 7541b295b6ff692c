//! Tree walks: `named_modules`, `named_children`, `_named_members`
//! (`named_parameters`, `named_buffers`) as lazy native iterators, and the
//! eager walks built on them (`train`, `requires_grad_`, `zero_grad`,
//! `apply`).
//!
//! Each walk mirrors torch's Python code step by step, including its dynamic
//! dispatch: at every module, a method is run natively only while that
//! module's class resolves it to torch's original (or to fastmodule's wrapper
//! of it, with torch's entry unpatched) and no instance attribute shadows it;
//! otherwise the module's own method is called, exactly where torch would call
//! it. Iterators keep an explicit stack (no native recursion), so laziness,
//! mutation during iteration and exceptions behave as in the generators they
//! replace. Eager walks recurse through `Py_EnterRecursiveCall`, so a
//! pathologically deep tree raises RecursionError as in stock instead of
//! overflowing the native stack.
use crate::cpython::recursion::{Depth, Recursion};
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::instance_dict;
use crate::instance::dispatch::{call_method, is_native, Method};
use crate::instance::registries::{identity_hashed, join, Items, Memo};
use crate::plans::module_walks::{self, Item, ItemKind, Node, NodeKind, Plan, Recorder, Reg};
use crate::torch_api::originals::{require, Globals};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyIterator, PyString};
use pyo3::{PyTraverseError, PyVisit};
use std::sync::Arc;

/// `(name, value)`, or just `value` for the value-only variants.
fn pair<'py>(
    py: Python<'py>,
    values: bool,
    name: Bound<'py, PyAny>,
    value: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if values {
        Ok(value)
    } else {
        two(py, name, value)
    }
}

/// The 2-tuple `(a, b)`, built directly (the walks build one per item).
#[inline(always)]
fn two<'py>(
    py: Python<'py>,
    a: Bound<'py, PyAny>,
    b: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    unsafe {
        let t = Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(2))?;
        ffi::PyTuple_SET_ITEM(t.as_ptr(), 0, a.into_ptr());
        ffi::PyTuple_SET_ITEM(t.as_ptr(), 1, b.into_ptr());
        Ok(t)
    }
}

/// `prefix + "." + name` with one concatenation per child, for a non-empty
/// exact-str prefix and an exact-str name (`dotted` caches `prefix + "."`);
/// None where `join`'s general rules apply.
fn dotted_join<'py>(
    py: Python<'py>,
    dotted: &mut Option<Py<PyAny>>,
    prefix: &Bound<'py, PyAny>,
    name: &Bound<'py, PyAny>,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    unsafe {
        if ffi::PyUnicode_CheckExact(prefix.as_ptr()) == 0
            || ffi::PyUnicode_CheckExact(name.as_ptr()) == 0
            || ffi::PyUnicode_GET_LENGTH(prefix.as_ptr()) == 0
        {
            return None;
        }
        if let Some(j) = crate::instance::qualified_names::cached(
            crate::instance::qualified_names::Kind::Dotted,
            prefix.as_ptr(),
            name.as_ptr(),
        ) {
            return Some(Ok(Bound::from_owned_ptr(py, j)));
        }
        if dotted.is_none() {
            let d = ffi::PyUnicode_Concat(prefix.as_ptr(), intern!(py, ".").as_ptr());
            match Bound::from_owned_ptr_or_err(py, d) {
                Ok(d) => *dotted = Some(d.unbind()),
                Err(e) => return Some(Err(e)),
            }
        }
        let d = dotted.as_ref()?.as_ptr();
        let j = ffi::PyUnicode_Concat(d, name.as_ptr());
        if !j.is_null() {
            crate::instance::qualified_names::store(
                crate::instance::qualified_names::Kind::Dotted,
                prefix.as_ptr(),
                name.as_ptr(),
                j,
            );
        }
        Some(Bound::from_owned_ptr_or_err(py, j))
    }
}

/// What one step of the `named_modules` walk produced.
enum Yielded<'py> {
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
    prefix: Py<PyAny>,
    /// `prefix + "."`, built for the first child that needs it.
    dotted: Option<Py<PyAny>>,
    state: State,
    /// The frame's node in the plan being recorded.
    node: u32,
}

/// A frame a replay has open: its node and `_modules`' iteration.
struct Shadow {
    node: u32,
    dict: Py<PyAny>,
    pos: ffi::Py_ssize_t,
    left: ffi::Py_ssize_t,
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
struct Replay {
    plan: Arc<Plan>,
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
    replay: Option<Box<Replay>>,
    rec: Option<Box<Recorder>>,
}

const NO_NODE: u32 = u32::MAX;

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
        let exact = unsafe { ffi::PyUnicode_CheckExact(prefix.as_ptr()) != 0 };
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
                    mods: Reg::NONE,
                    reg: Reg::NONE,
                    items: (0, 0),
                });
                walker.rec = Some(Box::new(rec));
            }
        }
        Ok(walker)
    }

    /// The plan node of the pair just yielded, while replaying.
    fn replay_node(&self) -> Option<(*const Plan, u32)> {
        match &self.replay {
            Some(r) => match r.phase {
                Phase::After(j) => Some((Arc::as_ptr(&r.plan), j)),
                _ => None,
            },
            None => None,
        }
    }

    /// The plan node of the top frame, while recording.
    fn recording_node(&self) -> Option<u32> {
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
                        let root = &plan.nodes[0];
                        let m = r.root.bind(py).clone();
                        if !identity_hashed(m.as_ptr()) {
                            break;
                        }
                        r.held.push(m.clone().unbind());
                        r.phase = Phase::After(0);
                        let prefix = match &root.prefix {
                            Some(p) => p.bind(py).clone(),
                            None => break,
                        };
                        return Replayed::Pair(prefix, m);
                    }
                    Phase::After(j) => {
                        let n = &plan.nodes[j as usize];
                        if n.mods.dict.is_null()
                            || !module_walks::holds(&n.seen, n.module)
                            || !n.mods.unchanged()
                        {
                            break;
                        }
                        r.phase = Phase::Items;
                        if n.mods.used == 0 {
                            // The live walker would open it and close it in
                            // this same step: nothing to keep open.
                            continue;
                        }
                        r.shadow.push(Shadow {
                            node: j,
                            dict: Bound::from_borrowed_ptr(py, n.mods.dict).unbind(),
                            pos: 0,
                            left: n.mods.used,
                        });
                    }
                    Phase::Items => {
                        let depth = r.shadow.len();
                        let Some(top) = r.shadow.last_mut() else {
                            self.replay = None;
                            return Replayed::Done;
                        };
                        let tn = &plan.nodes[top.node as usize];
                        if !tn.mods.unchanged() {
                            break;
                        }
                        let i = r.next;
                        match plan.nodes.get(i) {
                            Some(n) if n.depth == tn.depth + 1 => {
                                if n.kind == NodeKind::Empty {
                                    top.pos = n.ppos;
                                    top.left -= 1;
                                    r.next += 1;
                                    continue;
                                }
                                if !module_walks::holds(&n.seen, n.module)
                                    || depth as i64 >= ffi::Py_GetRecursionLimit() as i64
                                    || !identity_hashed(n.module)
                                {
                                    break;
                                }
                                top.pos = n.ppos;
                                top.left -= 1;
                                r.next += 1;
                                if n.kind == NodeKind::Dup {
                                    continue;
                                }
                                let m = Bound::from_borrowed_ptr(py, n.module);
                                r.held.push(m.clone().unbind());
                                r.phase = Phase::After(i as u32);
                                let prefix = match &n.prefix {
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
            let n = &plan.nodes[s.node as usize];
            let Some(prefix) = &n.prefix else { continue };
            stack.push(Frame {
                module: unsafe { Bound::from_borrowed_ptr(py, n.module) }.unbind(),
                prefix: prefix.clone_ref(py),
                dotted: None,
                state: State::Items(Items::resume(s.dict, s.pos, n.mods.used, s.left)),
                node: NO_NODE,
            });
        }
        let top = match r.phase {
            Phase::Start => Some((0, State::Entry)),
            Phase::After(j) => Some((j, State::Resume)),
            Phase::Items => None,
        };
        if let Some((j, state)) = top {
            let n = &plan.nodes[j as usize];
            if let Some(prefix) = &n.prefix {
                stack.push(Frame {
                    module: unsafe { Bound::from_borrowed_ptr(py, n.module) }.unbind(),
                    prefix: prefix.clone_ref(py),
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
    fn step_pair<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Yielded<'py>>> {
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
                    rec.finish();
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
                            (Some((d, _, used)), node) if node != NO_NODE => {
                                let n = &mut rec.plan.nodes[node as usize];
                                // Code ran while the module was yielded: the
                                // registry is kept only if it came from the
                                // instance dict the node recorded, unchanged
                                // (which then holds it while a replay finds
                                // that dict unchanged).
                                if unsafe { module_walks::holds(&n.seen, module.as_ptr()) } {
                                    n.mods = Reg {
                                        dict: d,
                                        version: unsafe {
                                            crate::cpython::validity::dict_version(d)
                                        },
                                        used,
                                    };
                                } else {
                                    rec.ok = false;
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
                                mods: Reg::NONE,
                                reg: Reg::NONE,
                                items: (0, 0),
                            });
                        }
                        continue;
                    }
                    let prefix = top.prefix.bind(py).clone();
                    let native = is_native(g, &child, Method::NamedModules);
                    // Names are only observable through named_modules (or a
                    // delegate) or when building them could fail.
                    let skip = native && self.values;
                    let joined = if skip {
                        None
                    } else {
                        dotted_join(py, &mut top.dotted, &prefix, &name)
                    };
                    let sub = match joined {
                        Some(s) => s?,
                        None => match join(&prefix, &name, skip)? {
                            Some(s) => s,
                            None => prefix.clone(),
                        },
                    };
                    if depth as i64 >= unsafe { ffi::Py_GetRecursionLimit() } as i64 {
                        // torch's nested generators would exceed the limit here.
                        return Err(pyo3::exceptions::PyRecursionError::new_err(
                            "maximum recursion depth exceeded",
                        ));
                    }
                    let mut node = NO_NODE;
                    if let Some(rec) = self.rec.as_mut() {
                        let pure = unsafe {
                            ffi::PyUnicode_CheckExact(prefix.as_ptr()) != 0
                                && ffi::PyUnicode_CheckExact(name.as_ptr()) != 0
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
                                    mods: Reg::NONE,
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
    fn traverse_inner(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
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

/// Where `_named_members` takes its modules from.
enum Source {
    Native(Box<NamedModules>),
    Python(Py<PyIterator>),
    /// `recurse=False`: `[(prefix, self)]`, not yet consumed.
    Single(Option<(Py<PyAny>, Py<PyAny>)>),
}

/// The module `_named_members` is walking: its prefix, `prefix + "."` once
/// `dotted_join` has built it, its registry's items, and its node in the plan
/// being recorded.
type Current = (Py<PyAny>, Option<Py<PyAny>>, Items, u32);

/// The member side of a replay: the node whose registry is being replayed.
struct MemberCursor {
    node: u32,
    dict: Py<PyAny>,
    pos: ffi::Py_ssize_t,
    left: ffi::Py_ssize_t,
    /// The next entry in `Plan::items`.
    k: u32,
}

struct MemberReplay {
    plan: Arc<Plan>,
    cur: Option<MemberCursor>,
    /// The member memo's objects, in order.
    held: Vec<Py<PyAny>>,
}

/// Native `_named_members(lambda m: m.<registry>.items(), prefix, recurse, remove_duplicate)`.
#[pyclass(module = "fastmodule._core")]
pub struct NamedMembers {
    values: bool,
    source: Source,
    registry: &'static str,
    current: Option<Current>,
    memo: Memo,
    rd: bool,
    done: bool,
    replay: Option<Box<MemberReplay>>,
}

impl NamedMembers {
    pub fn new<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        registry: &'static str,
        prefix: &Bound<'py, PyAny>,
        recurse: bool,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Self> {
        let g = require(py)?;
        let mut replay = None;
        let source = if !recurse {
            Source::Single(Some((prefix.clone().unbind(), module.clone().unbind())))
        } else if is_native(g, module, Method::NamedModules) {
            // Names are built only where the members' names need them.
            let kind = if registry == "_parameters" { 1 } else { 2 };
            let n = NamedModules::new(py, module, None, prefix, remove_duplicate, values, kind)?;
            if let Some(r) = &n.replay {
                replay = Some(Box::new(MemberReplay {
                    plan: r.plan.clone(),
                    cur: None,
                    held: Vec::with_capacity(r.plan.items.len()),
                }));
            }
            Source::Native(Box::new(n))
        } else {
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "prefix"), prefix)?;
            kw.set_item(intern!(py, "remove_duplicate"), remove_duplicate)?;
            Source::Python(
                module
                    .call_method(intern!(py, "named_modules"), (), Some(&kw))?
                    .try_iter()?
                    .unbind(),
            )
        };
        Ok(NamedMembers {
            values,
            source,
            registry,
            current: None,
            memo: Memo::for_tree(),
            rd: remove_duplicate.is_truthy()?,
            done: false,
            replay,
        })
    }

    fn next_module<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        let pair = match &mut self.source {
            Source::Single(s) => {
                return Ok(s.take().map(|(p, m)| (p.into_bound(py), m.into_bound(py))))
            }
            Source::Native(n) => match n.step_pair(py)? {
                None => None,
                Some(Yielded::Pair(prefix, module)) => return Ok(Some((prefix, module))),
                Some(Yielded::Item(v)) => Some(v),
            },
            Source::Python(it) => match it.bind(py).clone().next() {
                Some(v) => Some(v?),
                None => {
                    if let Some(e) = PyErr::take(py) {
                        return Err(e);
                    }
                    None
                }
            },
        };
        match pair {
            Some(p) => Ok(Some(p.extract()?)),
            None => Ok(None),
        }
    }

    fn registry_name<'py>(&self, py: Python<'py>) -> &Bound<'py, PyString> {
        if self.registry == "_parameters" {
            intern!(py, "_parameters")
        } else {
            intern!(py, "_buffers")
        }
    }

    /// Hand the member side over to the live walker, in the replay's state.
    fn materialize(&mut self, py: Python<'_>) {
        let Some(r) = self.replay.take() else { return };
        let r = *r;
        module_walks::forget(&r.plan);
        if let Some(c) = r.cur {
            let n = &r.plan.nodes[c.node as usize];
            if let Some(prefix) = &n.prefix {
                self.current = Some((
                    prefix.clone_ref(py),
                    None,
                    Items::resume(c.dict, c.pos, n.reg.used, c.left),
                    NO_NODE,
                ));
            }
        }
        self.memo = if self.rd {
            Memo::from_held(r.held)
        } else {
            Memo::for_tree()
        };
    }

    /// One replay step: `Ok(item or end)`, or `Err` once handed over to the
    /// live walker (with the next module's pair if one was taken).
    #[allow(clippy::type_complexity)]
    fn replay_step<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Result<Option<Bound<'py, PyAny>>, Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>>>
    {
        loop {
            let Some(r) = self.replay.as_deref_mut() else {
                return Ok(Err(None));
            };
            // SAFETY: the plan outlives every use below (`materialize`, which
            // drops this replay's reference, comes last).
            let plan: &Plan = unsafe { &*Arc::as_ptr(&r.plan) };
            if let Some(c) = r.cur.as_mut() {
                let n = &plan.nodes[c.node as usize];
                let mut out = None;
                let mut hand_over = false;
                let mut exhausted = false;
                unsafe {
                    if !n.reg.unchanged() {
                        hand_over = true;
                    } else if c.k < n.items.1 {
                        let it = &plan.items[c.k as usize];
                        if it.kind != ItemKind::Empty
                            && (!identity_hashed(it.value)
                                || (it.kind == ItemKind::Live && !self.values && it.name.is_none()))
                        {
                            hand_over = true;
                        } else {
                            c.pos = it.pos;
                            c.left -= 1;
                            c.k += 1;
                            if it.kind == ItemKind::Live {
                                let v = Bound::from_borrowed_ptr(py, it.value);
                                if self.rd {
                                    r.held.push(v.clone().unbind());
                                }
                                out = Some(match (&it.name, self.values) {
                                    (Some(name), false) => two(py, name.bind(py).clone(), v)?,
                                    _ => v,
                                });
                            }
                        }
                    } else {
                        exhausted = true;
                    }
                }
                if hand_over {
                    self.materialize(py);
                    return Ok(Err(None));
                }
                if let Some(o) = out {
                    return Ok(Ok(Some(o)));
                }
                if exhausted {
                    r.cur = None;
                } else {
                    continue;
                }
            }
            // The next module, from the (possibly replaying) module walk.
            let Some((prefix, module)) = self.next_module(py)? else {
                return Ok(Ok(None));
            };
            let node = match &self.source {
                Source::Native(n) => n.replay_node(),
                _ => None,
            };
            let Some(r) = self.replay.as_deref_mut() else {
                return Ok(Err(Some((prefix, module))));
            };
            if let Some((p, j)) = node {
                if std::ptr::eq(p, Arc::as_ptr(&r.plan)) {
                    let n = &r.plan.nodes[j as usize];
                    unsafe {
                        if !n.reg.dict.is_null()
                            && module_walks::holds(&n.seen, n.module)
                            && n.reg.unchanged()
                        {
                            if n.reg.used == 0 {
                                // Opened and found empty within this step.
                                continue;
                            }
                            let dict = Bound::from_borrowed_ptr(py, n.reg.dict).unbind();
                            let (used, k) = (n.reg.used, n.items.0);
                            r.cur = Some(MemberCursor {
                                node: j,
                                dict,
                                pos: 0,
                                left: used,
                                k,
                            });
                            continue;
                        }
                    }
                }
            }
            self.materialize(py);
            return Ok(Err(Some((prefix, module))));
        }
    }

    /// Start walking `module`'s registry (recording it where the module walk records).
    fn open<'py>(
        &mut self,
        py: Python<'py>,
        prefix: Bound<'py, PyAny>,
        module: Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let reg = self.registry_name(py).clone();
        let it = Items::of(&module, &reg)?;
        let mut node = NO_NODE;
        let recording = match &self.source {
            Source::Native(n) => n.recording_node(),
            _ => None,
        };
        if let (Some(j), Some(rec)) = (recording, recorder(&mut self.source)) {
            match it.dict_state() {
                // As for `_modules` (NamedModules' `State::Resume`): only
                // from the node's own unchanged instance dict.
                Some((d, _, used))
                    if unsafe {
                        module_walks::holds(&rec.plan.nodes[j as usize].seen, module.as_ptr())
                    } =>
                {
                    let start = rec.plan.items.len() as u32;
                    let n = &mut rec.plan.nodes[j as usize];
                    n.reg = Reg {
                        dict: d,
                        version: unsafe { crate::cpython::validity::dict_version(d) },
                        used,
                    };
                    n.items = (start, start);
                    node = j;
                }
                _ => rec.ok = false,
            }
        }
        self.current = Some((prefix.unbind(), None, it, node));
        Ok(())
    }

    pub fn step<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.replay.is_some() {
            match self.replay_step(py)? {
                Ok(v) => return Ok(v),
                Err(Some((prefix, module))) => self.open(py, prefix, module)?,
                Err(None) => {}
            }
        }
        loop {
            let Some((prefix, dotted, it, node)) = &mut self.current else {
                match self.next_module(py)? {
                    Some((prefix, module)) => {
                        self.open(py, prefix, module)?;
                        continue;
                    }
                    None => return Ok(None),
                }
            };
            let node = *node;
            let Some((k, v)) = it.next(py)? else {
                self.current = None;
                continue;
            };
            let pos = it.dict_state().map_or(0, |s| s.1);
            let empty = v.is_none();
            let dup = !empty && self.memo.seen_or_add(&v, self.rd)?;
            let mut name = None;
            let out = if empty || dup {
                None
            } else if self.values {
                // torch builds the name and drops it: only code can see that.
                join(prefix.bind(py), &k, true)?;
                Some(v.clone())
            } else {
                let joined = match dotted_join(py, dotted, prefix.bind(py), &k) {
                    Some(n) => Some(n?),
                    None => join(prefix.bind(py), &k, false)?,
                };
                match joined {
                    Some(n) => {
                        name = Some(n.clone().unbind());
                        Some(two(py, n, v.clone())?)
                    }
                    None => Some(v.clone()),
                }
            };
            if node != NO_NODE {
                let pure = unsafe {
                    ffi::PyUnicode_CheckExact(prefix.as_ptr()) != 0
                        && ffi::PyUnicode_CheckExact(k.as_ptr()) != 0
                };
                let identity = self.memo.is_identity();
                if let Some(rec) = recorder(&mut self.source) {
                    if pure && identity {
                        rec.plan.items.push(Item {
                            kind: if empty {
                                ItemKind::Empty
                            } else if dup {
                                ItemKind::Dup
                            } else {
                                ItemKind::Live
                            },
                            value: if empty {
                                std::ptr::null_mut()
                            } else {
                                v.as_ptr()
                            },
                            pos,
                            name,
                        });
                        let end = rec.plan.items.len() as u32;
                        rec.plan.nodes[node as usize].items.1 = end;
                    } else {
                        rec.ok = false;
                    }
                }
            }
            if let Some(o) = out {
                return Ok(Some(o));
            }
        }
    }
}

/// The recorder of a native module walk, while it records.
fn recorder(source: &mut Source) -> Option<&mut Recorder> {
    match source {
        Source::Native(n) => n.rec.as_deref_mut().filter(|r| r.ok),
        _ => None,
    }
}

#[pymethods]
impl NamedMembers {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.done {
            return Ok(None);
        }
        let r = self.step(py);
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
            self.current = None;
            self.replay = None;
            if r.is_err() {
                if let Source::Native(n) = &mut self.source {
                    n.rec = None;
                }
            }
        }
        r
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.memo.traverse(&visit)?;
        match &self.source {
            Source::Native(n) => n.traverse_inner(&visit)?,
            Source::Python(i) => visit.call(i)?,
            Source::Single(Some((p, m))) => {
                visit.call(p)?;
                visit.call(m)?;
            }
            Source::Single(None) => {}
        }
        if let Some((p, d, i, _)) = &self.current {
            visit.call(p)?;
            if let Some(d) = d {
                visit.call(d)?;
            }
            i.traverse(&visit)?;
        }
        if let Some(r) = &self.replay {
            for o in &r.held {
                visit.call(o)?;
            }
            if let Some(c) = &r.cur {
                visit.call(&c.dict)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.current = None;
        self.source = Source::Single(None);
        self.memo.clear();
        self.replay = None;
    }
}

/// Native `named_children()` generator.
#[pyclass(module = "fastmodule._core")]
pub struct NamedChildren {
    values: bool,
    items: Option<Items>,
    module: Option<Py<PyAny>>,
    memo: Memo,
}

impl NamedChildren {
    pub fn new(module: &Bound<'_, PyAny>, values: bool) -> PyResult<Self> {
        Ok(NamedChildren {
            values,
            items: None,
            module: Some(module.clone().unbind()),
            memo: Memo::new(),
        })
    }

    pub fn step<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some(m) = self.module.take() {
            // The generator body starts on the first next(): read _modules now.
            self.items = Some(Items::of(m.bind(py), intern!(py, "_modules"))?);
        }
        let Some(it) = &mut self.items else {
            return Ok(None);
        };
        while let Some((name, child)) = it.next(py)? {
            if child.is_none() || self.memo.seen_or_add(&child, true)? {
                continue;
            }
            return Ok(Some(pair(py, self.values, name, child)?));
        }
        Ok(None)
    }
}

#[pymethods]
impl NamedChildren {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let r = self.step(py);
        if !matches!(r, Ok(Some(_))) {
            self.items = None;
            self.module = None;
        }
        r
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.memo.traverse(&visit)?;
        if let Some(i) = &self.items {
            i.traverse(&visit)?;
        }
        if let Some(m) = &self.module {
            visit.call(m)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.items = None;
        self.module = None;
        self.memo.clear();
    }
}

/// Yields the second item of each pair of another iterator (`children()`
/// over an overriding `named_children`, and the like).
#[pyclass(module = "fastmodule._core")]
pub struct Values {
    inner: Option<Py<PyIterator>>,
}

#[pymethods]
impl Values {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(it) = &self.inner else {
            return Ok(None);
        };
        let mut it = it.bind(py).clone();
        match it.next() {
            Some(v) => {
                let (_, m): (Bound<'py, PyAny>, Bound<'py, PyAny>) = v?.extract()?;
                Ok(Some(m))
            }
            None => {
                self.inner = None;
                match PyErr::take(py) {
                    Some(e) => Err(e),
                    None => Ok(None),
                }
            }
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(i) = &self.inner {
            visit.call(i)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.inner = None;
    }
}

pub(crate) fn values_of<'py>(
    py: Python<'py>,
    it: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(Bound::new(
        py,
        Values {
            inner: Some(it.try_iter()?.unbind()),
        },
    )?
    .into_any())
}

/// Bodies of torch's methods, each with `self` already dispatched to it.
/// They call other methods of `self` and of children through `dispatch`.
pub mod body {
    use super::*;

    pub fn named_modules<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        memo: Option<Bound<'py, PyAny>>,
        prefix: &Bound<'py, PyAny>,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(
            py,
            NamedModules::new(py, module, memo, prefix, remove_duplicate, values, 0)?,
        )?
        .into_any())
    }

    pub fn named_children<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(py, NamedChildren::new(module, values)?)?.into_any())
    }

    /// `_named_members(lambda m: m.<registry>.items(), prefix, recurse, remove_duplicate)`.
    pub fn named_members<'py>(
        py: Python<'py>,
        module: &Bound<'py, PyAny>,
        registry: &'static str,
        prefix: &Bound<'py, PyAny>,
        recurse: &Bound<'py, PyAny>,
        remove_duplicate: &Bound<'py, PyAny>,
        values: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = recurse.is_truthy()?;
        Ok(Bound::new(
            py,
            NamedMembers::new(py, module, registry, prefix, r, remove_duplicate, values)?,
        )?
        .into_any())
    }
}

/// torch's `children` body: `for _, m in self.named_children(): yield m`.
pub(crate) fn children_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::NamedChildren) {
        return body::named_children(py, module, true);
    }
    values_of(py, call_method(module, Method::NamedChildren, ())?)
}

/// `self.children()` as torch's code calls it.
pub fn children<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::Children) {
        return children_body(py, g, module);
    }
    call_method(module, Method::Children, ())
}

/// `for child in self.children(): f(child)`, without a Python iterator when
/// `children`/`named_children` are torch's.
pub(crate) fn for_each_child<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if is_native(g, module, Method::Children) && is_native(g, module, Method::NamedChildren) {
        let mut nc = NamedChildren::new(module, true)?;
        while let Some(child) = nc.step(py)? {
            f(&child)?;
        }
        return Ok(());
    }
    for child in children(py, g, module)?.try_iter()? {
        f(&child?)?;
    }
    Ok(())
}

/// `for p in self.parameters(): f(p)`, natively when the whole dispatch chain
/// (`parameters` → `named_parameters` → `_named_members`) is torch's. The
/// first `skip` parameters a replay yields are not passed to `f`: the caller
/// knows `f` would do nothing for them (`crate::walk::zero_grad`).
pub(crate) fn for_each_parameter<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mut skip: usize,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if is_native(g, module, Method::Parameters)
        && is_native(g, module, Method::NamedParameters)
        && is_native(g, module, Method::NamedMembers)
    {
        let prefix = PyString::new(py, "");
        let t = PyBool::new(py, true).to_owned().into_any();
        let mut nm = NamedMembers::new(py, module, "_parameters", prefix.as_any(), true, &t, true)?;
        while let Some(p) = nm.step(py)? {
            // Still replaying: nothing ran since the caller's pass.
            if skip > 0 && nm.replay.is_some() {
                skip -= 1;
                continue;
            }
            skip = 0;
            f(&p)?;
        }
        return Ok(());
    }
    for p in parameters(py, g, module)?.try_iter()? {
        f(&p?)?;
    }
    Ok(())
}

/// `self.named_parameters(...)`/`named_buffers(...)` as torch's code calls it.
// The arguments are torch's, plus the walk's context.
#[allow(clippy::too_many_arguments)]
pub(crate) fn named_registry<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    which: Method,
    prefix: &Bound<'py, PyAny>,
    recurse: &Bound<'py, PyAny>,
    remove_duplicate: &Bound<'py, PyAny>,
    values: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let registry = if which == Method::NamedParameters {
        "_parameters"
    } else {
        "_buffers"
    };
    if is_native(g, module, which) && is_native(g, module, Method::NamedMembers) {
        return body::named_members(
            py,
            module,
            registry,
            prefix,
            recurse,
            remove_duplicate,
            values,
        );
    }
    // The caller passes exactly what torch's code passes: `recurse=` only.
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "recurse"), recurse)?;
    let it = module.call_method(which.name(), (), Some(&kw))?;
    if values {
        values_of(py, it)
    } else {
        Ok(it)
    }
}

/// `self.parameters()` as torch's code calls it.
pub fn parameters<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if is_native(g, module, Method::Parameters) {
        // parameters(recurse=True): `for _, p in self.named_parameters(recurse=recurse)`.
        let prefix = PyString::new(py, "");
        let t = PyBool::new(py, true).to_owned().into_any();
        return named_registry(
            py,
            g,
            module,
            Method::NamedParameters,
            prefix.as_any(),
            &t,
            &t,
            true,
        );
    }
    call_method(module, Method::Parameters, ())
}

/// Is the instance dict `dict` quiet, and each registry it holds under
/// `_parameters`, `_buffers`, `_modules` (read without running code)?
unsafe fn quiet_with_registries(g: &Globals, dict: *mut ffi::PyObject) -> bool {
    use crate::cpython::quiet;
    let n = &g.names;
    quiet::dict(dict)
        && [n.parameters, n.buffers, n.modules]
            .into_iter()
            .all(|name| {
                let r = ffi::PyDict_GetItemWithError(dict, name);
                r.is_null() || quiet::dict(r)
            })
}

/// `module.training = mode` as `Module.__setattr__` does it.
fn set_training(
    py: Python<'_>,
    g: &Globals,
    module: &Bound<'_, PyAny>,
    mode: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let name = intern!(py, "training");
    unsafe {
        // torch's __setattr__ body runs natively for any module whose class
        // resolves it to torch's function (a bool is never a Parameter,
        // Module or tensor).
        let tp = ffi::Py_TYPE(module.as_ptr());
        if type_lookup(tp, g.names.dunder_setattr) == g.orig.setattr
            && crate::instance::fast::object_after_nn_module(g, tp)
        {
            let dict = instance_dict(module.as_ptr());
            if !dict.is_null() {
                match crate::instance::walk_facts::set_training(
                    module.as_ptr(),
                    tp,
                    dict,
                    name.as_ptr(),
                    mode.as_ptr(),
                ) {
                    Some(Ok(())) => return Ok(()),
                    Some(Err(())) => return Err(PyErr::fetch(py)),
                    None => {}
                }
            }
            return match crate::registry::register::setattr_native(
                g,
                module.as_ptr(),
                name.as_ptr(),
                mode.as_ptr(),
            ) {
                crate::registry::register::Outcome::Done => {
                    // Remembered only where the lookups remembering makes,
                    // and those the next `set_training` skips (`"training"
                    // in` each registry), run no code: stock makes them all.
                    let dict = instance_dict(module.as_ptr());
                    if !dict.is_null() && quiet_with_registries(g, dict) {
                        crate::instance::walk_facts::note_training(g, tp, dict, name.as_ptr());
                    }
                    Ok(())
                }
                crate::registry::register::Outcome::Error => Err(PyErr::fetch(py)),
                crate::registry::register::Outcome::Stock => module.setattr(name, mode),
            };
        }
    }
    module.setattr(name, mode)
}

/// torch's `train` body for `module`.
fn train_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mode: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Routed)?;
    // bool cannot be subclassed: the exact check is isinstance(mode, bool).
    if !mode.is_exact_instance_of::<PyBool>() {
        return Err(PyValueError::new_err(
            "training mode is expected to be boolean",
        ));
    }
    set_training(py, g, module, mode)?;
    for_each_child(py, g, module, |child| {
        if is_native(g, child, Method::Train) {
            train_body(py, g, child, mode)?;
        } else {
            call_method(child, Method::Train, (mode,))?;
        }
        Ok(())
    })?;
    Ok(module.clone())
}

/// torch's `train` body for a walk's root: from its recorded plan when that
/// still holds, else live (then recorded).
pub(crate) fn train_root<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    mode: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let name = intern!(py, "training");
    if mode.is_exact_instance_of::<PyBool>() {
        if let Some(done) = crate::plans::eager::replay_train(py, name, module, mode) {
            done?;
            return Ok(module.clone());
        }
    }
    let out = train_body(py, g, module, mode)?;
    crate::plans::eager::record(g, crate::plans::parts::Walk::Train, module, Some(mode));
    Ok(out)
}

pub(crate) fn apply_body<'py>(
    py: Python<'py>,
    g: &Globals,
    module: &Bound<'py, PyAny>,
    f: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _depth = Depth::enter(py, Recursion::Python)?;
    for_each_child(py, g, module, |child| {
        if is_native(g, child, Method::Apply) {
            apply_body(py, g, child, f)?;
        } else {
            call_method(child, Method::Apply, (f,))?;
        }
        Ok(())
    })?;
    f.call1((module,))?;
    Ok(module.clone())
}
