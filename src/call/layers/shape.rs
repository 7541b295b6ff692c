//! `nn.Identity.forward` (`return input`) and `nn.Flatten.forward`
//! (`input.flatten(self.start_dim, self.end_dim)`).
use super::table::{get, Common, Obj};
use crate::cpython::capi;

pub(super) unsafe fn identity(input: Obj) -> Option<Obj> {
    capi::Py_INCREF(input);
    Some(input)
}

pub(super) unsafe fn flatten(c: &Common, slf: Obj, input: Obj) -> Option<Obj> {
    let start = get!(slf, c.s.start_dim);
    let end = get!(slf, c.s.end_dim);
    let args = [input, start.0, end.0];
    Some(capi::PyObject_VectorcallMethod(
        c.s.flatten,
        args.as_ptr(),
        3,
        std::ptr::null_mut(),
    ))
}
