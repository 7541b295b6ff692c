//! Is `torch.jit.trace` active on this thread?
//!
//! Stock `_call_impl` asks `torch._C._is_tracing()` on every call; through
//! pybind11 that costs ~80 ns, more than the rest of our fast path. libtorch
//! exports `torch::jit::tracer::getTracingState()`, which returns a reference
//! to the thread-local `std::shared_ptr<TracingState>`: its first word is the
//! state pointer, non-null exactly when tracing. We resolve it with dlsym on
//! the already-loaded libtorch and fall back to the Python function when the
//! symbol is absent.
use crate::state::Globals;
use pyo3::ffi;
use std::ffi::{c_void, CString};
use std::sync::OnceLock;

type GetTracingState = unsafe extern "C" fn() -> *const *const c_void;

static PROBE: OnceLock<Option<GetTracingState>> = OnceLock::new();

const SYMBOL: &std::ffi::CStr = c"_ZN5torch3jit6tracer15getTracingStateEv";

/// Resolve the probe from the libtorch at `lib_path` (already loaded by torch).
pub fn init(lib_path: &str) -> bool {
    let probe = PROBE.get_or_init(|| {
        let path = CString::new(lib_path).ok()?;
        // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded
        // library; dlsym on it has no side effects.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if handle.is_null() {
                return None;
            }
            let sym = libc::dlsym(handle, SYMBOL.as_ptr());
            if sym.is_null() {
                return None;
            }
            Some(std::mem::transmute::<*mut c_void, GetTracingState>(sym))
        }
    });
    probe.is_some()
}

/// Whether the native probe is in use (for tests and diagnostics).
pub fn native() -> bool {
    matches!(PROBE.get(), Some(Some(_)))
}

/// Ok(true) while jit-tracing; Err(()) with a Python exception set.
#[inline(always)]
pub unsafe fn is_tracing(g: &Globals) -> Result<bool, ()> {
    if let Some(Some(f)) = PROBE.get() {
        let state = f();
        return Ok(!state.is_null() && !(*state).is_null());
    }
    let r = ffi::PyObject_CallNoArgs(g.is_tracing_py);
    if r.is_null() {
        return Err(());
    }
    let t = ffi::PyObject_IsTrue(r);
    ffi::Py_DECREF(r);
    match t {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(()),
    }
}
