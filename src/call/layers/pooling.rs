//! Pooling: `nn.MaxPool2d` (`F.max_pool2d`, torch's `boolean_dispatch` on
//! `return_indices`, then `_max_pool2d`'s body) and `nn.AdaptiveAvgPool2d`
//! (`F.adaptive_avg_pool2d` with `_list_with_default`).
use super::table::{call, get, has_tf, none, plain_tensor, truth, Common, Held, Kw, Layer, Obj};
use crate::cpython::capi;

/// `F.max_pool2d` (the dispatcher), its `if_true` and `if_false`
/// (`_max_pool2d`), `torch.max_pool2d`.
pub(super) const MAX: &[&str] = &["f", "if_true", "if_false", "op"];
const IF_TRUE: usize = 1;
const IF_FALSE: usize = 2;
const MAX_OP: usize = 3;

/// `F.max_pool2d(input, self.kernel_size, self.stride, self.padding,
/// self.dilation, ceil_mode=self.ceil_mode, return_indices=self.return_indices)`.
pub(super) unsafe fn max_pool2d(
    l: &Layer,
    c: &Common,
    kw: &Kw,
    slf: Obj,
    input: Obj,
) -> Option<Obj> {
    let s = &c.s;
    let kernel = get!(slf, s.kernel_size);
    let stride = get!(slf, s.stride);
    let padding = get!(slf, s.padding);
    let dilation = get!(slf, s.dilation);
    let ceil = get!(slf, s.ceil_mode);
    let indices = get!(slf, s.return_indices);
    let args = [
        input, kernel.0, stride.0, padding.0, dilation.0, ceil.0, indices.0,
    ];
    // The dispatcher: `return_indices` is in its kwargs, so it decides.
    let target = match truth(indices.0) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return Some(call(l.o[IF_TRUE], &args, kw.pool)),
        Ok(false) => l.o[IF_FALSE],
    };
    // `_max_pool2d`'s body.
    match has_tf(c, &[input]) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return Some(call(target, &args, kw.pool)),
        Ok(false) => {}
    }
    if stride.0 == none() {
        return Some(call(target, &args, kw.pool));
    }
    let op_args = [input, kernel.0, stride.0, padding.0, dilation.0, ceil.0];
    Some(call(l.o[MAX_OP], &op_args, std::ptr::null_mut()))
}

/// `F.adaptive_avg_pool2d`, `torch._C._nn.adaptive_avg_pool2d`.
pub(super) const ADAPTIVE: &[&str] = &["f", "op"];
const F: usize = 0;
const OP: usize = 1;

/// `F.adaptive_avg_pool2d(input, self.output_size)`: for a plain tensor input
/// and an `output_size` that is an int, or a tuple of ints and Nones shorter
/// than the input's rank, `_list_with_default`'s result is built here;
/// anything else calls `F.adaptive_avg_pool2d`.
pub(super) unsafe fn adaptive_avg_pool2d(
    l: &Layer,
    c: &Common,
    slf: Obj,
    input: Obj,
) -> Option<Obj> {
    let size_arg = get!(slf, c.s.output_size);
    let python = || Some(call(l.o[F], &[input, size_arg.0], std::ptr::null_mut()));
    match has_tf(c, &[input]) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return python(),
        Ok(false) => {}
    }
    if !plain_tensor(c, input) {
        return python();
    }
    let out = if capi::PyLong_CheckExact(size_arg.0) != 0 {
        // `isinstance(out_size, (int, torch.SymInt))`: itself. (`input.size()`,
        // evaluated first, reads the plain tensor's size and nothing else.)
        capi::Py_INCREF(size_arg.0);
        Held(size_arg.0)
    } else if capi::PyTuple_CheckExact(size_arg.0) != 0 {
        let n = capi::PyTuple_GET_SIZE(size_arg.0);
        for i in 0..n {
            let v = capi::PyTuple_GET_ITEM(size_arg.0, i);
            if v != none() && capi::PyLong_CheckExact(v) == 0 {
                return python();
            }
        }
        let size = Held(capi::PyObject_CallMethodNoArgs(input, c.s.size));
        if size.0.is_null() {
            return Some(std::ptr::null_mut());
        }
        if capi::PyTuple_Check(size.0) == 0 {
            return python();
        }
        let rank = capi::PyTuple_GET_SIZE(size.0);
        if rank <= n {
            return python();
        }
        let list = Held(capi::PyList_New(n));
        if list.0.is_null() {
            return Some(std::ptr::null_mut());
        }
        for i in 0..n {
            let mut v = capi::PyTuple_GET_ITEM(size_arg.0, i);
            if v == none() {
                v = capi::PyTuple_GET_ITEM(size.0, rank - n + i);
            }
            capi::Py_INCREF(v);
            capi::PyList_SET_ITEM(list.0, i, v);
        }
        list
    } else {
        return python();
    };
    Some(call(l.o[OP], &[input, out.0], std::ptr::null_mut()))
}
