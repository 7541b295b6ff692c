//! Layer 3 — recorded walks ("plans"): what a complete walk of a tree read,
//! so the next walk of the unchanged tree replays it. [`module_walks`] for
//! `named_modules`/`_named_members`, [`eager`] for `train`/`eval` and no-op
//! `_apply`; [`table`] (where plans are kept, refusals), [`roots`] (each
//! root held weakly: its plans go with it) and [`visit`] (one recorded
//! module) are shared with the `state_dict`/`load_state_dict` plans in
//! `crate::state`.
//! May use: `cpython`, `torch_api`, `instance`.
pub mod eager;
pub mod module_walks;
pub mod roots;
pub mod table;
pub mod visit;
