//! fastmodule's native core: `torch.nn.Module` hot paths in Rust.
//!
//! Folders by concern, in layers; a folder uses only the layers below it
//! (`python scripts/src_graph.py` prints the graph and fails on a cycle):
//! - `cpython/` (0): the interpreter boundary — the C API re-exported
//!   (`capi`), private API, struct layouts and version differences behind
//!   typed wrappers;
//! - `torch_api/` (1): what we know about torch — captured originals,
//!   exception texts, hook dicts, the jit-tracing probe, runtime state;
//! - `instance/` (2): one module and its class — fast instances, attribute
//!   reads, method dispatch, per-instance facts, registries, names;
//! - `call/` (3): the module call and attribute reads through C slots,
//!   frameless layer forwards, containers;
//! - `plans/` (3): recorded walks and what their replays check;
//! - `registry/` (4): `__setattr__`/`__delattr__`/register_*, and torch's
//!   functions served through their vectorcall;
//! - `walk/` (5): tree walks — iterators, `train`, `apply`, `zero_grad`,
//!   dotted paths;
//! - `state/` (6): `state_dict`, `load_state_dict`, `_apply`;
//! - `routes/` (7): torch's whole-tree methods routed to native bodies.
//!
//! This file registers the Python functions of `fastmodule._core`.
mod call;
mod cpython;
mod instance;
mod plans;
mod registry;
mod routes;
mod state;
mod torch_api;
mod walk;

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Capture torch's originals, route torch's module functions through their
/// native vectorcalls and install the slots on `fast_module` itself. `off`
/// names the paths ("call", "getattr", "registration") that stay torch's:
/// their torch code is not what fastmodule verified.
#[pyfunction]
#[pyo3(signature = (fast_module, off = Vec::new()))]
fn init(py: Python<'_>, fast_module: &Bound<'_, PyType>, off: Vec<String>) -> PyResult<()> {
    for name in &off {
        call::slots::switch_off(match name.as_str() {
            "call" => call::slots::CALL,
            "getattr" => call::slots::GETATTR,
            "registration" => call::slots::REGISTRATION,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown native path {other:?}"
                )))
            }
        });
    }
    cpython::quiet::init(py)?;
    // A layout it cannot confirm leaves the keys' byte matching off (slower,
    // the same answers).
    let _ = cpython::strs::init(py);
    cpython::type_cache::init(py)?;
    // No free dict-watcher slot: caches and plans stay off (see `cache_validity`).
    let _ = cpython::validity::init(py);
    torch_api::originals::init(py, fast_module)?;
    call::slots::capture_generic(torch_api::originals::require(py)?);
    instance::walk_facts::init(torch_api::originals::require(py)?);
    plans::roots::register(&plans::module_walks::TABLE);
    plans::roots::register(&plans::eager::TABLE);
    plans::roots::register(&state::state_dict_plan::TABLE);
    plans::roots::register(&state::load_state_dict_plan::TABLE);
    registry::vectorcalls::install(py)?;
    call::slots::install_class(py, fast_module)?;
    instance::registries::init(py)?;
    instance::dispatch::init(py, fast_module.as_any())?;
    Ok(())
}

/// torch's method `method` (e.g. "named_modules", "train") for `module`, as
/// fastmodule's wrapper of it: natively while `nn.Module`'s entry is torch's
/// original, else whatever is installed there. Iterators come back as native
/// iterators; the Python wrappers turn them into generators.
#[pyfunction]
#[pyo3(name = "walk", signature = (method, module, *args))]
fn walk_method<'py>(
    py: Python<'py>,
    method: &str,
    module: &Bound<'py, PyAny>,
    args: &Bound<'py, pyo3::types::PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let m = routes::wrapped_methods::method_named(method).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("not a wrapped method: {method}"))
    })?;
    routes::wrapped_methods::call_root(py, m, module, args)
}

/// Forget every recorded walk (the next walk of each tree records anew).
#[pyfunction]
fn clear_plans() {
    plans::roots::forget_all();
}

