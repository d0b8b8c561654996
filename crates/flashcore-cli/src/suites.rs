//! Benchmark suites: named lists of cases (DESIGN §7).

use flashcore::DType;

use crate::cases::Case;

pub const NAMES: &[&str] = &["quick", "seed", "sweep", "small", "dims", "bwd", "bwd-dims", "paged"];

/// Whether suite `name` times the backward (`bench_bwd`) rather than the forward.
pub fn is_backward(name: &str) -> bool {
    matches!(name, "bwd" | "bwd-dims")
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
        // Decode (B8 Hq32/Hkv8 D128) from 4k to 128k keys: each case's contiguous decode beside
        // the same cache paged (`bench_paged`).
        "paged" => [4096, 8192, 16384, 32768, 65536, 131072].map(|s| decode_case(8, s)).to_vec(),
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
