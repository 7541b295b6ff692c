//! TODO
pub mod paths;
pub mod traversal;
pub mod zero_grad;