/// Give back what fastmodule keeps for the tree of `modules` (all of its
/// modules; `restore(model)`): every plan recorded for one of them as the
/// root, the walk facts of their instance dicts, and the remembered names
/// (all of them: the names of other trees are made again by their next live
/// walk; their plans hold their own).
#[pyfunction]
fn forget_tree(modules: &Bound<'_, PyAny>) -> PyResult<()> {
    let mut roots = std::collections::HashSet::new();
    for m in modules.try_iter()? {
        let m = m?;
        roots.insert(m.as_ptr() as usize);
        instance::walk_facts::forget(m.as_ptr());
    }
    plans::roots::forget(&roots);
    instance::qualified_names::clear();
    Ok(())
}

/// Give back everything kept for every tree: all plans, and the remembered
/// names (`uninstall()`: every class is restored).
#[pyfunction]
fn forget_all() {
    plans::roots::forget_all();
    instance::qualified_names::clear();
}

/// `(roots watched for their plans, names remembered)`, for tests.
#[pyfunction]
fn plan_memory() -> (usize, usize) {
    (plans::roots::watched(), instance::qualified_names::count())
}

/// `(walks recorded as plans, walks started from a plan)` since import.
#[pyfunction]
fn plan_stats() -> (usize, usize) {
    plans::module_walks::stats()
}

/// `(train/eval and no-op `_apply` walks recorded as plans, replayed)` since import.
#[pyfunction]
fn eager_plan_stats() -> (usize, usize) {
    plans::eager::TABLE.stats()
}

/// `(state_dict walks recorded as plans, replayed)` since import.
#[pyfunction]
fn state_dict_plan_stats() -> (usize, usize) {
    state::state_dict_plan::TABLE.stats()
}

/// `(load_state_dict walks recorded as plans, replayed)` since import.
#[pyfunction]
fn load_plan_stats() -> (usize, usize) {
    state::load_state_dict_plan::TABLE.stats()
}

