//! FlashCore's candle ops on the GPU against candle's own attention: each output and gradient
//! within 1.5x the bf16 error of candle's plain attention (both against plain attention in
//! f32 on the same bf16 inputs), on the kernels picked for the GPU and on the Ampere-class
//! kernels forced. Odd lengths, GQA, every option. Run on a machine with an NVIDIA GPU:
//! `cargo test -- --ignored` (CI has none; `flashcore-candle`'s own tests check bad input there).

use candle_core::{DType, Device, Result, Tensor, Var};
use flashcore_candle::{AttnOptions, KvCache, VarlenSeqs};
use flashcore_candle_llama::{plain_attention, rms_diff, Plain};

fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA GPU (these tests are --ignored without one)")
}

/// `shape` values drawn from N(0, 1), rounded to bf16.
fn randn(shape: &[usize], dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1.0, shape, dev).unwrap().to_dtype(DType::BF16).unwrap()
}

/// Asserts `got` is as close to `exact` as candle's bf16 `plain` is (1.5x, plus a floor for
/// results exact to the last bit); NaN fails.
fn assert_close(what: &str, got: &Tensor, plain: &Tensor, exact: &Tensor) {
    let (err, bound) = (rms_diff(got, exact).unwrap(), rms_diff(plain, exact).unwrap());
    println!("{what}: rms error {err:.3e}, candle bf16 {bound:.3e}");
    assert!(err <= 1.5 * bound + 1e-4, "{what}: rms error {err:.3e} > 1.5 x candle's bf16 {bound:.3e}");
}

/// The options each test runs, with the plain attention that spells them out.
fn cases(d: usize, heads: usize, dev: &Device) -> Vec<(&'static str, AttnOptions, Plain)> {
    let scale = 1.0 / (d as f64).sqrt();
    let slopes: Vec<f32> = (0..heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
    vec![
        ("full", AttnOptions::default(), Plain { scale, ..Plain::default() }),
        ("causal", AttnOptions::causal(), Plain { scale, causal: true, ..Plain::default() }),
        (
            "window",
            AttnOptions { window: (Some(19), Some(7)), ..AttnOptions::default() },
            Plain { scale, window: (Some(19), Some(7)), ..Plain::default() },
        ),
        (
            "softcap",
            AttnOptions { softcap: Some(5.0), softmax_scale: Some(0.5), ..AttnOptions::causal() },
            Plain { scale: 0.5, causal: true, softcap: Some(5.0), ..Plain::default() },
        ),
        (
            "alibi",
            AttnOptions { alibi_slopes: Some(Tensor::new(slopes.as_slice(), dev).unwrap()), ..AttnOptions::causal() },
            Plain { scale, causal: true, alibi: Some(slopes), ..Plain::default() },
        ),
    ]
}

/// Forward and backward of dense attention, every option, both kernel choices.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn dense_forward_and_backward_match_candle_attention() -> Result<()> {
    let dev = gpu();
    for (b, sq, sk, hq, hkv, d) in [(2, 77, 93, 8, 2, 64), (1, 130, 130, 4, 4, 128)] {
        let (q, k, v) = (randn(&[b, sq, hq, d], &dev), randn(&[b, sk, hkv, d], &dev), randn(&[b, sk, hkv, d], &dev));
        let dout = randn(&[b, sq, hq, d], &dev);
        for (name, options, plain) in cases(d, hq, &dev) {
            // The exact side: plain attention in f32 on the same bf16 inputs, and its gradients.
            let grads_of = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>, dtype: DType| -> Result<Vec<Tensor>> {
                let vars = [&q, &k, &v].map(|t| Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap());
                let o = f(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor())?;
                let grads = (o.to_dtype(DType::F32)? * dout.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
                let mut out = vec![o];
                out.extend(vars.iter().map(|var| grads.get(var).expect("a gradient").clone()));
                Ok(out)
            };
            let exact = grads_of(&|q, k, v| plain_attention(q, k, v, &plain), DType::F32)?;
            let candle = grads_of(&|q, k, v| plain_attention(q, k, v, &plain), DType::BF16)?;
            for (kernels, options) in [("picked", options.clone()), ("ampere", options.clone().ampere_kernels())] {
                let ours = grads_of(&|q, k, v| flashcore_candle::attention(q, k, v, &options), DType::BF16)?;
                for (i, what) in ["o", "dq", "dk", "dv"].iter().enumerate() {
                    assert_close(&format!("B{b} Sq{sq} Sk{sk} D{d} {name} {kernels} {what}"), &ours[i], &candle[i], &exact[i]);
                }
            }
        }
    }
    Ok(())
}

/// A packed batch's outputs and gradients equal each sequence's plain attention.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn varlen_forward_and_backward_match_each_sequence() -> Result<()> {
    let dev = gpu();
    let (hq, hkv, d) = (8, 2, 64);
    let (lens_q, lens_k) = ([37usize, 64, 5], [45usize, 64, 9]);
    let (tq, tk) = (lens_q.iter().sum::<usize>(), lens_k.iter().sum::<usize>());
    let (q, k, v) = (randn(&[tq, hq, d], &dev), randn(&[tk, hkv, d], &dev), randn(&[tk, hkv, d], &dev));
    let cu = |lens: &[usize]| {
        let ends = lens.iter().scan(0u32, |end, &n| {
            *end += n as u32;
            Some(*end)
        });
        Tensor::new(std::iter::once(0).chain(ends).collect::<Vec<u32>>(), &dev).unwrap()
    };
    let seqs = VarlenSeqs { cu_seqlens_q: cu(&lens_q), cu_seqlens_k: cu(&lens_k), max_seqlen_q: 64, max_seqlen_k: 64 };
    for options in [AttnOptions::causal(), AttnOptions::causal().ampere_kernels()] {
        let vars = [&q, &k, &v].map(|t| Var::from_tensor(t).unwrap());
        let o = flashcore_candle::attention_varlen(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor(), &seqs, &options)?;
        let o_before_backward = o.copy()?;
        let grads = o.to_dtype(DType::F32)?.sum_all()?.backward()?;
        assert_eq!(rms_diff(&o, &o_before_backward)?, 0.0, "the backward changed the forward's output");
        let dq = grads.get(&vars[0]).expect("dq");
        let (mut oq, mut ok) = (0, 0);
        for (&lq, &lk) in lens_q.iter().zip(&lens_k) {
            let plain = Plain { scale: 1.0 / (d as f64).sqrt(), causal: true, ..Plain::default() };
            let seq = |t: &Tensor, at: usize, n: usize| t.narrow(0, at, n).unwrap().unsqueeze(0).unwrap();
            let run = |dtype: DType| -> Result<(Tensor, Tensor)> {
                let qv = Var::from_tensor(&seq(&q, oq, lq).to_dtype(dtype)?)?;
                let o = plain_attention(qv.as_tensor(), &seq(&k, ok, lk).to_dtype(dtype)?, &seq(&v, ok, lk).to_dtype(dtype)?, &plain)?;
                let g = o.to_dtype(DType::F32)?.sum_all()?.backward()?;
                Ok((o, g.get(&qv).expect("dq").clone()))
            };
            let ((exact_o, exact_dq), (candle_o, candle_dq)) = (run(DType::F32)?, run(DType::BF16)?);
            assert_close(&format!("varlen Sq{lq} Sk{lk} o"), &seq(&o, oq, lq), &candle_o, &exact_o);
            assert_close(&format!("varlen Sq{lq} Sk{lk} dq"), &seq(dq, oq, lq), &candle_dq, &exact_dq);
            (oq, ok) = (oq + lq, ok + lk);
        }
    }
    Ok(())
}

