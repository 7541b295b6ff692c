//! Norms: `nn.LayerNorm` (`F.layer_norm`), `nn.RMSNorm` (`F.rms_norm`) and
//! `nn.BatchNorm1d/2d` (`_BatchNorm.forward` with `F.batch_norm`'s body).
use super::table::{
    call, cudnn_enabled, exact_float, get, has_tf, none, plain_tensor, read, truth, Common, Held,
    Layer, Obj,
};
use crate::cpython::capi;
use crate::cpython::load_global::load_global;
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
/// active and `training` and `track_running_stats` are bools; otherwise
/// torch's `forward` runs (nothing has happened yet).
///
/// torch's `forward` reads the layer's attributes as it goes, and
/// `self.num_batches_tracked.add_(1)` (training with tracked statistics) may
/// release the GIL or run Python code (a dispatch mode): what torch reads
/// after it is read after it here too, in torch's order ([`after_add`]).
/// Where no `add_` is made nothing between the reads runs code, so torch's
/// repeated reads of one plain attribute are one read here.
pub(super) unsafe fn batch_norm(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let s = &c.s;
    // `self._check_input_dim(input)`: the class's function, no instance attribute.
    // Asked only of a quiet dict (a forward pre-hook may have given it a non-str
    // key since the call's checks): elsewhere the lookup would run a key's
    // `__eq__` that torch's own read then runs again.
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    let check = type_lookup(tp, s._check_input_dim);
    let one_d = check == l.o[CHECK_1D];
    if !(one_d || check == l.o[CHECK_2D])
        || dict.is_null()
        || !crate::cpython::quiet::dict(dict)
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
    // Up to `add_`: `self.momentum` (twice), `self.training`,
    // `self.track_running_stats`, `self.num_batches_tracked` (twice).
    let momentum = get!(slf, s.momentum);
    let training = get!(slf, s.training);
    let track = get!(slf, s.track_running_stats);
    let is_bool = |x: Obj| x == capi::Py_True() || x == capi::Py_False();
    // A truth test of anything else could run code before a hand-over.
    if !is_bool(training.0) || !is_bool(track.0) {
        return None;
    }
    let training_b = training.0 == capi::Py_True();
    let track_b = track.0 == capi::Py_True();
    if training_b && track_b {
        let tracked = get!(slf, s.num_batches_tracked);
        if tracked.0 != none() {
            // Nothing read so far is used after `add_`, nor held across it
            // (torch's frame holds only the tensor whose method runs).
            drop((momentum, training, track));
            // The first step with an effect: from here on torch's code is not
            // handed the call again.
            let r = capi::PyObject_CallMethodOneArg(tracked.0, s.add_, c.one);
            drop(tracked);
            if r.is_null() {
                return Some(r);
            }
            capi::Py_DECREF(r);
            return Some(after_add(l, c, slf, input).unwrap_or(std::ptr::null_mut()));
        }
    }
    // No `add_`: nothing from the first read to `F.batch_norm`'s ops runs code.
    let running_mean = get!(slf, s.running_mean);
    let running_var = get!(slf, s.running_var);
    let weight = get!(slf, s.weight);
    let bias = get!(slf, s.bias);
    let eps = get!(slf, s.eps);
    // exponential_average_factor
    let factor = if momentum.0 == none() {
        Held(capi::PyFloat_FromDouble(0.0))
    } else {
        capi::Py_INCREF(momentum.0);
        Held(momentum.0)
    };
    if factor.0.is_null() {
        return Some(std::ptr::null_mut());
    }
    let bn_training = training_b || (running_mean.0 == none() && running_var.0 == none());
    let pass_stats = !training_b || track_b;
    let mean = if pass_stats { running_mean.0 } else { none() };
    let var = if pass_stats { running_var.0 } else { none() };
    let args = BnArgs {
        input,
        mean,
        var,
        weight: weight.0,
        bias: bias.0,
        training: bn_training,
        factor: factor.0,
        eps: eps.0,
    };
    // The guard held at the call's start and nothing ran since: `F.batch_norm`
    // is torch's, with its body and globals.
    Some(finish(l, c, l.o[BN_F], true, &args))
}

