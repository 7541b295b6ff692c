//! Interned `str` constants whose first use lets no other thread run.
//!
//! pyo3's `intern!` fills its cell through `PyOnceLock`, which releases the
//! GIL on the first use of each site (a thread blocked on the cell then
//! cannot deadlock with the one filling it). Inside a native path that
//! release lets another thread run in the middle of it: that thread sees the
//! cyclic GC paused ([`crate::cpython::gc`]), or changes what the path holds
//! borrowed. Here the str is made first (`PyUnicode_InternFromString` runs
//! no code: a str is not tracked by the GC), then moved into the cell. With
//! the GIL held throughout, no other thread can be filling the same cell, so
//! the move never waits.
use pyo3::types::PyString;
use pyo3::{Bound, Py, Python};
use std::sync::OnceLock;

/// One `intern!` site's str, made on its first use.
pub struct Interned(&'static str, OnceLock<Py<PyString>>);

impl Interned {
    pub const fn new(text: &'static str) -> Interned {
        Interned(text, OnceLock::new())
    }

    /// The interned str (made now on the first call).
    #[inline]
    pub fn get<'a, 'py>(&'a self, py: Python<'py>) -> &'a Bound<'py, PyString> {
        match self.1.get() {
            Some(s) => s.bind(py),
            None => self.fill(py),
        }
    }

    #[cold]
    fn fill<'a, 'py>(&'a self, py: Python<'py>) -> &'a Bound<'py, PyString> {
        let made = PyString::intern(py, self.0).unbind();
        // Err only on a free-threaded build, where another thread filled the
        // cell meanwhile: ours is dropped (the same interned str).
        let _ = self.1.set(made);
        // Filled above: the closure never runs.
        self.1
            .get_or_init(|| PyString::intern(py, self.0).unbind())
            .bind(py)
    }
}

/// `intern!(py, "name")`: the `&Bound<PyString>` of an interned str, made
/// once per site; used instead of pyo3's (see the module docs).
macro_rules! intern {
    ($py:expr, $text:expr) => {{
        static INTERNED: $crate::cpython::interned::Interned =
            $crate::cpython::interned::Interned::new($text);
        INTERNED.get($py)
    }};
}
pub(crate) use intern;
