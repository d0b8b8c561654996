//! Packed (varlen) batches: sequences of their own lengths in one tensor, without padding,
//! as flash_attn's `flash_attn_varlen_func`.

use crate::error::{Error, Result};
use crate::shape::ProblemShape;
use crate::tensor::DeviceVec;

/// A borrowed int32 vector on the device: `cu_seqlens` or `seqused_k` (and a KV cache's
/// `cache_seqlens`).
pub type SeqLensView<'a> = DeviceVec<'a, i32>;

/// A packed batch of `B` sequences (flash_attn's varlen convention).
///
/// `q` and `o` are `[1, total_q, Hq, D]` (the sequences' rows one after another), `k` and
/// `v` `[1, total_k, Hkv, D]`. Sequence `b` is query rows `cu_seqlens_q[b] ..
/// cu_seqlens_q[b + 1]` and keys `cu_seqlens_k[b] .. cu_seqlens_k[b] + len_k`, where
/// `len_k = seqused_k[b]` when `seqused_k` is given (a cache with slack after each
/// sequence's keys), else `cu_seqlens_k[b + 1] - cu_seqlens_k[b]`. Each sequence is its own
/// attention problem: the causal mask and the window are bottom-right aligned per sequence.
/// The log-sum-exp is `[Hq, total_q]`.
///
/// **The caller's contract** (the values live on the device, and reading them would
/// synchronise the stream): `cu_seqlens_*` start at 0, never decrease and end at the
/// totals; no sequence is longer than `max_seqlen_*`; `seqused_k[b]` is at most the
/// sequence's key count. [`crate::Context::check_values`] checks all of it (it copies the
/// vectors to the host); the CLI runs it on every call. The kernels clamp every offset to
/// the tensors, so a batch that breaks the contract gives wrong output, never an access
/// outside the tensors. What the host can see is checked on every call: the vectors'
/// lengths and alignment, their dtype (by type), the maxima's range.
#[derive(Debug, Clone, Copy)]
pub struct VarlenBatch<'a> {
    /// `[B + 1]` int32: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: SeqLensView<'a>,
    /// `[B + 1]` int32: the first key of each sequence, then `total_k`.
    pub cu_seqlens_k: SeqLensView<'a>,
    /// `[B]` int32: the keys each sequence uses, when fewer than its `cu_seqlens_k` span.
    pub seqused_k: Option<SeqLensView<'a>>,
    /// The longest sequence's query count.
    pub max_seqlen_q: usize,
    /// The longest sequence's key count.
    pub max_seqlen_k: usize,
}

impl VarlenBatch<'_> {
    /// The number of sequences.
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len.saturating_sub(1)
    }

    /// The problem as the kernels see it: `B` sequences of the longest lengths (the grid's
    /// extent), from the packed `shape` (`[1, total, H, D]`).
    pub(crate) fn kernel_shape(&self, packed: &ProblemShape) -> ProblemShape {
        ProblemShape { batch: self.batch(), seqlen_q: self.max_seqlen_q, seqlen_k: self.max_seqlen_k, ..*packed }
    }

    /// Checks what the host can see against the packed problem `shape` (`q [1, total_q, ..]`).
    pub(crate) fn validate(&self, shape: &ProblemShape) -> Result<()> {
        if shape.batch != 1 {
            return Err(shape_err("q", format!("a packed batch is [1, total, H, D]; got batch {}", shape.batch)));
        }
        let n = self.cu_seqlens_q.len;
        if n == 0 {
            return Err(shape_err("cu_seqlens_q", "0 entries: need B + 1 >= 1".into()));
        }
        // A batch of no sequences is a call with nothing to compute (no rows, no keys).
        if n == 1 && (shape.seqlen_q > 0 || shape.seqlen_k > 0) {
            let msg = format!("1 entry (no sequences), but q has {} rows and k {}", shape.seqlen_q, shape.seqlen_k);
            return Err(shape_err("cu_seqlens_q", msg));
        }
        if self.cu_seqlens_k.len != n {
            return Err(shape_err("cu_seqlens_k", format!("{} entries, cu_seqlens_q has {n}", self.cu_seqlens_k.len)));
        }
        if let Some(used) = &self.seqused_k {
            if used.len != n - 1 {
                return Err(shape_err("seqused_k", format!("{} entries, need B = {}", used.len, n - 1)));
            }
        }
        for (arg, max) in [("max_seqlen_q", self.max_seqlen_q), ("max_seqlen_k", self.max_seqlen_k)] {
            if max > i32::MAX as usize {
                return Err(Error::Param { arg, msg: format!("{max} does not fit int32") });
            }
        }
        for (arg, v) in [("cu_seqlens_q", &self.cu_seqlens_q), ("cu_seqlens_k", &self.cu_seqlens_k)]
            .into_iter()
            .chain(self.seqused_k.as_ref().map(|u| ("seqused_k", u)))
        {
            if v.ptr == 0 || v.ptr % 4 != 0 {
                return Err(Error::Alignment { arg, ptr: v.ptr });
            }
        }
        Ok(())
    }
}

