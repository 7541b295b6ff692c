//! TODO
pub mod apply_fn;
pub mod children;
pub mod named_members;
pub mod named_modules;
pub mod paths;
pub mod train;
pub mod yielded;
pub mod zero_grad;
