//! Norms: `nn.LayerNorm` (`F.layer_norm`), `nn.RMSNorm` (`F.rms_norm`) and
//! `nn.BatchNorm1d/2d` (`_BatchNorm.forward` with `F.batch_norm`'s body).
use super::table::{
    call, cudnn_enabled, exact_float, get, has_tf, none, plain_tensor, Common, Held, Layer, Obj,
};
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::instance_dict;

/// `F.layer_norm` / `F.rms_norm`, and `torch.layer_norm` / `torch.rms_norm`.
pub(super) const NORM: &[&str] = &["f", "op"];
/// `BatchNorm1d._check_input_dim`, `BatchNorm2d._check_input_dim`,
/// `F.batch_norm`, `torch.batch_norm`.
pub(super) const BATCH: &[&str] = &["check1d", "check2d", "f", "op"];
const F: usize = 0;
const OP: usize = 1;

/// `F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)`.
pub(super) unsafe fn layer_norm(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let shape = get!(slf, c.s.normalized_shape);
    let weight = get!(slf, c.s.weight);
    let bias = get!(slf, c.s.bias);
    let eps = get!(slf, c.s.eps);
    Some(match has_tf(c, &[input, weight.0, bias.0]) {
        Err(()) => std::ptr::null_mut(),
        Ok(true) => call(
            l.o[F],
            &[input, shape.0, weight.0, bias.0, eps.0],
            std::ptr::null_mut(),
        ),
        Ok(false) => {
            let enabled = Held(cudnn_enabled(c));
            if enabled.0.is_null() {
                return Some(std::ptr::null_mut());
            }
            let args = [input, shape.0, weight.0, bias.0, eps.0, enabled.0];
            call(l.o[OP], &args, std::ptr::null_mut())
        }
    })
}

/// `F.rms_norm(x, self.normalized_shape, self.weight, self.eps)`.
pub(super) unsafe fn rms_norm(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let shape = get!(slf, c.s.normalized_shape);
    let weight = get!(slf, c.s.weight);
    let eps = get!(slf, c.s.eps);
    let args = [input, shape.0, weight.0, eps.0];
    Some(match has_tf(c, &[input, weight.0]) {
        Err(()) => std::ptr::null_mut(),
        Ok(true) => call(l.o[F], &args, std::ptr::null_mut()),
        Ok(false) => call(l.o[OP], &args, std::ptr::null_mut()),
    })
}

const CHECK_1D: usize = 0;
const CHECK_2D: usize = 1;
const BN_F: usize = 2;
const BN_OP: usize = 3;

