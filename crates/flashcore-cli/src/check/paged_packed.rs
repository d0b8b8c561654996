//! `flashcore check`'s packed queries over a paged cache (`flashcore::PackedQueries`:
//! flash_attn's varlen call with a block table): each sequence against the f64 oracle (its
//! pages gathered, its own query and key counts, masks and ALiBi bottom-right aligned to
//! them), twice bitwise, and bitwise against the sequence run alone (a batch of one: its
//! table row, its rows of q, its slopes) at the same longest query count.

use anyhow::Result;
use flashcore::reference::{self, RefMask};
use flashcore::{BlockTableView, Context, DeviceTensor, FwdInputs, PackedQueries, PagedKv, ProblemShape, SeqLensView};

use crate::check::outcome::{judge, Outcome};
use crate::check::paged::{build, host_data, Caches, PagedSpec};
use crate::check::poison::same_bits;
use crate::check::{sink_values, slopes_of, upload_slopes, wide_slopes};

/// The sequences `seqs` of `spec` (their query counts `queries`, keys `lens`, table rows
/// `table`, slopes `slopes`) as one packed call over the pools: (o bits, lse `[Hq, total_q]`).
fn run(
    ctx: &Context,
    spec: &PagedSpec,
    caches: &Caches,
    q_rows: &[f32],
    (queries, lens, table, slopes): (&[usize], &[i32], &[i32], &[f32]),
) -> Result<(Vec<u16>, Vec<f32>)> {
    let (hq, d) = (spec.heads_q, spec.head_dim);
    let mut cu = vec![0i32];
    queries.iter().for_each(|&n| cu.push(cu.last().unwrap() + n as i32));
    let total_q = *cu.last().unwrap() as usize;
    let q = DeviceTensor::from_f32(ctx, q_rows, [1, total_q, hq, d], spec.dtype)?;
    let (cu, lens, table) = (ctx.stream().clone_htod(&cu)?, ctx.stream().clone_htod(lens)?, ctx.stream().clone_htod(table)?);
    let slopes = upload_slopes(ctx, slopes)?;
    let kv = PagedKv {
        block_table: Some(BlockTableView::of(&table, queries.len(), spec.max_pages())?),
        cache_seqlens: Some(SeqLensView::of(&lens)),
        k_new: None,
        v_new: None,
        queries: Some(PackedQueries { cu_seqlens_q: SeqLensView::of(&cu), max_seqlen_q: spec.seqlen_q }),
    };
    let (k, v) = caches.pools();
    ctx.check_values(&FwdInputs::paged(q.view(), k.view(), v.view(), kv))?;
    caches.run_over(ctx, spec, &q, caches.pools(), kv, slopes.as_ref())
}

pub fn check_one(ctx: &Context, spec: &PagedSpec) -> Result<Outcome> {
    let queries = spec.packed_queries.clone().expect("a packed-queries spec");
    let (b, hq, hkv, d) = (spec.batch(), spec.heads_q, spec.heads_kv, spec.head_dim);
    let total_q: usize = queries.iter().sum();
    let (host_k, host_v, q) = host_data(spec, total_q);
    let caches = build(ctx, spec, &host_k, &host_v)?;
    let lens: Vec<i32> = spec.cached.iter().map(|&n| n as i32).collect();
    let slopes = spec.alibi.slopes(b, hq);
    let all = (&queries[..], &lens[..], &caches.table_host[..], &slopes[..]);
    let first = run(ctx, spec, &caches, &q, all)?;
    let deterministic = same_bits(&first, &run(ctx, spec, &caches, &q, all)?);
    let (o_bits, lse) = first;

    let pools = caches.wide_pools(spec.dtype);
    let seqlens: Vec<usize> = spec.cached.clone();
    let cache = caches.reference(spec, &pools, &seqlens);
    let (wide_slopes, sinks) = (wide_slopes(&slopes), wide_slopes(&sink_values(spec.sinks, hq)));
    let (mut ref_o, mut ref_lse) = (Vec::with_capacity(o_bits.len()), vec![f64::NAN; hq * total_q]);
    let mut failure = None;
    let mut row0 = 0;
    let rows = hq * d;
    for (s, &n) in queries.iter().enumerate() {
        let (k, v) = cache.gather(s, (hkv * d, hkv * d));
        let shape = ProblemShape { batch: 1, seqlen_q: n, seqlen_k: seqlens[s], heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d };
        let q_s: Vec<f64> = q[row0 * rows..(row0 + n) * rows].iter().map(|&x| x as f64).collect();
        let mask = RefMask { sinks: &sinks, ..RefMask::of(&spec.params()).with_alibi(&wide_slopes) }.for_sequence(s, hq);
        let r = reference::attention_masked(&q_s, &k, &v, &shape, 1.0 / (d as f64).sqrt(), &mask);
        ref_o.extend(r.o);
        for h in 0..hq {
            ref_lse[h * total_q + row0..][..n].iter_mut().zip(&r.lse[h * n..][..n]).for_each(|(a, &x)| *a = x);
        }
        // Alone: its table row, its rows, its slopes, at the batch's longest query count.
        if n > 0 && failure.is_none() {
            let table = &caches.table_host[s * spec.max_pages()..][..spec.max_pages()];
            let one = (&queries[s..s + 1], &lens[s..s + 1], table, slopes_of(&slopes, s, hq));
            let (o_alone, lse_alone) = run(ctx, spec, &caches, &q[row0 * rows..(row0 + n) * rows], one)?;
            let lse_same = (0..hq).all(|h| (0..n).all(|i| lse_alone[h * n + i].to_bits() == lse[h * total_q + row0 + i].to_bits()));
            if o_alone != o_bits[row0 * rows..(row0 + n) * rows] || !lse_same {
                failure = Some(format!("sequence {s} differs bitwise from the same sequence run alone"));
            }
        }
        row0 += n;
    }
    let o: Vec<f32> = o_bits.iter().map(|&x| spec.dtype.decode(x)).collect();
    let (rel, max_abs, lse_err, judged) = judge(&o, &ref_o, &lse, &ref_lse, spec.dtype, deterministic);
    let failure = judged.or(failure);
    Ok(Outcome { spec_name: spec.name(), kernel: spec.kernel, oracle: "cpu-f64", rel, max_abs, lse_err, deterministic, failure })
}
