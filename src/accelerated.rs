//! Classes accelerated in place by `fastmodule.accelerate` / `install`: their
//! instances take the native paths exactly as instances of
//! `fastmodule.Module` subclasses do, while the class object itself (its
//! name, its dict, `type(m) is nn.Linear`) stays what it was.
//!
//! The set is read on hot paths and written rarely: readers load an
//! immutable snapshot through an atomic pointer; a writer publishes a new
//! snapshot and frees the old one. Readers and writers all hold the GIL and a
//! lookup never releases it, so no reader can be inside a snapshot being
//! freed. The set holds a strong reference to each class while it is in the
//! set (so an address in it always names that class), and lets it go when
//! the class is restored.
use pyo3::prelude::*;
use pyo3::types::PyType;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::items::AddressHasher;
use pyo3::ffi;

type Set = HashSet<usize, BuildHasherDefault<AddressHasher>>;

static SNAPSHOT: AtomicPtr<Set> = AtomicPtr::new(std::ptr::null_mut());

/// The classes in the set (strong references), and the published snapshot.
struct Owned {
    classes: HashMap<usize, Py<PyType>>,
    current: Option<Box<Set>>,
}
static OWNED: LazyLock<Mutex<Owned>> = LazyLock::new(|| {
    Mutex::new(Owned {
        classes: HashMap::new(),
        current: None,
    })
});

/// Is `tp` accelerated?
#[inline(always)]
pub fn contains(tp: *mut ffi::PyTypeObject) -> bool {
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

fn publish(owned: &mut Owned) {
    let mut b = Box::new(owned.classes.keys().copied().collect::<Set>());
    let p: *mut Set = &mut *b;
    SNAPSHOT.store(p, Ordering::Release);
    owned.current = Some(b);
}

fn lock() -> PyResult<std::sync::MutexGuard<'static, Owned>> {
    OWNED
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("fastmodule: registry poisoned"))
}

pub fn add(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let tp = cls.as_ptr() as usize;
    {
        let mut owned = lock()?;
        if let std::collections::hash_map::Entry::Vacant(e) = owned.classes.entry(tp) {
            e.insert(cls.clone().unbind());
            publish(&mut owned);
        }
    }
    crate::routes::note_accelerated(cls.py(), true)
}

pub fn remove(cls: &Bound<'_, PyType>) -> PyResult<bool> {
    let tp = cls.as_ptr() as usize;
    let released = {
        let mut owned = lock()?;
        let Some(r) = owned.classes.remove(&tp) else {
            return Ok(false);
        };
        publish(&mut owned);
        r
    };
    // Dropped outside the lock: releasing a class may run Python code (which
    // may accelerate another class, hence `any()` read afterwards).
    drop(released);
    crate::routes::note_accelerated(cls.py(), any())?;
    Ok(true)
}
