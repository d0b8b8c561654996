//! Problem cases: the shapes `check` and `bench` run, random inputs for them, and the
//! error metrics.

use anyhow::Result;
use flashcore::{AttnParams, Context, DType, DeviceTensor, Layout, ProblemShape, TensorView, Window};
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
    /// V's own head dim (`ProblemShape::head_dim_v`; `check --value-dim`); absent: `head_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim_v: Option<usize>,
    pub causal: bool,
    pub dtype: DType,
    /// Sliding window `[left, right]` (`bench --window`); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<[i32; 2]>,
    /// Logit softcap (`bench --softcap`); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
    /// Chunked attention's chunk in keys (the `chunked` suites); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_chunk: Option<usize>,
    /// Learnable sinks, one a query head (`cases::sink_values`'s), on the call (the `sinks`
    /// suites); absent when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learnable_sink: bool,
    /// FlashAttention-3's `qv` on the call, random normal values shaped like the output (the
    /// `value-dim-fa3` suite); absent when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qv: bool,
    /// A packed (varlen) batch: `batch` sequences of these lengths, `seqlen_q` and
    /// `seqlen_k` then the longest (max_seqlen_q, max_seqlen_k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed: Option<Packed>,
    /// `bench`'s FLOP and K+V byte counts of the case ([`Case::with_counts`]), written into
    /// its JSON so `bench/anchors.py` and `bench/report.py` take the same counts (a window's
    /// or a packed batch's visible pairs are counted here, by the library, only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<Counts>,
}

/// See [`Case::counts`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Forward matrix FLOPs ([`Case::flops`]).
    pub flops: f64,
    /// Bytes of the keys and values attended to ([`Case::kv_bytes`]).
    pub kv_bytes: f64,
}

/// The sequences of a packed batch, as `bench --list-json` hands them to `bench/anchors.py`
/// (so both time the same batch).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Packed {
    /// Query rows of each sequence.
    pub seqlens_q: Vec<usize>,
    /// Keys each sequence holds (its `cu_seqlens_k` span).
    pub seqlens_k: Vec<usize>,
    /// Keys each sequence uses (`seqused_k`), when fewer than it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqused_k: Option<Vec<usize>>,
}

impl Packed {
    /// Keys sequence `b` attends over.
    pub fn used_k(&self, b: usize) -> usize {
        self.seqused_k.as_ref().map_or(self.seqlens_k[b], |u| u[b])
    }

