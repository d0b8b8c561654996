//! Attention dropout: the parameters of one call's mask, and the mask itself on the host, the
//! kernels' generator bit for bit (`kernels/common/dropout.cuh`: Philox4x32-7), for the f64
//! oracle and the tests.

use crate::error::{Error, Result};

/// Dropout of one call (flash_attn's `dropout_p`, with the generator state it was drawn
/// from): each probability `P_ij` is kept with probability `1 - p` and scaled by
/// `1 / (1 - p)`, else zeroed. The mask is a function of `(seed, offset, batch, head, row,
/// key)` alone, so the backward, given the same `seed` and `offset`, regenerates it; the
/// caller advances `offset` (or changes `seed`) from one call to the next. The pair may live
/// on the device instead ([`DropoutState`](crate::DropoutState), given with the inputs), where
/// a CUDA graph's replays can rewrite it; `seed` and `offset` are then not read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// The probability of dropping a score, in `(0, 1)`.
    pub p: f32,
    /// The generator's key.
    pub seed: u64,
    /// The call's place in the generator's stream.
    pub offset: u64,
}

impl Dropout {
    /// Checks `p` (in `(0, 1)`): the error names `dropout_p`.
    pub fn check(&self) -> Result<()> {
        if !(self.p > 0.0 && self.p < 1.0) {
            return Err(Error::Param { arg: "dropout_p", msg: format!("{} must be in (0, 1) (0: no dropout)", self.p) });
        }
        Ok(())
    }

    /// The byte below which a score is dropped: `p · 256`, rounded (p quantised to 1/256, as
    /// FlashAttention-2 quantises it), at most 255.
    pub fn threshold(&self) -> u32 {
        (self.p as f64 * 256.0).round().min(255.0) as u32
    }

    /// The keepers' scale, `1 / (1 - p)`.
    pub fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// Whether score `(row, key)` of batch entry `batch` (a packed batch's sequence) and query
    /// head `head` of `heads_q` is kept, rows and keys counted within the sequence: its byte of
    /// the Philox call of its 16-row x 32-key cell (`kernels/common/dropout.cuh`).
    pub fn keeps(&self, batch: usize, head: usize, heads_q: usize, row: usize, key: usize) -> bool {
        let key0 = self.seed as u32;
        let key1 = (self.seed >> 32) as u32 ^ (self.offset >> 32) as u32;
        let column_pair = (key >> 1) & 3;
        let counter = [(((key >> 5) << 2) | column_pair) as u32, (row & !8) as u32, (batch * heads_q + head) as u32, self.offset as u32];
        let word = philox(ROUNDS, [key0, key1], counter)[(key >> 3) & 3];
        let byte = (word >> (8 * (2 * ((row >> 3) & 1) + (key & 1)))) & 0xff;
        byte >= self.threshold()
    }
}

/// The mask's Philox rounds: seven, as FlashAttention-2 draws its masks (Salmon et al. found
/// Philox4x32 passes BigCrush from seven rounds; ten is Random123's margin, and cost the
/// backward kernel 3-4% more instructions).
pub const ROUNDS: usize = 7;

/// Philox4x32-`rounds` (Salmon et al., SC 2011): rounds of two 32 x 32 -> 64-bit products,
/// the key bumped by the Weyl constants between them.
pub fn philox(rounds: usize, mut key: [u32; 2], mut c: [u32; 4]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    for _ in 0..rounds {
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ key[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ key[1], p0 as u32];
        key = [key[0].wrapping_add(0x9E37_79B9), key[1].wrapping_add(0xBB67_AE85)];
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_gives_random123s_known_answers() {
        // Random123's kat_vectors for philox4x32_7 (the mask's) and philox4x32_10.
        let pi_key = [0xa4093822, 0x299f31d0];
        let pi_counter = [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344];
        assert_eq!(philox(7, [0, 0], [0, 0, 0, 0]), [0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48]);
        assert_eq!(philox(7, [u32::MAX, u32::MAX], [u32::MAX; 4]), [0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662]);
        assert_eq!(philox(7, pi_key, pi_counter), [0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a]);
        assert_eq!(philox(10, [0, 0], [0, 0, 0, 0]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox(10, [u32::MAX, u32::MAX], [u32::MAX; 4]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(philox(10, pi_key, pi_counter), [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]);
        assert_eq!(ROUNDS, 7);
    }

    /// f16's value of a bit pattern below the infinities (0x7c00).
    fn f16_value(bits: u32) -> f64 {
        let (exponent, mantissa) = ((bits >> 10) & 0x1f, (bits & 0x3ff) as f64);
        if exponent == 0 {
            mantissa * 2f64.powi(-24)
        } else {
            (1.0 + mantissa / 1024.0) * 2f64.powi(exponent as i32 - 15)
        }
    }

    #[test]
    fn bytes_compared_as_f16_order_as_the_integers() {
        // bwd_sm80 on sm_90 tests a pair of bytes with one f16x2 compare (common/dropout.cuh,
        // `zero_dropped`): each byte and the threshold, widened to 16 bits, read as f16.
        for p in [1e-6f32, 0.1, 0.5, 0.9, 0.999_999] {
            let threshold = Dropout { p, seed: 0, offset: 0 }.threshold();
            assert!(threshold <= 255, "p = {p}: threshold {threshold} is a byte");
            for byte in 0..=255u32 {
                assert_eq!(f16_value(byte) >= f16_value(threshold), byte >= threshold, "byte {byte}, threshold {threshold}");
            }
        }
    }

    #[test]
    fn the_mask_drops_its_fraction_and_changes_with_the_offset() {
        let d = Dropout { p: 0.17, seed: 0x1234_5678_9abc, offset: 4 };
        let n = 64 * 256;
        let dropped = (0..n).filter(|&i| !d.keeps(1, 2, 4, i / 256, i % 256)).count();
        assert!((dropped as f64 / n as f64 - 0.17).abs() < 0.01, "{dropped} of {n}");
        let other = Dropout { offset: 5, ..d };
        let same = (0..n).filter(|&i| d.keeps(1, 2, 4, i / 256, i % 256) == other.keeps(1, 2, 4, i / 256, i % 256)).count();
        assert!(same < n * 9 / 10, "another offset, another mask: {same} of {n} agree");
        assert!(Dropout { p: 0.0, ..d }.check().is_err() && Dropout { p: 1.0, ..d }.check().is_err() && d.check().is_ok());
    }
}
