//! A small candle-transformers Llama (random weights, config in code) run with FlashCore's
//! attention, through the candle-flash-attn stand-in, and with candle's own: the prompt's
//! logits within 1.5x candle's bf16 error against an f32 run, and greedy tokens equal up to
//! exact ties. Needs an NVIDIA GPU: `cargo test -- --ignored`.

use candle_core::{DType, Device, Result, Tensor, D};
use flashcore_candle_llama::{config, greedy, max_abs_diff, Weights};

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn llama_on_flashcore_matches_candle_attention() -> Result<()> {
    let dev = Device::new_cuda(0)?;
    // D128 with GQA (8 query heads, 2 KV heads), and D64 with MHA.
    for (hidden, heads, kv_heads) in [(1024, 8, 2), (512, 8, 8)] {
        let (cfg_plain, cfg_flash) = (config(hidden, 4, heads, kv_heads, false), config(hidden, 4, heads, kv_heads, true));
        let weights = Weights::random(&cfg_plain, &dev, 7)?;
        let exact = weights.load(&cfg_plain, DType::F32, &dev)?;
        let plain = weights.load(&cfg_plain, DType::BF16, &dev)?;
        let flash = weights.load(&cfg_flash, DType::BF16, &dev)?;
        // Two prompts of 97 tokens (an odd length: partial tiles).
        let prompt = Tensor::rand(0f32, 1024.0, (2, 97), &dev)?.to_dtype(DType::U32)?;
        let steps = 12;
        let (exact_logits, _) = greedy(&exact, &cfg_plain, &prompt, 1, DType::F32)?;
        let (plain_logits, plain_tokens) = greedy(&plain, &cfg_plain, &prompt, steps, DType::BF16)?;
        let (flash_logits, flash_tokens) = greedy(&flash, &cfg_flash, &prompt, steps, DType::BF16)?;

        let (err_flash, err_plain) = (max_abs_diff(&flash_logits[0], &exact_logits[0])?, max_abs_diff(&plain_logits[0], &exact_logits[0])?);
        println!("hidden {hidden}, heads {heads}/{kv_heads}: prompt logits vs f32, max |err| FlashCore {err_flash:.3e}, candle bf16 {err_plain:.3e}");
        assert!(err_flash <= 1.5 * err_plain, "FlashCore's logits err {err_flash:.3e} > 1.5 x candle's bf16 {err_plain:.3e}");

        // Greedy tokens: equal, or a divergence where candle's own logits nearly tie (within
        // the bf16 error of the logits measured above).
        for seq in 0..2 {
            for step in 0..steps {
                let (a, b) = (plain_tokens[step][seq], flash_tokens[step][seq]);
                if a == b {
                    let gap = max_abs_diff(&flash_logits[step].get(seq)?, &plain_logits[step].get(seq)?)?;
                    assert!(gap <= 2.0 * err_plain.max(err_flash) + 1e-2, "seq {seq} step {step}: logits differ by {gap:.3e}");
                    continue;
                }
                let row = plain_logits[step].get(seq)?;
                let margin = (row.get(a as usize)?.to_scalar::<f32>()? - row.get(b as usize)?.to_scalar::<f32>()?).abs();
                println!("seq {seq}: tokens diverge at step {step} ({a} vs {b}), candle's logits differ by {margin:.3e}");
                assert!(
                    margin <= 2.0 * err_plain.max(err_flash),
                    "seq {seq} step {step}: a divergence that is not a tie (margin {margin:.3e})"
                );
                break; // the contexts differ from here on
            }
        }
        let agree = (0..steps).take_while(|&s| plain_tokens[s] == flash_tokens[s]).count();
        println!(
            "greedy: both sequences agree for {agree} of {steps} steps; top logit {:?}",
            flash_logits[0].max(D::Minus1)?.to_vec1::<f32>()?
        );
    }
    Ok(())
}
