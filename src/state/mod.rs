//! Layer 6 — a module's tensors saved, loaded and converted:
//! `state_dict()` ([`state_dict`], recorded in [`state_dict_plan`]),
//! `load_state_dict()` ([`load_state_dict`], its per-child [`buckets`], the
//! native [`load_from_state_dict`], recorded in [`load_state_dict_plan`]),
//! and `_apply` (`.to()`, `.float()`, `.cuda()`, ...: [`apply`]).
//! May use: `cpython`, `torch_api`, `instance`, `plans`, `walk`.
pub mod apply;
pub mod buckets;
pub mod load_from_state_dict;
pub mod load_state_dict;
pub mod load_state_dict_plan;
pub mod state_dict;
pub mod state_dict_plan;
