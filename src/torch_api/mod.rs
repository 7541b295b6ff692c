//! Layer 1 — what fastmodule knows about torch: the originals captured at
//! import that every fast path compares against ([`originals`]), torch's
//! exception texts ([`errors`]), `torch.compiler.is_compiling()` ([`compiling`]), the module-level hook dicts ([`hooks`]), what the native hook dispatch
//! needs from torch ([`hook_support`]),
//! the jit-tracing probe ([`jit_tracing`]), torch's runtime state (grad
//! mode, modes, `torch.__future__` flags: [`runtime`]) and torch's own code
//! of routed methods ([`torch_code`]).
//! May use: `cpython`.
pub mod compiling;
pub mod errors;
pub mod hook_support;
pub mod hooks;
pub mod jit_tracing;
pub mod originals;
pub mod runtime;
pub mod torch_code;
