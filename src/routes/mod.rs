//! Layer 7 — torch's whole-tree methods routed to fastmodule's bodies: the
//! route on `torch.nn.Module`'s own functions and its check
//! ([`whole_tree`]), and the entry point the Python wrappers call for each
//! method ([`wrapped_methods`]).
//! May use: every layer below.
pub mod whole_tree;
pub mod wrapped_methods;