/// The reads after `add_`, each made where torch's code makes it. A read
/// that repeats one made since code last could run (plain reads and truth
/// tests of bools run none) reuses its value: it would find the same. The
/// values kept for that are dropped before anything that may run code, so
/// nothing is held across it that torch's frame would not hold.
struct Reads<'a> {
    l: &'a Layer,
    slf: Obj,
    /// (name, value) of the plain reads since code last could run.
    seen: Vec<(Obj, Held)>,
    /// The guard's answer since code last could run.
    guard: Option<bool>,
}

impl Reads<'_> {
    /// Code may run next: forget what it could change.
    fn may_run_code(&mut self) {
        self.seen.clear();
        self.guard = None;
    }

    /// `self.<name>`, as the bytecode reads it: a plain read where it is one
    /// (no code runs), else the full getattr (whatever it runs, it runs here,
    /// once).
    unsafe fn attr(&mut self, name: Obj) -> Result<Held, ()> {
        if let Some((_, v)) = self.seen.iter().find(|(n, _)| *n == name) {
            capi::Py_INCREF(v.0);
            return Ok(Held(v.0));
        }
        // `read` answers as fastmodule's `tp_getattro` would, with torch's
        // `__getattr__` reproduced: only while that is what a read runs.
        if super::getattr_intact() && !crate::instance::fast::switched_off() {
            match read(self.slf, name) {
                Some(v) if v.is_null() => return Err(()),
                Some(v) => {
                    capi::Py_INCREF(v);
                    self.seen.push((name, Held(v)));
                    return Ok(Held(v));
                }
                None => {}
            }
        }
        self.may_run_code();
        let v = capi::PyObject_GetAttr(self.slf, name);
        if v.is_null() {
            Err(())
        } else {
            Ok(Held(v))
        }
    }

    /// `if <x>:` on a value just read, released right after the test as the
    /// bytecode releases it.
    unsafe fn test(&mut self, x: Held) -> Result<bool, ()> {
        if x.0 != capi::Py_True() && x.0 != capi::Py_False() {
            self.may_run_code();
        }
        truth(x.0)
    }

    /// Does the guard hold (asked where torch's code reads a guarded global)?
    unsafe fn guard(&mut self) -> bool {
        *self.guard.get_or_insert_with(|| self.l.guard_holds())
    }

    /// `self.<stat> if not self.training or self.track_running_stats else
    /// None` (`stat`: `running_mean` or `running_var`).
    unsafe fn stat_arg(&mut self, c: &Common, stat: Obj) -> Result<Held, ()> {
        let s = &c.s;
        let training = self.attr(s.training)?;
        let pass = !self.test(training)? || {
            let track = self.attr(s.track_running_stats)?;
            self.test(track)?
        };
        if pass {
            self.attr(stat)
        } else {
            capi::Py_INCREF(none());
            Ok(Held(none()))
        }
    }
}

