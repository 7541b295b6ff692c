//! TODO
pub mod whole_tree;
