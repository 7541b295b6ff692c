//! TODO
pub mod apply;
pub mod buckets;
pub mod load_from_state_dict;
pub mod load_state_dict;
pub mod load_state_dict_plan;
pub mod state_dict;
pub mod state_dict_plan;
