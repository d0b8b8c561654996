//! `flashcore check`'s KV-cache cases (`flashcore::PagedKv`): a batch of sequences of mixed
//! cached lengths in shuffled, non-contiguous, non-monotonic pages, new keys appended across
//! page boundaries, decode and chunked prefill. Each against the f64 oracle (gather, then
//! attend), bitwise against the same data in a contiguous cache (the same kernel and split
//! count: the capacities are equal), and the pools after the append bit for bit against
//! where the new keys belong (no other row written).

use anyhow::Result;
use flashcore::reference::{self, RefMask, RefPagedCache};
use flashcore::{
    AlibiSlopes, AttnParams, BlockTableView, Context, DType, DeviceTensor, FwdInputs, FwdOutputs, KernelFamily, LearnableSinks, LseViewMut,
    PagedKv, ProblemShape, SeqLensView, Window,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::cases::normal;
use crate::check::outcome::{judge, Outcome};
use crate::check::poison::{nan_bits, poisoned_run, same_bits};
use crate::check::{sink_values, upload_slopes, wide_slopes, Alibi};

#[derive(Debug, Clone)]
pub struct PagedSpec {
    /// The kernel run (its paged form): fwd_sm80 or fwd_sm90.
    pub kernel: KernelFamily,
    /// Keys each sequence holds before the call (cache_seqlens).
    pub cached: Vec<usize>,
    /// Keys appended to every sequence (k_new, v_new; 0: none).
    pub new_keys: usize,
    pub seqlen_q: usize,
    pub page_size: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub dtype: DType,
    pub window: Window,
    /// Chunked attention's chunk (0: off), counted from each sequence's first cache key.
    pub chunk: usize,
    pub softcap: f32,
    pub alibi: Alibi,
    /// Learnable sinks, one a query head (`cases::sink_values`).
    pub sinks: bool,
    pub splits: Option<usize>,
    /// Packed queries over the paged cache (`check::paged_packed`): each sequence's query
    /// count (`seqlen_q` their longest; no new keys).
    pub packed_queries: Option<Vec<usize>>,
    /// A used table entry is set out of the pool: check_values must name it, and the kernels
    /// (which clamp it) must still write finite output without faulting.
    pub corrupt_table: bool,
}

impl PagedSpec {
    pub(crate) fn name(&self) -> String {
        let lens: Vec<String> = self.cached.iter().map(|l| l.to_string()).collect();
        let mut name = format!(
            "paged{}[{}]+{}_sq{}_h{}kv{}_d{}_{}_{}",
            self.page_size,
            lens.join(","),
            self.new_keys,
            self.seqlen_q,
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            self.dtype.name()
        );
        name += &super::score_suffix(self.window, self.softcap);
        name += &super::chunk_suffix(self.chunk);
        name += self.alibi.suffix();
        if self.sinks {
            name += "_sinks";
        }
        if let Some(queries) = &self.packed_queries {
            let rows: Vec<String> = queries.iter().map(|n| n.to_string()).collect();
            name += &format!("_packed[{}]", rows.join(","));
        }
        if let Some(n) = self.splits {
            name += &format!("_split{n}");
        }
        if self.corrupt_table {
            name += "_bad-table";
        }
        name
    }

    pub(crate) fn params(&self) -> AttnParams {
        AttnParams {
            causal: self.causal,
            kernel: Some(self.kernel),
            num_splits: self.splits,
            window: self.window,
            attention_chunk: self.chunk,
            softcap: self.softcap,
            ..AttnParams::default()
        }
    }

    pub(crate) fn batch(&self) -> usize {
        self.cached.len()
    }

    pub(crate) fn keys(&self, b: usize) -> usize {
        self.cached[b] + self.new_keys
    }

    /// Page slots a sequence may use: the longest one's, and one spare (unused, -1).
    pub(crate) fn max_pages(&self) -> usize {
        (0..self.batch()).map(|b| self.keys(b).div_ceil(self.page_size)).max().unwrap_or(0) + 1
    }
}

/// The lengths (1, 15, 16, 17, 1000, 4097 in one batch) at page sizes 16, 64 and 256,
/// GQA 1/4/8 and D 64/128/256: decode, decode appending one key (16 -> 17 crosses a page
/// boundary at page size 16), speculative decode appending 4, chunked prefill appending 300
/// (bottom-right causal); a window with a softcap, ALiBi (per sequence; in decode, GQA heads
/// are then not packed as rows), learnable sinks (decode with GQA heads packed as rows, a
/// windowed chunked prefill, and split sequences without keys: lse = the sink), forced splits
/// (fwd_sm80: fwd_sm90 does not split), fp16, and a corrupt table. For fwd_sm80 and fwd_sm90,
/// the two with paged forms.
/// On fwd_sm90 the key blocks (D64 128, D128 192, D256 80 keys) take 1 to 12 page boxes
/// (gcd(page, block)), and a block of 192 straddles two pages of 256.
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<PagedSpec> {
    if !matches!(family, KernelFamily::FwdSm80 | KernelFamily::FwdSm90) {
        return Vec::new();
    }
    let lens = vec![1, 15, 16, 17, 1000, 4097];
    let dims: &[usize] = if quick || smoke { &[64, 128] } else { &[64, 128, 256] };
    let pages: &[usize] = if smoke { &[16, 256] } else { &[16, 64, 256] };
    let mut out = Vec::new();
    for (di, &d) in dims.iter().enumerate() {
        for (pi, &page) in pages.iter().enumerate() {
            let (hq, hkv) = [(4, 4), (8, 2), (8, 1)][(di + pi) % 3];
            let spec = |seqlen_q, new_keys, causal| PagedSpec {
                kernel: family,
                cached: lens.clone(),
                new_keys,
                seqlen_q,
                page_size: page,
                heads_q: hq,
                heads_kv: hkv,
                head_dim: d,
                causal,
                dtype: DType::BF16,
                window: Window::UNBOUNDED,
                chunk: 0,
                softcap: 0.0,
                alibi: Alibi::Off,
                sinks: false,
                splits: None,
                packed_queries: None,
                corrupt_table: false,
            };
            out.push(spec(1, 1, true));
            if smoke {
                continue;
            }
            out.push(spec(300, 300, true));
            if quick {
                continue;
            }
            out.push(spec(1, 0, false));
            out.push(spec(4, 4, true));
        }
    }
    if family == KernelFamily::FwdSm80 {
        out.extend(packed_specs(&out[0], smoke));
    }
    if smoke {
        return out;
    }
    let base = out[0].clone();
    out.push(PagedSpec { dtype: DType::F16, head_dim: 128, ..base.clone() });
    out.push(PagedSpec { window: Window::new(127, 0), softcap: 30.0, page_size: 64, head_dim: 128, ..base.clone() });
    out.push(PagedSpec { alibi: Alibi::PerSequence, head_dim: 128, ..base.clone() });
    // Chunked attention over a cache (FA3's flash_attn_with_kvcache): decode, whose row sits
    // at its cache position, and a chunked prefill crossing chunks of 100.
    out.push(PagedSpec { chunk: 256, head_dim: 128, ..base.clone() });
    out.push(PagedSpec { chunk: 100, new_keys: 300, seqlen_q: 300, page_size: 64, head_dim: 128, ..base.clone() });
    out.push(PagedSpec { alibi: Alibi::PerHead, new_keys: 300, seqlen_q: 300, page_size: 64, head_dim: 128, ..base.clone() });
    // Learnable sinks (gpt-oss serving): decode with GQA heads packed as rows (each its own
    // head's sink), and a chunked prefill under gpt-oss's window.
    let gqa_sinks = PagedSpec { sinks: true, heads_q: 8, heads_kv: 2, ..base.clone() };
    out.push(gqa_sinks.clone());
    out.push(PagedSpec { window: Window::new(127, 0), new_keys: 300, seqlen_q: 300, page_size: 64, head_dim: 128, ..gqa_sinks.clone() });
    if family == KernelFamily::FwdSm80 {
        out.push(PagedSpec { splits: Some(5), page_size: 64, ..base.clone() });
        // The split tiles' chunks (fwd_sm80.cu, start_chunk): sequences without keys (the
        // combine writes them), and several query tiles a sequence (200 queries: 4 tiles of
        // 64, causal), split 3 ways, one sequence empty before the append.
        out.push(PagedSpec { cached: vec![0, 4097, 1, 0, 33], new_keys: 0, seqlen_q: 1, causal: false, ..base.clone() });
        // The same with sinks: the combine folds them, and a row without keys gets lse = sink.
        out.push(PagedSpec { cached: vec![0, 4097, 1, 0, 33], new_keys: 0, seqlen_q: 1, causal: false, splits: Some(5), ..gqa_sinks });
        out.push(PagedSpec {
            cached: vec![3000, 0, 2100],
            new_keys: 200,
            seqlen_q: 200,
            heads_q: 16,
            heads_kv: 4,
            head_dim: 128,
            splits: Some(3),
            ..base.clone()
        });
    }
    // Chunked prefill of 600 queries (5 query tiles) over pages of 16, and full attention over
    // pages of 256 whose sequences end mid-page.
    out.push(PagedSpec { cached: vec![3000, 17, 2100], new_keys: 600, seqlen_q: 600, head_dim: 128, ..base.clone() });
    out.push(PagedSpec {
        cached: vec![2500, 5, 1],
        new_keys: 513,
        seqlen_q: 513,
        causal: false,
        page_size: 256,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 128,
        ..base.clone()
    });
    out.push(PagedSpec { cached: vec![0, 31, 700], new_keys: 40, seqlen_q: 40, causal: true, ..base.clone() });
    out.push(PagedSpec { corrupt_table: true, ..base });
    out
}

/// Packed queries over a paged cache (fwd_sm80's packed paged form, from `base`, a spec of
/// the lengths): chunked prefill and decode rows together (GQA 4, page 16), decode
/// alone (GQA heads packed as rows, page 64), ALiBi per sequence with a window and a softcap
/// (page 256), a sequence without keys beside one without queries, D256 f16.
fn packed_specs(base: &PagedSpec, smoke: bool) -> Vec<PagedSpec> {
    let mixed = vec![1, 15, 1, 17, 300, 1];
    let spec = |queries: Vec<usize>, page_size, head_dim| PagedSpec {
        seqlen_q: queries.iter().copied().max().unwrap_or(0),
        packed_queries: Some(queries),
        new_keys: 0,
        page_size,
        head_dim,
        heads_q: 8,
        heads_kv: 2,
        causal: true,
        kernel: KernelFamily::FwdSm80,
        ..base.clone()
    };
    let mut out = vec![spec(mixed.clone(), 16, 128)];
    if smoke {
        return out;
    }
    out.push(spec(vec![1; 6], 64, 128));
    out.push(PagedSpec { window: Window::new(127, 0), softcap: 30.0, alibi: Alibi::PerSequence, ..spec(mixed.clone(), 256, 64) });
    out.push(PagedSpec { cached: vec![0, 31, 700], causal: false, ..spec(vec![3, 0, 100], 16, 128) });
    out.push(PagedSpec { dtype: DType::F16, ..spec(mixed.clone(), 64, 256) });
    out.push(PagedSpec { sinks: true, ..spec(mixed, 16, 128) });
    out
}

/// The spec's cache in both forms on the device, with what the host expects of it.
pub(crate) struct Caches {
    pool_k: DeviceTensor,
    pool_v: DeviceTensor,
    flat_k: DeviceTensor,
    flat_v: DeviceTensor,
    k_new: Option<DeviceTensor>,
    v_new: Option<DeviceTensor>,
    table: cudarc::driver::CudaSlice<i32>,
    lens: cudarc::driver::CudaSlice<i32>,
    slopes: Option<cudarc::driver::CudaSlice<f32>>,
    sinks: Option<cudarc::driver::CudaSlice<f32>>,
    /// The pools as the append must leave them.
    want_k: Vec<u16>,
    want_v: Vec<u16>,
    pub table_host: Vec<i32>,
}

pub(crate) fn build(ctx: &Context, spec: &PagedSpec, host_k: &[Vec<f32>], host_v: &[Vec<f32>]) -> Result<Caches> {
    let (b, page, row) = (spec.batch(), spec.page_size, spec.heads_kv * spec.head_dim);
    let max_pages = spec.max_pages();
    let used: Vec<usize> = (0..b).map(|i| spec.keys(i).div_ceil(page)).collect();
    let num_pages = used.iter().sum::<usize>() + 3; // and 3 pages nobody uses
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(0x9a9e ^ page as u64));
    let mut table = vec![-1i32; b * max_pages];
    let mut next = ids.into_iter();
    for (i, &n) in used.iter().enumerate() {
        table[i * max_pages..][..n].iter_mut().for_each(|e| *e = next.next().unwrap());
    }
    let nan = nan_bits(spec.dtype);
    let enc = |x: f32| spec.dtype.encode(x);
    let capacity = max_pages * page;
    // Pools and contiguous caches hold the cached keys; the pools' expected state also the new.
    let (mut pool_k, mut pool_v) = (vec![nan; num_pages * page * row], vec![nan; num_pages * page * row]);
    let (mut flat_k, mut flat_v) = (vec![nan; b * capacity * row], vec![nan; b * capacity * row]);
    let (mut want_k, mut want_v) = (pool_k.clone(), pool_v.clone());
    for i in 0..b {
        for j in 0..spec.keys(i) {
            let at = (table[i * max_pages + j / page] as usize * page + j % page) * row;
            let src = j * row..(j + 1) * row;
            for (dst, data) in [(&mut want_k, &host_k[i]), (&mut want_v, &host_v[i])] {
                dst[at..at + row].iter_mut().zip(&data[src.clone()]).for_each(|(d, &x)| *d = enc(x));
            }
            if j < spec.cached[i] {
                pool_k[at..at + row].copy_from_slice(&want_k[at..at + row]);
                pool_v[at..at + row].copy_from_slice(&want_v[at..at + row]);
                let flat = (i * capacity + j) * row;
                flat_k[flat..flat + row].copy_from_slice(&want_k[at..at + row]);
                flat_v[flat..flat + row].copy_from_slice(&want_v[at..at + row]);
            }
        }
    }
    let new = |data: &[Vec<f32>]| -> Vec<u16> {
        (0..b).flat_map(|i| data[i][spec.cached[i] * row..spec.keys(i) * row].iter().map(|&x| enc(x)).collect::<Vec<u16>>()).collect()
    };
    let d = spec.head_dim;
    let up = |bits: &[u16], shape| DeviceTensor::from_bits(ctx, bits, shape, spec.dtype);
    let new_shape = [b, spec.new_keys, spec.heads_kv, d];
    let mut device_table = table.clone();
    if spec.corrupt_table {
        device_table[4 * max_pages + 1] = num_pages as i32 + 5; // sequence 4 (1000 keys), slot 1
    }
    Ok(Caches {
        pool_k: up(&pool_k, [num_pages, page, spec.heads_kv, d])?,
        pool_v: up(&pool_v, [num_pages, page, spec.heads_kv, d])?,
        flat_k: up(&flat_k, [b, capacity, spec.heads_kv, d])?,
        flat_v: up(&flat_v, [b, capacity, spec.heads_kv, d])?,
        k_new: if spec.new_keys > 0 { Some(up(&new(host_k), new_shape)?) } else { None },
        v_new: if spec.new_keys > 0 { Some(up(&new(host_v), new_shape)?) } else { None },
        table: ctx.stream().clone_htod(&device_table)?,
        lens: ctx.stream().clone_htod(&spec.cached.iter().map(|&l| l as i32).collect::<Vec<i32>>())?,
        slopes: upload_slopes(ctx, &spec.alibi.slopes(b, spec.heads_q))?,
        sinks: upload_slopes(ctx, &sink_values(spec.sinks, spec.heads_q))?,
        want_k,
        want_v,
        table_host: table,
    })
}

