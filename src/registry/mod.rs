//! TODO
pub mod register;
pub mod vectorcalls;
