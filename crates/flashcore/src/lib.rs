//! # FlashCore
//!
//! Fused attention kernels for NVIDIA GPUs, compiled on first use by NVRTC for the exact
//! GPU and cached on disk. No CUDA toolkit is needed to build; at run time FlashCore needs
//! the NVIDIA driver and `libnvrtc` (the CUDA toolkit's, PyTorch's, or
//! `pip install nvidia-cuda-nvrtc`).
//!
//! ```no_run
//! # fn main() -> flashcore::Result<()> {
//! use flashcore::{AttnParams, Context, DType, DeviceTensor, FwdInputs};
//! let ctx = Context::new(0)?;                                    // GPU 0, JIT cache ready
//! let shape = [1, 4096, 16, 128];                                // [B, S, H, D]
//! let x: Vec<f32> = (0..shape.iter().product()).map(|i: usize| (i % 7) as f32 * 0.1).collect();
//! let q = DeviceTensor::from_f32(&ctx, &x, shape, DType::BF16)?;
//! let out = ctx.attention(&FwdInputs::dense(q.view(), q.view(), q.view()), &AttnParams::causal())?;
//! println!("{:?}", &out.o.to_f32(&ctx)?[..4]);
//! # Ok(()) }
//! ```
//!
//! Shapes are BSHD (`q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`), GQA/MQA when
//! `Hq % Hkv == 0`, causal masks bottom-right aligned (see [`AttnParams::causal`]).
//!
//! Six entry points cover every call: [`Context::attention`], [`Context::attention_into`]
//! and [`Context::attention_on_stream`] for the forward, the same three `attention_backward*`
//! for the gradients. What a call reads is a [`FwdInputs`] or [`BwdInputs`], whose
//! [`KvLayout`] says how the keys are laid out (dense, a packed [`VarlenBatch`], a
//! [`PagedKv`] cache); where it writes, a [`FwdOutputs`] or [`GradsMut`]; where it runs, the
//! context's stream or a [`CallerStream`].
//!
//! Inside, each call passes through the same layers, one module each: validate (`call`,
//! `validate`) → plan ([`dispatch`]) → pack (`pack`: the kernels' parameter structs) →
//! launch (`launch`) → the kernel families ([`kernels`], each family's CUDA source beside its
//! host file).
//! [`reference::attention`] is the f64 CPU oracle every kernel is checked against.
#![deny(missing_docs)]

mod backward;
pub mod bench;
mod call;
mod chunks;
mod context;
mod device_tensor;
pub mod dispatch;
mod dropout;
mod error;
mod external;
mod forward;
pub mod jit;
pub mod kernels;
mod launch;
mod pack;
mod paged;
mod params;
pub mod reference;
mod shape;
mod tensor;
mod validate;
mod varlen;

pub use backward::AttnGrads;
pub use call::{AlibiSlopes, BwdInputs, DropoutState, Fp8Descales, FwdInputs, FwdOutputs, GradsMut, KvLayout, LearnableSinks, SinkGradMut};
pub use context::{Context, DeviceInfo};
pub use device_tensor::DeviceTensor;
pub use dropout::{philox, Dropout};
pub use error::{Error, Result};
pub use external::{CallerStream, ExternalStream};
pub use forward::AttnOutput;
pub use kernels::{Entries, KernelFamily, ScoreMods, Tile, Variant};
pub use launch::LoadedKernel;
pub use paged::{check_values as check_paged_values, BlockTableView, PackedQueries, PagedKv, PAGE_SIZE_MULTIPLE};
pub use params::{AttnParams, Window};
pub use shape::ProblemShape;
pub use tensor::{DType, DeviceVec, DeviceVecMut, Layout, LseView, LseViewMut, TensorView, TensorViewMut};
pub use varlen::{check_values as check_varlen_values, SeqLensView, VarlenBatch};
