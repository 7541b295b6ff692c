//! Pausing CPython's cyclic garbage collector around native code that holds
//! borrowed pointers across allocations.
use pyo3::ffi;

/// The cyclic GC paused while this lives (and re-enabled on drop if it was
/// enabled): replays that read borrowed objects, or hold a plan's pointers,
/// across calls that may allocate need no finalizer to run in between.
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