    /// `[B + 1]` prefix sums of `lens` (cu_seqlens).
    pub fn cumulative(lens: &[usize]) -> Vec<i32> {
        let mut cu = vec![0i32];
        for &len in lens {
            cu.push(cu[cu.len() - 1] + len as i32);
        }
        cu
    }
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
        Self {
            name,
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
            head_dim_v: None,
            causal,
            dtype,
            window: None,
            softcap: None,
            attention_chunk: None,
            learnable_sink: false,
            qv: false,
            packed: None,
            counts: None,
        }
    }

    /// A packed batch of the sequences `packed` describes, named `{prefix}_h.._d.._mask_dtype`.
    #[allow(clippy::too_many_arguments)]
    pub fn packed(prefix: &str, packed: Packed, heads_q: usize, heads_kv: usize, head_dim: usize, causal: bool, dtype: DType) -> Self {
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let used: Vec<usize> = (0..packed.seqlens_k.len()).map(|b| packed.used_k(b)).collect();
        let mut case = Case::new(packed.seqlens_q.len(), max(&packed.seqlens_q), max(&used), heads_q, heads_kv, head_dim, causal, dtype);
        case.name = prefix.to_string() + &case.name[case.name.find("_h").expect("Case::new names heads")..];
        case.packed = Some(packed);
        case
    }

    /// The case with V's own head dim `head_dim_v`, which its name says after the head dim
    /// (`_d192_dv128`).
    pub fn with_value_dim(mut self, head_dim_v: usize) -> Self {
        let d = format!("_d{}", self.head_dim);
        self.name = self.name.replacen(&(d.clone() + "_"), &format!("{d}_dv{head_dim_v}_"), 1);
        self.head_dim_v = Some(head_dim_v);
        self
    }

    /// The case with FlashAttention-3's `qv` (`_qv` at the end of its name).
    pub fn with_qv(mut self) -> Self {
        self.name += "_qv";
        self.qv = true;
        self
    }

    /// V's head dim (and the output's): its own, else `head_dim`.
    pub fn value_dim(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }

    /// The case with a window and a softcap (`bench --window`, `--softcap`), which its name
    /// then says (`_win{left}_{right}`, `_cap{softcap}`).
    pub fn with_mods(mut self, window: Window, softcap: f32) -> Self {
        if window != Window::UNBOUNDED {
            self.name += &format!("_win{}_{}", window.left, window.right);
            self.window = Some([window.left, window.right]);
        }
        if softcap != 0.0 {
            self.name += &format!("_cap{softcap}");
            self.softcap = Some(softcap);
        }
        self
    }

    /// The case with chunked attention of `chunk` keys, which its name then says (`_chunk{chunk}`).
    pub fn with_chunk(mut self, chunk: usize) -> Self {
        self.name += &format!("_chunk{chunk}");
        self.attention_chunk = Some(chunk);
        self
    }

    /// The case with learnable sinks, which its name then says (`_sinks`).
    pub fn with_sinks(mut self) -> Self {
        self.name += "_sinks";
        self.learnable_sink = true;
        self
    }

    /// The sinks of the case on the device ([`sink_values`]), or none.
    pub fn sinks(&self, ctx: &flashcore::Context) -> anyhow::Result<Option<cudarc::driver::CudaSlice<f32>>> {
        upload_slopes(ctx, &sink_values(self.learnable_sink, self.heads_q))
    }

    /// The case with its [`Counts`] filled in (what `bench` writes).
    pub fn with_counts(mut self) -> Self {
        self.counts = Some(Counts { flops: self.flops(), kv_bytes: self.kv_bytes() });
        self
    }

    /// The mask and score transform of the case (its causal flag, window, chunk and softcap).
    pub fn params(&self) -> AttnParams {
        AttnParams {
            causal: self.causal,
            window: self.window.map_or(Window::UNBOUNDED, |[l, r]| Window::new(l, r)),
            attention_chunk: self.attention_chunk.unwrap_or(0),
            softcap: self.softcap.unwrap_or(0.0),
            ..AttnParams::default()
        }
    }

    /// Forward matrix FLOPs, counted on the pairs the mask lets through
    /// ([`ProblemShape::flops`]); a packed batch's are the sum of its sequences', each
    /// counted as a dense batch of one (so a packed row's rate compares with a dense one's).
    /// With `qv`, qv·vᵀ counts as a Q·Kᵀ of V's depth more (2·(D + 2·Dv) a visible pair).
    pub fn flops(&self) -> f64 {
        let params = self.params();
        if self.qv {
            let deeper = Case { head_dim: self.head_dim + self.value_dim(), head_dim_v: Some(self.value_dim()), qv: false, ..self.clone() };
            return deeper.flops();
        }
        match &self.packed {
            None => self.shape().flops(&params),
            Some(p) => (0..p.seqlens_q.len())
                .map(|b| ProblemShape { batch: 1, seqlen_q: p.seqlens_q[b], seqlen_k: p.used_k(b), ..self.shape() }.flops(&params))
                .sum(),
        }
    }

    /// Bytes of the keys and values attended to: what a decode step must read.
    pub fn kv_bytes(&self) -> f64 {
        let elem = self.dtype.size_bytes();
        match &self.packed {
            None => self.shape().kv_bytes(elem),
            Some(p) => {
                let keys: usize = (0..p.seqlens_k.len()).map(|b| p.used_k(b)).sum();
                (keys * self.heads_kv * (self.head_dim + self.value_dim()) * elem) as f64
            }
        }
    }

    pub fn shape(&self) -> ProblemShape {
        ProblemShape {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            head_dim_v: self.value_dim(),
        }
    }

    /// The tensors' shape as the kernels' arguments hold them: `shape()`, or packed
    /// `B = 1` with the total query rows and keys (what the input sets' bytes count).
    pub fn storage_shape(&self) -> ProblemShape {
        let ([batch, seqlen_q, ..], [_, seqlen_k, ..]) = (self.q_shape(), self.kv_shape());
        ProblemShape { batch, seqlen_q, seqlen_k, ..self.shape() }
    }

    /// `q`'s shape: `[B, Sq, Hq, D]`, or `[1, total_q, Hq, D]` packed.
    pub fn q_shape(&self) -> [usize; 4] {
        match &self.packed {
            None => [self.batch, self.seqlen_q, self.heads_q, self.head_dim],
            Some(p) => [1, p.seqlens_q.iter().sum(), self.heads_q, self.head_dim],
        }
    }

    /// `k`'s (and `v`'s) shape: `[B, Sk, Hkv, D]`, or `[1, total_k, Hkv, D]` packed.
    pub fn kv_shape(&self) -> [usize; 4] {
        match &self.packed {
            None => [self.batch, self.seqlen_k, self.heads_kv, self.head_dim],
            Some(p) => [1, p.seqlens_k.iter().sum(), self.heads_kv, self.head_dim],
        }
    }

    /// `v`'s shape: `k`'s with V's head dim.
    pub fn v_shape(&self) -> [usize; 4] {
        let [b, s, h, _] = self.kv_shape();
        [b, s, h, self.value_dim()]
    }

    /// The output's shape: `q`'s with V's head dim.
    pub fn o_shape(&self) -> [usize; 4] {
        let [b, s, h, _] = self.q_shape();
        [b, s, h, self.value_dim()]
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
    let v = normal(case.v_shape().iter().product(), 1.0, case.dtype, seed ^ 0x76);
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

/// `slopes` on the device (`None` when empty: ALiBi off).
pub fn upload_slopes(ctx: &flashcore::Context, slopes: &[f32]) -> anyhow::Result<Option<cudarc::driver::CudaSlice<f32>>> {
    Ok(if slopes.is_empty() { None } else { Some(ctx.stream().clone_htod(slopes)?) })
}

/// Learnable sinks for a check, one a query head (none unless `on`): spread over [-1, 8], below
/// and above a row's LSE (ln of ~1000 keys is ~7), so that some rows barely feel theirs and
/// others are mostly sink.
pub fn sink_values(on: bool, heads_q: usize) -> Vec<f32> {
    if !on {
        return Vec::new();
    }
    (0..heads_q).map(|h| (h as f32 * 2.7).rem_euclid(9.0) - 1.0).collect()
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
    fn a_case_with_v_s_own_head_dim_names_it_and_shapes_v_and_the_output_by_it() {
        let fa3 = Case::new(2, 8, 8, 4, 4, 64, false, DType::BF16).with_value_dim(256);
        let with_qv = fa3.clone().with_qv();
        assert!(with_qv.name.ends_with("_bf16_qv") && with_qv.shape() == fa3.shape(), "{}", with_qv.name);
        assert_eq!(with_qv.flops() / fa3.flops(), (64.0 + 2.0 * 256.0) / (64.0 + 256.0), "qv·vᵀ: a Q·Kᵀ of V's depth more");
        let case = Case::new(2, 5, 7, 4, 2, 192, true, DType::BF16).with_value_dim(128);
        assert_eq!(case.name, "b2_sq5_sk7_h4kv2_d192_dv128_causal_bf16");
        assert_eq!(
            (case.q_shape(), case.kv_shape(), case.v_shape(), case.o_shape()),
            ([2, 5, 4, 192], [2, 7, 2, 192], [2, 7, 2, 128], [2, 5, 4, 128])
        );
        assert_eq!((case.shape().head_dim, case.shape().head_dim_v), (192, 128));
        let host = random_qkv(&case, Inputs::Normal, 3);
        assert_eq!((host.q.len(), host.k.len(), host.v.len()), (2 * 5 * 4 * 192, 2 * 7 * 2 * 192, 2 * 7 * 2 * 128));
        let plain = Case::new(2, 5, 7, 4, 2, 192, true, DType::BF16);
        assert_eq!((plain.value_dim(), plain.v_shape()), (192, plain.kv_shape()));
        assert_eq!(case.flops(), plain.flops() * (192.0 + 128.0) / (2.0 * 192.0), "P·V at 128 columns");
        assert_eq!(case.kv_bytes(), (2 * 7 * 2 * (192 + 128) * 2) as f64);
    }

    #[test]
    fn mods_name_the_case_and_packed_counts_are_per_sequence() {
        let case = Case::new(1, 16, 16, 2, 1, 8, true, DType::BF16).with_mods(Window::new(4, 0), 30.0);
        assert_eq!(case.name, "b1_sq16_sk16_h2kv1_d8_causal_bf16_win4_0_cap30");
        assert_eq!(case.params(), AttnParams { causal: true, window: Window::new(4, 0), softcap: 30.0, ..AttnParams::default() });
        assert_eq!(case.flops(), 4.0 * 2.0 * 8.0 * case.params().visible_pairs(16, 16) as f64);
        let plain = Case::new(1, 16, 16, 2, 1, 8, false, DType::BF16).with_mods(Window::UNBOUNDED, 0.0);
        assert_eq!((plain.window, plain.softcap, plain.name.as_str()), (None, None, "b1_sq16_sk16_h2kv1_d8_full_bf16"));

        let packed = Packed { seqlens_q: vec![3, 1, 4], seqlens_k: vec![3, 8, 4], seqused_k: Some(vec![3, 5, 0]) };
        assert_eq!(Packed::cumulative(&packed.seqlens_k), vec![0, 3, 11, 15]);
        let case = Case::packed("p", packed, 4, 2, 8, true, DType::BF16);
        assert_eq!((case.name.as_str(), case.batch, case.seqlen_q, case.seqlen_k), ("p_h4kv2_d8_causal_bf16", 3, 4, 5));
        assert_eq!((case.q_shape(), case.kv_shape()), ([1, 8, 4, 8], [1, 15, 2, 8]));
        let dense = |sq, sk| Case::new(1, sq, sk, 4, 2, 8, true, DType::BF16).flops();
        assert_eq!(case.flops(), dense(3, 3) + dense(1, 5), "each sequence as a dense batch of one; no keys, no FLOPs");
        assert_eq!(case.kv_bytes(), (2 * 8 * 2 * 8 * 2) as f64, "the used keys only");
        let back: Case = serde_json::from_str(&serde_json::to_string(&case.clone().with_counts()).unwrap()).unwrap();
        assert_eq!(back.counts.unwrap().flops, case.flops());
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
