//! Causal attention over a small batch: on GPU 0 when there is one, checked against the f64
//! CPU reference; without a GPU, the reference alone (and the reason no GPU was used).
//!
//! ```sh
//! cargo run --release --example attention
//! ```

use flashcore::reference::{self, RefMask};
use flashcore::{AttnParams, Context, DType, DeviceTensor, Error, FwdInputs, ProblemShape};

fn main() -> flashcore::Result<()> {
    // q, k, v: [B, S, H, D] (BSHD), bf16 on the GPU.
    let (b, s, h, d) = (2, 300, 8, 64);
    let shape = ProblemShape { batch: b, seqlen_q: s, seqlen_k: s, heads_q: h, heads_kv: h, head_dim: d, head_dim_v: d };
    let [q_host, k_host, v_host] = [1, 2, 3].map(|seed| values(b * s * h * d, seed));
    let params = AttnParams::causal();

    let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    let scale = f64::from(params.scale_for(d));
    let expected = reference::attention_masked(&wide(&q_host), &wide(&k_host), &wide(&v_host), &shape, scale, &RefMask::of(&params));
    println!("f64 reference: o {:?}, lse {:?}; o[0, 0, 0, ..4] = {:.4?}", [b, s, h, d], [b, h, s], &expected.o[..4]);

    let ctx = match Context::new(0) {
        Ok(ctx) => ctx,
        Err(e @ Error::NoGpu(_)) => {
            println!("{e}: the reference alone ran (on a GPU this compares the kernel with it)");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let upload = |x: &[f32]| DeviceTensor::from_f32(&ctx, x, [b, s, h, d], DType::BF16);
    let (q, k, v) = (upload(&q_host)?, upload(&k_host)?, upload(&v_host)?);
    let out = ctx.attention(&FwdInputs::dense(q.view(), k.view(), v.view()), &params)?;
    let o = out.o.to_f32(&ctx)?;
    let max_error = o.iter().zip(&expected.o).map(|(&x, &r)| (f64::from(x) - r).abs()).fold(0.0, f64::max);
    println!("GPU ({}): o[0, 0, 0, ..4] = {:.4?}; max |o - reference| = {max_error:.1e} (bf16 inputs)", ctx.info().name, &o[..4]);
    Ok(())
}

/// `n` fixed pseudo-random values in [-1, 1) (a linear congruential sequence: no dependency).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
