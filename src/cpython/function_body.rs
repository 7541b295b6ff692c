//! A Python function as it was when a native path took over its body: its
//! code object, positional defaults and keyword defaults.
//!
//! Assigning `__code__`, `__defaults__` or `__kwdefaults__` (IPython's
//! `%autoreload`, hot-reload tools, test doubles) keeps the function's
//! identity and its class's version tag, so neither can tell that the body
//! changed; [`Body::intact`] compares the three pointers, running no code.
//! The captured objects are held, so a new object can never reuse the address
//! of one that died and pass for it.
use super::capi;
use super::Owned;

/// The body of one Python function, as captured.
pub struct Body {
    func: *mut capi::PyObject,
    code: Owned,
    defaults: Option<Owned>,
    kwdefaults: Option<Owned>,
    /// The function object's fields are where pyo3's layout of
    /// `PyFunctionObject` says (checked against the C API when captured):
    /// then [`Body::intact`] reads them in place instead of calling the API.
    direct: bool,
}

// SAFETY: strong references, read and released with the GIL held.
unsafe impl Send for Body {}
unsafe impl Sync for Body {}

impl Body {
    /// `func`'s body as it is now; None when `func` is not a Python function.
    /// `func` itself is borrowed: the caller keeps it alive as long as this.
    ///
    /// # Safety
    /// `func` is a live object; the GIL is held.
    pub unsafe fn of(func: *mut capi::PyObject) -> Option<Body> {
        if func.is_null() || capi::PyFunction_Check(func) == 0 {
            return None;
        }
        let held = |p: *mut capi::PyObject| (!p.is_null()).then(|| Owned::new_ref(p));
        let (code, defaults, kwdefaults) = (
            capi::PyFunction_GetCode(func),
            capi::PyFunction_GetDefaults(func),
            capi::PyFunction_GetKwDefaults(func),
        );
        Some(Body {
            func,
            code: held(code)?,
            defaults: held(defaults),
            kwdefaults: held(kwdefaults),
            direct: fields(func) == (code, defaults, kwdefaults),
        })
    }

    /// Is the function's code (and are its defaults) still what was captured?
    ///
    /// # Safety
    /// The GIL is held.
    #[inline(always)]
    pub unsafe fn intact(&self) -> bool {
        let ptr = |o: &Option<Owned>| o.as_ref().map_or(std::ptr::null_mut(), |o| o.as_ptr());
        let now = if self.direct {
            fields(self.func)
        } else {
            (
                capi::PyFunction_GetCode(self.func),
                capi::PyFunction_GetDefaults(self.func),
                capi::PyFunction_GetKwDefaults(self.func),
            )
        };
        now == (
            self.code.as_ptr(),
            ptr(&self.defaults),
            ptr(&self.kwdefaults),
        )
    }
}

type Fields = (
    *mut capi::PyObject,
    *mut capi::PyObject,
    *mut capi::PyObject,
);

/// A Python function's code, defaults and keyword defaults, read in place.
#[inline(always)]
unsafe fn fields(func: *mut capi::PyObject) -> Fields {
    let f = func as *mut capi::PyFunctionObject;
    ((*f).func_code, (*f).func_defaults, (*f).func_kwdefaults)
}
