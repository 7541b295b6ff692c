//! Reads of CPython's str objects beyond the stable accessors: the bytes of
//! a compact ASCII str.
//!
//! Up to 3.13 pyo3 describes `PyASCIIObject`'s state bits and data, and
//! those accessors are used. On 3.14 pyo3 leaves them out, so the same
//! layout is read here (the state word after `length` and `hash`: `interned`
//! 2 bits, `kind` 3, `compact` 1, `ascii` 1; a compact ASCII str's bytes
//! right after the struct) and [`init`] checks it at import on strs whose
//! answers are known; where any answer differs, [`ascii_bytes`] answers None
//! for every str and the callers take their general path.
#[cfg(not(Py_3_14))]
use pyo3::ffi;

/// The bytes of an exact, compact ASCII str (None for any other str).
#[cfg(not(Py_3_14))]
pub unsafe fn ascii_bytes<'a>(s: *mut ffi::PyObject) -> Option<&'a [u8]> {
    if ffi::PyUnicode_CheckExact(s) == 0 || ffi::PyUnicode_IS_ASCII(s) == 0 {
        return None;
    }
    let len = ffi::PyUnicode_GET_LENGTH(s) as usize;
    Some(std::slice::from_raw_parts(
        ffi::PyUnicode_1BYTE_DATA(s),
        len,
    ))
}

/// Nothing to check where pyo3 describes the layout.
#[cfg(not(Py_3_14))]
pub fn init(_py: pyo3::Python<'_>) -> bool {
    true
}

/// Is the compact ASCII layout read (always, where pyo3 describes it)?
#[cfg(not(Py_3_14))]
pub fn known() -> bool {
    true
}

#[cfg(Py_3_14)]
mod layout {
    use pyo3::ffi;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// `PyObject_HEAD`, `Py_ssize_t length`, `Py_hash_t hash`, then the state.
    const STATE: usize = std::mem::size_of::<ffi::PyObject>() + 2 * std::mem::size_of::<isize>();
    /// `sizeof(PyASCIIObject)`: the state word padded to pointer alignment.
    const DATA: usize = STATE + std::mem::size_of::<usize>();
    const COMPACT: u32 = 1 << 5;
    const ASCII: u32 = 1 << 6;
    const KIND_1BYTE: u32 = 1 << 2;
    const KIND_MASK: u32 = 0b111 << 2;

    static KNOWN: AtomicBool = AtomicBool::new(false);

    #[inline(always)]
    unsafe fn state(s: *mut ffi::PyObject) -> u32 {
        *((s as *const u8).add(STATE) as *const u32)
    }

    /// Is `s` compact ASCII by the layout above?
    #[inline(always)]
    unsafe fn compact_ascii(s: *mut ffi::PyObject) -> bool {
        let st = state(s);
        st & (COMPACT | ASCII) == COMPACT | ASCII && st & KIND_MASK == KIND_1BYTE
    }

    pub unsafe fn ascii_bytes<'a>(s: *mut ffi::PyObject) -> Option<&'a [u8]> {
        if !KNOWN.load(Ordering::Relaxed) || ffi::PyUnicode_CheckExact(s) == 0 || !compact_ascii(s)
        {
            return None;
        }
        let len = ffi::PyUnicode_GetLength(s) as usize;
        Some(std::slice::from_raw_parts((s as *const u8).add(DATA), len))
    }

    /// Check the layout on strs whose answers are known: made now (so not
    /// statically allocated), ASCII and not, one and two bytes a character,
    /// empty and long. True when every answer and every byte is as expected.
    pub fn init(py: pyo3::Python<'_>) -> bool {
        let cases: [(&str, bool); 6] = [
            ("abc", true),
            ("state_dict.weight", true),
            ("", true),
            ("caf\u{e9}", false),
            ("\u{20ac}uro", false),
            ("\u{1f600}", false),
        ];
        let ok = cases.iter().all(|&(text, ascii)| {
            // A fresh str: `PyUnicode_FromStringAndSize` copies the UTF-8.
            let Ok(len) = isize::try_from(text.len()) else {
                return false;
            };
            let s = unsafe {
                pyo3::Bound::from_owned_ptr_or_opt(
                    py,
                    ffi::PyUnicode_FromStringAndSize(text.as_ptr().cast(), len),
                )
            };
            let Some(s) = s else {
                unsafe { ffi::PyErr_Clear() };
                return false;
            };
            let p = s.as_ptr();
            unsafe {
                if compact_ascii(p) != ascii {
                    return false;
                }
                if !ascii {
                    return true;
                }
                let n = ffi::PyUnicode_GetLength(p) as usize;
                n == text.len()
                    && std::slice::from_raw_parts((p as *const u8).add(DATA), n + 1)
                        == [text.as_bytes(), b"\0"].concat().as_slice()
            }
        });
        KNOWN.store(ok, Ordering::Relaxed);
        ok
    }

    pub fn known() -> bool {
        KNOWN.load(Ordering::Relaxed)
    }
}

#[cfg(Py_3_14)]
pub use layout::{ascii_bytes, init, known};
