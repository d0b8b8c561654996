//! Checks of the attention arguments, each failure an [`Error`] naming the argument.

use crate::error::{Error, Result};
use crate::shape::ProblemShape;
use crate::tensor::{DType, TensorView};

/// Kernel grids put heads in `gridDim.y` and batch in `gridDim.z`, which stop at 65535.
const MAX_GRID_YZ: usize = 65535;

/// Validates `q`, `k`, `v` and the output `o` on `device`; returns the problem's shape.
pub(crate) fn problem(q: &TensorView, k: &TensorView, v: &TensorView, o: &TensorView, device: usize) -> Result<ProblemShape> {
    for (arg, t) in [("q", q), ("k", k), ("v", v)] {
        tensor(arg, t, device)?;
    }
    let [b, sq, hq, d] = q.layout.shape;
    let [kb, sk, hkv, kd] = k.layout.shape;
    if kb != b {
        return Err(shape_err("k", format!("batch {kb} differs from q's batch {b}")));
    }
    if kd != d {
        return Err(shape_err("k", format!("head dim {kd} differs from q's head dim {d}")));
    }
    same_dims(("v", v), ("k", k), 3)?; // V may have a head dim of its own: which the kernels take is the planner's
    let dv = v.layout.shape[3];
    if hq % hkv != 0 {
        return Err(shape_err("k", format!("q heads ({hq}) are not a multiple of k/v heads ({hkv})")));
    }
    if b > MAX_GRID_YZ || hq > MAX_GRID_YZ {
        return Err(shape_err("q", format!("batch {b} and heads {hq} must each be at most {MAX_GRID_YZ}")));
    }
    if sq > i32::MAX as usize || sk > i32::MAX as usize {
        return Err(shape_err("q", "sequence lengths must be below 2^31".into()));
    }
    let dtype = q.layout.dtype;
    for (arg, t) in [("k", k), ("v", v)] {
        if t.layout.dtype != dtype {
            return Err(Error::DType { arg, msg: format!("{} differs from q's {dtype}", t.layout.dtype) });
        }
    }
    output(q, o, dv, device)?;
    Ok(ProblemShape { batch: b, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv })
}

/// Validates `q` and `o` of a call without queries (a KV cache's, whose pools are then not
/// read): the problem has no keys either.
pub(crate) fn queries_only(q: &TensorView, o: &TensorView, device: usize) -> Result<ProblemShape> {
    tensor("q", q, device)?;
    let [b, sq, hq, d] = q.layout.shape;
    output(q, o, d, device)?;
    Ok(ProblemShape { batch: b, seqlen_q: sq, seqlen_k: 0, heads_q: hq, heads_kv: hq, head_dim: d, head_dim_v: d })
}

/// Validates the output `o` against the checked `q`: a tensor of the call's device with q's
/// shape but its head dim, which is V's `dv`, in q's dtype (e4m3 inputs: bf16, `DType::output`).
fn output(q: &TensorView, o: &TensorView, dv: usize, device: usize) -> Result<()> {
    tensor("o", o, device)?;
    same_dims(("o", o), ("q", q), 3)?;
    if o.layout.shape[3] != dv {
        return Err(shape_err("o", format!("head dim {} differs from v's {dv}", o.layout.shape[3])));
    }
    let (got, inputs, want) = (o.layout.dtype, q.layout.dtype, q.layout.dtype.output());
    if got != want {
        let msg = if want == inputs { format!("{got} differs from q's {inputs}") } else { format!("{got}: {inputs} inputs give {want}") };
        return Err(Error::DType { arg: "o", msg });
    }
    Ok(())
}

/// Validates FP8 descales (q's, k's, v's: `(address, values)` each, or none) against the
/// inputs' `dtype` and the kernels' `shape`: only with e4m3 inputs, each f32 `[B, Hkv]`, 4-byte
/// aligned. Returns their addresses (0: none).
pub(crate) fn descales(d: [Option<(u64, usize)>; 3], dtype: DType, shape: &ProblemShape) -> Result<[u64; 3]> {
    let mut out = [0u64; 3];
    for (i, (arg, vec)) in ["q_descale", "k_descale", "v_descale"].into_iter().zip(d).enumerate() {
        let Some((ptr, len)) = vec else { continue };
        if dtype != DType::E4M3 {
            return Err(Error::Param { arg, msg: format!("given with {dtype} inputs: descales go with e4m3 ones") });
        }
        if !ptr.is_multiple_of(4) {
            return Err(Error::Param { arg, msg: format!("device pointer {ptr:#x} is not 4-byte aligned") });
        }
        let want = shape.batch * shape.heads_kv;
        if len != want {
            return Err(shape_err(arg, format!("{len} values: need one a sequence and KV head, [B, Hkv] = {want}")));
        }
        out[i] = ptr;
    }
    Ok(out)
}

