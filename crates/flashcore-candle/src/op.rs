//! Attention as a candle op with a backward: the forward runs FlashCore's forward kernels on
//! candle's stream; candle's autograd calls [`AttnOp`]'s `bwd`, which runs FlashCore's backward
//! kernels (`bwd_sm90` on Hopper, `bwd_sm80` elsewhere or when forced) for dq, dk and dv.
//!
//! The backward needs the forward's log-sum-exp. The op keeps it (`[B, Hq, Sq]` f32, 4 bytes a
//! query row and head: 1/64 of the output at D128 bf16) when an input is tracked by autograd,
//! and recomputes it with a forward pass otherwise (candle-flash-attn's [`crate::FlashAttn`],
//! built by callers without that flag, takes that path).

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDevice, CudaStorage};
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Storage, Tensor};
use flashcore::{BwdInputs, FwdInputs, FwdOutputs, GradsMut, KvLayout, SeqLensView, VarlenBatch};

use crate::device::{self, cuda, Held, Output};
use crate::options::AttnOptions;

/// How the op's sequences are laid out.
#[derive(Debug, Clone)]
pub(crate) enum Packing {
    /// `[B, S, H, D]` tensors.
    Dense,
    /// Packed sequences, `[total, H, D]`, bounded by cumulative lengths (int32 or uint32, `[B + 1]`).
    Varlen { cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: usize, max_seqlen_k: usize },
}

/// One attention call in candle's graph.
pub(crate) struct AttnOp {
    pub options: AttnOptions,
    pub packing: Packing,
    /// Keep the forward's log-sum-exp for the backward (an input is tracked by autograd).
    pub keep_lse: bool,
    /// The log-sum-exp the forward kept.
    lse: Mutex<Option<Tensor>>,
}

/// A storage and its layout, as the op's arguments arrive.
type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// The extra tensors of a call, held for its duration.
struct Extras<'a> {
    cu_seqlens: Option<(Held<'a>, Held<'a>, usize, usize)>,
    alibi: Option<Held<'a>>,
    sinks: Option<Held<'a>>,
}

impl<'a> Extras<'a> {
    fn of(op: &'a AttnOp) -> Self {
        let cu_seqlens = match &op.packing {
            Packing::Dense => None,
            Packing::Varlen { cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k } => {
                Some((Held::of(cu_seqlens_q), Held::of(cu_seqlens_k), *max_seqlen_q, *max_seqlen_k))
            }
        };
        Extras {
            cu_seqlens,
            alibi: op.options.alibi_slopes.as_ref().map(Held::of),
            sinks: op.options.learnable_sink.as_ref().map(Held::of),
        }
    }

    fn layout(&self) -> Result<KvLayout<'_>> {
        Ok(match &self.cu_seqlens {
            None => KvLayout::Dense,
            Some((q, k, max_seqlen_q, max_seqlen_k)) => {
                let (cu_seqlens_q, cu_seqlens_k): (SeqLensView, SeqLensView) = (q.vector("cu_seqlens_q")?, k.vector("cu_seqlens_k")?);
                KvLayout::Varlen(VarlenBatch {
                    cu_seqlens_q,
                    cu_seqlens_k,
                    seqused_k: None,
                    max_seqlen_q: *max_seqlen_q,
                    max_seqlen_k: *max_seqlen_k,
                })
            }
        })
    }

    fn alibi(&self) -> Result<Option<flashcore::AlibiSlopes<'_>>> {
        self.alibi.as_ref().map(|a| a.vector("alibi_slopes")).transpose()
    }

    fn sinks(&self) -> Result<Option<flashcore::LearnableSinks<'_>>> {
        self.sinks.as_ref().map(|s| s.vector("learnable_sink")).transpose()
    }
}

/// The log-sum-exp's element count for queries shaped `q` (`[B, Sq, Hq, D]` or `[total, Hq, D]`).
fn lse_shape(q: &[usize]) -> Shape {
    match q {
        [b, s, h, _] => Shape::from((*b, *h, *s)),
        [total, h, _] => Shape::from((*h, *total)),
        _ => Shape::from(0usize),
    }
}

impl AttnOp {
    pub(crate) fn new(options: AttnOptions, packing: Packing, keep_lse: bool) -> Self {
        AttnOp { options, packing, keep_lse, lse: Mutex::new(None) }
    }

