//! Problem cases: the shapes `check` and `bench` run, random inputs for them, and the
//! error metrics.

use anyhow::Result;
use flashcore::{Context, DType, DeviceTensor, Layout, ProblemShape, TensorView};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

/// One attention problem.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Case {
    pub name: String,
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub dtype: DType,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        causal: bool,
        dtype: DType,
    ) -> Self {
        let mut name = format!("b{batch}_sq{seqlen_q}_sk{seqlen_k}_h{heads_q}");
        if heads_kv != heads_q {
            name += &format!("kv{heads_kv}");
        }
        name += &format!("_d{head_dim}_{}_{}", if causal { "causal" } else { "full" }, dtype.name());
        Self { name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype }
    }

    pub fn shape(&self) -> ProblemShape {
        ProblemShape {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        }
    }

    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.heads_q, self.head_dim]
    }

    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.heads_kv, self.head_dim]
    }
}

/// How the random inputs are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Inputs {
    /// Standard normal q, k, v.
    Normal,
    /// q and k scaled so the logits spread to about ±30 (tests the max subtraction).
    LargeLogits,
    /// Every key identical: softmax is uniform, so o is the mean of v.
    IdenticalKeys,
    /// Keys scaled from 1× at both ends of the sequence to 8× in the middle, so a row's
    /// running max keeps rising whichever end a kernel starts from (tests the rescale of
    /// the output when the max moves mid-row).
    RisingLogits,
}

/// Host copies of q, k, v, already rounded to the case's dtype.
pub struct HostQkv {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

pub fn random_qkv(case: &Case, inputs: Inputs, seed: u64) -> HostQkv {
    let qk_scale = if inputs == Inputs::LargeLogits { 30f32.sqrt() } else { 1.0 };
    let q = normal(case.q_shape().iter().product(), qk_scale, case.dtype, seed);
    let mut k = normal(case.kv_shape().iter().product(), qk_scale, case.dtype, seed ^ 0x6b);
    let v = normal(case.kv_shape().iter().product(), 1.0, case.dtype, seed ^ 0x76);
    let d = case.head_dim;
    if inputs == Inputs::IdenticalKeys {
        let first: Vec<f32> = k[..d].to_vec();
        k.chunks_mut(d).for_each(|row| row.copy_from_slice(&first));
    }
    if inputs == Inputs::RisingLogits {
        // k rows in [B, Sk, Hkv, D] order: row r is key (r / Hkv) % Sk.
        let sk = case.seqlen_k as f32;
        for (r, row) in k.chunks_mut(d).enumerate() {
            let j = ((r / case.heads_kv) % case.seqlen_k) as f32;
            let tent = 1.0 + 7.0 * (1.0 - (2.0 * j / sk.max(2.0) - 1.0).abs());
            row.iter_mut().for_each(|x| *x = case.dtype.decode(case.dtype.encode(*x * tent)));
        }
    }
    HostQkv { q, k, v }
}

/// `n` standard normal values times `scale`, rounded to `dtype`; drawn in parallel chunks,
/// each from its own seeded generator, so the result depends only on `seed`.
pub fn normal(n: usize, scale: f32, dtype: DType, seed: u64) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i as u64));
        for x in chunk {
            let z: f32 = StandardNormal.sample(&mut rng);
            *x = dtype.decode(dtype.encode(z * scale));
        }
    });
    out
}

/// Memory layout of a device tensor: BSHD contiguous, or stored BHSD (PyTorch's usual
/// layout) and viewed as BSHD through strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Bshd,
    Bhsd,
}

/// A device tensor in a given storage order, holding BSHD data.
pub struct Stored {
    pub tensor: DeviceTensor,
    pub layout: Layout,
}

impl Stored {
    pub fn upload(ctx: &Context, data: &[f32], shape: [usize; 4], dtype: DType, storage: Storage) -> Result<Self> {
        let [b, s, h, d] = shape;
        match storage {
            Storage::Bshd => {
                Ok(Self { tensor: DeviceTensor::from_f32(ctx, data, shape, dtype)?, layout: Layout::contiguous(shape, dtype) })
            }
            Storage::Bhsd => {
                let mut t = vec![0f32; data.len()];
                for (bi, si, hi) in itertools(b, s, h) {
                    let src = ((bi * s + si) * h + hi) * d;
                    let dst = ((bi * h + hi) * s + si) * d;
                    t[dst..dst + d].copy_from_slice(&data[src..src + d]);
                }
                let tensor = DeviceTensor::from_f32(ctx, &t, [b, h, s, d], dtype)?;
                Ok(Self { tensor, layout: Layout { shape, strides: [h * s * d, d, s * d, 1], dtype } })
            }
        }
    }

    pub fn view(&self) -> TensorView<'_> {
        let ptr = self.tensor.view().ptr();
        // SAFETY: the layout covers exactly the storage of `self.tensor`, which outlives the view.
        unsafe { TensorView::from_raw(ptr, self.layout, self.tensor.view().device()) }
    }
}

fn itertools(b: usize, s: usize, h: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..b).flat_map(move |bi| (0..s).flat_map(move |si| (0..h).map(move |hi| (bi, si, hi))))
}

/// `‖a − b‖₂ / ‖b‖₂` and `max |a − b|`; NaN anywhere gives NaN.
pub fn errors(out: &[f32], reference: &[f64]) -> (f64, f64) {
    let (mut diff2, mut ref2, mut max_abs) = (0f64, 0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let d = o as f64 - r;
        if d.is_nan() {
            return (f64::NAN, f64::NAN);
        }
        diff2 += d * d;
        ref2 += r * r;
        max_abs = max_abs.max(d.abs());
    }
    let rel = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    (rel, max_abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_flag_nan_and_measure_relative_error() {
        assert!(errors(&[1.0, f32::NAN], &[1.0, 1.0]).0.is_nan());
        let (rel, max) = errors(&[1.0, 2.0], &[1.0, 2.5]);
        assert!((rel - 0.5 / (1.0f64 + 6.25).sqrt()).abs() < 1e-12);
        assert_eq!(max, 0.5);
    }

    #[test]
    fn identical_keys_are_identical_and_inputs_are_rounded() {
        let case = Case::new(1, 3, 5, 2, 1, 8, false, DType::BF16);
        let x = random_qkv(&case, Inputs::IdenticalKeys, 1);
        assert!(x.k.chunks(8).all(|r| r == &x.k[..8]));
        assert!(x.q.iter().all(|&v| DType::BF16.decode(DType::BF16.encode(v)) == v));
        assert!(x.v.iter().any(|&v| v != 0.0));
    }
}
