//! Layer 2 — facts about one module instance and its class: which modules
//! take the native paths ([`fast`], [`accelerated`]), its `__dict__` and
//! plain attribute reads ([`attributes`]), which of torch's methods it runs
//! ([`dispatch`]), what the walks remember per instance ([`walk_facts`]),
//! iterating its registries and de-duplicating what they hold
//! ([`registries`]), and the qualified names (`prefix.key`) built from it
//! ([`qualified_names`]).
//! May use: `cpython`, `torch_api`.
pub mod accelerated;
pub mod attributes;
pub mod dispatch;
pub mod fast;
pub mod qualified_names;
pub mod registries;
pub mod walk_facts;
