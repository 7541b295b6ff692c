//! `nn.Conv1d`/`nn.Conv2d`: `forward` is `self._conv_forward(input,
//! self.weight, self.bias)` (the class's function, no instance attribute of
//! that name), whose body for `padding_mode == "zeros"` is `F.conv<n>d(input,
//! weight, bias, self.stride, self.padding, self.dilation, self.groups)`
//! (torch's builtin). Another padding mode calls torch's `_conv_forward`.
use super::table::{call, get, Common, Layer, Obj};
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::instance::attributes::instance_dict;

/// The class's `_conv_forward`, `F.conv1d` / `F.conv2d`.
pub(super) const OBJS: &[&str] = &["conv_forward", "op"];
const CONV_FORWARD: usize = 0;
const OP: usize = 1;

pub(super) unsafe fn conv(l: &Layer, c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let s = &c.s;
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    // Only a quiet instance dict is asked (a pre-hook may have given it a
    // non-str key since the call's checks): a lookup in any other would run
    // a key's `__eq__` that torch's `self._conv_forward` then runs again.
    if type_lookup(tp, s._conv_forward) != l.o[CONV_FORWARD]
        || dict.is_null()
        || !crate::cpython::quiet::dict(dict)
        || capi::PyDict_Contains(dict, s._conv_forward) != 0
    {
        capi::PyErr_Clear();
        return None;
    }
    let weight = get!(slf, s.weight);
    let bias = get!(slf, s.bias);
    let mode = get!(slf, s.padding_mode);
    let zeros =
        capi::PyUnicode_CheckExact(mode.0) != 0 && capi::PyUnicode_Compare(mode.0, s.zeros) == 0;
    if !zeros {
        capi::PyErr_Clear();
        let args = [slf, input, weight.0, bias.0];
        return Some(call(l.o[CONV_FORWARD], &args, std::ptr::null_mut()));
    }
    let stride = get!(slf, s.stride);
    let padding = get!(slf, s.padding);
    let dilation = get!(slf, s.dilation);
    let groups = get!(slf, s.groups);
    let args = [
        input, weight.0, bias.0, stride.0, padding.0, dilation.0, groups.0,
    ];
    Some(call(l.o[OP], &args, std::ptr::null_mut()))
}
