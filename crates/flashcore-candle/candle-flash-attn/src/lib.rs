//! candle-flash-attn 0.11's public API on FlashCore's kernels: the same functions and
//! signatures ([`flashcore_candle::compat`]), with a backward. Patch it in at the top of a
//! workspace that uses candle-flash-attn (candle-transformers' `flash-attn` feature, say):
//!
//! ```toml
//! [patch.crates-io]
//! candle-flash-attn = { git = "https://github.com/flashcore/flashcore", package = "candle-flash-attn" }
//! ```
//!
//! and the models call FlashCore unchanged.
#![deny(missing_docs)]

pub use flashcore_candle::compat::*;