/// Checks a packed batch's vectors held on the host (see [`VarlenBatch`]'s contract) for
/// `totals` (query rows, keys) and `maxima` (max_seqlen_q, max_seqlen_k): each error names
/// the argument. [`crate::Context::check_values`] runs it on the device's values.
pub fn check_values(cu_q: &[i32], cu_k: &[i32], used: Option<&[i32]>, totals: (usize, usize), maxima: (usize, usize)) -> Result<()> {
    check_offsets("cu_seqlens_q", cu_q, totals.0, Some(maxima.0))?;
    // With seqused_k, a sequence may hold more keys than it uses (and than max_seqlen_k).
    check_offsets("cu_seqlens_k", cu_k, totals.1, used.is_none().then_some(maxima.1))?;
    if let Some(used) = used {
        for (b, (&u, w)) in used.iter().zip(cu_k.windows(2)).enumerate() {
            if u < 0 || u > w[1] - w[0] {
                return Err(Error::Param { arg: "seqused_k", msg: format!("{u} keys for sequence {b}, which has {}", w[1] - w[0]) });
            }
            if u as usize > maxima.1 {
                return Err(Error::Param { arg: "max_seqlen_k", msg: format!("{}, but sequence {b} uses {u} keys", maxima.1) });
            }
        }
    }
    Ok(())
}

/// Checks one `cu_seqlens` vector's values: from 0, never decreasing, to `total` rows, and,
/// given `max`, no sequence longer (the error names `max_seqlen_q` / `max_seqlen_k`).
pub(crate) fn check_offsets(arg: &'static str, cu: &[i32], total: usize, max: Option<usize>) -> Result<()> {
    if cu[0] != 0 {
        return Err(Error::Param { arg, msg: format!("starts at {}, not 0", cu[0]) });
    }
    if let Some(b) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(Error::Param { arg, msg: format!("decreases at entry {}: {} then {}", b + 1, cu[b], cu[b + 1]) });
    }
    let last = *cu.last().unwrap();
    if last as i64 != total as i64 {
        return Err(Error::Param { arg, msg: format!("ends at {last}, but the tensor has {total} packed rows") });
    }
    let max_arg = if arg == "cu_seqlens_q" { "max_seqlen_q" } else { "max_seqlen_k" };
    if let Some(max) = max {
        if let Some((b, len)) = cu.windows(2).map(|w| (w[1] - w[0]) as usize).enumerate().find(|&(_, len)| len > max) {
            return Err(Error::Param { arg: max_arg, msg: format!("{max}, but sequence {b} has {len}") });
        }
    }
    Ok(())
}

