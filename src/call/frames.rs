//! torch's own `forward`s that count their caller's frames.
//!
//! The native module call has no `_wrapped_call_impl`/`_call_impl` frames.
//! A warning whose `stacklevel` reaches past `forward` is then attributed to
//! another line (and registered in another module's `__warningregistry__`)
//! than on stock. For user code that is a documented property of the call
//! path; torch's own modules keep stock's frames: a call whose `forward` is
//! torch code that passes a stack level or reads frames runs torch's
//! `_wrapped_call_impl` (always, or, for the softmax family, when `self.dim`
//! is None, the only case in which `F.softmax` and its siblings warn).
//!
//! Which code is which is `fastmodule._verified.frame_counting`'s decision, asked once
//! per code object and remembered here.
use crate::cpython::{capi, Owned};
use crate::instance::registries::AddressHasher;
use pyo3::prelude::*;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::OnceLock;

/// What a `forward` needs of torch's call frames.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Frames {
    /// Nothing: it runs without them as stock runs it with them.
    None,
    /// torch's frames when `self.dim` is None.
    WhenDimNone,
    /// torch's frames on every call.
    Always,
}

struct Support {
    /// `fastmodule._verified.frame_counting.classify(code) -> int`.
    classify: *mut capi::PyObject,
    dim: *mut capi::PyObject,
}

// SAFETY: strong references kept for the life of the process, read with the GIL.
unsafe impl Send for Support {}
unsafe impl Sync for Support {}
static SUPPORT: OnceLock<Support> = OnceLock::new();

/// Answers by code object; each key is kept alive by its `Owned`, so an
/// address is never reused while it is a key. Bounded: code objects made at
/// run time (fx's generated forwards) would otherwise accumulate.
type Table = HashMap<usize, (Owned, Frames), BuildHasherDefault<AddressHasher>>;
struct Memo(UnsafeCell<Option<Table>>);
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Memo {}
static MEMO: Memo = Memo(UnsafeCell::new(None));
const MEMO_LIMIT: usize = 4096;

/// `classify`: see `fastmodule._verified.frame_counting`.
pub fn init(py: Python<'_>, classify: &Bound<'_, PyAny>) -> PyResult<()> {
    let _ = SUPPORT.set(Support {
        classify: classify.clone().into_ptr(),
        dim: pyo3::types::PyString::intern(py, "dim").into_ptr(),
    });
    Ok(())
}

/// What the Python function `func` (a class's `forward`) needs, when that is
/// known without running Python code (remembered for its code object, or
/// before `init`); None when only [`of`] can tell.
#[inline(always)]
pub unsafe fn known(func: *mut capi::PyObject) -> Option<Frames> {
    if SUPPORT.get().is_none() {
        return Some(Frames::None);
    }
    let code = capi::PyFunction_GetCode(func);
    if code.is_null() {
        capi::PyErr_Clear();
        return None;
    }
    let memo = (*MEMO.0.get()).as_ref()?;
    memo.get(&(code as usize)).map(|&(_, f)| f)
}

/// What the Python function `func` (a class's `forward`) needs; Err(()) with
/// a Python exception set if asking failed. Before `init`: nothing. Asking
/// about a new code object runs Python code (the classifier; and any
/// allocation may run the cyclic GC's finalizers): a caller holding
/// borrowed pointers asks [`known`] first.
pub unsafe fn of(func: *mut capi::PyObject) -> Result<Frames, ()> {
    let Some(s) = SUPPORT.get() else {
        return Ok(Frames::None);
    };
    let code = capi::PyFunction_GetCode(func);
    if code.is_null() {
        return Err(());
    }
    let memo = (*MEMO.0.get()).get_or_insert_with(Table::default);
    if let Some((_, f)) = memo.get(&(code as usize)) {
        return Ok(*f);
    }
    let code = Owned::new_ref(code);
    let answer =
        Owned::from_owned_ptr(capi::PyObject_CallOneArg(s.classify, code.as_ptr())).ok_or(())?;
    let n = capi::PyLong_AsLongLong(answer.as_ptr());
    if n == -1 && !capi::PyErr_Occurred().is_null() {
        return Err(());
    }
    let frames = match n {
        0 => Frames::None,
        1 => Frames::WhenDimNone,
        _ => Frames::Always,
    };
    // The call above ran Python code: take the table again.
    let memo = (*MEMO.0.get()).get_or_insert_with(Table::default);
    let full = (memo.len() >= MEMO_LIMIT).then(|| std::mem::take(memo));
    let old = memo.insert(code.as_ptr() as usize, (code, frames));
    // Released after the table is consistent: a weakref callback on a code
    // object may run Python code (and come back here) meanwhile.
    drop(old);
    drop(full);
    Ok(frames)
}

/// Does this call of `slf` need torch's call frames? Runs no Python code.
/// `hooked`: forward pre-hooks run before `forward`, and one may change what
/// the answer rests on (`self.dim`) after it was given; such a call keeps
/// torch's frames whenever it might need them.
#[inline(always)]
pub unsafe fn needed(frames: Frames, slf: *mut capi::PyObject, hooked: bool) -> bool {
    match frames {
        Frames::None => false,
        Frames::Always => true,
        Frames::WhenDimNone => hooked || dim_is_none(slf),
    }
}

/// Kept out of the module call's hot code: only the softmax family asks.
#[cold]
#[inline(never)]
unsafe fn dim_is_none(slf: *mut capi::PyObject) -> bool {
    let Some(s) = SUPPORT.get() else {
        return true;
    };
    crate::call::layers::attr_is_none_or_unknown(slf, s.dim)
}
