//! TODO
pub mod apply;
pub mod load_state_dict;
pub mod load_state_dict_plan;
pub mod state_dict_plan;
