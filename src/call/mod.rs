//! Layer 3 — calling a module and reading its attributes through C slots:
//! installing `tp_call`/`tp_getattro` on classes ([`slots`]), the call
//! decision of `_call_impl` ([`module_call`]) and its cache ([`call_cache`]),
//! `_call_impl`'s forward-hook logic ([`hooks_dispatch`]),
//! registered-attribute reads ([`getattr`]), torch's `Sequential`/`Linear`/
//! `ReLU` forwards without frames ([`layers`]), and the container protocol
//! of `ModuleList`/`Sequential`/`ModuleDict` ([`containers`]), and which
//! of torch's forwards keep torch's call frames ([`frames`]).
//! May use: `cpython`, `torch_api`, `instance`.
pub mod call_cache;
pub mod containers;
pub mod frames;
pub mod getattr;
pub mod hooks_dispatch;
pub mod layers;
pub mod module_call;
pub mod slots;
