//! TODO
pub mod whole_tree;
pub mod wrapped_methods;