fn shape_err(arg: &'static str, msg: String) -> Error {
    Error::Shape { arg, msg }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg_of(r: Result<()>) -> &'static str {
        match r {
            Err(Error::Param { arg, .. }) => arg,
            other => panic!("expected a parameter error, got {other:?}"),
        }
    }

    #[test]
    fn device_values_are_checked_by_name() {
        let ok = check_values(&[0, 3, 3, 10], &[0, 5, 6, 6], None, (10, 6), (7, 5));
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(arg_of(check_values(&[1, 3, 10], &[0, 5, 6], None, (10, 6), (7, 5))), "cu_seqlens_q");
        assert_eq!(arg_of(check_values(&[0, 3, 2, 10], &[0, 5, 6, 6], None, (10, 6), (8, 5))), "cu_seqlens_q");
        assert_eq!(arg_of(check_values(&[0, 3, 9], &[0, 5, 6], None, (10, 6), (7, 5))), "cu_seqlens_q");
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 7], None, (10, 6), (7, 5))), "cu_seqlens_k");
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 6], None, (10, 6), (6, 5))), "max_seqlen_q");
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 6], None, (10, 6), (7, 4))), "max_seqlen_k");
        // seqused_k: at most the sequence's keys; the maximum then bounds the used keys.
        assert!(check_values(&[0, 3, 10], &[0, 5, 6], Some(&[2, 1]), (10, 6), (7, 2)).is_ok());
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 6], Some(&[2, 2]), (10, 6), (7, 5))), "seqused_k");
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 6], Some(&[-1, 1]), (10, 6), (7, 5))), "seqused_k");
        assert_eq!(arg_of(check_values(&[0, 3, 10], &[0, 5, 6], Some(&[3, 1]), (10, 6), (7, 2))), "max_seqlen_k");
    }

    fn view(len: usize) -> SeqLensView<'static> {
        // SAFETY: never dereferenced (validation reads only the length and the address).
        unsafe { SeqLensView::from_raw(0x1000, len) }
    }

    #[test]
    fn host_visible_mistakes_name_the_argument() {
        let packed = ProblemShape { batch: 1, seqlen_q: 100, seqlen_k: 80, heads_q: 8, heads_kv: 2, head_dim: 64, head_dim_v: 64 };
        let batch = VarlenBatch { cu_seqlens_q: view(4), cu_seqlens_k: view(4), seqused_k: None, max_seqlen_q: 50, max_seqlen_k: 40 };
        assert!(batch.validate(&packed).is_ok());
        assert_eq!(batch.kernel_shape(&packed), ProblemShape { batch: 3, seqlen_q: 50, seqlen_k: 40, ..packed });
        let shape_arg = |r: Result<()>| match r {
            Err(Error::Shape { arg, .. }) => arg,
            other => panic!("expected a shape error, got {other:?}"),
        };
        assert_eq!(shape_arg(batch.validate(&ProblemShape { batch: 2, ..packed })), "q");
        assert_eq!(shape_arg(VarlenBatch { cu_seqlens_q: view(1), ..batch }.validate(&packed)), "cu_seqlens_q");
        assert_eq!(shape_arg(VarlenBatch { cu_seqlens_k: view(3), ..batch }.validate(&packed)), "cu_seqlens_k");
        assert_eq!(shape_arg(VarlenBatch { seqused_k: Some(view(4)), ..batch }.validate(&packed)), "seqused_k");
        assert_eq!(arg_of(VarlenBatch { max_seqlen_q: 1 << 31, ..batch }.validate(&packed)), "max_seqlen_q");
        assert_eq!(arg_of(VarlenBatch { max_seqlen_k: 1 << 31, ..batch }.validate(&packed)), "max_seqlen_k");
        // SAFETY: never dereferenced.
        let unaligned = unsafe { SeqLensView::from_raw(0x1002, 4) };
        assert!(matches!(
            VarlenBatch { cu_seqlens_k: unaligned, ..batch }.validate(&packed),
            Err(Error::Alignment { arg: "cu_seqlens_k", .. })
        ));
    }
}