/// The rest of `_BatchNorm.forward` after `self.num_batches_tracked.add_(1)`,
/// which may have released the GIL or run Python code: every attribute, and
/// the globals torch's code reads from here on, is read again where torch
/// reads it, as often (where a read can be seen), in its order, and may now
/// be anything.
unsafe fn after_add(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Result<Obj, ()> {
    let s = &c.s;
    let mut r = Reads {
        l,
        slf,
        seen: Vec::with_capacity(8),
        guard: None,
    };
    // `if self.momentum is None: exponential_average_factor = 1.0 /
    // float(self.num_batches_tracked) else: ... = self.momentum`
    let momentum_none = r.attr(s.momentum)?.0 == none();
    let factor = if momentum_none {
        // `float` is loaded before `self.num_batches_tracked` is read.
        let float = if r.guard() {
            None
        } else {
            r.may_run_code();
            Some(load_global(l.globals(), s.float).map_err(|_| ())?)
        };
        let tracked = r.attr(s.num_batches_tracked)?;
        // `float(x)` converts a tensor through its op (a dispatch mode sees it).
        r.may_run_code();
        let f = Held(match &float {
            // The builtin (not shadowed: the guard): `float(x)` is `PyNumber_Float(x)`.
            None => capi::PyNumber_Float(tracked.0),
            Some(f) => capi::PyObject_CallOneArg(f.as_ptr(), tracked.0),
        });
        if f.0.is_null() {
            return Err(());
        }
        drop((tracked, float));
        let q = capi::PyNumber_TrueDivide(c.float_one, f.0);
        if q.is_null() {
            return Err(());
        }
        Held(q)
    } else {
        r.attr(s.momentum)?
    };
    // `if self.training: bn_training = True else: bn_training =
    // (self.running_mean is None) and (self.running_var is None)`
    let training = r.attr(s.training)?;
    let bn_training = if r.test(training)? {
        true
    } else {
        // Each value released after its `is None`, before the next read.
        let mean_none = r.attr(s.running_mean)?.0 == none();
        mean_none && r.attr(s.running_var)?.0 == none()
    };
    // `F.batch_norm` is looked up before its arguments are evaluated.
    let (func, native) = if r.guard() {
        capi::Py_INCREF(l.o[BN_F]);
        (Held(l.o[BN_F]), true)
    } else {
        r.may_run_code();
        let f = load_global(l.globals(), c.f_global).map_err(|_| ())?;
        let v = capi::PyObject_GetAttr(f.as_ptr(), s.batch_norm);
        if v.is_null() {
            return Err(());
        }
        (Held(v), false)
    };
    let mean = r.stat_arg(c, s.running_mean)?;
    let var = r.stat_arg(c, s.running_var)?;
    let weight = r.attr(s.weight)?;
    let bias = r.attr(s.bias)?;
    let eps = r.attr(s.eps)?;
    // `F.batch_norm`'s body natively only if it is still torch's function
    // with the globals it reads (the reads above may have run code) and the
    // tensor methods it calls are torch's.
    let native = native && func.0 == l.o[BN_F] && r.guard() && c.tensor_methods_intact();
    // The call runs code: nothing kept beyond torch's arguments.
    r.may_run_code();
    let args = BnArgs {
        input,
        mean: mean.0,
        var: var.0,
        weight: weight.0,
        bias: bias.0,
        training: bn_training,
        factor: factor.0,
        eps: eps.0,
    };
    let out = finish(l, c, func.0, native, &args);
    if out.is_null() {
        Err(())
    } else {
        Ok(out)
    }
}

/// The arguments of `F.batch_norm(input, running_mean, running_var,
/// self.weight, self.bias, bn_training, exponential_average_factor, self.eps)`.
struct BnArgs {
    input: Obj,
    mean: Obj,
    var: Obj,
    weight: Obj,
    bias: Obj,
    training: bool,
    factor: Obj,
    eps: Obj,
}

/// `func(*args)`, `func` being the `F.batch_norm` torch's code looked up;
/// `native`: it is torch's, and its body may run here.
unsafe fn finish(l: &Layer, c: &Common, func: Obj, native: bool, a: &BnArgs) -> Obj {
    let flag = if a.training {
        capi::Py_True()
    } else {
        capi::Py_False()
    };
    let f_args = [
        a.input, a.mean, a.var, a.weight, a.bias, flag, a.factor, a.eps,
    ];
    if !native {
        return call(func, &f_args, std::ptr::null_mut());
    }
    match batch_norm_body(
        c, a.input, a.mean, a.var, a.weight, a.bias, a.training, a.eps,
    ) {
        Err(()) => std::ptr::null_mut(),
        Ok(false) => call(func, &f_args, std::ptr::null_mut()),
        Ok(true) => {
            let enabled = Held(cudnn_enabled(c));
            if enabled.0.is_null() {
                return std::ptr::null_mut();
            }
            let args = [
                a.input, a.weight, a.bias, a.mean, a.var, flag, a.factor, a.eps, enabled.0,
            ];
            call(l.o[BN_OP], &args, std::ptr::null_mut())
        }
    }
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
