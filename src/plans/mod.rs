//! TODO
pub mod eager;
pub mod module_walks;
pub mod table;
pub mod visit;