/// Why calling `module` now would run torch's `_wrapped_call_impl` instead of
/// the native path, or None when it takes the native path: the call's own
/// checks, for `fastmodule check`'s report.
#[pyfunction]
fn call_handover(module: &Bound<'_, PyAny>) -> PyResult<Option<&'static str>> {
    let py = module.py();
    let g = torch_api::originals::require(py)?;
    let obj = module.as_ptr();
    unsafe {
        let tp = cpython::capi::Py_TYPE(obj);
        if instance::fast::switched_off() {
            return Ok(Some(
                "fastmodule is switched off (fastmodule.disabled() or FASTMODULE_DISABLE=1)",
            ));
        }
        if !call::slots::on(call::slots::CALL) {
            return Ok(Some(
                "the native module call is off for this torch (fastmodule doctor says why)",
            ));
        }
        // `m(...)` goes through the class's `tp_call`: fastmodule's slot makes the
        // native decision; CPython's calls `__call__`, which when it is torch's
        // `_wrapped_call_impl` reaches fastmodule's entry point for fast instances.
        let slot = call::slots::current(g, tp).call;
        if !slot {
            let call = cpython::type_cache::type_lookup(tp, g.names.dunder_call);
            if call == cpython::type_cache::unknown() {
                return Ok(Some(
                    "a class in its MRO has a key that is not a str in its __dict__ (a lookup \
                     there may run that key's __eq__)",
                ));
            }
            if call != g.orig.call {
                return Ok(Some("its class defines its own __call__"));
            }
            if !instance::fast::is_fast_instance(g, obj) {
                let accelerated = cpython::capi::PyType_IsSubtype(tp, g.fast_module) != 0
                    || instance::accelerated::contains(tp);
                return Ok(Some(if !accelerated {
                    "its class is not accelerated"
                } else {
                    "its class is accelerated but a class after torch.nn.Module in its \
                         MRO defines __setattr__ or __delattr__, and it lacks the call slot \
                         (a patch of nn.Module.__call__ reset it)"
                }));
            }
        }
        match call::module_call::handover_reason(g, obj) {
            Ok(why) => Ok(why.map(|w| w.text())),
            Err(()) => Err(PyErr::fetch(py)),
        }
    }
}

/// Would a lookup by an exact `str` in `obj` run no code (an exact dict with
/// a str-only key table, or an exact set of exact str)? For tests and
/// diagnostics.
#[pyfunction]
fn is_quiet(obj: &Bound<'_, PyAny>) -> bool {
    unsafe { cpython::quiet::dict(obj.as_ptr()) || cpython::quiet::set(obj.as_ptr()) }
}

/// Did the import-time check of CPython's dict key-table layout succeed?
/// (If not, no fast path that needs a quiet dict is taken.)
#[pyfunction]
fn quiet_dicts_known() -> bool {
    cpython::quiet::known()
}

/// Did the import-time check of a compact ASCII str's layout succeed (always
/// true where pyo3 describes it)? If not, state-dict keys are matched as strs
/// rather than as bytes.
#[pyfunction]
fn ascii_layout_known() -> bool {
    cpython::strs::known()
}

/// Find where CPython keeps this thread's profile and trace functions; the
/// caller (a fresh thread) has just set `profile` and then `trace`.
#[pyfunction]
fn locate_tracer_fields(profile: &Bound<'_, PyAny>, trace: &Bound<'_, PyAny>) -> bool {
    cpython::tracer::locate(profile.as_ptr(), trace.as_ptr())
}

/// The same thread, with both unset again: confirm the fields are clear and
/// start reading them.
#[pyfunction]
fn confirm_tracer_fields() -> bool {
    cpython::tracer::confirm()
}

/// Switch the tracer check on or off (for tests that watch the native paths
/// with a profile function); returns the previous setting.
#[pyfunction]
fn set_tracer_check(on: bool) -> bool {
    cpython::tracer::set_checking(on)
}

/// Can the call path tell that a trace or profile function is set?
#[pyfunction]
fn tracer_check_known() -> bool {
    cpython::tracer::known()
}

/// Capture what the native `_apply` needs (see `fastmodule._methods.conversion`).
#[pyfunction]
fn init_apply(py: Python<'_>, config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    state::apply::init(py, config)
}

/// Capture torch's layer functions the call path may run natively.
#[pyfunction]
fn init_layers(py: Python<'_>, config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    call::layers::init(py, config)
}

/// Switch the native dispatch of forward hooks on (see `fastmodule._verified.hook_dispatch`).
#[pyfunction]
fn init_hooks(py: Python<'_>, config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    torch_api::hook_support::init(py, config)
}

/// Tell the call path which of torch's forwards count their caller's frames
/// (see `fastmodule._verified.frame_counting`).
#[pyfunction]
fn init_frame_counting(py: Python<'_>, classify: &Bound<'_, PyAny>) -> PyResult<()> {
    call::frames::init(py, classify)
}

/// Serve torch's container methods (`config`: qualified name -> function).
#[pyfunction]
fn init_containers(py: Python<'_>, config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    call::containers::init(py, config)
}

/// Route torch's own whole-tree methods to `bodies[name]` for fast instances.
#[pyfunction]
fn route_torch_methods(
    py: Python<'_>,
    bodies: &Bound<'_, pyo3::types::PyDict>,
    copies: &Bound<'_, pyo3::types::PyDict>,
) -> PyResult<()> {
    routes::whole_tree::install(py, bodies, copies)
}

/// Is torch's `nn.Module.<name>` still running the code it was routed with?
#[pyfunction]
fn torch_method_intact(name: &str) -> bool {
    routes::whole_tree::method_intact(name)
}

/// Switch every native path off (`fastmodule.disabled()`) or back on.
#[pyfunction]
fn set_switched_off(off: bool) {
    instance::fast::switch_off(off);
}

/// Is every native path switched off?
#[pyfunction]
fn switched_off() -> bool {
    instance::fast::switched_off()
}

/// Record the bodies of torch's `nn.Module.<name>` for `names`, as routed: the
/// whole-tree paths stand aside once one of them has another `__code__` or
/// other defaults.
#[pyfunction]
fn seal_torch_methods(py: Python<'_>, names: Vec<String>) -> PyResult<()> {
    routes::whole_tree::seal(py, &names)
}

/// Make the Python function `func` answer, when called eagerly, whether
/// torch's whole-tree method should run fastmodule's body for its argument;
/// `namespace[flag]` is kept equal to "some class is accelerated in place".
#[pyfunction]
fn install_route_check(
    func: &Bound<'_, PyAny>,
    namespace: &Bound<'_, pyo3::types::PyDict>,
    flag: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<()> {
    routes::whole_tree::install_check(func, namespace, flag)
}

/// Give `cls` (a fastmodule.Module subclass) the native slots its MRO allows.
/// Returns which of (call, getattr, setattr) it carries.
#[pyfunction]
fn install_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<(bool, bool, bool)> {
    let i = call::slots::install_class(py, cls)?;
    Ok((i.call, i.getattr, i.setattr))
}

/// Accelerate `cls` (a torch.nn.Module subclass) in place: its instances take
/// the native paths. Returns which of (call, getattr, setattr) it carries.
#[pyfunction]
fn accelerate_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<(bool, bool, bool)> {
    let i = call::slots::accelerate_class(py, cls)?;
    Ok((i.call, i.getattr, i.setattr))
}

/// Undo `accelerate_class`; False if `cls` was not accelerated in place.
#[pyfunction]
fn restore_class(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<bool> {
    call::slots::restore_class(py, cls)
}

/// Is `cls` accelerated in place?
#[pyfunction]
fn is_accelerated_class(cls: &Bound<'_, PyType>) -> bool {
    call::slots::is_accelerated(cls)
}

/// Which of (call, getattr, setattr) slots `cls` carries right now.
#[pyfunction]
fn installed(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<(bool, bool, bool)> {
    let i = call::slots::installed(py, cls)?;
    Ok((i.call, i.getattr, i.setattr))
}

/// True when jit-tracing is detected through libtorch directly.
#[pyfunction]
fn native_tracing_probe() -> bool {
    torch_api::jit_tracing::native()
}

/// Look libtorch's `getTracingState` up through the loaded library
/// `torch_library` (torch's extension) and, if `walk`, among all loaded
/// libraries; `(native probe in use, what was found)`. Without it the call
/// path asks `torch._C._is_tracing()`.
#[pyfunction]
#[pyo3(signature = (torch_library, walk = true))]
fn resolve_tracing_probe(torch_library: Option<&str>, walk: bool) -> (bool, String) {
    torch_api::jit_tracing::resolve(torch_library, walk)
}

/// `(native probe in use, what the last lookup found)`.
#[pyfunction]
fn tracing_probe() -> (bool, String) {
    torch_api::jit_tracing::status()
}

/// Are recorded walks (plans) kept on this interpreter build?
#[pyfunction]
fn recorded_walks() -> bool {
    plans::table::enabled()
}

/// How this interpreter decides that a remembered dict or class is unchanged
/// ("dict version tags (CPython 3.11)", "dict watcher N"), or why caches and
/// plans are off ("off: ...").
#[pyfunction]
fn cache_validity() -> String {
    cpython::validity::status()
}

/// A value that changes whenever a dict is mutated (its version, see
/// `cpython::validity`), plus, for an exact `OrderedDict`, its linked-list
/// state (which also moves on `move_to_end`). None for non-dicts.
#[pyfunction]
fn dict_version(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<Option<(u64, u64)>> {
    let odict = torch_api::originals::require(py).map(|g| g.odict).ok();
    cpython::dicts::dict_version_of(py, d, odict)
}

/// Capture torch's runtime state accessors (see `fastmodule._methods.runtime`).
#[pyfunction]
fn init_runtime(config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    torch_api::runtime::init(config)
}

/// Capture what the native load walk needs (see `fastmodule._methods.loading`).
#[pyfunction]
fn init_load(config: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    state::load_state_dict::init(config)
}

/// The module declares that it does not need the GIL (pyo3's default, spelt
/// out): on a free-threaded CPython importing it must not switch the GIL back
/// on. Nothing native is used there (the interpreter is refused at import,
/// `fastmodule._verified.verification.interpreter_problem`), so nothing relies
/// on the GIL's exclusion.
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(clear_plans, m)?)?;
    m.add_function(wrap_pyfunction!(forget_tree, m)?)?;
    m.add_function(wrap_pyfunction!(forget_all, m)?)?;
    m.add_function(wrap_pyfunction!(plan_memory, m)?)?;
    m.add_function(wrap_pyfunction!(plan_stats, m)?)?;
    m.add_function(wrap_pyfunction!(eager_plan_stats, m)?)?;
    m.add_function(wrap_pyfunction!(state_dict_plan_stats, m)?)?;
    m.add_function(wrap_pyfunction!(load_plan_stats, m)?)?;
    m.add_function(wrap_pyfunction!(install_class, m)?)?;
    m.add_function(wrap_pyfunction!(installed, m)?)?;
    m.add_function(wrap_pyfunction!(route_torch_methods, m)?)?;
    m.add_function(wrap_pyfunction!(install_route_check, m)?)?;
    m.add_function(wrap_pyfunction!(seal_torch_methods, m)?)?;
    m.add_function(wrap_pyfunction!(set_switched_off, m)?)?;
    m.add_function(wrap_pyfunction!(torch_method_intact, m)?)?;
    m.add_function(wrap_pyfunction!(switched_off, m)?)?;
    m.add_function(wrap_pyfunction!(init_layers, m)?)?;
    m.add_function(wrap_pyfunction!(init_containers, m)?)?;
    m.add_function(wrap_pyfunction!(init_frame_counting, m)?)?;
    m.add_function(wrap_pyfunction!(accelerate_class, m)?)?;
    m.add_function(wrap_pyfunction!(restore_class, m)?)?;
    m.add_function(wrap_pyfunction!(is_accelerated_class, m)?)?;
    m.add_function(wrap_pyfunction!(native_tracing_probe, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_tracing_probe, m)?)?;
    m.add_function(wrap_pyfunction!(tracing_probe, m)?)?;
    m.add_function(wrap_pyfunction!(recorded_walks, m)?)?;
    m.add_function(wrap_pyfunction!(walk_method, m)?)?;
    m.add_function(wrap_pyfunction!(init_apply, m)?)?;
    m.add_function(wrap_pyfunction!(init_load, m)?)?;
    m.add_function(wrap_pyfunction!(init_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(state::load_state_dict::load_tree, m)?)?;
    m.add_function(wrap_pyfunction!(state::load_state_dict::load_replay, m)?)?;
    m.add_function(wrap_pyfunction!(dict_version, m)?)?;
    m.add_function(wrap_pyfunction!(cache_validity, m)?)?;
    m.add_function(wrap_pyfunction!(is_quiet, m)?)?;
    m.add_function(wrap_pyfunction!(call_handover, m)?)?;
    m.add_function(wrap_pyfunction!(init_hooks, m)?)?;
    m.add_function(wrap_pyfunction!(locate_tracer_fields, m)?)?;
    m.add_function(wrap_pyfunction!(confirm_tracer_fields, m)?)?;
    m.add_function(wrap_pyfunction!(tracer_check_known, m)?)?;
    m.add_function(wrap_pyfunction!(set_tracer_check, m)?)?;
    m.add_function(wrap_pyfunction!(quiet_dicts_known, m)?)?;
    m.add_function(wrap_pyfunction!(ascii_layout_known, m)?)?;
    m.add_class::<walk::named_modules::NamedModules>()?;
    m.add_class::<walk::named_members::NamedMembers>()?;
    m.add_class::<walk::children::NamedChildren>()?;
    m.add_class::<walk::children::Values>()?;
    Ok(())
}
