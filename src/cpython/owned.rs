//! An owned (strong) reference to a Python object.
use pyo3::ffi;
use std::ptr::NonNull;

/// A strong reference, released on drop. Unlike a borrowed `*mut PyObject`,
/// it stays valid while code that may drop the container's reference runs.
pub struct Owned(NonNull<ffi::PyObject>);

impl Owned {
    /// A new strong reference to a borrowed, non-null pointer.
    ///
    /// # Safety
    /// `p` must be a live object and the GIL held.
    #[inline(always)]
    pub unsafe fn from_borrowed(p: NonNull<ffi::PyObject>) -> Owned {
        ffi::Py_INCREF(p.as_ptr());
        Owned(p)
    }

    /// A new strong reference to a borrowed pointer the caller knows is not
    /// null (an item just read from a container, a result just checked).
    ///
    /// # Safety
    /// `p` must be a live, non-null object and the GIL held.
    #[inline(always)]
    pub unsafe fn new_ref(p: *mut ffi::PyObject) -> Owned {
        Owned::from_borrowed(NonNull::new_unchecked(p))
    }

    /// Take over a new reference (a call's result), or None for null.
    ///
    /// # Safety
    /// `p` must be a new reference (or null) and the GIL held.
    #[inline(always)]
    pub unsafe fn from_owned_ptr(p: *mut ffi::PyObject) -> Option<Owned> {
        NonNull::new(p).map(Owned)
    }

    /// Give the reference to the caller (a result returned to Python).
    #[inline(always)]
    pub fn into_ptr(self) -> *mut ffi::PyObject {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The object, borrowed from this reference.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut ffi::PyObject {
        self.0.as_ptr()
    }
}

impl Drop for Owned {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: an Owned exists only with the GIL held (see the constructors).
        unsafe { ffi::Py_DECREF(self.0.as_ptr()) }
    }
}
