//! The CPU's kernels of ours for the forward pass, each an MLX operation
//! whose CPU evaluation is Rust on rayon's pool: a decoder block for one
//! token ([`layer`]) and its attention ([`attention`]), a prompt chunk's
//! attention ([`prompt_attention`]), norms and RoPE ([`norms`]) and the
//! gated MLP's GELU ([`gelu`]).

pub(crate) mod attention;
pub(crate) mod gelu;
pub(crate) mod layer;
pub(crate) mod norms;
pub(crate) mod prompt_attention;
