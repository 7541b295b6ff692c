//! Reads of CPython's dict objects beyond the C API: the entry count
//! (`ma_used`), and `OrderedDict`'s linked-list state (`od_state`, at an
//! offset verified once on a live `OrderedDict`).
use pyo3::ffi;
use pyo3::prelude::*;

/// The number of entries of `d`, an exact `dict` or a subclass (no code runs).
///
/// # Safety
/// GIL held; `d` a live dict.
#[inline(always)]
pub unsafe fn used(d: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    (*(d as *mut ffi::PyDictObject)).ma_used
}

/// A value that changes whenever `d` is mutated (its version), plus, for an
/// exact `OrderedDict` (`odict`: its type, if known), its linked-list state
/// (which also moves on `move_to_end`). None for non-dicts.
pub fn dict_version_of(
    py: Python<'_>,
    d: &Bound<'_, PyAny>,
    odict: Option<*mut ffi::PyTypeObject>,
) -> PyResult<Option<(u64, u64)>> {
    if !d.is_instance_of::<pyo3::types::PyDict>() {
        return Ok(None);
    }
    let tag = unsafe { super::validity::dict_version(d.as_ptr()) };
    let is_odict = odict.is_some_and(|t| unsafe { ffi::Py_TYPE(d.as_ptr()) } == t);
    let od_state = if is_odict {
        match odict_state_offset(py)? {
            Some(off) => unsafe { *((d.as_ptr() as *const u8).add(off) as *const u64) },
            // Layout not recognised: report "always changed".
            None => u64::MAX - tag,
        }
    } else {
        0
    };
    Ok(Some((tag, od_state)))
}

/// Offset of `od_state` in CPython's `PyODictObject` (after the dict and five
/// pointer-sized fields), verified once on a live OrderedDict.
fn odict_state_offset(py: Python<'_>) -> PyResult<Option<usize>> {
    static OFFSET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if let Some(o) = OFFSET.get() {
        return Ok(*o);
    }
    let off = std::mem::size_of::<ffi::PyDictObject>() + 5 * std::mem::size_of::<usize>();
    let od = py.import("collections")?.getattr("OrderedDict")?.call0()?;
    let read =
        |o: &Bound<'_, PyAny>| unsafe { *((o.as_ptr() as *const u8).add(off) as *const u64) };
    let ok = (|| -> PyResult<bool> {
        let basic = unsafe { (*(od.get_type().as_ptr() as *mut ffi::PyTypeObject)).tp_basicsize };
        if basic < (off + 8) as isize {
            return Ok(false);
        }
        od.set_item("a", 1)?;
        od.set_item("b", 2)?;
        let s0 = read(&od);
        od.call_method1("move_to_end", ("a",))?;
        let s1 = read(&od);
        od.call_method1("move_to_end", ("b",))?;
        let s2 = read(&od);
        Ok(s1 != s0 && s2 != s1)
    })()?;
    let result = if ok { Some(off) } else { None };
    let _ = OFFSET.set(result);
    Ok(result)
}
