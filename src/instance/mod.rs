//! TODO
pub mod accelerated;
pub mod attributes;
pub mod dispatch;
pub mod fast;
pub mod qualified_names;
pub mod registries;
pub mod walk_facts;
