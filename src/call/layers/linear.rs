//! `nn.Linear.forward`: `F.linear(input, self.weight, self.bias)`.
use super::registry_only;
use super::{cached, is, Checked, Leaves};
use crate::call::call_cache::{set_leaf, Entry, Leaf, LeafKind};
use crate::cpython::capi;
use crate::cpython::quiet;
use crate::cpython::validity::dict_version;
use crate::instance::attributes::{instance_dict, plain_attr, Plain};

static LINEAR_GLOBALS: Checked<2> = Checked::new();

/// `self.weight`/`self.bias` of a Linear, remembered on the call cache entry
/// when both come straight from an exact `_parameters` dict.
unsafe fn remember_linear(
    l: &Leaves,
    slf: *mut capi::PyObject,
    entry: *mut Entry,
    w: *mut capi::PyObject,
    b: *mut capi::PyObject,
) {
    if entry.is_null() {
        return;
    }
    let n = &l.names;
    let tp = capi::Py_TYPE(slf);
    let dict = instance_dict(slf);
    // Only quiet dicts (the instance dict and `_parameters`): no lookup below
    // runs code, so what one read stays true for the next and for the entry.
    if dict.is_null()
        || !quiet::dict(dict)
        || !registry_only(tp, dict, n.weight)
        || !registry_only(tp, dict, n.bias)
    {
        return;
    }
    let reg = match plain_attr(tp, dict, n.parameters) {
        Plain::Found(d) if quiet::dict(d) => d,
        Plain::Error => {
            capi::PyErr_Clear();
            return;
        }
        _ => return,
    };
    if capi::PyDict_GetItemWithError(reg, n.weight) != w
        || capi::PyDict_GetItemWithError(reg, n.bias) != b
    {
        capi::PyErr_Clear();
        return;
    }
    let leaf = Leaf {
        kind: LeafKind::Linear,
        reg,
        reg_version: dict_version(reg),
        a: w,
        b,
    };
    set_leaf(entry, tp, dict, leaf);
}

/// `F.linear(input, self.weight, self.bias)`.
pub(super) unsafe fn linear(
    l: &Leaves,
    slf: *mut capi::PyObject,
    input: *mut capi::PyObject,
    entry: *mut Entry,
) -> Option<*mut capi::PyObject> {
    let n = &l.names;
    let ok = LINEAR_GLOBALS.pass([l.linear_globals, l.functional_dict], || {
        is(l.linear_globals, n.f, l.functional) && is(l.functional_dict, n.linear, l.f_linear)
    });
    if !ok {
        return None;
    }
    let (weight, bias) = match cached(entry, LeafKind::Linear) {
        // Borrowed from the unchanged `_parameters`; held across the call as
        // torch's frame would hold them.
        Some((w, b)) => {
            capi::Py_INCREF(w);
            capi::Py_INCREF(b);
            (w, b)
        }
        None => {
            let w = capi::PyObject_GetAttr(slf, n.weight);
            if w.is_null() {
                return Some(w);
            }
            let b = capi::PyObject_GetAttr(slf, n.bias);
            if b.is_null() {
                capi::Py_DECREF(w);
                return Some(b);
            }
            remember_linear(l, slf, entry, w, b);
            (w, b)
        }
    };
    let args = [input, weight, bias];
    let r = capi::PyObject_Vectorcall(l.f_linear, args.as_ptr(), 3, std::ptr::null_mut());
    capi::Py_DECREF(weight);
    capi::Py_DECREF(bias);
    Some(r)
}
