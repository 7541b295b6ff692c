//! Pausing CPython's cyclic garbage collector around native code that holds
//! borrowed pointers across allocations.
//!
//! The GC's switch is process-wide: another thread that runs while it is off
//! sees `gc.isenabled()` False, has its own `gc.disable()` undone at the
//! pause's end, and a process it forks then keeps the GC off for life. So a
//! pause may only cover code that neither runs Python code nor releases the
//! GIL (reads of quiet dicts, allocations, torch's C getters; not pyo3's
//! lazily filled cells, `intern!` and `PyOnceLock`, which release it on
//! first use: the crate's `intern!` is [`crate::cpython::interned`]'s): no other
//! thread runs during it, and none can tell it happened. Around anything that
//! may release the GIL (`detach`, `copy_`, a conversion, any call into
//! torch's kernels) hold strong references instead and check afterwards.
use pyo3::ffi;

/// The cyclic GC paused while this lives (and re-enabled on drop if it was
/// enabled): replays that read borrowed objects, or hold a plan's pointers,
/// across calls that may allocate need no finalizer to run in between. Only
/// around code that cannot release the GIL (see the module docs).
pub struct GcPause(bool);

impl GcPause {
    pub fn new() -> GcPause {
        // SAFETY: every caller holds the GIL.
        GcPause(unsafe { ffi::PyGC_Disable() } != 0)
    }
}

impl Drop for GcPause {
    fn drop(&mut self) {
        if self.0 {
            // SAFETY: as in `new`.
            unsafe { ffi::PyGC_Enable() };
        }
    }
}
