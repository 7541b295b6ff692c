//! Layer 5 — tree walks that follow torch's dispatch at every module: the
//! lazy iterators ([`named_modules`], [`named_members`] for
//! `named_parameters`/`named_buffers`, [`children`]), the eager walks
//! ([`train`] for `train`/`eval`, [`apply_fn`] for `apply(fn)`,
//! [`zero_grad`] with its fast first pass), and dotted paths ([`paths`]:
//! `get_submodule` & co.); [`yielded`] builds what the iterators yield.
//! May use: `cpython`, `torch_api`, `instance`, `plans`, `registry`.
pub mod apply_fn;
pub mod children;
pub mod named_members;
pub mod named_modules;
pub mod paths;
pub mod train;
pub mod yielded;
pub mod zero_grad;
