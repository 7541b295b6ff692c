//! Layer 0 — the interpreter boundary: everything fastmodule reads of
//! CPython beyond its public functions, and every version difference
//! (`cfg(Py_3_12)`, `Py_3_14`, free-threading), each behind a small typed
//! wrapper with a runtime self-test wherever a layout is assumed.
//! Uses nothing of the crate (`use crate::` only within `cpython/`).
//!
//! - [`capi`]: the public C API items the rest of the crate calls,
//!   re-exported explicitly (domain code writes `capi::X`, never `ffi::`).
//! - Private API and layouts: [`private_api`] (`_Py*` entry points),
//!   [`type_cache`] (our cache in front of `_PyType_Lookup`), [`types`]
//!   (type-object slots, MRO, base), [`dicts`] (entry counts,
//!   `OrderedDict`'s state), [`strs`] (compact ASCII bytes), [`vectorcall`]
//!   (a function's entry point), [`recursion`] (recursion limits of native
//!   recursion), [`gc`] (pausing the cyclic GC), [`interned`] (interned
//!   str constants whose first use releases no GIL, unlike pyo3's).
//! - [`Owned`]: a strong reference that is released when it goes out of
//!   scope. Native code that keeps an object across anything that can run
//!   Python code (a dict lookup whose keys compare with `__eq__`, a delete or
//!   replacement whose old value has a finalizer, a call) holds it as an
//!   `Owned`, as torch's Python code holds it in a local variable.
//! - [`quiet`]: can a lookup in this container run code? An exact dict whose
//!   keys are all exact `str` (CPython's str-only key tables), looked up with
//!   an exact `str`, compares keys without calling `__eq__`; an exact set
//!   whose elements are all exact `str` likewise. Fast paths require it and
//!   hand anything else to torch's own code.
//! - [`str_keys`]: a dict whose keys are all exact `str`, by reading them
//!   (any key-table kind; `OrderedDict` too).
//! - [`exceptions`]: the exception being raised and the one being handled
//!   (3.11's triple or 3.12's single object), as `try`/`except` sees them.
//! - [`function_body`]: a Python function's code and defaults as captured, to
//!   tell that `__code__`/`__defaults__` was reassigned since.
//! - [`load_global`]: a global name as a function's code reads it.
//! - [`tracer`]: is a trace or profile function set on this thread?
//! - [`stack`]: how much of this thread's native stack is left?
//! - [`validity`]: is what a cache remembered about a dict or a class still
//!   true? (dict and class versions; dict watchers from 3.12 on.)
pub mod capi;
pub mod dicts;
pub mod exceptions;
pub mod function_body;
pub mod gc;
pub mod interned;
pub mod load_global;
pub mod owned;
pub mod private_api;
pub mod quiet;
pub mod recursion;
pub mod stack;
pub mod str_keys;
pub mod strs;
pub mod tracer;
pub mod type_cache;
pub mod types;
pub mod validity;
pub mod vectorcall;

pub use owned::Owned;

/// Is this a free-threaded build (`Py_GIL_DISABLED`)? Caches that rely on
/// the GIL for exclusive access stay empty there.
pub const FREE_THREADED: bool = cfg!(Py_GIL_DISABLED);
