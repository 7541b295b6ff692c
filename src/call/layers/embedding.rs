//! `nn.Embedding.forward`: `F.embedding(input, self.weight, self.padding_idx,
//! self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)`, with
//! `F.embedding`'s body for `max_norm=None` and a `padding_idx` that is None
//! or an int within range; otherwise (renorm, an error to raise, a
//! `__torch_function__` argument) `F.embedding` itself runs.
use super::table::{call, get, has_tf, none, plain_tensor, Common, Held, Layer, Obj};
use crate::cpython::capi;

/// `F.embedding`, `torch.embedding`.
pub(super) const OBJS: &[&str] = &["f", "op"];
const F: usize = 0;
const OP: usize = 1;

pub(super) unsafe fn embedding(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let s = &c.s;
    let weight = get!(slf, s.weight);
    let padding_idx = get!(slf, s.padding_idx);
    let max_norm = get!(slf, s.max_norm);
    let norm_type = get!(slf, s.norm_type);
    let scale = get!(slf, s.scale_grad_by_freq);
    let sparse = get!(slf, s.sparse);
    let f_args = [
        input,
        weight.0,
        padding_idx.0,
        max_norm.0,
        norm_type.0,
        scale.0,
        sparse.0,
    ];
    let python = || Some(call(l.o[F], &f_args, std::ptr::null_mut()));
    match has_tf(c, &[input, weight.0]) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return python(),
        Ok(false) => {}
    }
    if max_norm.0 != none() {
        return python();
    }
    let idx = if padding_idx.0 == none() {
        capi::Py_INCREF(c.minus_one);
        Held(c.minus_one)
    } else {
        if capi::PyLong_CheckExact(padding_idx.0) == 0 || !plain_tensor(c, weight.0) {
            return python();
        }
        let i = capi::PyLong_AsLongLong(padding_idx.0);
        if i == -1 && !capi::PyErr_Occurred().is_null() {
            capi::PyErr_Clear();
            return python();
        }
        if i == 0 {
            capi::Py_INCREF(padding_idx.0);
            Held(padding_idx.0)
        } else {
            // `weight.size(0)`
            let n = Held(capi::PyObject_CallMethodOneArg(weight.0, s.size, c.zero));
            if n.0.is_null() {
                return Some(std::ptr::null_mut());
            }
            let rows = capi::PyLong_AsLongLong(n.0);
            if rows == -1 && !capi::PyErr_Occurred().is_null() {
                capi::PyErr_Clear();
                return python();
            }
            if i > 0 {
                if i >= rows {
                    return python();
                }
                capi::Py_INCREF(padding_idx.0);
                Held(padding_idx.0)
            } else {
                if i < -rows {
                    return python();
                }
                Held(capi::PyLong_FromLongLong(rows + i))
            }
        }
    };
    if idx.0.is_null() {
        return Some(std::ptr::null_mut());
    }
    let args = [weight.0, input, idx.0, scale.0, sparse.0];
    Some(call(l.o[OP], &args, std::ptr::null_mut()))
}
