//! TODO
pub mod preconditions;
pub mod register;
pub mod setattr;
pub mod vectorcalls;
