//! TODO
pub mod errors;
pub mod hooks;
pub mod jit_tracing;
pub mod originals;
pub mod runtime;
pub mod torch_code;