impl Caches {
    fn kv(&self, spec: &PagedSpec, paged: bool) -> Result<PagedKv<'_>> {
        let table = if paged { Some(BlockTableView::of(&self.table, spec.batch(), spec.max_pages())?) } else { None };
        Ok(PagedKv {
            block_table: table,
            cache_seqlens: Some(SeqLensView::of(&self.lens)),
            k_new: self.k_new.as_ref().map(|t| t.view()),
            v_new: self.v_new.as_ref().map(|t| t.view()),
            queries: None,
        })
    }

    /// The pools after the append, widened for the f64 oracle.
    pub(crate) fn wide_pools(&self, dtype: DType) -> (Vec<f64>, Vec<f64>) {
        let wide = |bits: &[u16]| bits.iter().map(|&x| dtype.decode(x) as f64).collect::<Vec<f64>>();
        (wide(&self.want_k), wide(&self.want_v))
    }

    /// The cache as the f64 oracle reads it: `pools` (`wide_pools`), sequence b's `seqlens[b]` keys.
    pub(crate) fn reference<'a>(&'a self, spec: &PagedSpec, pools: &'a (Vec<f64>, Vec<f64>), seqlens: &'a [usize]) -> RefPagedCache<'a> {
        RefPagedCache {
            k: &pools.0,
            v: &pools.1,
            block_table: &self.table_host,
            max_pages: spec.max_pages(),
            page_size: spec.page_size,
            seqlens,
        }
    }

    /// The pools, as attention reads them.
    pub(crate) fn pools(&self) -> (&DeviceTensor, &DeviceTensor) {
        (&self.pool_k, &self.pool_v)
    }

    /// Runs `q` into NaN-poisoned o and lse, through the table or from the contiguous caches.
    fn run(&self, ctx: &Context, spec: &PagedSpec, q: &DeviceTensor, paged: bool) -> Result<(Vec<u16>, Vec<f32>)> {
        let kv = self.kv(spec, paged)?;
        let (k, v) = if paged { (&self.pool_k, &self.pool_v) } else { (&self.flat_k, &self.flat_v) };
        self.run_over(ctx, spec, q, (k, v), kv, self.slopes.as_ref())
    }

    /// Runs `q` over `kv` (the cache's pools `k`, `v` or its contiguous form) with ALiBi's
    /// `slopes` and the spec's sinks, into NaN-poisoned o and lse (`[B, Hq, Sq]`, or packed `[Hq, total_q]`: as many).
    pub(crate) fn run_over(
        &self,
        ctx: &Context,
        spec: &PagedSpec,
        q: &DeviceTensor,
        (k, v): (&DeviceTensor, &DeviceTensor),
        kv: PagedKv,
        slopes: Option<&cudarc::driver::CudaSlice<f32>>,
    ) -> Result<(Vec<u16>, Vec<f32>)> {
        let shape = q.layout().shape;
        poisoned_run(ctx, shape, spec.dtype, shape[0] * shape[1] * shape[2], |o, lse| {
            ctx.attention_into(
                &FwdInputs {
                    alibi_slopes: slopes.map(AlibiSlopes::of),
                    learnable_sink: self.sinks.as_ref().map(LearnableSinks::of),
                    ..FwdInputs::paged(q.view(), k.view(), v.view(), kv)
                },
                FwdOutputs { o, lse: Some(LseViewMut::of(lse)), probs: None },
                &spec.params(),
            )
        })
    }
}

