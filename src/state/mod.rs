//! TODO
pub mod apply;
pub mod load_plan;
pub mod state_dict;
pub mod state_dict_plan;
