//! Raising the exceptions torch raises, with torch's exact texts.
//!
//! Messages are assembled from Python `str` objects (never via Rust `String`)
//! so that any name a user can pass, lone surrogates included, round-trips.
use crate::cpython::capi;
use crate::cpython::type_cache::type_lookup;
use crate::cpython::types::getattro_slot;
use crate::torch_api::originals::Globals;
use std::ffi::CStr;

/// A piece of an error message.
#[derive(Clone, Copy)]
pub enum Part<'a> {
    Lit(&'a CStr),
    /// A borrowed object, formatted like an f-string field (`format(obj, "")`).
    Obj(*mut capi::PyObject),
}

/// Build the message; null with an exception set on failure.
pub unsafe fn join(g: &Globals, parts: &[Part<'_>]) -> *mut capi::PyObject {
    let list = capi::PyList_New(0);
    if list.is_null() {
        return list;
    }
    for p in parts {
        let s = match p {
            Part::Lit(c) => capi::PyUnicode_FromString(c.as_ptr()),
            Part::Obj(o) => capi::PyObject_Format(*o, g.names.empty),
        };
        if s.is_null() || capi::PyList_Append(list, s) < 0 {
            capi::Py_XDECREF(s);
            capi::Py_DECREF(list);
            return std::ptr::null_mut();
        }
        capi::Py_DECREF(s);
    }
    let r = capi::PyUnicode_Join(g.names.empty, list);
    capi::Py_DECREF(list);
    r
}

/// Raise `exc(message)`; always returns null for convenient tail calls.
pub unsafe fn raise(
    g: &Globals,
    exc: *mut capi::PyObject,
    parts: &[Part<'_>],
) -> *mut capi::PyObject {
    let msg = join(g, parts);
    if !msg.is_null() {
        // KeyError and friends must receive the message as their single
        // argument, exactly as `raise KeyError("...")` does.
        let e = capi::PyObject_CallOneArg(exc, msg);
        capi::Py_DECREF(msg);
        if !e.is_null() {
            capi::PyErr_SetObject(exc, e);
            capi::Py_DECREF(e);
        }
    }
    std::ptr::null_mut()
}

/// `torch.typename(obj)` as a new reference (null with an exception set).
pub unsafe fn typename(g: &Globals, obj: *mut capi::PyObject) -> *mut capi::PyObject {
    capi::PyObject_CallOneArg(g.typename, obj)
}

/// Messages of recent misses, by the identity of the two exact `str`s they
/// are made of (the class's `__name__` and the attribute's name): the same
/// two strings always make the same message, and the entry holds all three,
/// so an identity compare stays meaningful. A code object's constant name and
/// a class's `__name__` are the same objects on every miss, so code that asks
/// `getattr(model, "flag", None)` again and again (Hugging Face's `to`,
/// `train`) gets its message without formatting it anew. Direct-mapped; only
/// touched with the GIL held (the slot and the native `__getattr__` body).
struct Misses(std::cell::UnsafeCell<[[*mut capi::PyObject; 3]; MISS_SLOTS]>);
const MISS_SLOTS: usize = 16;
// SAFETY: read and written only with the GIL held.
unsafe impl Sync for Misses {}
static MISSES: Misses = Misses(std::cell::UnsafeCell::new(
    [[std::ptr::null_mut(); 3]; MISS_SLOTS],
));

/// The pieces of `f"'{tname}' object has no attribute '{name}'"`.
fn miss_parts<'a>(tname: *mut capi::PyObject, name: *mut capi::PyObject) -> [Part<'a>; 5] {
    [
        Part::Lit(c"'"),
        Part::Obj(tname),
        Part::Lit(c"' object has no attribute '"),
        Part::Obj(name),
        Part::Lit(c"'"),
    ]
}

/// `f"'{tname}' object has no attribute '{name}'"` for two exact strs (an
/// f-string field of an exact str is the str itself), as a new reference.
unsafe fn miss_message(
    g: &Globals,
    tname: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let slot = ((tname as usize >> 4) ^ (name as usize >> 4).rotate_left(3)) % MISS_SLOTS;
    // SAFETY: the GIL is held (see `Misses`).
    let hit = (*MISSES.0.get())[slot];
    if hit[0] == tname && hit[1] == name {
        capi::Py_INCREF(hit[2]);
        return hit[2];
    }
    // Building the message allocates: on 3.11 the cyclic GC may run a
    // finalizer there, which may miss an attribute too and fill this slot.
    let msg = join(g, &miss_parts(tname, name));
    if msg.is_null() {
        return msg;
    }
    // SAFETY: as above; taken after `join`, and nothing below runs Python
    // code while it is alive (freeing the strs of the old entry runs none).
    let entry = &mut (*MISSES.0.get())[slot];
    let old = *entry;
    capi::Py_INCREF(tname);
    capi::Py_INCREF(name);
    capi::Py_INCREF(msg);
    *entry = [tname, name, msg];
    for o in old {
        capi::Py_XDECREF(o);
    }
    msg
}

/// nn.Module.__getattr__'s final
/// `AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")`.
pub unsafe fn no_attribute(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> *mut capi::PyObject {
    let tname = capi::PyObject_GetAttr(
        capi::Py_TYPE(obj) as *mut capi::PyObject,
        g.names.dunder_name,
    );
    if tname.is_null() {
        return tname;
    }
    if capi::PyUnicode_CheckExact(tname) == 0 || capi::PyUnicode_CheckExact(name) == 0 {
        // A str subclass formats through its own `__format__`: as torch's
        // f-string does, every time.
        raise(g, capi::PyExc_AttributeError, &miss_parts(tname, name));
        capi::Py_DECREF(tname);
        return std::ptr::null_mut();
    }
    let msg = miss_message(g, tname, name);
    capi::Py_DECREF(tname);
    if !msg.is_null() {
        // `raise AttributeError(msg)`: CPython makes the same instance from
        // the message when the exception is looked at (at once where one is
        // being handled, for its context), as for `PyErr_SetString`; a
        // `getattr(obj, name, default)` that only clears it never makes it
        // on 3.11.
        capi::PyErr_SetObject(capi::PyExc_AttributeError, msg);
        capi::Py_DECREF(msg);
    }
    std::ptr::null_mut()
}

/// Can `type(obj).__name__`, read for a class `tp`, run code or fail? No
/// when the metaclass reads attributes with `type`'s own `tp_getattro` and
/// resolves `__name__` to `type`'s getter (a data descriptor: it wins over
/// the class's own dict), which only returns the stored name. A metaclass
/// that overrides `__name__` (a property), `__getattribute__` or
/// `__getattr__` makes the read observable. Two slot reads and a cached
/// class lookup: cheap enough for each miss.
unsafe fn class_name_read_is_quiet(g: &Globals, tp: *mut capi::PyTypeObject) -> bool {
    let meta = capi::Py_TYPE(tp as *mut capi::PyObject);
    let type_type = std::ptr::addr_of_mut!(capi::PyType_Type);
    // `type` itself cannot be changed (a static, immutable type).
    if meta == type_type {
        return true;
    }
    let same_getattro = match (getattro_slot(meta), getattro_slot(type_type)) {
        (Some(a), Some(b)) => std::ptr::fn_addr_eq(a, b),
        _ => false,
    };
    same_getattro && type_lookup(meta, g.names.dunder_name) == g.orig.type_name
}

/// A miss of `nn.Module.__getattr__` for a caller that only asks whether it
/// missed (`hasattr(self, name)` in `register_parameter`, `register_buffer`
/// and `add_module`): Ok(()) where torch's raise would have been an
/// AttributeError, Err(()) with the exception set where building it raised
/// something else. torch builds the message before raising, so it reads
/// `type(self).__name__` and formats it and `name` (f-string fields) on
/// every miss; that is skipped only where none of it can run code (see
/// [`class_name_read_is_quiet`]; an exact-str class name and attribute name
/// format as themselves), else the message is built as
/// [`no_attribute`] builds it, and dropped.
pub unsafe fn missed(
    g: &Globals,
    obj: *mut capi::PyObject,
    name: *mut capi::PyObject,
) -> Result<(), ()> {
    let tp = capi::Py_TYPE(obj);
    if capi::PyUnicode_CheckExact(name) != 0 && class_name_read_is_quiet(g, tp) {
        // What `type.__dict__["__name__"]` returns for `tp`: the stored name,
        // which `type.__name__ = ...` may have made a str subclass (whose
        // `__format__` the f-string would call).
        let tname = capi::PyType_GetName(tp);
        if tname.is_null() {
            return Err(());
        }
        let exact = capi::PyUnicode_CheckExact(tname) != 0;
        capi::Py_DECREF(tname);
        if exact {
            return Ok(());
        }
    }
    no_attribute(g, obj, name);
    if capi::PyErr_ExceptionMatches(capi::PyExc_AttributeError) != 0 {
        capi::PyErr_Clear();
        Ok(())
    } else {
        Err(())
    }
}

/// Raised from a slot when `_core.init` never ran (cannot happen through the
/// public package, which initialises before installing any slot).
pub unsafe fn not_initialised() -> *mut capi::PyObject {
    capi::PyErr_SetString(
        capi::PyExc_RuntimeError,
        c"fastmodule._core is not initialised".as_ptr(),
    );
    std::ptr::null_mut()
}
