//! `_named_members` (`named_parameters`, `named_buffers`, `parameters`,
//! `buffers`) as a lazy native iterator over the modules `named_modules`
//! yields, each registry's `.items()` read as torch's generator reads it;
//! walks of an unchanged tree replay their recorded plan.
use super::named_modules::NamedModules;
use super::named_modules::{Yielded, NO_NODE};
use super::yielded::{dotted_join, two};
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::instance::dispatch::{is_native, Method};
use crate::instance::registries::{identity_hashed, join, Items, Memo};
use crate::plans::module_walks::{self, Item, ItemKind, Plan, Recorder, Reg};
use crate::torch_api::originals::require;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyString};
use pyo3::{PyTraverseError, PyVisit};
use std::sync::Arc;

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
    /// The dict's recorded version (the node's, kept here for the checks
    /// before each entry).
    version: u64,
    pos: capi::Py_ssize_t,
    /// The dict's size when opened.
    used: capi::Py_ssize_t,
    left: capi::Py_ssize_t,
    /// The next entry in `Plan::items`, and the end of the node's.
    k: u32,
    end: u32,
}

pub(super) struct MemberReplay {
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
    pub(super) replay: Option<Box<MemberReplay>>,
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
            if let Some(prefix) = r.plan.prefix(c.node as usize) {
                self.current = Some((
                    prefix.clone_ref(py),
                    None,
                    Items::resume(c.dict, c.pos, c.used, c.left),
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
                let mut out = None;
                let mut hand_over = false;
                let mut exhausted = false;
                unsafe {
                    if crate::cpython::validity::dict_version(c.dict.as_ptr()) != c.version {
                        hand_over = true;
                    } else if c.k < c.end {
                        let k = c.k as usize;
                        let it = &plan.items[k];
                        let name = plan.item_name(k);
                        if it.kind != ItemKind::Empty
                            && (!identity_hashed(it.value)
                                || (it.kind == ItemKind::Live && !self.values && name.is_none()))
                        {
                            hand_over = true;
                        } else {
                            c.pos = it.pos as capi::Py_ssize_t;
                            c.left -= 1;
                            c.k += 1;
                            if it.kind == ItemKind::Live {
                                let v = Bound::from_borrowed_ptr(py, it.value);
                                if self.rd {
                                    r.held.push(v.clone().unbind());
                                }
                                out = Some(match (name, self.values) {
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
                    let plan = &r.plan;
                    let c = plan.checked(&plan.nodes[j as usize]);
                    unsafe {
                        if c.seen_holds() && plan.reg_unchanged(c) {
                            // At its recorded version: its recorded size.
                            let reg = plan.reg(c);
                            let used = crate::cpython::dicts::used(reg);
                            if used == 0 {
                                // Opened and found empty within this step.
                                continue;
                            }
                            let dict = Bound::from_borrowed_ptr(py, reg).unbind();
                            let (k, end) = plan.items_of(j as usize);
                            r.cur = Some(MemberCursor {
                                node: j,
                                dict,
                                version: c.regs[plan.reg_index()].1,
                                pos: 0,
                                used,
                                left: used,
                                k,
                                end,
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
                Some((d, _, _))
                    if unsafe {
                        module_walks::holds(&rec.plan.nodes[j as usize].seen, module.as_ptr())
                    } =>
                {
                    let start = rec.plan.items.len() as u32;
                    let n = &mut rec.plan.nodes[j as usize];
                    n.reg = Reg {
                        dict: d,
                        version: unsafe { crate::cpython::validity::dict_version(d) },
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
                    capi::PyUnicode_CheckExact(prefix.as_ptr()) != 0
                        && capi::PyUnicode_CheckExact(k.as_ptr()) != 0
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
