//! The entry points of fastmodule's Python wrappers of torch's whole-tree
//! methods (`_core.walk(name, module, *args)`): the wrapper has checked that
//! `nn.Module`'s entry is torch's original and bound the arguments; here
//! torch's method body runs for `module`, natively (iterators, `train`,
//! `zero_grad`, `_apply`, dotted paths, `state_dict`, ...).
use crate::cpython::interned::intern;
use crate::instance::dispatch::{call_method, is_native, torch_method, Method, METHODS};
use crate::torch_api::originals::require;
use crate::walk::apply_fn::apply_body;
use crate::walk::children::{body, children_body, for_each_parameter, named_registry, values_of};
use crate::walk::train::train_root;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple};

/// Entry points used by fastmodule's wrappers (which have already checked that
/// `nn.Module`'s entry is torch's original and bound the arguments): torch's
/// method body for `module`, natively.
pub fn call_root<'py>(
    py: Python<'py>,
    m: Method,
    module: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let g = require(py)?;
    let arg = |i: usize| args.get_item(i);
    match m {
        Method::NamedModules => {
            let memo = arg(0)?;
            body::named_modules(py, module, Some(memo), &arg(1)?, &arg(2)?, false)
        }
        Method::Modules => {
            // modules(rd): `for _, m in self.named_modules(remove_duplicate=rd)`.
            let rd = arg(0)?;
            if is_native(g, module, Method::NamedModules) {
                let prefix = PyString::new(py, "");
                return body::named_modules(py, module, None, prefix.as_any(), &rd, true);
            }
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "remove_duplicate"), &rd)?;
            values_of(
                py,
                module.call_method(intern!(py, "named_modules"), (), Some(&kw))?,
            )
        }
        Method::NamedChildren => body::named_children(py, module, false),
        Method::Children => children_body(py, g, module),
        Method::NamedParameters | Method::NamedBuffers => {
            let registry = if m == Method::NamedParameters {
                "_parameters"
            } else {
                "_buffers"
            };
            let (prefix, recurse, rd) = (arg(0)?, arg(1)?, arg(2)?);
            if is_native(g, module, Method::NamedMembers) {
                return body::named_members(py, module, registry, &prefix, &recurse, &rd, false);
            }
            // An overriding _named_members gets torch's getter.
            torch_method(py, m)?.call1((module, prefix, recurse, rd))
        }
        Method::Parameters | Method::Buffers => {
            let which = if m == Method::Parameters {
                Method::NamedParameters
            } else {
                Method::NamedBuffers
            };
            let recurse = arg(0)?;
            let prefix = PyString::new(py, "");
            let t = PyBool::new(py, true).to_owned().into_any();
            named_registry(py, g, module, which, prefix.as_any(), &recurse, &t, true)
        }
        Method::Train => train_root(py, g, module, &arg(0)?),
        Method::Eval => {
            let f = PyBool::new(py, false).to_owned().into_any();
            if is_native(g, module, Method::Train) {
                return train_root(py, g, module, &f);
            }
            call_method(module, Method::Train, (f,))
        }
        Method::RequiresGrad => {
            let flag = arg(0)?;
            for_each_parameter(py, g, module, 0, |p| {
                p.call_method1(intern!(py, "requires_grad_"), (&flag,))?;
                Ok(())
            })?;
            Ok(module.clone())
        }
        Method::ZeroGrad => crate::walk::zero_grad::zero_grad(py, g, module, &arg(0)?),
        Method::Apply => apply_body(py, g, module, &arg(0)?),
        Method::ApplyFn => crate::state::apply::root(py, g, module, &arg(0)?, &arg(1)?),
        Method::GetSubmodule => crate::walk::paths::get_submodule(py, g, module, &arg(0)?),
        Method::SetSubmodule => {
            crate::walk::paths::set_submodule(py, g, module, &arg(0)?, &arg(1)?, &arg(2)?)
        }
        Method::GetParameter => crate::walk::paths::get_member(py, g, module, &arg(0)?, false),
        Method::GetBuffer => crate::walk::paths::get_member(py, g, module, &arg(0)?, true),
        Method::StateDict => {
            let (destination, prefix, keep_vars) = (arg(0)?, arg(1)?, arg(2)?);
            // A new destination, a str prefix and a bool keep_vars: the walk
            // can come from a recorded plan (crate::state::state_dict_plan).
            let plannable = destination.is_none()
                && crate::instance::attributes::exact_str(&prefix)
                && keep_vars.is_exact_instance_of::<PyBool>();
            if plannable {
                let keep = keep_vars.is_truthy()?;
                if let Some(r) = crate::state::state_dict_plan::replay(py, g, module, &prefix, keep)
                {
                    return r;
                }
            }
            let out = crate::state::state_dict::save_tree(
                py,
                g,
                module,
                &destination,
                &prefix,
                &keep_vars,
            )?;
            if plannable {
                crate::state::state_dict_plan::record(g, module, &prefix);
            }
            Ok(out)
        }
        Method::SaveToStateDict | Method::GetExtraState => Err(
            pyo3::exceptions::PyTypeError::new_err("not a wrapped entry point"),
        ),
        Method::NamedMembers => Err(pyo3::exceptions::PyTypeError::new_err(
            "_named_members is not a wrapped entry point",
        )),
    }
}

/// Look a wrapped method up by name.
pub fn method_named(name: &str) -> Option<Method> {
    METHODS.iter().copied().find(|m| m.name() == name)
}
