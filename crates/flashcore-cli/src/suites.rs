//! Benchmark suites: named lists of cases (docs/design.md §10).

use flashcore::{DType, Window};
use rand::{Rng, SeedableRng};

use crate::cases::{Case, Packed};

pub const NAMES: &[&str] = &[
    "quick",
    "seed",
    "sweep",
    "small",
    "dims",
    "bwd",
    "bwd-dims",
    "varlen",
    "paged",
    "chunked",
    "bwd-chunked",
    "sinks",
    "bwd-sinks",
    "value-dim",
    "bwd-value-dim",
    "value-dim-fa3",
    "fp8",
];

/// The varlen suite's packed batches: 64k tokens in sequences of lengths drawn from
/// 128..=8192 (issue 17's speed goal), the same batch at every head dim and mask.
const VARLEN_TOKENS: usize = 65536;
const VARLEN_LENGTHS: (usize, usize) = (128, 8192);
const VARLEN_SEED: u64 = 17;
/// Its decode batch: one query per sequence over a cache of 1k..32k used keys (seed 18),
/// each sequence's keys held in whole 1024-key blocks (the slack seqused_k skips).
const DECODE_SEQUENCES: usize = 16;
const DECODE_KEYS: (usize, usize) = (1024, 32768);
const DECODE_SEED: u64 = 18;
const DECODE_BLOCK: usize = 1024;

/// Sequence lengths drawn uniformly from `lo..=hi` by a generator seeded with `seed`, until
/// they sum to exactly `total` (the last takes the remainder, so it may be shorter than
/// `lo`). The one definition of the varlen batches: `bench --list-json` writes the lengths
/// out, and `bench/anchors.py` times FA2 on those.
pub fn mixed_lengths(total: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut lens = Vec::new();
    let mut left = total;
    while left > 0 {
        let len = rng.random_range(lo..=hi).min(left);
        lens.push(len);
        left -= len;
    }
    lens
}