    /// The forward: the output (contiguous, q's shape with V's head dim) and the log-sum-exp.
    pub(crate) fn forward(&self, q: Arg, k: Arg, v: Arg) -> Result<(CudaStorage, Shape, Tensor)> {
        let device: &CudaDevice = q.0.device();
        let ctx = device::context(device)?;
        let dtype = q.0.dtype();
        let (qv, kv, vv) = (device::view("q", q.0, q.1)?, device::view("k", k.0, k.1)?, device::view("v", v.0, v.1)?);
        // V's head dim, its own where it has one (DeepSeek's Q/K 192 with V 128): the output's.
        let mut o_dims = q.1.shape().dims().to_vec();
        if let (Some(last), Some(&dv)) = (o_dims.last_mut(), v.1.shape().dims().last()) {
            *last = dv;
        }
        let shape = Shape::from(o_dims);
        let mut o_layout = qv.layout().shape;
        o_layout[3] = vv.layout().shape[3];
        let o = Output::alloc(device, dtype, shape.elem_count())?;
        let lse_shape = lse_shape(shape.dims());
        let lse = Output::alloc(device, DType::F32, lse_shape.elem_count())?;
        let extras = Extras::of(self);
        let inputs = FwdInputs {
            q: qv,
            k: kv,
            v: vv,
            kv: extras.layout()?,
            alibi_slopes: extras.alibi()?,
            dropout_state: None,
            learnable_sink: extras.sinks()?,
            qv: None,
            descales: flashcore::Fp8Descales::default(),
        };
        let o_view = o.view_mut(o_layout, qv.layout().dtype, qv.device());
        // SAFETY: the LSE buffer holds `lse_shape`'s values and is written by this call alone.
        let lse_view = unsafe { flashcore::LseViewMut::from_raw(lse.ptr, lse_shape.elem_count()) };
        let params = self.options.params(false);
        device::on_candle_stream(device, |caller| {
            // SAFETY: every view is of candle memory on this device that stays alive (borrowed
            // or owned here) until the stream has run the call; the stream is candle's.
            unsafe { ctx.attention_on_stream(caller, &inputs, FwdOutputs { o: o_view, lse: Some(lse_view), probs: None }, &params) }
        })?;
        Ok((o.storage, shape, lse.into_tensor(lse_shape)))
    }

    /// The gradients of `q`, `k`, `v` for the output `o` and its gradient `dout`.
    fn backward(&self, q: &Tensor, k: &Tensor, v: &Tensor, o: &Tensor, dout: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let lse = match self.lse.lock().unwrap().take() {
            Some(lse) => lse,
            None => self.recompute_lse(q, k, v)?,
        };
        // Autograd's gradient of a sum is a broadcast (zero strides): the kernels read rows.
        let dout = dout.contiguous()?;
        let (qs, ks, vs, os, dos, lses) = (
            q.storage_and_layout(),
            k.storage_and_layout(),
            v.storage_and_layout(),
            o.storage_and_layout(),
            dout.storage_and_layout(),
            Held::of(&lse),
        );
        let (qc, kc, vc, oc, doc) = (cuda("q", &qs.0)?, cuda("k", &ks.0)?, cuda("v", &vs.0)?, cuda("o", &os.0)?, cuda("dout", &dos.0)?);
        let device: &CudaDevice = qc.device();
        let ctx = device::context(device)?;
        let extras = Extras::of(self);
        let inputs = BwdInputs {
            q: device::view("q", qc, qs.1)?,
            k: device::view("k", kc, ks.1)?,
            v: device::view("v", vc, vs.1)?,
            o: device::view("o", oc, os.1)?,
            lse: lses.vector("lse")?,
            dout: device::view("dout", doc, dos.1)?,
            kv: extras.layout()?,
            alibi_slopes: extras.alibi()?,
            dropout_state: None,
            learnable_sink: None,
        };
        let (dtype, ordinal) = (q.dtype(), inputs.q.device());
        let dq = Output::alloc(device, dtype, q.elem_count())?;
        let dk = Output::alloc(device, dtype, k.elem_count())?;
        let dv = Output::alloc(device, dtype, v.elem_count())?;
        let fc = inputs.q.layout().dtype;
        let grads = GradsMut::new(
            dq.view_mut(inputs.q.layout().shape, fc, ordinal),
            dk.view_mut(inputs.k.layout().shape, fc, ordinal),
            dv.view_mut(inputs.v.layout().shape, fc, ordinal),
        );
        let params = self.options.params(true);
        device::on_candle_stream(device, |caller| {
            // SAFETY: as the forward's: candle memory of this device, alive until the stream ran.
            unsafe { ctx.attention_backward_on_stream(caller, &inputs, grads, &params) }
        })?;
        Ok((dq.into_tensor(q.shape()), dk.into_tensor(k.shape()), dv.into_tensor(v.shape())))
    }

    /// The log-sum-exp of a forward the op did not keep, from a second forward pass.
    fn recompute_lse(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (qs, ks, vs) = (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout());
        match (&*qs.0, &*ks.0, &*vs.0) {
            (Storage::Cuda(qc), Storage::Cuda(kc), Storage::Cuda(vc)) => Ok(self.forward((qc, qs.1), (kc, ks.1), (vc, vs.1))?.2),
            _ => candle_core::bail!("flashcore: `q`, `k` and `v` must be on a CUDA device"),
        }
    }
}

impl candle_core::CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "flashcore-attention"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::device::cpu_refused()
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (o, shape, lse) = self.forward((q, q_l), (k, k_l), (v, v_l))?;
        if self.keep_lse {
            *self.lse.lock().unwrap() = Some(lse);
        }
        Ok((o, shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        dout: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = self.backward(q, k, v, o, dout)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