/// Decode over a paged cache equals attention over each sequence's cached keys; so does
/// candle-flash-attn's paged varlen call.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn kv_cache_decode_matches_attention_over_the_cached_keys() -> Result<()> {
    let dev = gpu();
    let (hq, hkv, d, page) = (8, 2, 128, 16);
    let lens = [40usize, 17];
    let pages_per_seq = 3;
    let num_pages = lens.len() * pages_per_seq;
    let (k_pool, v_pool) = (randn(&[num_pages, page, hkv, d], &dev), randn(&[num_pages, page, hkv, d], &dev));
    // Sequence b owns pages in reverse order, to exercise the table.
    let table: Vec<u32> =
        (0..lens.len()).flat_map(|b| (0..pages_per_seq).map(move |p| (num_pages - 1 - (b * pages_per_seq + p)) as u32)).collect();
    let table = Tensor::from_vec(table, (lens.len(), pages_per_seq), &dev)?;
    let q = randn(&[lens.len(), 1, hq, d], &dev);
    let cache = KvCache { cache_seqlens: Some(Tensor::new(lens.map(|n| n as u32).as_slice(), &dev)?), block_table: Some(table.clone()) };
    let o = flashcore_candle::attention_with_kvcache(&q, &k_pool, &v_pool, &cache, &AttnOptions::causal())?;
    let cu_q = Tensor::new(&[0u32, 1, 2], &dev)?;
    let cu_k = Tensor::new(&[0u32, lens[0] as u32, (lens[0] + lens[1]) as u32], &dev)?;
    let q_packed = q.squeeze(1)?;
    let o_compat = flashcore_candle::flash_attn_varlen_paged_windowed(
        &q_packed,
        &k_pool,
        &v_pool,
        &cu_q,
        &cu_k,
        &table,
        None,
        1,
        64,
        1.0 / (d as f32).sqrt(),
        None,
        Some(0),
        page,
        None,
    )?;
    for (b, &len) in lens.iter().enumerate() {
        let gather = |pool: &Tensor| -> Result<Tensor> {
            let ids = table.get(b)?;
            pool.index_select(&ids, 0)?.reshape((pages_per_seq * page, hkv, d))?.narrow(0, 0, len)?.unsqueeze(0)
        };
        let (kb, vb, qb) = (gather(&k_pool)?, gather(&v_pool)?, q.narrow(0, b, 1)?);
        let plain = Plain { scale: 1.0 / (d as f64).sqrt(), causal: true, ..Plain::default() };
        let exact = plain_attention(&qb.to_dtype(DType::F32)?, &kb.to_dtype(DType::F32)?, &vb.to_dtype(DType::F32)?, &plain)?;
        let candle = plain_attention(&qb, &kb, &vb, &plain)?;
        assert_close(&format!("kvcache seq {b} (len {len})"), &o.narrow(0, b, 1)?, &candle, &exact);
        assert_close(&format!("paged varlen seq {b} (len {len})"), &o_compat.narrow(0, b, 1)?.unsqueeze(0)?, &candle, &exact);
    }
    Ok(())
}

