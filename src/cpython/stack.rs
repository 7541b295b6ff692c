//! How much of this thread's native stack is left.
//!
//! From CPython 3.12 on, Python-to-Python calls take no native stack, so a
//! stock tree walk recurses as deep as the recursion limit allows, while
//! `Py_EnterRecursiveCall` counts against a separate, fixed C recursion limit
//! (1500 on 3.12). fastmodule's eager walks recurse natively: there they
//! count levels against the recursion limit as torch's frames would, and
//! raise RecursionError only where the native stack itself would run out, read
//! from the thread's stack bounds (`pthread_getattr_np`). Where the bounds are
//! unknown, [`room`] answers None and the caller keeps `Py_EnterRecursiveCall`.
use std::cell::Cell;

thread_local! {
    /// The lowest usable stack address of this thread (0: not read yet,
    /// usize::MAX: unknown).
    static LOW: Cell<usize> = const { Cell::new(0) };
}

fn stack_low() -> usize {
    LOW.with(|low| {
        if low.get() == 0 {
            low.set(read_low().unwrap_or(usize::MAX));
        }
        low.get()
    })
}

#[cfg(target_os = "linux")]
fn read_low() -> Option<usize> {
    // SAFETY: plain libc queries on the calling thread, with an attribute
    // object initialised by pthread_getattr_np and destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        (ok && !addr.is_null()).then_some(addr as usize)
    }
}

#[cfg(not(target_os = "linux"))]
fn read_low() -> Option<usize> {
    None
}

/// Bytes of native stack left below the caller's frame, or None when the
/// thread's bounds are unknown.
#[inline(always)]
pub fn room() -> Option<usize> {
    let low = stack_low();
    if low == usize::MAX {
        return None;
    }
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    Some(sp.saturating_sub(low))
}
