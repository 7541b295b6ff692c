//! Is `torch.jit.trace` active on this thread?
//!
//! Stock `_call_impl` asks `torch._C._is_tracing()` on every call; through
//! pybind11 that costs ~80 ns, more than the rest of our fast path. libtorch
//! exports `torch::jit::tracer::getTracingState()`, which returns a reference
//! to the thread-local `std::shared_ptr<TracingState>`: its first word is the
//! state pointer, non-null exactly when tracing.
//!
//! The symbol is looked up without assuming any library's file name: first
//! through torch's own extension (`dlsym` on a handle searches the object and
//! the libraries it depends on, which is how `torch._C` itself binds it), then
//! in every loaded library, where it must be found at one address only. Where
//! neither finds it, the Python function is asked (and [`status`] says why).
use crate::cpython::capi;
use crate::torch_api::originals::Globals;
use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
use std::sync::Mutex;

type GetTracingState = unsafe extern "C" fn() -> *const *const c_void;

/// The resolved `getTracingState`, or null for the Python probe.
static PROBE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// What [`resolve`] found, for diagnostics.
static STATUS: Mutex<String> = Mutex::new(String::new());

const SYMBOL: &CStr = c"_ZN5torch3jit6tracer15getTracingStateEv";

/// `SYMBOL` in the already loaded object at `path` or the libraries it depends
/// on; null if it is not loaded or defines no such symbol.
unsafe fn in_library(path: &CStr) -> *mut c_void {
    // RTLD_NOLOAD only returns a handle to a library that is already loaded;
    // dlsym on it has no side effects. Closing drops only our reference.
    let handle = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    let sym = libc::dlsym(handle, SYMBOL.as_ptr());
    libc::dlclose(handle);
    sym
}

/// The distinct addresses `SYMBOL` has in the libraries loaded now.
#[cfg(target_os = "linux")]
fn in_loaded_libraries() -> Vec<usize> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        let found = &mut *(data as *mut Vec<usize>);
        let name = (*info).dlpi_name;
        if !name.is_null() && *name != 0 {
            let sym = in_library(CStr::from_ptr(name));
            if !sym.is_null() && !found.contains(&(sym as usize)) {
                found.push(sym as usize);
            }
        }
        0
    }
    let mut found: Vec<usize> = Vec::new();
    // SAFETY: the callback only reads the entry it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut found as *mut Vec<usize> as *mut c_void) };
    found
}

#[cfg(not(target_os = "linux"))]
fn in_loaded_libraries() -> Vec<usize> {
    Vec::new()
}

/// The file of the loaded library that holds `sym`.
fn file_of(sym: *mut c_void) -> String {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return "an unnamed library".to_owned();
    }
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// Find `getTracingState` through the loaded library `torch_library` (torch's
/// extension, `torch._C.__file__`) and, if `walk`, in every loaded library;
/// returns whether the native probe is in use and what was found. Calling it
/// again replaces the earlier answer (tests take the fallback this way).
pub fn resolve(torch_library: Option<&str>, walk: bool) -> (bool, String) {
    let through_torch = torch_library
        .and_then(|p| CString::new(p).ok())
        .map_or(std::ptr::null_mut(), |p| unsafe { in_library(&p) });
    let (sym, detail) = if !through_torch.is_null() {
        let via = torch_library.unwrap_or_default();
        let via = std::path::Path::new(via)
            .file_name()
            .map_or(via.into(), |n| n.to_string_lossy());
        let detail = format!("{} (found from {via})", file_of(through_torch));
        (through_torch, detail)
    } else if !walk {
        let detail = match torch_library {
            Some(p) => format!("{} not found from {p}", symbol_name()),
            None => format!("{} not looked up", symbol_name()),
        };
        (std::ptr::null_mut(), detail)
    } else {
        match in_loaded_libraries()[..] {
            [one] => {
                let sym = one as *mut c_void;
                (
                    sym,
                    format!("{} (found among the loaded libraries)", file_of(sym)),
                )
            }
            [] => (
                std::ptr::null_mut(),
                format!("{} not found in any loaded library", symbol_name()),
            ),
            ref many => (
                std::ptr::null_mut(),
                format!(
                    "{} found at {} addresses (several libtorch copies loaded)",
                    symbol_name(),
                    many.len()
                ),
            ),
        }
    };
    PROBE.store(sym, Relaxed);
    let on = !sym.is_null();
    if let Ok(mut s) = STATUS.lock() {
        s.clone_from(&detail);
    }
    (on, detail)
}

fn symbol_name() -> &'static str {
    "torch::jit::tracer::getTracingState()"
}

/// Whether the native probe is in use, and what [`resolve`] found.
pub fn status() -> (bool, String) {
    let detail = STATUS.lock().map(|s| s.clone()).unwrap_or_default();
    (native(), detail)
}

/// Whether the native probe is in use (for tests and diagnostics).
pub fn native() -> bool {
    !PROBE.load(Relaxed).is_null()
}

/// Ok(true) while jit-tracing; Err(()) with a Python exception set.
#[inline(always)]
pub unsafe fn is_tracing(g: &Globals) -> Result<bool, ()> {
    let f = PROBE.load(Relaxed);
    if !f.is_null() {
        let f = std::mem::transmute::<*mut c_void, GetTracingState>(f);
        let state = f();
        return Ok(!state.is_null() && !(*state).is_null());
    }
    let r = capi::PyObject_CallNoArgs(g.is_tracing_py);
    if r.is_null() {
        return Err(());
    }
    let t = capi::PyObject_IsTrue(r);
    capi::Py_DECREF(r);
    match t {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(()),
    }
}
