//! Is a trace or profile function set on this thread (`sys.settrace`,
//! `sys.setprofile`, or their C forms used by debuggers, cProfile and
//! coverage's tracer)? While one is, the module call hands over to torch's
//! code, so those tools see torch's `_wrapped_call_impl`/`_call_impl` frames
//! exactly as on stock.
//!
//! CPython keeps them in `PyThreadState` (`c_profilefunc`, `c_tracefunc`,
//! `c_profileobj`, `c_traceobj`, in that order, on 3.11-3.13). Their offset
//! differs between versions, so it is not assumed: at import, a fresh thread
//! sets a profile and a trace function of its own, [`locate`] finds the two
//! objects among the thread state's first words (the two function pointers
//! just before them must be set), and [`confirm`] sees all four cleared once
//! they are unset. Until both succeed the check answers "no"; if they fail at
//! import, `fastmodule._verified.verification` switches no native path on (and
//! `fastmodule.diagnostics()` says why).
use pyo3::ffi;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Byte offset of `c_profilefunc` (then `c_tracefunc`) in `PyThreadState`;
/// 0 while unknown (offset 0 is `prev`, never these fields).
static FUNCS: AtomicUsize = AtomicUsize::new(0);
static CANDIDATE: AtomicUsize = AtomicUsize::new(0);

/// How many words of the thread state the search reads (the fields sit
/// within the first dozen or so on every version checked).
const SEARCH_WORDS: usize = 40;

/// Off: [`active`] answers no (tests that watch the native paths with a
/// profile function of their own switch it off meanwhile).
static CHECKING: AtomicBool = AtomicBool::new(true);

/// Is a trace or profile function set on the calling thread?
#[inline(always)]
pub unsafe fn active() -> bool {
    let off = FUNCS.load(Ordering::Relaxed);
    if off == 0 || !CHECKING.load(Ordering::Relaxed) {
        return false;
    }
    let ts = ffi::PyThreadState_Get() as *const u8;
    let funcs = ts.add(off) as *const [usize; 2];
    let [profile, trace] = *funcs;
    profile != 0 || trace != 0
}

/// Called by a fresh thread that has just set `profile` with `sys.setprofile`
/// and then `trace` with `sys.settrace`: find where they are kept.
pub fn locate(profile: *mut ffi::PyObject, trace: *mut ffi::PyObject) -> bool {
    unsafe {
        let words = ffi::PyThreadState_Get() as *const usize;
        for i in 2..SEARCH_WORDS - 1 {
            let w = |k: usize| *words.add(k);
            if w(i) == profile as usize
                && w(i + 1) == trace as usize
                && w(i - 2) != 0
                && w(i - 1) != 0
            {
                CANDIDATE.store((i - 2) * std::mem::size_of::<usize>(), Ordering::Relaxed);
                return true;
            }
        }
    }
    false
}

/// Called by the same thread after unsetting both: the four fields found by
/// [`locate`] are clear. Only then does [`active`] read them.
pub fn confirm() -> bool {
    let off = CANDIDATE.load(Ordering::Relaxed);
    if off == 0 {
        return false;
    }
    let clear = unsafe {
        let fields = (ffi::PyThreadState_Get() as *const u8).add(off) as *const [usize; 4];
        *fields == [0; 4]
    };
    if clear {
        FUNCS.store(off, Ordering::Relaxed);
    }
    clear
}

/// Was the layout found and confirmed?
pub fn known() -> bool {
    FUNCS.load(Ordering::Relaxed) != 0
}

/// Switch the check on or off; returns the previous setting.
pub fn set_checking(on: bool) -> bool {
    CHECKING.swap(on, Ordering::Relaxed)
}
