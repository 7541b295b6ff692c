//! TODO
pub mod named_modules;
pub mod paths;
pub mod zero_grad;
