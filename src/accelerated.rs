//! Classes accelerated in place by `fastmodule.accelerate` / `install`: their
//! instances take the native paths exactly as instances of
//! `fastmodule.Module` subclasses do, while the class object itself (its
//! name, its dict, `type(m) is nn.Linear`) stays what it was.
//!
//! The set is read on hot paths and written rarely: readers load an
//! immutable snapshot through an atomic pointer; a writer (holding the GIL,
//! which serialises writers) publishes a new snapshot and keeps the old ones
//! alive, so a reader never sees freed memory.
use pyo3::prelude::*;
use pyo3::types::PyType;
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use crate::items::AddressHasher;
use pyo3::ffi;

type Set = HashSet<usize, BuildHasherDefault<AddressHasher>>;

static SNAPSHOT: AtomicPtr<Set> = AtomicPtr::new(std::ptr::null_mut());

/// Strong references to the classes in the set, and every snapshot ever
/// published (a handful of small sets: accelerating is rare).
struct Owned {
    classes: Vec<Py<PyType>>,
    // Boxed: readers hold pointers to the sets themselves, which must not
    // move when the vector grows.
    #[allow(clippy::vec_box)]
    snapshots: Vec<Box<Set>>,
}
static OWNED: Mutex<Owned> = Mutex::new(Owned {
    classes: Vec::new(),
    snapshots: Vec::new(),
});

/// Is `tp` accelerated?
#[inline(always)]
pub fn contains(tp: *mut ffi::PyTypeObject) -> bool {
    let p = SNAPSHOT.load(Ordering::Acquire);
    // SAFETY: published snapshots are never freed (see `Owned`).
    !p.is_null() && unsafe { (*p).contains(&(tp as usize)) }
}

fn publish(owned: &mut Owned, set: Set) {
    let mut b = Box::new(set);
    let p: *mut Set = &mut *b;
    owned.snapshots.push(b);
    SNAPSHOT.store(p, Ordering::Release);
}

fn current() -> Set {
    let p = SNAPSHOT.load(Ordering::Acquire);
    if p.is_null() {
        Set::default()
    } else {
        unsafe { (*p).clone() }
    }
}

pub fn add(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let tp = cls.as_ptr() as usize;
    let mut owned = OWNED
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("fastmodule: registry poisoned"))?;
    let mut set = current();
    if set.insert(tp) {
        owned.classes.push(cls.clone().unbind());
        publish(&mut owned, set);
    }
    Ok(())
}

pub fn remove(cls: &Bound<'_, PyType>) -> PyResult<bool> {
    let tp = cls.as_ptr() as usize;
    let mut owned = OWNED
        .lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("fastmodule: registry poisoned"))?;
    let mut set = current();
    if !set.remove(&tp) {
        return Ok(false);
    }
    publish(&mut owned, set);
    // The class stays referenced: a reader may hold an older snapshot.
    Ok(true)
}
