//! The head dim a call runs at: one rule for every binding, decided where the architecture is
//! known. The kernels move rows 16 bytes at a time and the Ampere-class families have tiles for
//! six sizes only; a call of another head dim runs zero-padded to one the kernels it may need
//! all take.

use crate::jit::Arch;
use crate::kernels::{fwd_sm80, KernelFamily, MAX_HEAD_DIM};

/// What a call needs of the kernels' head dims, for [`run_head_dim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDimUse {
    /// A dense or packed batch without dropout, forward and backward.
    Attention,
    /// With dropout: its probabilities (`return_attn_probs`) are fwd_sm80's alone, and with a
    /// window, a softcap or ALiBi its backward bwd_sm80's.
    Dropout,
    /// Packed queries over a paged cache: fwd_sm80's packed paged form alone.
    PackedPagedQueries,
}

/// The head dim a call of head dim `d` runs at on `arch`: `d` where every kernel the call may
/// need takes it, else the next size they all take, to which the binding zero-pads `q`, `k`
/// and `v` (zero columns add nothing to `q·kᵀ`; the output's extra columns are sliced off; the
/// softmax scale stays the caller's, from `d`). On Hopper fwd_sm90 and bwd_sm90 take every
/// multiple of 8 up to 256, so a plain call pads to the next multiple of 8 (as flash_attn pads);
/// a call that may need the Ampere-class families (every call elsewhere, and the uses
/// [`HeadDimUse`] names) pads to the next of their sizes (32, 64, 96, 128, 192, 256). Decided
/// once, at the forward, for both passes: autograd sees the pad and the slice. A `d` no
/// kernel can take (0, or over 256) comes back as it is, for the dispatcher to refuse by name.
pub fn run_head_dim(arch: Arch, d: usize, call: HeadDimUse) -> usize {
    let hopper = KernelFamily::FwdSm90.runs_on(arch) && KernelFamily::BwdSm90.runs_on(arch);
    if d == 0 || d > MAX_HEAD_DIM {
        return d;
    }
    if hopper && call == HeadDimUse::Attention {
        return d.next_multiple_of(8);
    }
    fwd_sm80::HEAD_DIMS.iter().copied().find(|&n| n >= d && KernelFamily::BwdSm80.takes_head_dim(n)).unwrap_or(d)
}

/// The head dims every call runs at as they are, on every architecture ([`run_head_dim`]
/// returns them unchanged): the Ampere-class families' sizes. A binding may skip asking for
/// these (the Python package's per-call fast path).
pub fn head_dims_run_as_they_are() -> &'static [usize] {
    fwd_sm80::HEAD_DIMS
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOPPER: Arch = Arch { major: 9, minor: 0, specific: true };
    const AMPERE: Arch = Arch { major: 8, minor: 0, specific: false };
    const ADA: Arch = Arch { major: 8, minor: 9, specific: false };
    const USES: [HeadDimUse; 3] = [HeadDimUse::Attention, HeadDimUse::Dropout, HeadDimUse::PackedPagedQueries];

    #[test]
    fn a_plain_call_on_hopper_pads_to_the_next_multiple_of_8_and_no_further() {
        let run = |d| run_head_dim(HOPPER, d, HeadDimUse::Attention);
        assert_eq!([1, 8, 36, 40, 72, 100, 250, 256].map(run), [8, 8, 40, 40, 72, 104, 256, 256]);
    }

    #[test]
    fn calls_that_need_the_ampere_families_pad_to_their_sizes() {
        for (arch, use_) in [
            (AMPERE, HeadDimUse::Attention),
            (ADA, HeadDimUse::Attention),
            (HOPPER, HeadDimUse::Dropout),
            (HOPPER, HeadDimUse::PackedPagedQueries),
        ] {
            let run = |d| run_head_dim(arch, d, use_);
            assert_eq!(
                [1, 32, 33, 40, 64, 72, 100, 129, 192, 200, 256].map(run),
                [32, 32, 64, 64, 64, 96, 128, 192, 192, 256, 256],
                "{arch} {use_:?}"
            );
        }
    }

    #[test]
    fn every_size_it_picks_is_taken_by_the_families_the_call_may_need() {
        for d in 1..=MAX_HEAD_DIM {
            for use_ in USES {
                let n = run_head_dim(HOPPER, d, use_);
                assert!(n >= d && n - d < 64, "D{d} {use_:?}: {n}");
                assert!(KernelFamily::FwdSm90.takes_head_dim(n) && KernelFamily::BwdSm90.takes_head_dim(n), "D{d} {use_:?}: {n}");
                if use_ != HeadDimUse::Attention {
                    assert!(KernelFamily::FwdSm80.takes_head_dim(n) && KernelFamily::BwdSm80.takes_head_dim(n), "D{d} {use_:?}: {n}");
                }
                let m = run_head_dim(AMPERE, d, use_);
                assert!(KernelFamily::FwdSm80.takes_head_dim(m) && KernelFamily::BwdSm80.takes_head_dim(m), "D{d} {use_:?} on sm_80: {m}");
            }
        }
    }

    #[test]
    fn the_sizes_that_run_as_they_are_do_on_every_arch_for_every_call() {
        for &d in head_dims_run_as_they_are() {
            for arch in [HOPPER, AMPERE, ADA] {
                for use_ in USES {
                    assert_eq!(run_head_dim(arch, d, use_), d, "D{d} {arch} {use_:?}");
                }
            }
        }
    }

    #[test]
    fn a_head_dim_no_kernel_takes_is_left_for_the_dispatcher_to_refuse() {
        for use_ in USES {
            for arch in [HOPPER, AMPERE] {
                assert_eq!(run_head_dim(arch, 0, use_), 0);
                assert_eq!(run_head_dim(arch, 264, use_), 264);
            }
        }
    }
}