/// Validates FlashAttention-3's `qv` against the checked output `o`: a tensor of the call's
/// device shaped like `o` (`[B, Sq, Hq, Dv]`; packed `[1, total_q, Hq, Dv]`) in q's dtype.
/// Which pairs and layouts take it is the planner's (`dispatch::qv_form`).
pub(crate) fn qv(qv: &TensorView, o: &TensorView, device: usize) -> Result<()> {
    tensor("qv", qv, device)?;
    same_shape(("qv", qv), ("o", o))?;
    if qv.layout.dtype != o.layout.dtype {
        return Err(Error::DType { arg: "qv", msg: format!("{} differs from q's {}", qv.layout.dtype, o.layout.dtype) });
    }
    Ok(())
}

/// Validates the log-sum-exp buffer's length against the problem.
pub(crate) fn lse(len: usize, shape: &ProblemShape) -> Result<()> {
    let want = shape.batch * shape.heads_q * shape.seqlen_q;
    if len != want {
        return Err(shape_err("lse", format!("{len} elements, need B*Hq*Sq = {want}")));
    }
    Ok(())
}

/// Validates the backward's extra arguments against the forward problem `shape` (from
/// [`problem`] on q, k, v, o): `dout` like `o`, the gradients like their inputs, and no
/// gradient overlapping an input or another gradient.
pub(crate) fn backward(
    inputs: &[(&'static str, &TensorView); 5],
    grads: &[(&'static str, &TensorView); 3],
    shape: &ProblemShape,
    device: usize,
) -> Result<()> {
    let [(_, q), (_, k), (_, v), (_, o), (_, dout)] = *inputs;
    tensor("dout", dout, device)?;
    same_shape(("dout", dout), ("o", o))?;
    if dout.layout.dtype != o.layout.dtype {
        return Err(Error::DType { arg: "dout", msg: format!("{} differs from o's {}", dout.layout.dtype, o.layout.dtype) });
    }
    for &(arg, g) in grads {
        tensor(arg, g, device)?;
        let like = match arg {
            "dq" => ("q", q),
            "dk" => ("k", k),
            _ => ("v", v),
        };
        same_shape((arg, g), like)?;
        if g.layout.dtype != like.1.layout.dtype {
            return Err(Error::DType { arg, msg: format!("{} differs from the inputs' {}", g.layout.dtype, like.1.layout.dtype) });
        }
        for &(other, t) in inputs.iter().chain(grads.iter()) {
            if other != arg && overlaps(g, t) {
                return Err(Error::Param { arg, msg: format!("its memory overlaps `{other}`: gradients need buffers of their own") });
            }
        }
    }
    if !crate::kernels::is_head_dim(shape.head_dim) {
        return Err(Error::HeadDim { head_dim: shape.head_dim, supported: crate::kernels::KernelFamily::Reference.head_dims_text() });
    }
    Ok(())
}

/// The names of a BSHD tensor's dimensions, as errors give them.
const DIMS: [&str; 4] = ["batch (dim 0)", "sequence length (dim 1)", "heads (dim 2)", "head dim (dim 3)"];

/// Checks that `t` has `like`'s shape; the error names the first dimension that differs and
/// both values, e.g. `v: sequence length (dim 1) 7 differs from k's 8`.
fn same_shape(t: (&'static str, &TensorView), like: (&str, &TensorView)) -> Result<()> {
    same_dims(t, like, 4)
}

/// [`same_shape`] over the first `dims` dimensions.
fn same_dims((arg, t): (&'static str, &TensorView), (like_name, like): (&str, &TensorView), dims: usize) -> Result<()> {
    let (a, b) = (t.layout.shape, like.layout.shape);
    match (0..dims).find(|&i| a[i] != b[i]) {
        Some(i) => Err(shape_err(arg, format!("{} {} differs from {like_name}'s {} (shapes {a:?} and {b:?})", DIMS[i], a[i], b[i]))),
        None => Ok(()),
    }
}

/// Whether the byte ranges `a` and `b` may reach overlap (an empty tensor reaches none).
fn overlaps(a: &TensorView, b: &TensorView) -> bool {
    let range = |t: &TensorView| (t.ptr, t.ptr + (t.layout.span() * t.layout.dtype.size_bytes()) as u64);
    let ((a0, a1), (b0, b1)) = (range(a), range(b));
    a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
}

/// Validates a caller's log-sum-exp address: f32 elements, so 4-byte aligned.
pub(crate) fn lse_alignment(ptr: u64) -> Result<()> {
    if !ptr.is_multiple_of(4) {
        return Err(Error::Param { arg: "lse", msg: format!("device pointer {ptr:#x} is not 4-byte aligned") });
    }
    Ok(())
}

/// The batch stride of ALiBi slopes of `len` f32 values at `ptr` for `shape` (the kernels'
/// shape: packed, B is the sequences): 0 for `[Hq]` (every sequence's), Hq for `[B, Hq]`.
pub(crate) fn alibi_slopes(ptr: u64, len: usize, shape: &ProblemShape) -> Result<usize> {
    let (b, h) = (shape.batch, shape.heads_q);
    if !ptr.is_multiple_of(4) {
        return Err(Error::Param { arg: "alibi_slopes", msg: format!("device pointer {ptr:#x} is not 4-byte aligned") });
    }
    if len == h {
        Ok(0)
    } else if len == b * h {
        Ok(h)
    } else {
        Err(shape_err("alibi_slopes", format!("{len} values: need [Hq] = {h} or [B, Hq] = {} (B = {b} sequences)", b * h)))
    }
}

/// Validates learnable sinks (`FwdInputs::learnable_sink`): f32 `[Hq]`, 4-byte aligned.
pub(crate) fn learnable_sink(ptr: u64, len: usize, shape: &ProblemShape) -> Result<()> {
    one_a_query_head("learnable_sink", ptr, len, shape)
}

/// Validates where the sinks' gradient goes (`GradsMut::dsink`): f32 `[Hq]`, 4-byte aligned.
pub(crate) fn sink_grad(ptr: u64, len: usize, shape: &ProblemShape) -> Result<()> {
    one_a_query_head("dsink", ptr, len, shape)
}

fn one_a_query_head(arg: &'static str, ptr: u64, len: usize, shape: &ProblemShape) -> Result<()> {
    if !ptr.is_multiple_of(4) {
        return Err(Error::Param { arg, msg: format!("device pointer {ptr:#x} is not 4-byte aligned") });
    }
    if len != shape.heads_q {
        return Err(shape_err(arg, format!("{len} values: need one a query head, [Hq] = {}", shape.heads_q)));
    }
    Ok(())
}

/// Validates dropout's probabilities (`FwdOutputs::probs`) for the kernels' `shape` (B
/// sequences of the longest lengths) in q's `dtype`: a call with dropout, `[B, Hq, rows,
/// cols]` contiguous with `rows >= Sq`, `cols >= Sk` (flash_attn rounds both up to 128), on
/// `device`. Returns `(rows, cols)`.
pub(crate) fn dropout_probs(t: &TensorView, shape: &ProblemShape, dtype: DType, dropout: bool, device: usize) -> Result<(usize, usize)> {
    if !dropout {
        return Err(Error::Param { arg: "probs", msg: "the dropout mask's probabilities exist only with dropout".into() });
    }
    if t.device != device {
        return Err(Error::DeviceMismatch { arg: "probs", tensor_device: t.device, context_device: device });
    }
    if t.layout.dtype != dtype {
        return Err(Error::DType { arg: "probs", msg: format!("{} differs from q's {dtype}", t.layout.dtype) });
    }
    let [b, h, rows, cols] = t.layout.shape;
    if b != shape.batch || h != shape.heads_q || rows < shape.seqlen_q || cols < shape.seqlen_k || cols % 2 != 0 {
        let want =
            format!("[B, Hq, >= Sq, >= Sk (even)] = [{}, {}, >= {}, >= {}]", shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k);
        return Err(shape_err("probs", format!("{:?}, need {want}", t.layout.shape)));
    }
    if t.layout.strides != [h * rows * cols, rows * cols, cols, 1] || !t.ptr.is_multiple_of(4) {
        return Err(Error::Stride {
            arg: "probs",
            msg: format!("must be contiguous and 4-byte aligned, got strides {:?}", t.layout.strides),
        });
    }
    if b * h * rows * cols > i64::MAX as usize / 2 || rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(shape_err("probs", "too large".into()));
    }
    Ok((rows, cols))
}

/// Validates the scratch memory a caller's allocator returned (read as float4 rows).
pub(crate) fn scratch_alignment(ptr: u64) -> Result<()> {
    if ptr == 0 || !ptr.is_multiple_of(16) {
        return Err(Error::Alignment { arg: "scratch", ptr });
    }
    Ok(())
}

/// Validates the softmax scale: finite and not negative (the kernels take each row's max
/// of the raw scores, which is the max of the scaled ones only for a scale ≥ 0).
pub(crate) fn tensor(arg: &'static str, t: &TensorView, device: usize) -> Result<()> {
    if t.device != device {
        return Err(Error::DeviceMismatch { arg, tensor_device: t.device, context_device: device });
    }
    // No sequences or no rows is a call with nothing to compute (`ProblemShape::has_no_pairs`);
    // no heads or no head dim is not a problem at all.
    if t.layout.shape[2] == 0 || t.layout.shape[3] == 0 {
        return Err(shape_err(arg, format!("{:?} has no heads or no head dim", t.layout.shape)));
    }
    if !t.layout.shape[3].is_multiple_of(8) {
        return Err(shape_err(arg, format!("head dim {} must be a multiple of 8", t.layout.shape[3])));
    }
    if t.layout.strides[3] != 1 {
        return Err(Error::Stride { arg, msg: format!("last dim must be contiguous (stride 1), got {:?}", t.layout.strides) });
    }
    // Kernels move 16 bytes (8 16-bit elements, 16 e4m3) at a time along each row.
    let per_16_bytes = 16 / t.layout.dtype.size_bytes();
    if let Some(i) = (0..3).find(|&i| !t.layout.strides[i].is_multiple_of(per_16_bytes) && t.layout.shape[i] > 1) {
        return Err(Error::Stride {
            arg,
            msg: format!("stride of dim {i} is {}, must be a multiple of {per_16_bytes} elements (16 bytes)", t.layout.strides[i]),
        });
    }
    if !t.ptr.is_multiple_of(16) {
        return Err(Error::Alignment { arg, ptr: t.ptr });
    }
    Ok(())
}

fn shape_err(arg: &'static str, msg: String) -> Error {
    Error::Shape { arg, msg }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Layout;

    const DEV: usize = 0;

    fn view(shape: [usize; 4], dtype: DType) -> TensorView<'static> {
        // SAFETY: validation never dereferences the pointer.
        unsafe { TensorView::from_raw(0x1000, Layout::contiguous(shape, dtype), DEV) }
    }

    fn with(layout: Layout, ptr: u64, device: usize) -> TensorView<'static> {
        // SAFETY: as above.
        unsafe { TensorView::from_raw(ptr, layout, device) }
    }

    fn qkv() -> [TensorView<'static>; 4] {
        let q = view([2, 100, 8, 64], DType::BF16);
        let kv = view([2, 300, 2, 64], DType::BF16);
        [q, kv, kv, q]
    }

    fn check(t: [TensorView<'static>; 4]) -> Result<ProblemShape> {
        problem(&t[0], &t[1], &t[2], &t[3], DEV)
    }

    /// FlashAttention-3's `qv` is checked against the output: its shape, q's dtype, the
    /// call's device; each error names `qv`.
    #[test]
    fn e4m3_inputs_give_a_bf16_output_and_take_descales_of_b_by_hkv() {
        let (q, k, v) = (view([2, 10, 8, 128], DType::E4M3), view([2, 12, 2, 128], DType::E4M3), view([2, 12, 2, 128], DType::E4M3));
        let o = view([2, 10, 8, 128], DType::BF16);
        let shape = problem(&q, &k, &v, &o, DEV).unwrap();
        let err = problem(&q, &k, &v, &view([2, 10, 8, 128], DType::E4M3), DEV).unwrap_err();
        assert!(matches!(err, Error::DType { arg: "o", .. }) && err.to_string().contains("bf16"), "{err}");
        // e4m3 rows step by whole 16 bytes: 16 elements.
        let odd = Layout { strides: [10 * 8 * 136, 8 * 136, 136, 1], ..Layout::contiguous([2, 10, 8, 128], DType::E4M3) };
        assert!(matches!(problem(&with(odd, 0x1000, DEV), &k, &v, &o, DEV), Err(Error::Stride { arg: "q", .. })));
        let all = [Some((0x1000, 4)); 3];
        assert_eq!(descales(all, DType::E4M3, &shape).unwrap(), [0x1000; 3]);
        assert_eq!(descales([None; 3], DType::BF16, &shape).unwrap(), [0; 3]);
        let cases = [
            ([None, Some((0x1000, 8)), None], DType::E4M3, "k_descale"),
            ([None, None, Some((0x1002, 4))], DType::E4M3, "v_descale"),
            ([Some((0x1000, 4)), None, None], DType::BF16, "q_descale"),
        ];
        for (d, dtype, arg) in cases {
            let err = descales(d, dtype, &shape).unwrap_err();
            assert!(err.to_string().contains(arg), "{err}");
        }
    }

    #[test]
    fn qv_is_shaped_like_the_output_in_q_s_dtype() {
        let o = view([2, 100, 8, 256], DType::BF16);
        assert!(qv(&view([2, 100, 8, 256], DType::BF16), &o, DEV).is_ok());
        for (bad, what) in [
            (view([2, 100, 8, 64], DType::BF16), "head dim (dim 3) 64 differs from o's 256"),
            (view([2, 99, 8, 256], DType::BF16), "sequence length (dim 1) 99"),
            (view([2, 100, 8, 256], DType::F16), "f16 differs from q's bf16"),
            (with(Layout::contiguous([2, 100, 8, 256], DType::BF16), 0x1000, DEV + 1), "device"),
        ] {
            let err = qv(&bad, &o, DEV).unwrap_err().to_string();
            assert!(err.contains("`qv`") && err.contains(what), "{err}");
        }
    }

    #[test]
    fn a_valid_gqa_problem_passes() {
        let s = check(qkv()).unwrap();
        assert_eq!((s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim), (2, 100, 300, 8, 2, 64));
    }

    #[test]
    fn bhsd_strides_are_accepted() {
        let mut t = qkv();
        t[0] = with(Layout { shape: [2, 100, 8, 64], strides: [8 * 100 * 64, 64, 100 * 64, 1], dtype: DType::BF16 }, 0x1000, DEV);
        assert!(check(t).is_ok());
    }

    #[test]
    fn batch_mismatch_names_k() {
        let mut t = qkv();
        t[1] = view([3, 300, 2, 64], DType::BF16);
        assert!(matches!(check(t), Err(Error::Shape { arg: "k", .. })));
    }

    #[test]
    fn a_shape_mismatch_names_the_dimension_and_both_values() {
        let mut t = qkv();
        t[2] = view([2, 299, 2, 64], DType::BF16);
        let msg = check(t).unwrap_err().to_string();
        assert!(msg.contains("`v`") && msg.contains("sequence length (dim 1) 299 differs from k's 300"), "{msg}");
        let mut t = qkv();
        t[3] = view([2, 100, 4, 64], DType::BF16);
        let msg = check(t).unwrap_err().to_string();
        assert!(msg.contains("`o`") && msg.contains("heads (dim 2) 4 differs from q's 8"), "{msg}");
    }

    #[test]
    fn head_dim_mismatch_names_k() {
        let mut t = qkv();
        t[1] = view([2, 300, 2, 128], DType::BF16);
        assert!(matches!(check(t), Err(Error::Shape { arg: "k", .. })));
    }

    #[test]
    fn v_may_have_a_head_dim_of_its_own_and_the_output_follows_it() {
        let mut t = qkv();
        t[2] = view([2, 300, 2, 128], DType::BF16);
        t[3] = view([2, 100, 8, 128], DType::BF16);
        let s = check(t).unwrap();
        assert_eq!((s.head_dim, s.head_dim_v), (64, 128), "which kernels take it is the planner's to say");
        let mut t = qkv();
        t[2] = view([2, 300, 2, 128], DType::BF16);
        let msg = check(t).unwrap_err().to_string();
        assert!(msg.contains("`o`") && msg.contains("head dim 64 differs from v's 128"), "{msg}");
        let mut t = qkv();
        t[3] = view([2, 100, 8, 32], DType::BF16);
        let msg = check(t).unwrap_err().to_string();
        assert!(msg.contains("`o`") && msg.contains("head dim 32 differs from v's 64"), "{msg}");
        assert_eq!(check(qkv()).unwrap().head_dim_v, 64);
    }

    #[test]
    fn v_unlike_k_names_v() {
        let mut t = qkv();
        t[2] = view([2, 301, 2, 64], DType::BF16);
        assert!(matches!(check(t), Err(Error::Shape { arg: "v", .. })));
    }

    #[test]
    fn output_unlike_q_names_o() {
        let mut t = qkv();
        t[3] = view([2, 99, 8, 64], DType::BF16);
        assert!(matches!(check(t), Err(Error::Shape { arg: "o", .. })));
    }

    #[test]
    fn heads_not_a_multiple_names_k() {
        let mut t = qkv();
        t[1] = view([2, 300, 3, 64], DType::BF16);
        t[2] = t[1];
        let err = check(t).unwrap_err();
        assert!(matches!(err, Error::Shape { arg: "k", .. }));
        assert!(err.to_string().contains("multiple"), "{err}");
    }

    #[test]
    fn no_sequences_rows_or_keys_pass_as_a_problem_without_pairs() {
        for (q, kv) in [([0, 100, 8, 64], [0, 300, 2, 64]), ([2, 0, 8, 64], [2, 300, 2, 64]), ([2, 100, 8, 64], [2, 0, 2, 64])] {
            let (q, kv) = (view(q, DType::BF16), view(kv, DType::BF16));
            let shape = check([q, kv, kv, q]).unwrap();
            assert!(shape.has_no_pairs(), "{shape:?}");
        }
        assert!(!check(qkv()).unwrap().has_no_pairs());
    }

    #[test]
    fn no_heads_or_no_head_dim_is_an_error() {
        for (i, q) in [[2, 100, 0, 64], [2, 100, 8, 0]].into_iter().enumerate() {
            let mut t = qkv();
            t[0] = view(q, DType::BF16);
            t[3] = t[0];
            let err = check(t).unwrap_err();
            assert!(matches!(err, Error::Shape { arg: "q", .. }) && err.to_string().contains("no heads or no head dim"), "{i}: {err}");
        }
    }

    #[test]
    fn an_empty_gradient_overlaps_nothing() {
        let empty = view([2, 0, 8, 64], DType::BF16);
        let inside = with(Layout::contiguous([2, 0, 8, 64], DType::BF16), 0x1000 + 64, DEV);
        assert!(!overlaps(&inside, &view([2, 100, 8, 64], DType::BF16)));
        assert!(!overlaps(&empty, &empty));
        assert!(overlaps(&view([2, 100, 8, 64], DType::BF16), &view([2, 100, 8, 64], DType::BF16)));
    }

    #[test]
    fn mixed_dtypes_name_the_odd_one() {
        let mut t = qkv();
        t[2] = view([2, 300, 2, 64], DType::F16);
        assert!(matches!(check(t), Err(Error::DType { arg: "v", .. })));
    }

    #[test]
    fn non_contiguous_last_dim_is_a_stride_error() {
        let mut t = qkv();
        t[0] = with(Layout { shape: [2, 100, 8, 64], strides: [100 * 8 * 128, 8 * 128, 128, 2], dtype: DType::BF16 }, 0x1000, DEV);
        assert!(matches!(check(t), Err(Error::Stride { arg: "q", .. })));
    }

    #[test]
    fn stride_not_a_multiple_of_8_is_a_stride_error() {
        let mut t = qkv();
        t[1] = with(Layout { shape: [2, 300, 2, 64], strides: [300 * 132, 132 + 4, 66, 1], dtype: DType::BF16 }, 0x1000, DEV);
        assert!(matches!(check(t), Err(Error::Stride { arg: "k", .. })));
    }

    #[test]
    fn misaligned_pointer_is_an_alignment_error() {
        let mut t = qkv();
        t[2] = with(*t[2].layout(), 0x1008, DEV);
        assert!(matches!(check(t), Err(Error::Alignment { arg: "v", ptr: 0x1008 })));
    }

    #[test]
    fn head_dim_not_a_multiple_of_8_is_rejected() {
        let q = view([1, 4, 1, 60], DType::BF16);
        assert!(matches!(problem(&q, &q, &q, &q, DEV), Err(Error::Shape { arg: "q", .. })));
    }

    #[test]
    fn tensor_on_another_device_is_a_device_error() {
        let mut t = qkv();
        t[1] = with(*t[1].layout(), 0x1000, 1);
        assert!(matches!(check(t), Err(Error::DeviceMismatch { arg: "k", tensor_device: 1, context_device: 0 })));
    }

    #[test]
    fn lse_length_must_match() {
        let s = check(qkv()).unwrap();
        assert!(lse(2 * 8 * 100, &s).is_ok());
        assert!(matches!(lse(2 * 8 * 99, &s), Err(Error::Shape { arg: "lse", .. })));
    }

    /// q, k, v, o, dout at separate addresses, and gradients dq, dk, dv at their own.
    fn backward_args(grads_at: [u64; 3]) -> ([TensorView<'static>; 5], [TensorView<'static>; 3]) {
        let q = Layout::contiguous([2, 100, 8, 64], DType::BF16);
        let kv = Layout::contiguous([2, 300, 2, 64], DType::BF16);
        let inputs =
            [with(q, 0x10_0000, DEV), with(kv, 0x20_0000, DEV), with(kv, 0x30_0000, DEV), with(q, 0x40_0000, DEV), with(q, 0x50_0000, DEV)];
        let grads = [with(q, grads_at[0], DEV), with(kv, grads_at[1], DEV), with(kv, grads_at[2], DEV)];
        (inputs, grads)
    }

    fn check_backward(inputs: &[TensorView<'static>; 5], grads: &[TensorView<'static>; 3]) -> Result<()> {
        let shape = problem(&inputs[0], &inputs[1], &inputs[2], &inputs[3], DEV)?;
        let named = [("q", &inputs[0]), ("k", &inputs[1]), ("v", &inputs[2]), ("o", &inputs[3]), ("dout", &inputs[4])];
        backward(&named, &[("dq", &grads[0]), ("dk", &grads[1]), ("dv", &grads[2])], &shape, DEV)
    }

    #[test]
    fn backward_arguments_in_buffers_of_their_own_pass() {
        let (inputs, grads) = backward_args([0x60_0000, 0x70_0000, 0x80_0000]);
        assert!(check_backward(&inputs, &grads).is_ok());
    }

    #[test]
    fn a_gradient_overlapping_an_input_or_another_gradient_is_named() {
        // dk over the last bytes of v; dv over dk.
        let (inputs, grads) = backward_args([0x60_0000, 0x30_0000 + 112, 0x80_0000]);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::Param { arg: "dk", .. })));
        let (inputs, grads) = backward_args([0x60_0000, 0x70_0000, 0x70_0000 + 16]);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::Param { arg: "dk", .. })));
    }

    #[test]
    fn backward_shapes_and_dtypes_are_named() {
        let (mut inputs, grads) = backward_args([0x60_0000, 0x70_0000, 0x80_0000]);
        inputs[4] = with(Layout::contiguous([2, 99, 8, 64], DType::BF16), 0x50_0000, DEV);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::Shape { arg: "dout", .. })));
        inputs[4] = with(Layout::contiguous([2, 100, 8, 64], DType::F16), 0x50_0000, DEV);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::DType { arg: "dout", .. })));
        let (inputs, mut grads) = backward_args([0x60_0000, 0x70_0000, 0x80_0000]);
        grads[2] = with(Layout::contiguous([2, 300, 8, 64], DType::BF16), 0x80_0000, DEV);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::Shape { arg: "dv", .. })));
        grads[2] = with(Layout::contiguous([2, 300, 2, 64], DType::F16), 0x80_0000, DEV);
        assert!(matches!(check_backward(&inputs, &grads), Err(Error::DType { arg: "dv", .. })));
    }
}
