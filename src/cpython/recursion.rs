//! Recursion limits for fastmodule's native recursion (the eager walks):
//! RecursionError where torch's Python recursion would raise it, with the
//! text of this CPython version, and a guard for the native stack itself.
use pyo3::ffi;
use pyo3::prelude::*;

thread_local! {
    /// Depth of the eager walks' native recursion on this thread.
    static WALK_DEPTH: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// Which text torch's own recursion would raise RecursionError with: on 3.11
/// every Python call counts as "while calling a Python object"; from 3.12
/// on, a recursion of Python frames raises the bare text (torch's routed
/// methods keep CPython's own entry point there, so they recurse in Python
/// too). `Routed` names walks whose stock recursion goes through a routed
/// method (`state_dict`, `train`), `Python` the others; both read alike now.
#[derive(Clone, Copy)]
pub(crate) enum Recursion {
    /// torch recurses through a routed method called from torch's code.
    Routed,
    /// torch recurses through plain Python calls.
    Python,
}

impl Recursion {
    fn text(self) -> &'static str {
        match self {
            Recursion::Routed | Recursion::Python => {
                if cfg!(Py_3_12) {
                    "maximum recursion depth exceeded"
                } else {
                    "maximum recursion depth exceeded while calling a Python object"
                }
            }
        }
    }
}

/// Native stack an eager walk keeps in reserve (from 3.12 on): below this it
/// raises RecursionError rather than overflow (a level takes a few KiB).
const STACK_RESERVE: usize = 256 * 1024;

/// RAII guard for one level of an eager walk: RecursionError where torch's
/// Python recursion would exceed the recursion limit (from 3.13 on,
/// `Py_EnterRecursiveCall` only guards the C stack, with a higher limit), and
/// `Py_EnterRecursiveCall` for the native stack itself.
/// The eager walks' native recursion depth on this thread.
pub(crate) fn walk_depth() -> i64 {
    WALK_DEPTH.with(|d| d.get())
}

pub(crate) struct Depth {
    /// Entered with `Py_EnterRecursiveCall` (to leave on drop).
    counted: bool,
}
impl Depth {
    pub(crate) fn enter(py: Python<'_>, kind: Recursion) -> PyResult<Depth> {
        let depth = WALK_DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get()
        });
        if depth > i64::from(unsafe { ffi::Py_GetRecursionLimit() }) {
            WALK_DEPTH.with(|d| d.set(d.get() - 1));
            return Err(pyo3::exceptions::PyRecursionError::new_err(kind.text()));
        }
        // From 3.12 on torch's Python recursion takes no native stack and
        // does not count against CPython's C recursion limit: only the
        // native stack itself bounds the walk. Elsewhere (3.11, or bounds
        // unknown) CPython's own counter guards it, as a C call would.
        if cfg!(Py_3_12) {
            if let Some(room) = super::stack::room() {
                if room < STACK_RESERVE {
                    WALK_DEPTH.with(|d| d.set(d.get() - 1));
                    return Err(pyo3::exceptions::PyRecursionError::new_err(kind.text()));
                }
                return Ok(Depth { counted: false });
            }
        }
        if unsafe { ffi::Py_EnterRecursiveCall(c" while calling a Python object".as_ptr()) } != 0 {
            WALK_DEPTH.with(|d| d.set(d.get() - 1));
            return Err(PyErr::fetch(py));
        }
        Ok(Depth { counted: true })
    }
}
impl Drop for Depth {
    fn drop(&mut self) {
        WALK_DEPTH.with(|d| d.set(d.get() - 1));
        if self.counted {
            unsafe { ffi::Py_LeaveRecursiveCall() };
        }
    }
}

/// Would the live walk's recursion (`max_depth` levels below a root level)
/// stay within the limits it checks?
pub unsafe fn room_for(max_depth: u32) -> bool {
    let levels = i64::from(max_depth) + 1;
    if walk_depth() + levels > i64::from(ffi::Py_GetRecursionLimit()) {
        return false;
    }
    let mut entered = 0;
    while entered < levels {
        if ffi::Py_EnterRecursiveCall(c"".as_ptr()) != 0 {
            ffi::PyErr_Clear();
            break;
        }
        entered += 1;
    }
    for _ in 0..entered {
        ffi::Py_LeaveRecursiveCall();
    }
    entered == levels
}
