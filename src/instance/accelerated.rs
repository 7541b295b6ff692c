//! Classes accelerated in place by `fastmodule.accelerate` / `install`: their
//! instances take the native paths exactly as instances of
//! `fastmodule.Module` subclasses do, while the class object itself (its
//! name, its dict, `type(m) is nn.Linear`) stays what it was.
//!
//! The set is read on hot paths and written rarely: readers load an
//! immutable snapshot through an atomic pointer; a writer publishes a new
//! snapshot and frees the old one. Readers and writers all hold the GIL and a
//! lookup never releases it, so no reader can be inside a snapshot being
//! freed.
//!
//! The set holds each class *weakly*, as a stock process would (nothing
//! keeps a class alive: `torch.fx` makes a class per `GraphModule`,
//! parametrization one per parametrized module). The weak reference's
//! callback removes the class's address from the set; CPython runs it before
//! the class's memory is freed (on a refcount drop as in a cyclic collection,
//! where our weak reference, held from here, is never part of the garbage), so
//! the set never names a dead class and a class later allocated at the same
//! address is not accelerated by accident.
use pyo3::prelude::*;
use pyo3::types::{PyType, PyWeakrefReference};
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use crate::cpython::capi;
use crate::instance::registries::AddressHasher;

type Set = HashSet<usize, BuildHasherDefault<AddressHasher>>;

static SNAPSHOT: AtomicPtr<Set> = AtomicPtr::new(std::ptr::null_mut());

/// The classes in the set (class address -> weak reference, and back), and
/// the published snapshot.
struct Registry {
    classes: HashMap<usize, Py<PyWeakrefReference>>,
    by_ref: HashMap<usize, usize>,
    current: Option<Box<Set>>,
}
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        classes: HashMap::new(),
        by_ref: HashMap::new(),
        current: None,
    })
});

/// Is `tp` accelerated?
#[inline(always)]
pub fn contains(tp: *mut capi::PyTypeObject) -> bool {
    let p = SNAPSHOT.load(Ordering::Acquire);
    // SAFETY: the snapshot is freed only by a writer holding the GIL, which
    // the caller holds too (see the module documentation).
    !p.is_null() && unsafe { (*p).contains(&(tp as usize)) }
}

/// Is any class accelerated now?
pub fn any() -> bool {
    let p = SNAPSHOT.load(Ordering::Acquire);
    // SAFETY: as in `contains`.
    !p.is_null() && unsafe { !(*p).is_empty() }
}

fn publish(registry: &mut Registry) {
    let mut b = Box::new(registry.classes.keys().copied().collect::<Set>());
    let p: *mut Set = &mut *b;
    SNAPSHOT.store(p, Ordering::Release);
    registry.current = Some(b);
}

/// The registry, locked. Nothing that can run Python code (allocating a
/// weak reference may collect garbage, whose callbacks lock this too) runs
/// while it is held.
fn lock() -> PyResult<std::sync::MutexGuard<'static, Registry>> {
    REGISTRY
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("fastmodule: registry poisoned"))
}

/// The weak references' callback: `cls` is being freed.
#[pyfunction]
fn accelerated_class_freed(weak: &Bound<'_, PyAny>) {
    let removed = match lock() {
        Ok(mut registry) => match registry.by_ref.remove(&(weak.as_ptr() as usize)) {
            Some(tp) => {
                let r = registry.classes.remove(&tp);
                publish(&mut registry);
                r
            }
            None => None,
        },
        Err(_) => None,
    };
    // Released outside the lock; the caller holds `weak` until we return.
    drop(removed);
    // The prefix flag may turn off. A failure leaves it on, which only costs
    // stock modules the (eager) route check; a callback must not raise.
    let _ = note_accelerated(weak.py(), any());
}

static CALLBACK: OnceLock<Py<PyAny>> = OnceLock::new();

fn callback(py: Python<'_>) -> PyResult<&'static Py<PyAny>> {
    if let Some(c) = CALLBACK.get() {
        return Ok(c);
    }
    let f = wrap_pyfunction!(accelerated_class_freed, py)?
        .into_any()
        .unbind();
    Ok(CALLBACK.get_or_init(|| f))
}

pub fn add(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let py = cls.py();
    let tp = cls.as_ptr() as usize;
    if lock()?.classes.contains_key(&tp) {
        return Ok(());
    }
    // Made without the lock (see `lock`).
    let weak = PyWeakrefReference::new_with(cls.as_any(), callback(py)?.bind(py))?.unbind();
    let unused = {
        let mut guard = lock()?;
        let registry = &mut *guard;
        if let std::collections::hash_map::Entry::Vacant(e) = registry.classes.entry(tp) {
            registry.by_ref.insert(weak.as_ptr() as usize, tp);
            e.insert(weak);
            publish(registry);
            None
        } else {
            Some(weak)
        }
    };
    drop(unused);
    note_accelerated(py, true)
}

pub fn remove(cls: &Bound<'_, PyType>) -> PyResult<bool> {
    let tp = cls.as_ptr() as usize;
    let released = {
        let mut registry = lock()?;
        let Some(r) = registry.classes.remove(&tp) else {
            return Ok(false);
        };
        registry.by_ref.remove(&(r.as_ptr() as usize));
        publish(&mut registry);
        r
    };
    // Outside the lock (see `lock`).
    drop(released);
    note_accelerated(cls.py(), any())?;
    Ok(true)
}

/// Where `fastmodule._verified.inline_routes` keeps its flag "is any class accelerated
/// in place now?" (torch's module namespace), and the flag's name.
static FLAG: std::sync::OnceLock<(Py<pyo3::types::PyDict>, Py<pyo3::types::PyString>)> =
    OnceLock::new();

/// Keep `namespace[flag]` equal to "some class is accelerated in place" from
/// now on (`fastmodule._verified.inline_routes`' flag; the first call decides).
pub fn keep_flag(
    namespace: &Bound<'_, pyo3::types::PyDict>,
    flag: &Bound<'_, pyo3::types::PyString>,
) {
    let _ = FLAG.set((namespace.clone().unbind(), flag.clone().unbind()));
}

/// Record whether any class is accelerated in place (see
/// `crate::routes::whole_tree::install_check`).
pub fn note_accelerated(py: Python<'_>, any: bool) -> PyResult<()> {
    if let Some((namespace, flag)) = FLAG.get() {
        let namespace = namespace.bind(py);
        let value = pyo3::types::PyBool::new(py, any);
        let same = namespace.get_item(flag)?.is_some_and(|v| v.is(&*value));
        if !same {
            namespace.set_item(flag, value)?;
        }
    }
    Ok(())
}
