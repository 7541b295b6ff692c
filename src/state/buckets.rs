//! `load_state_dict`'s per-child buckets: the parent's dict split once by
//! child name (same entries, same order) instead of torch's scan of the
//! whole dict per child; None wherever torch's own scan must decide.
use super::load_from_state_dict::exact_dict;
use crate::cpython::capi;
use crate::cpython::interned::intern;
use crate::cpython::strs::ascii_bytes;
use crate::instance::attributes::exact_str;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// FNV-1a over a child name's bytes (names are short; no DoS concern: the
/// table is built from the module's own registry).
#[derive(Default)]
pub(super) struct NameHasher(u64);

impl std::hash::Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0 ^ 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }
}

pub(super) type NameSet<'a> =
    std::collections::HashSet<&'a [u8], std::hash::BuildHasherDefault<NameHasher>>;

pub(super) type NameTable<'a> =
    std::collections::HashMap<&'a [u8], usize, std::hash::BuildHasherDefault<NameHasher>>;

/// Split `local` by child name: `{name: {key: value}}` for keys
/// `prefix + name + "." + ...` where `name` is a child's name (keys under any
/// other head are never asked for); None when torch's own scan must decide.
pub(super) fn build_buckets<'py>(
    py: Python<'py>,
    local: &Bound<'py, PyAny>,
    prefix: &Bound<'py, PyAny>,
    children: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    // A key that is not an exact str is torch's scan's to meet; checked
    // first, by reading the table: iterating an `OrderedDict` looks each key
    // up, which runs a colliding key's `__eq__`.
    if !exact_str(prefix)
        || (unsafe { capi::PyDict_Check(local.as_ptr()) } != 0
            && !unsafe { crate::cpython::str_keys::all_str(local.as_ptr()) })
    {
        return Ok(None);
    }
    let mut names: Vec<Bound<'py, PyAny>> = Vec::new();
    for name in children.try_iter()? {
        let name = name?;
        if !exact_str(&name) {
            return Ok(None);
        }
        let n = name.as_ptr();
        let len = unsafe { capi::PyUnicode_GET_LENGTH(n) };
        match unsafe { capi::PyUnicode_FindChar(n, '.' as u32, 0, len, 1) } {
            -2 => return Err(PyErr::fetch(py)),
            -1 => {}
            _ => return Ok(None),
        }
        names.push(name);
    }
    // Child names by their bytes, where the prefix and every name are ASCII:
    // a key's head is then found without building it as a str.
    let prefix_bytes = unsafe { ascii_bytes(prefix.as_ptr()) };
    let mut table = NameTable::default();
    let mut by_bytes = prefix_bytes.is_some();
    for (i, n) in names.iter().enumerate() {
        match unsafe { ascii_bytes(n.as_ptr()) } {
            Some(b) => {
                table.insert(b, i);
            }
            None => by_bytes = false,
        }
    }
    let out = PyDict::new(py);
    let mut buckets: Vec<Option<Bound<'py, PyAny>>> = vec![None; names.len()];
    let start = prefix.len()? as isize;
    let mut add = |key: &Bound<'py, PyAny>, value: &Bound<'py, PyAny>| -> PyResult<bool> {
        if !exact_str(key) {
            return Ok(false);
        }
        unsafe {
            let k = key.as_ptr();
            if let (true, Some(p), Some(kb)) = (by_bytes, prefix_bytes, ascii_bytes(k)) {
                if !kb.starts_with(p) {
                    return Ok(true);
                }
                let rest = &kb[p.len()..];
                let Some(dot) = rest.iter().position(|&c| c == b'.') else {
                    return Ok(true);
                };
                let Some(&i) = table.get(&rest[..dot]) else {
                    return Ok(true);
                };
                let bucket = match &buckets[i] {
                    Some(b) => b,
                    None => {
                        let b = PyDict::new(py).into_any();
                        out.set_item(&names[i], &b)?;
                        buckets[i].insert(b)
                    }
                };
                bucket.set_item(key, value)?;
                return Ok(true);
            }
            let len = capi::PyUnicode_GET_LENGTH(k);
            if capi::PyUnicode_Tailmatch(k, prefix.as_ptr(), 0, len, -1) != 1 {
                return Ok(true);
            }
            let dot = capi::PyUnicode_FindChar(k, '.' as u32, start, len, 1);
            if dot == -2 {
                return Err(PyErr::fetch(py));
            }
            if dot < 0 {
                return Ok(true);
            }
            let head = Bound::from_owned_ptr_or_err(py, capi::PyUnicode_Substring(k, start, dot))?;
            let bucket = match out.get_item(&head)? {
                Some(b) => b,
                None => {
                    let b = PyDict::new(py).into_any();
                    out.set_item(&head, &b)?;
                    // Found again by bytes for a later ASCII key.
                    if let Some(i) = names.iter().position(|n| n.eq(&head).unwrap_or(false)) {
                        buckets[i] = Some(b.clone());
                    }
                    b
                }
            };
            bucket.set_item(key, value)?;
            Ok(true)
        }
    };
    if exact_dict(local) {
        // An exact dict iterates in its own order, with no code run.
        let d = local.as_ptr();
        let mut pos: capi::Py_ssize_t = 0;
        let mut k: *mut capi::PyObject = std::ptr::null_mut();
        let mut v: *mut capi::PyObject = std::ptr::null_mut();
        while unsafe { capi::PyDict_Next(d, &mut pos, &mut k, &mut v) } != 0 {
            let (key, value) = unsafe {
                (
                    Bound::from_borrowed_ptr(py, k),
                    Bound::from_borrowed_ptr(py, v),
                )
            };
            if !add(&key, &value)? {
                return Ok(None);
            }
        }
    } else {
        for kv in local.call_method0(intern!(py, "items"))?.try_iter()? {
            let (key, value): (Bound<'py, PyAny>, Bound<'py, PyAny>) = kv?.extract()?;
            if !add(&key, &value)? {
                return Ok(None);
            }
        }
    }
    Ok(Some(out))
}