/// The varlen suite: for D64 and D128, full and causal, the packed batch and the dense batch
/// of the same 64k tokens (B16 S4096, whose rate the packed one is held to); then the decode
/// batch (seqused_k) and a dense decode batch of about the same keys.
fn varlen_suite() -> Vec<Case> {
    let (lo, hi) = VARLEN_LENGTHS;
    let lens = mixed_lengths(VARLEN_TOKENS, lo, hi, VARLEN_SEED);
    let prefix = format!("varlen{}k_{lo}-{hi}_seed{VARLEN_SEED}", VARLEN_TOKENS / 1024);
    let mut v = Vec::new();
    for d in [64, 128] {
        for causal in [false, true] {
            let packed = Packed { seqlens_q: lens.clone(), seqlens_k: lens.clone(), seqused_k: None };
            v.push(Case::packed(&prefix, packed, 16, 16, d, causal, DType::BF16));
            v.push(Case::new(VARLEN_TOKENS / 4096, 4096, 4096, 16, 16, d, causal, DType::BF16));
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(DECODE_SEED);
    let used: Vec<usize> = (0..DECODE_SEQUENCES).map(|_| rng.random_range(DECODE_KEYS.0..=DECODE_KEYS.1)).collect();
    let held = used.iter().map(|&u| u.div_ceil(DECODE_BLOCK) * DECODE_BLOCK).collect();
    let mean = used.iter().sum::<usize>() / DECODE_SEQUENCES;
    let packed = Packed { seqlens_q: vec![1; DECODE_SEQUENCES], seqlens_k: held, seqused_k: Some(used) };
    let prefix = format!("decode_varlen_b{DECODE_SEQUENCES}_sk{}-{}_seed{DECODE_SEED}_seqused", DECODE_KEYS.0, DECODE_KEYS.1);
    v.push(Case::packed(&prefix, packed, 32, 8, 128, false, DType::BF16));
    v.push(decode_case(DECODE_SEQUENCES, mean.div_ceil(128) * 128));
    v
}

/// Whether suite `name` times the backward (`bench::bwd`) rather than the forward.
pub fn is_backward(name: &str) -> bool {
    matches!(name, "bwd" | "bwd-dims" | "bwd-chunked" | "bwd-sinks" | "bwd-value-dim")
}

/// 16k tokens per batch, hidden 2048: `B = 16384 / S`, `H = 2048 / D`.
fn sweep_case(s: usize, d: usize, causal: bool) -> Case {
    Case::new(16384 / s, s, s, 2048 / d, 2048 / d, d, causal, DType::BF16)
}

fn decode_case(batch: usize, seqlen_k: usize) -> Case {
    Case::new(batch, 1, seqlen_k, 32, 8, 128, false, DType::BF16)
}

pub fn suite(name: &str) -> Option<Vec<Case>> {
    let cases = match name {
        "quick" => vec![
            Case::new(4, 2048, 2048, 16, 16, 128, false, DType::BF16),
            Case::new(4, 2048, 2048, 16, 16, 128, true, DType::BF16),
            Case::new(16, 512, 512, 16, 16, 64, false, DType::F16),
            decode_case(8, 4096),
        ],
        // The backward's sweep: the forward sweep's cases (`flashcore bench --suite bwd`).
        "sweep" | "bwd" => {
            let mut v = Vec::new();
            for d in [64, 128, 256] {
                for causal in [false, true] {
                    for s in [512, 1024, 2048, 4096, 8192, 16384] {
                        v.push(sweep_case(s, d, causal));
                    }
                }
            }
            v
        }
        "seed" => {
            let mut v: Vec<Case> = [64, 128, 256].iter().flat_map(|&d| [false, true].map(|c| sweep_case(16384, d, c))).collect();
            v.push(Case::new(16, 2048, 2048, 16, 16, 64, false, DType::F16));
            v.push(Case::new(32, 512, 512, 8, 8, 64, false, DType::F16));
            v.push(Case::new(1, 512, 512, 8, 8, 64, false, DType::F16));
            v.extend([(8, 4096), (8, 32768), (8, 131072), (1, 131072)].map(|(b, s)| decode_case(b, s)));
            v
        }
        // Grids that leave most SMs idle (one short sequence, few heads): latency-bound, where
        // splitting the keys across CTAs competes with one CTA per query tile.
        "small" => {
            let bf16 = |b, s, hq, hkv, d, causal| Case::new(b, s, s, hq, hkv, d, causal, DType::BF16);
            vec![
                Case::new(1, 512, 512, 8, 8, 64, false, DType::F16),
                bf16(1, 512, 8, 8, 64, true),
                bf16(1, 1024, 8, 8, 128, false),
                bf16(1, 1024, 4, 4, 128, false),
                bf16(1, 1024, 4, 4, 128, true),
                bf16(1, 512, 16, 16, 128, true),
                bf16(1, 256, 32, 8, 128, false),
                bf16(2, 512, 8, 8, 256, false),
                bf16(2, 512, 8, 8, 256, true),
                bf16(1, 2048, 8, 8, 64, true),
            ]
        }
        // The head dims outside the sweep (32, 96, 192), 16 heads, at 2k and 8k keys; `bwd-dims`
        // times their backward.
        "dims" | "bwd-dims" => {
            let mut v = Vec::new();
            for d in [32, 96, 192] {
                for causal in [false, true] {
                    for (b, s) in [(8, 2048), (2, 8192)] {
                        v.push(Case::new(b, s, s, 16, 16, d, causal, DType::BF16));
                    }
                }
            }
            v
        }
        "varlen" => varlen_suite(),
        // Learnable sinks on gpt-oss's attention (Hq 64, Hkv 8, D64, causal; its sliding
        // layers' window (128, 0)) at 2k and 8k tokens a sequence, 16k a batch, each case beside
        // the same call without sinks (issue 52's goal: sinks cost at most 3%). `bwd-sinks`
        // times their backward, the sinks' gradient included.
        "sinks" | "bwd-sinks" => {
            let mut v = Vec::new();
            for s in [2048, 8192] {
                for window in [Window::UNBOUNDED, Window::new(128, 0)] {
                    let plain = Case::new(16384 / s, s, s, 64, 8, 64, true, DType::BF16).with_mods(window, 0.0);
                    v.push(plain.clone());
                    v.push(plain.with_sinks());
                }
            }
            v
        }
        // Chunked attention (Llama 4's local layers: chunks of 8k keys) at 32k and 128k tokens,
        // each beside causal attention of the same shape and beside the same tokens as a batch
        // of chunk-long causal sequences (the same visible pairs, each chunk a sequence of its
        // own: what dense chunked self-attention runs as, `chunks.rs`). TFLOPS count the visible
        // pairs, so the rows compare per pair. `bwd-chunked` times their backward.
        "chunked" | "bwd-chunked" => {
            const CHUNK: usize = 8192;
            let mut v = Vec::new();
            for d in [64, 128] {
                for s in [32768, 131072] {
                    let causal = Case::new(1, s, s, 2048 / d, 2048 / d, d, true, DType::BF16);
                    v.push(causal.clone());
                    v.push(causal.with_chunk(CHUNK));
                    v.push(Case::new(s / CHUNK, CHUNK, CHUNK, 2048 / d, 2048 / d, d, true, DType::BF16));
                }
            }
            v
        }
        // V's own head dim on DeepSeek-V3's prefill (Q and K 192, V 128; Hq = Hkv = 128,
        // causal; issue 52's shape B2 S8k, and B8 S2k), each beside the same call with V's head
        // dim 192 (what running it at D192 with V zero-padded would cost); `bwd-value-dim` times
        // their backward (bwd_sm90's split layout).
        "value-dim" | "bwd-value-dim" => {
            let mut v = Vec::new();
            for (b, s) in [(2, 8192), (8, 2048)] {
                let d192 = Case::new(b, s, s, 128, 128, 192, true, DType::BF16);
                v.push(d192.clone().with_value_dim(128));
                v.push(d192);
            }
            v
        }
        // FlashAttention-3's (64, 256) (Q and K 64, V 256; Hq = Hkv = 16, causal, B2 S8k and B8
        // S2k), with its `qv` and without, beside the same call at D256 (what it costs with q
        // and k zero-padded to 256, as its backward runs). Forward only: the binary's own
        // comparison (no anchor here has qv).
        "value-dim-fa3" => {
            let mut v = Vec::new();
            for (b, s) in [(2, 8192), (8, 2048)] {
                let fa3 = Case::new(b, s, s, 16, 16, 64, true, DType::BF16).with_value_dim(256);
                v.extend([fa3.clone(), fa3.with_qv(), Case::new(b, s, s, 16, 16, 256, true, DType::BF16)]);
            }
            v
        }
        // e4m3 (FP8) beside bf16 on issue 53's shapes: the sweep's 16k tokens (H = 2048 / D) at
        // S 2k, 8k and 16k, D64, D128 and D256, full and causal.
        "fp8" => {
            let mut v = Vec::new();
            for d in [64, 128, 256] {
                for causal in [false, true] {
                    for s in [2048, 8192, 16384] {
                        let bf16 = sweep_case(s, d, causal);
                        v.extend([Case::new(bf16.batch, s, s, bf16.heads_q, bf16.heads_kv, d, causal, DType::E4M3), bf16]);
                    }
                }
            }
            v
        }
        // Decode (B8 Hq32/Hkv8 D128) from 4k to 128k keys: each case's contiguous decode beside
        // the same cache paged (`bench::paged`); then chunked prefill, chunks of 512, 1k and 2k
        // queries ending a 16k-key cache (B2, causal), beside the dense attention of the shape.
        "paged" => {
            let decode = [4096, 8192, 16384, 32768, 65536, 131072].map(|s| decode_case(8, s));
            let prefill = [512, 1024, 2048].map(|chunk| Case::new(2, chunk, 16384, 32, 8, 128, true, DType::BF16));
            decode.into_iter().chain(prefill).collect()
        }
        _ => return None,
    };
    Some(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_has_16k_tokens_and_2048_hidden_everywhere() {
        let sweep = suite("sweep").unwrap();
        assert_eq!(sweep.len(), 36);
        assert!(sweep.iter().all(|c| c.batch * c.seqlen_q == 16384 && c.heads_q * c.head_dim == 2048));
    }

    #[test]
    fn varlen_batches_are_seeded_mixed_and_whole() {
        let lens = mixed_lengths(65536, 128, 8192, 17);
        assert_eq!(lens, mixed_lengths(65536, 128, 8192, 17), "the same seed gives the same batch");
        assert_eq!(lens.iter().sum::<usize>(), 65536);
        assert!(lens[..lens.len() - 1].iter().all(|&l| (128..=8192).contains(&l)) && lens.len() > 4);
        let suite = suite("varlen").unwrap();
        let packed: Vec<_> = suite.iter().filter(|c| c.packed.is_some()).collect();
        assert_eq!(packed.len(), 5);
        for c in &packed[..4] {
            let p = c.packed.as_ref().unwrap();
            assert_eq!((c.q_shape()[1], c.seqlen_q, c.batch), (65536, *lens.iter().max().unwrap(), lens.len()));
            assert_eq!(p.seqlens_q, lens);
        }
        let decode = packed[4];
        let p = decode.packed.as_ref().unwrap();
        let used = p.seqused_k.as_ref().unwrap();
        assert!(p.seqlens_q.iter().all(|&l| l == 1) && used.iter().zip(&p.seqlens_k).all(|(u, h)| u <= h && h % 1024 == 0));
        assert_eq!(decode.kv_bytes(), (2 * used.iter().sum::<usize>() * 8 * 128 * 2) as f64, "bytes of the used keys");
        // Each packed row's dense partner: the same tokens at one length.
        let dense = suite.iter().find(|c| c.name == "b16_sq4096_sk4096_h16_d128_causal_bf16").unwrap();
        assert_eq!(dense.q_shape()[0] * dense.q_shape()[1], 65536);
    }

    #[test]
    fn every_named_suite_exists_and_names_are_unique() {
        for name in NAMES {
            let cases = suite(name).unwrap();
            let mut names: Vec<_> = cases.iter().map(|c| c.name.clone()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), cases.len(), "{name}");
        }
        assert!(suite("nope").is_none());
    }
}