/// The spec's keys and values per sequence (`keys(b)` rows of `[Hkv, D]` each) and its
/// queries (`rows` of `[Hq, D]`), random and rounded to the dtype.
pub(crate) fn host_data(spec: &PagedSpec, rows: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<f32>) {
    let (b, hq, hkv, d) = (spec.batch(), spec.heads_q, spec.heads_kv, spec.head_dim);
    let seed = 0x9a6e ^ (d as u64) << 8 ^ spec.page_size as u64;
    let host_k: Vec<Vec<f32>> = (0..b).map(|i| normal(spec.keys(i) * hkv * d, 1.0, spec.dtype, seed ^ (i as u64) << 20)).collect();
    let host_v: Vec<Vec<f32>> = (0..b).map(|i| normal(spec.keys(i) * hkv * d, 1.0, spec.dtype, seed ^ 0x76 ^ (i as u64) << 20)).collect();
    let qk_scale = if spec.softcap > 0.0 { 30f32.sqrt() } else { 1.0 };
    (host_k, host_v, normal(rows * hq * d, qk_scale, spec.dtype, seed ^ 0x71))
}

/// A dense-queries spec (packed queries: `check::paged_packed::check_one`).
pub fn check_one(ctx: &Context, spec: &PagedSpec) -> Result<Outcome> {
    let (b, hq, hkv, d, sq) = (spec.batch(), spec.heads_q, spec.heads_kv, spec.head_dim, spec.seqlen_q);
    let (host_k, host_v, q) = host_data(spec, b * sq);
    let caches = build(ctx, spec, &host_k, &host_v)?;
    let q_dev = DeviceTensor::from_f32(ctx, &q, [b, sq, hq, d], spec.dtype)?;
    let name = spec.name();
    let outcome = |rel, max_abs, lse_err, deterministic, failure| Outcome {
        spec_name: name.clone(),
        kernel: spec.kernel,
        oracle: "cpu-f64",
        rel,
        max_abs,
        lse_err,
        deterministic,
        failure,
    };

    let checked = ctx.check_values(&FwdInputs::paged(q_dev.view(), caches.pool_k.view(), caches.pool_v.view(), caches.kv(spec, true)?));
    if spec.corrupt_table {
        // The debug check names the entry; the kernels clamp it (wrong output, no fault).
        let named = matches!(&checked, Err(flashcore::Error::Param { arg: "block_table", msg }) if msg.contains("[4, 1]"));
        let (o, _) = caches.run(ctx, spec, &q_dev, true)?;
        // Sequence 4 may read a spare (NaN) page now; the others must be untouched by it.
        let per_seq = spec.seqlen_q * spec.heads_q * spec.head_dim;
        let finite = o.iter().enumerate().all(|(i, &x)| i / per_seq == 4 || spec.dtype.decode(x).is_finite());
        let failure = match (named, finite) {
            (false, _) => Some(format!("check_values did not name entry [4, 1]: {checked:?}")),
            (_, false) => Some("NaN/Inf in another sequence's output beside a clamped bad table".into()),
            _ => None,
        };
        return Ok(outcome(0.0, 0.0, 0.0, true, failure));
    }
    checked?;
    let first = caches.run(ctx, spec, &q_dev, true)?;
    let deterministic = same_bits(&first, &caches.run(ctx, spec, &q_dev, true)?);
    let contiguous_same = same_bits(&first, &caches.run(ctx, spec, &q_dev, false)?);
    let (o_bits, lse) = first;

    let mut failure = None;
    if caches.pool_k.to_bits(ctx)? != caches.want_k || caches.pool_v.to_bits(ctx)? != caches.want_v {
        failure = Some("the pools after the append differ from where the new keys belong".to_string());
    } else if !contiguous_same {
        failure = Some("differs bitwise from the same data in a contiguous cache".to_string());
    }

    let pools = caches.wide_pools(spec.dtype);
    let seqlens: Vec<usize> = (0..b).map(|i| spec.keys(i)).collect();
    let cache = caches.reference(spec, &pools, &seqlens);
    let shape = ProblemShape { batch: b, seqlen_q: sq, seqlen_k: 0, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d };
    let (slopes, sinks) = (wide_slopes(&spec.alibi.slopes(b, hq)), wide_slopes(&sink_values(spec.sinks, hq)));
    let mask = RefMask { sinks: &sinks, ..RefMask::of(&spec.params()).with_alibi(&slopes) };
    let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let r = reference::attention_paged(&q64, &cache, &shape, 1.0 / (d as f64).sqrt(), &mask);
    let o: Vec<f32> = o_bits.iter().map(|&x| spec.dtype.decode(x)).collect();
    let (rel, max_abs, lse_err, judged) = judge(&o, &r.o, &lse, &r.lse, spec.dtype, deterministic);
    Ok(outcome(rel, max_abs, lse_err, deterministic, failure.or(judged)))
}
