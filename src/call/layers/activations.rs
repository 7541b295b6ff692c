//! Activations: `nn.ReLU`, `nn.GELU`, `nn.SiLU`, `nn.Tanh`, `nn.Sigmoid`, `nn.Softmax`.
use super::{cached, is, remember_plain, Checked, Leaves};
use crate::call::call_cache::{Entry, LeafKind};
use crate::cpython::capi;

static RELU_GLOBALS: Checked<4> = Checked::new();

/// `F.relu(input, inplace=self.inplace)`, with `F.relu`'s body.
pub(super) unsafe fn relu(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    let n = &l.names;
    let dicts = [
        l.activation_globals,
        l.functional_dict,
        l.f_relu_globals,
        l.torch_dict,
    ];
    let ok = RELU_GLOBALS.pass(dicts, || {
        is(l.activation_globals, n.f, l.functional)
            && is(l.functional_dict, n.relu, l.f_relu)
            && is(l.f_relu_globals, n.has_tf_unary, l.has_torch_function_unary)
            && is(l.f_relu_globals, n.torch, l.torch)
            && is(l.torch_dict, n.relu, l.torch_relu)
            && is(l.torch_dict, n.relu_, l.torch_relu_)
    });
    // `F.relu`'s body is reproduced below: only while it is torch's.
    if !ok || !l.bodies.f_relu.intact() {
        return None;
    }
    let inplace = match cached(entry, LeafKind::Relu) {
        Some((v, _)) => {
            capi::Py_INCREF(v);
            v
        }
        None => {
            let v = capi::PyObject_GetAttr(slf, n.inplace);
            if v.is_null() {
                return Some(v);
            }
            remember_plain(slf, entry, n.inplace, v, LeafKind::Relu);
            v
        }
    };
    let r = relu_body(l, input, inplace);
    capi::Py_DECREF(inplace);
    Some(r)
}

unsafe fn relu_body(
    l: &Leaves,
    input: *mut capi::PyObject,
    inplace: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let has = capi::PyObject_CallOneArg(l.has_torch_function_unary, input);
    if has.is_null() {
        return has;
    }
    let truth = capi::PyObject_IsTrue(has);
    capi::Py_DECREF(has);
    if truth < 0 {
        return std::ptr::null_mut();
    }
    if truth == 1 {
        // torch's own F.relu handles __torch_function__.
        let args = [input, inplace];
        let kw = capi::PyTuple_Pack(1, l.names.inplace);
        if kw.is_null() {
            return kw;
        }
        let r = capi::PyObject_Vectorcall(l.f_relu, args.as_ptr(), 1, kw);
        capi::Py_DECREF(kw);
        return r;
    }
    match capi::PyObject_IsTrue(inplace) {
        1 => capi::PyObject_CallOneArg(l.torch_relu_, input),
        0 => capi::PyObject_CallOneArg(l.torch_relu, input),
        _ => std::ptr::null_mut(),
    }
}

/// `GELU`: `F.gelu` (torch's builtin).
pub(super) const GELU: &[&str] = &["f"];
/// `SiLU`: `F.silu`, `torch._C._nn.silu`, `torch._C._nn.silu_`.
pub(super) const SILU: &[&str] = &["f", "op", "op_"];
/// `Tanh`/`Sigmoid`: `torch.tanh` / `torch.sigmoid`.
pub(super) const UNARY: &[&str] = &["op"];
/// `Softmax`: `F.softmax`.
pub(super) const SOFTMAX: &[&str] = &["f"];
const F: usize = 0;
const OP: usize = 1;
const OP_: usize = 2;

use super::table::{call, get, has_tf, none, truth, Common, Kw, Layer, Obj};

/// `F.gelu(input, approximate=self.approximate)`.
pub(super) unsafe fn gelu(l: &Layer, c: &Common, kw: &Kw, slf: Obj, input: Obj) -> Option<Obj> {
    let a = get!(slf, c.s.approximate);
    Some(call(l.o[F], &[input, a.0], kw.approximate))
}

/// `F.silu(input, inplace=self.inplace)`, with `F.silu`'s body.
pub(super) unsafe fn silu(l: &Layer, c: &Common, kw: &Kw, slf: Obj, input: Obj) -> Option<Obj> {
    let inplace = get!(slf, c.s.inplace);
    Some(match has_tf(c, &[input]) {
        Err(()) => std::ptr::null_mut(),
        Ok(true) => call(l.o[F], &[input, inplace.0], kw.inplace),
        Ok(false) => match truth(inplace.0) {
            Err(()) => std::ptr::null_mut(),
            Ok(true) => capi::PyObject_CallOneArg(l.o[OP_], input),
            Ok(false) => capi::PyObject_CallOneArg(l.o[OP], input),
        },
    })
}

/// `torch.tanh(input)` / `torch.sigmoid(input)`.
pub(super) unsafe fn unary(l: &Layer, input: Obj) -> Option<Obj> {
    Some(capi::PyObject_CallOneArg(l.o[0], input))
}

/// `F.softmax(input, self.dim, _stacklevel=5)`, with `F.softmax`'s body for a
/// given `dim` (and its default `dtype=None`). `dim=None` makes `F.softmax`
/// warn with a stack level counted in frames: such a call runs torch's
/// `_wrapped_call_impl` (`crate::call::frames`); should `dim` become None
/// after that check (a pre-hook), torch's `forward` runs here.
pub(super) unsafe fn softmax(l: &Layer, c: &Common, kw: &Kw, slf: Obj, input: Obj) -> Option<Obj> {
    let dim = get!(slf, c.s.dim);
    if dim.0 == none() {
        return None;
    }
    Some(match has_tf(c, &[input]) {
        Err(()) => std::ptr::null_mut(),
        Ok(true) => {
            let five = super::table::Held(capi::PyLong_FromLong(5));
            if five.0.is_null() {
                return Some(std::ptr::null_mut());
            }
            call(l.o[F], &[input, dim.0, five.0], kw.stacklevel)
        }
        Ok(false) => capi::PyObject_CallMethodOneArg(input, c.s.softmax, dim.0),
    })
}
