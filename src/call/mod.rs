//! TODO
pub mod call_cache;
pub mod containers;
pub mod getattr;
pub mod layers;
pub mod module_call;
pub mod slots;
