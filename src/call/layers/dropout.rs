//! The dropouts: `nn.Dropout`, `Dropout1d/2d/3d`, `AlphaDropout`,
//! `FeatureAlphaDropout`, whose forwards call `F.<name>(input, self.p,
//! self.training[, self.inplace])`, with those functions' bodies: the
//! `__torch_function__` check, the range check of `p`, then
//! `_VF.<op>_(input, p, training)` if `inplace` else `_VF.<op>(...)` (the
//! guard holds `_VF`'s attribute resolution: `VFModule.__getattr__` reading
//! `torch._C._VariableFunctions`). Anything else — `p` not an exact float or
//! out of range (the error is `F`'s), a `__torch_function__` input — calls
//! `F.<name>` itself; an input of another rank than the batched one runs
//! torch's `forward` (`dropout2d`/`dropout3d` warn there with a stack level).
use super::table::{
    call, exact_float, get, has_tf, plain_tensor, truth, Common, Held, Kind, Layer, Obj,
};
use crate::cpython::capi;

/// `F.<name>`, `_VF.<op>` and `_VF.<op>_` (the builtins).
pub(super) const OBJS: &[&str] = &["f", "op", "op_"];
const F: usize = 0;
const OP: usize = 1;
const OP_: usize = 2;

pub(super) unsafe fn dropout(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let p = get!(slf, c.s.p);
    let training = get!(slf, c.s.training);
    // AlphaDropout and FeatureAlphaDropout pass no `inplace`: `F`'s default
    // (False, held by the guard) applies.
    let with_inplace = !matches!(l.kind, Kind::AlphaDropout | Kind::FeatureAlphaDropout);
    let inplace = if with_inplace {
        get!(slf, c.s.inplace)
    } else {
        capi::Py_INCREF(capi::Py_False());
        Held(capi::Py_False())
    };
    let args3 = [input, p.0, training.0];
    let args4 = [input, p.0, training.0, inplace.0];
    let python = |_: ()| -> *mut capi::PyObject {
        if with_inplace {
            call(l.o[F], &args4, std::ptr::null_mut())
        } else {
            call(l.o[F], &args3, std::ptr::null_mut())
        }
    };
    match has_tf(c, &[input]) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return Some(python(())),
        Ok(false) => {}
    }
    // `p < 0.0 or p > 1.0` as Python has it: a NaN passes (a range test would not).
    #[allow(clippy::manual_range_contains)]
    match exact_float(p.0) {
        Some(v) if !(v < 0.0 || v > 1.0) => {}
        _ => return Some(python(())),
    }
    let batched_rank = match l.kind {
        Kind::Dropout1d => 3,
        Kind::Dropout2d => 4,
        Kind::Dropout3d => 5,
        _ => 0,
    };
    if batched_rank != 0 {
        if !plain_tensor(c, input) {
            return None;
        }
        let dim = Held(capi::PyObject_CallMethodNoArgs(input, c.s.dim));
        if dim.0.is_null() {
            return Some(std::ptr::null_mut());
        }
        if capi::PyLong_CheckExact(dim.0) == 0 || capi::PyLong_AsLongLong(dim.0) != batched_rank {
            capi::PyErr_Clear();
            return match l.kind {
                // No warning in `F.dropout1d`: its own checks and reshapes.
                Kind::Dropout1d => Some(python(())),
                _ => None,
            };
        }
    }
    let op = match truth(inplace.0) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => l.o[OP_],
        Ok(false) => l.o[OP],
    };
    Some(call(op, &args3, std::ptr::null_mut()))
}