/// `_BatchNorm.forward`. Served when the input is a plain tensor of the rank
/// the class's `_check_input_dim` accepts, no `__torch_function__` mode is
/// active, `training` and `track_running_stats` are bools, `momentum` a float
/// or None and `eps` a float; otherwise torch's `forward` runs (nothing has
/// happened yet).
pub(super) unsafe fn batch_norm(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let s = &c.s;
    // `self._check_input_dim(input)`: the class's function, no instance attribute.
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    let check = type_lookup(tp, s._check_input_dim);
    let one_d = check == l.o[CHECK_1D];
    if !(one_d || check == l.o[CHECK_2D])
        || dict.is_null()
        || capi::PyDict_Contains(dict, s._check_input_dim) != 0
    {
        capi::PyErr_Clear();
        return None;
    }
    if !plain_tensor(c, input) {
        return None;
    }
    // Under a `__torch_function__` mode `input.dim()` is seen (as often as
    // `_check_input_dim` calls it, once or twice), and so would be a call
    // before a hand-over: torch's `forward` makes them all.
    match has_tf(c, &[input]) {
        Err(()) => return Some(std::ptr::null_mut()),
        Ok(true) => return None,
        Ok(false) => {}
    }
    let dim = Held(capi::PyObject_CallMethodNoArgs(input, s.dim));
    if dim.0.is_null() {
        return Some(std::ptr::null_mut());
    }
    let rank = if capi::PyLong_CheckExact(dim.0) != 0 {
        capi::PyLong_AsLongLong(dim.0)
    } else {
        -1
    };
    let fits = if one_d {
        rank == 2 || rank == 3
    } else {
        rank == 4
    };
    if !fits {
        capi::PyErr_Clear();
        return None;
    }
    let momentum = get!(slf, s.momentum);
    let training = get!(slf, s.training);
    let track = get!(slf, s.track_running_stats);
    let eps = get!(slf, s.eps);
    let is_bool = |x: Obj| x == capi::Py_True() || x == capi::Py_False();
    if !(momentum.0 == none() || exact_float(momentum.0).is_some())
        || !is_bool(training.0)
        || !is_bool(track.0)
        || exact_float(eps.0).is_none()
    {
        return None;
    }
    let training_b = training.0 == capi::Py_True();
    let track_b = track.0 == capi::Py_True();
    let running_mean = get!(slf, s.running_mean);
    let running_var = get!(slf, s.running_var);
    let weight = get!(slf, s.weight);
    let bias = get!(slf, s.bias);
    // exponential_average_factor
    let mut factor = if momentum.0 == none() {
        Held(capi::PyFloat_FromDouble(0.0))
    } else {
        capi::Py_INCREF(momentum.0);
        Held(momentum.0)
    };
    if factor.0.is_null() {
        return Some(std::ptr::null_mut());
    }
    if training_b && track_b {
        let tracked = get!(slf, s.num_batches_tracked);
        if tracked.0 != none() {
            // The first step with an effect: from here on torch's code is not
            // handed the call again.
            let r = capi::PyObject_CallMethodOneArg(tracked.0, s.add_, c.one);
            if r.is_null() {
                return Some(r);
            }
            capi::Py_DECREF(r);
            if momentum.0 == none() {
                let t = Held(capi::PyNumber_Float(tracked.0));
                if t.0.is_null() {
                    return Some(std::ptr::null_mut());
                }
                factor = Held(capi::PyNumber_TrueDivide(c.float_one, t.0));
                if factor.0.is_null() {
                    return Some(std::ptr::null_mut());
                }
            }
        }
    }
    let bn_training = training_b || (running_mean.0 == none() && running_var.0 == none());
    let pass_stats = !training_b || track_b;
    let mean = if pass_stats { running_mean.0 } else { none() };
    let var = if pass_stats { running_var.0 } else { none() };
    let flag = if bn_training {
        capi::Py_True()
    } else {
        capi::Py_False()
    };
    let f_args = [input, mean, var, weight.0, bias.0, flag, factor.0, eps.0];
    Some(
        match batch_norm_body(c, input, mean, var, weight.0, bias.0, bn_training, eps.0) {
            Err(()) => std::ptr::null_mut(),
            Ok(false) => call(l.o[BN_F], &f_args, std::ptr::null_mut()),
            Ok(true) => {
                let enabled = Held(cudnn_enabled(c));
                if enabled.0.is_null() {
                    return Some(std::ptr::null_mut());
                }
                let args = [
                    input, weight.0, bias.0, mean, var, flag, factor.0, eps.0, enabled.0,
                ];
                call(l.o[BN_OP], &args, std::ptr::null_mut())
            }
        },
    )
}

/// `F.batch_norm`'s checks before `torch.batch_norm`: Ok(true) when they all
/// pass, Ok(false) when `F.batch_norm` itself must run (a `__torch_function__`
/// argument, a batch of one value per channel, an `eps` not above 0: its own
/// checks and errors, which differ between torch versions), Err(()) with an
/// exception set.
#[allow(clippy::too_many_arguments)]
unsafe fn batch_norm_body(
    c: &Common,
    input: Obj,
    mean: Obj,
    var: Obj,
    weight: Obj,
    bias: Obj,
    training: bool,
    eps: Obj,
) -> Result<bool, ()> {
    if has_tf(c, &[input, mean, var, weight, bias])? {
        return Ok(false);
    }
    if training {
        // `_verify_batch_size(input.size())`: size[0] * size[2] * ... != 1.
        let size = Held(capi::PyObject_CallMethodNoArgs(input, c.s.size));
        if size.0.is_null() {
            return Err(());
        }
        if capi::PyTuple_Check(size.0) == 0 {
            return Ok(false);
        }
        let n = capi::PyTuple_GET_SIZE(size.0);
        if n < 1 {
            return Ok(false);
        }
        let mut prod: i128 = 1;
        for i in 0..n {
            if i == 1 {
                continue;
            }
            let v = capi::PyTuple_GET_ITEM(size.0, i);
            if capi::PyLong_CheckExact(v) == 0 {
                return Ok(false);
            }
            let x = capi::PyLong_AsLongLong(v);
            if x == -1 && !capi::PyErr_Occurred().is_null() {
                capi::PyErr_Clear();
                return Ok(false);
            }
            prod = prod.saturating_mul(x as i128);
        }
        if prod == 1 {
            return Ok(false);
        }
    }
    let Some(e) = exact_float(eps) else {
        return Ok(false);
    };
    // torch 2.15 raises for `training and eps <= 0.0` or `eps < 0.0`, 2.11 for
    // `eps <= 0.0`: any eps not above 0 (or NaN) is `F.batch_norm`'s to judge.
    if e.is_nan() || e <= 0.0 {
        return Ok(false);
    }
    Ok(true)
}
