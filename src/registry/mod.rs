//! Layer 4 — registration: `Module.__setattr__`/`__delattr__` ([`setattr`])
//! and `register_parameter`/`register_buffer`/`add_module` ([`register`]),
//! with what they share ([`preconditions`]); and torch's own functions
//! (`__call__`, `__getattr__`, `__setattr__`, register_*) served natively
//! through their vectorcall entry points ([`vectorcalls`]).
//! May use: `cpython`, `torch_api`, `instance`, `call`.
pub mod preconditions;
pub mod register;
pub mod setattr;
pub mod vectorcalls;