/// The forward's log-sum-exp merges two halves of the keys into the whole call's output.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn halves_merged_by_their_lse_equal_one_call() -> Result<()> {
    let dev = gpu();
    let (q, k, v) = (randn(&[2, 64, 4, 64], &dev), randn(&[2, 200, 4, 64], &dev), randn(&[2, 200, 4, 64], &dev));
    let opts = AttnOptions::default();
    let (whole, _) = flashcore_candle::attention_with_lse(&q, &k, &v, &opts)?;
    let (o1, l1) = flashcore_candle::attention_with_lse(&q, &k.narrow(1, 0, 120)?, &v.narrow(1, 0, 120)?, &opts)?;
    let (o2, l2) = flashcore_candle::attention_with_lse(&q, &k.narrow(1, 120, 80)?, &v.narrow(1, 120, 80)?, &opts)?;
    // lse [B, H, S] -> weights [B, S, H, 1].
    let lse = |l: &Tensor| l.transpose(1, 2).unwrap().unsqueeze(3).unwrap();
    let (l1, l2) = (lse(&l1), lse(&l2));
    let total = (l1.exp()? + l2.exp()?)?.log()?;
    let merged = (o1.to_dtype(DType::F32)?.broadcast_mul(&(l1 - &total)?.exp()?)?
        + o2.to_dtype(DType::F32)?.broadcast_mul(&(l2 - &total)?.exp()?)?)?;
    let err = rms_diff(&merged, &whole)?;
    println!("merged halves vs one call: rms {err:.3e}");
    assert!(err < 4e-3, "merged halves differ from one call: rms {err:.3e}");
    Ok(())
}

/// Calls without (query, key) pairs answer as the core answers every binding (Python's
/// `flash_attn_func` included): no sequences or no rows give empty outputs, no keys give
/// o = 0 and lse = -inf, and the gradient of q is zero. The empty inputs are views of no
/// elements (`narrow`), as candle's own CUDA ops take no empty buffers.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -- --ignored"]
fn calls_without_pairs_answer_as_the_core_does() -> Result<()> {
    let dev = gpu();
    let with_empty_dims = |shape: [usize; 4]| {
        let t = randn(&shape.map(|n| n.max(1)), &dev);
        (0..4).fold(t, |t, dim| if shape[dim] == 0 { t.narrow(dim, 0, 0).unwrap() } else { t })
    };
    for (b, sq, sk) in [(0, 16, 16), (2, 0, 16), (2, 5, 0)] {
        let q = with_empty_dims([b, sq, 4, 64]);
        let (k, v) = (with_empty_dims([b, sk, 2, 64]), with_empty_dims([b, sk, 2, 64]));
        let (o, lse) = flashcore_candle::attention_with_lse(&q, &k, &v, &AttnOptions::causal())?;
        assert_eq!((o.dims(), lse.dims()), (&[b, sq, 4, 64][..], &[b, 4, sq][..]), "B{b} Sq{sq} Sk{sk}");
        if o.elem_count() == 0 {
            continue;
        }
        let o_values = o.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(o_values.iter().all(|&x| x == 0.0), "B{b} Sq{sq} Sk{sk}: o must be 0");
        let lse_values = lse.flatten_all()?.to_vec1::<f32>()?;
        assert!(lse_values.iter().all(|&x| x == f32::NEG_INFINITY), "B{b} Sq{sq} Sk{sk}: lse must be -inf");
        let qv = Var::from_tensor(&q)?;
        let o = flashcore_candle::attention(qv.as_tensor(), &k, &v, &AttnOptions::causal())?;
        let grads = o.to_dtype(DType::F32)?.sum_all()?.backward()?;
        let dq = grads.get(&qv).expect("dq").to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(dq.iter().all(|&x| x == 0.0), "B{b} Sq{sq} Sk{sk}: dq must be 0");
    }
    Ok(())
}
