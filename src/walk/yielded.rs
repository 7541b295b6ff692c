//! What the lazy walks yield: `(name, value)` pairs (or bare values for the
//! value-only variants) and dotted names `prefix + "." + key`, built
//! directly (one tuple and at most one concatenation per item).
use crate::cpython::capi;
use crate::cpython::interned::intern;
use pyo3::prelude::*;

/// `(name, value)`, or just `value` for the value-only variants.
pub(super) fn pair<'py>(
    py: Python<'py>,
    values: bool,
    name: Bound<'py, PyAny>,
    value: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if values {
        Ok(value)
    } else {
        two(py, name, value)
    }
}

/// The 2-tuple `(a, b)`, built directly (the walks build one per item).
#[inline(always)]
pub(super) fn two<'py>(
    py: Python<'py>,
    a: Bound<'py, PyAny>,
    b: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    unsafe {
        let t = Bound::from_owned_ptr_or_err(py, capi::PyTuple_New(2))?;
        capi::PyTuple_SET_ITEM(t.as_ptr(), 0, a.into_ptr());
        capi::PyTuple_SET_ITEM(t.as_ptr(), 1, b.into_ptr());
        Ok(t)
    }
}

/// `prefix + "." + name` with one concatenation per child, for a non-empty
/// exact-str prefix and an exact-str name (`dotted` caches `prefix + "."`);
/// None where `join`'s general rules apply.
pub(super) fn dotted_join<'py>(
    py: Python<'py>,
    dotted: &mut Option<Py<PyAny>>,
    prefix: &Bound<'py, PyAny>,
    name: &Bound<'py, PyAny>,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    unsafe {
        if capi::PyUnicode_CheckExact(prefix.as_ptr()) == 0
            || capi::PyUnicode_CheckExact(name.as_ptr()) == 0
            || capi::PyUnicode_GET_LENGTH(prefix.as_ptr()) == 0
        {
            return None;
        }
        if let Some(j) = crate::instance::qualified_names::cached(
            crate::instance::qualified_names::Kind::Dotted,
            prefix.as_ptr(),
            name.as_ptr(),
        ) {
            return Some(Ok(Bound::from_owned_ptr(py, j)));
        }
        if dotted.is_none() {
            let d = capi::PyUnicode_Concat(prefix.as_ptr(), intern!(py, ".").as_ptr());
            match Bound::from_owned_ptr_or_err(py, d) {
                Ok(d) => *dotted = Some(d.unbind()),
                Err(e) => return Some(Err(e)),
            }
        }
        let d = dotted.as_ref()?.as_ptr();
        let j = capi::PyUnicode_Concat(d, name.as_ptr());
        if !j.is_null() {
            crate::instance::qualified_names::store(
                crate::instance::qualified_names::Kind::Dotted,
                prefix.as_ptr(),
                name.as_ptr(),
                j,
            );
        }
        Some(Bound::from_owned_ptr_or_err(py, j))
    }
}
