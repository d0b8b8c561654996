//! `flashcore attn` over a KV cache (flash_attn's `flash_attn_with_kvcache`;
//! `flashcore::PagedKv`): the input file's `k_cache`, `v_cache` pools with a `block_table`
//! (or contiguous caches without one), `cache_seqlens`, and `k_new`, `v_new` appended first;
//! on the GPU, or (`--cpu`) by the f64 reference: the new keys written into the pools on the
//! host, then each sequence's keys gathered through the table and attended.

use anyhow::{bail, Result};
use flashcore::reference::{self, RefMask, RefPagedCache};
use flashcore::{AttnParams, BlockTableView, DeviceTensor, FwdInputs, PagedKv, ProblemShape, SeqLensView, PAGE_SIZE_MULTIPLE};

use crate::attn::args::{attn_params, softmax_scale, AttnArgs};
use crate::attn::tensors::{download, gpu_and_dtype, problem_shapes, shape4, shape_error, upload, ValueHeadDim};
use crate::io::{read_dout, write_tensors, FileDType, HostKvCache, HostTensor};

/// The cache's geometry as the input describes it, checked as the library checks it.
struct Geometry {
    /// `q`'s `[B, Sq, Hq, D]`.
    q: [usize; 4],
    heads_kv: usize,
    /// Keys a page; a contiguous cache is one page of `S_cache` keys a sequence.
    page_size: usize,
    /// Pages in the pool (`B` for a contiguous cache).
    num_pages: usize,
    /// Columns of the block table (1 for a contiguous cache).
    max_pages: usize,
    new_keys: usize,
}

impl Geometry {
    fn of(kv: &HostKvCache) -> Result<Self> {
        let ([b, sq, hq, d], [pages, rows, hkv, _], _) =
            problem_shapes(&kv.q, [("k_cache", &kv.k_cache), ("v_cache", &kv.v_cache)], ValueHeadDim::AsKeys)?;
        let max_pages = match &kv.block_table {
            Some((_, [tb, max_pages])) => {
                if *tb != b {
                    return Err(shape_error("block_table", format!("{tb} rows, q's batch is {b}")));
                }
                if *max_pages == 0 {
                    return Err(shape_error("block_table", "has no columns".into()));
                }
                if rows % PAGE_SIZE_MULTIPLE != 0 {
                    bail!("page size {rows} (k_cache's dim 1) is not supported: every multiple of {PAGE_SIZE_MULTIPLE} is");
                }
                *max_pages
            }
            None if pages != b => {
                return Err(shape_error(
                    "k_cache",
                    format!("batch {pages} differs from q's batch {b} (a contiguous cache: no block_table)"),
                ))
            }
            None => 1,
        };
        if let Some(lens) = kv.cache_seqlens.as_ref().filter(|l| l.len() != b) {
            return Err(shape_error("cache_seqlens", format!("{} entries, need B = {b}", lens.len())));
        }
        let new_keys = match (&kv.k_new, &kv.v_new) {
            (None, None) => 0,
            (Some(kn), Some(vn)) => {
                let [nb, s_new, nh, nd] = shape4(kn, "k_new")?;
                let mismatch = [("batch", nb, "q's", b), ("heads", nh, "k_cache's", hkv), ("head dim", nd, "q's", d)];
                if let Some((dim, got, of, want)) = mismatch.into_iter().find(|&(_, got, _, want)| got != want) {
                    return Err(shape_error("k_new", format!("{dim} {got} differs from {of} {dim} {want}")));
                }
                if s_new == 0 {
                    return Err(shape_error("k_new", format!("{:?} is empty", kn.shape)));
                }
                if vn.shape != kn.shape {
                    return Err(shape_error("v_new", format!("{:?} differs from k_new's {:?}", vn.shape, kn.shape)));
                }
                if kv.cache_seqlens.is_none() {
                    bail!("k_new needs cache_seqlens (where the new keys go)");
                }
                s_new
            }
            _ => bail!("k_new and v_new come together: the input has one of them"),
        };
        Ok(Self { q: [b, sq, hq, d], heads_kv: hkv, page_size: rows, num_pages: pages, max_pages, new_keys })
    }

    fn capacity(&self) -> usize {
        self.max_pages * self.page_size
    }

    /// The block table, row-major `[B, max_pages]` (a contiguous cache: sequence b is page b).
    fn table(&self, kv: &HostKvCache) -> Vec<i32> {
        kv.block_table.as_ref().map_or_else(|| (0..self.q[0] as i32).collect(), |(t, _)| t.clone())
    }

    /// The keys each sequence holds before the call (`cache_seqlens`, else the capacity).
    fn cached(&self, kv: &HostKvCache) -> Vec<usize> {
        kv.cache_seqlens
            .as_ref()
            .map_or_else(|| vec![self.capacity() - self.new_keys; self.q[0]], |l| l.iter().map(|&x| x as usize).collect())
    }
}

/// Attention over the input's KV cache: writes `o [B, Sq, Hq, D]`, `lse [B, Hq, Sq]` and, when
/// keys were appended, the caches after the append (`k_cache`, `v_cache`). The table and the
/// lengths are checked first (`Context::check_values`' checks; on the host with `--cpu`), and
/// the error names the first bad entry.
pub fn run(args: &AttnArgs, kv: &HostKvCache) -> Result<bool> {
    if read_dout(&args.input, &kv.q, kv.q.shape.last().copied().unwrap_or(0))?.is_some() {
        bail!("the KV-cache form is forward only: remove `do` from the input");
    }
    let g = Geometry::of(kv)?;
    let [b, sq, hq, d] = g.q;
    let params = attn_params(args, d)?; // the options checked before anything runs
    let out = if args.cpu { cpu(kv, &g, softmax_scale(args, d), &RefMask::of(&params))? } else { gpu(args, kv, &g, params)? };
    let data_dtype = if args.f64_out { FileDType::F64 } else { kv.q.dtype.output() };
    let lse_dtype = if args.f64_out { FileDType::F64 } else { FileDType::F32 };
    let like = |t: &HostTensor, data| HostTensor { shape: t.shape.clone(), dtype: data_dtype, data };
    let o = like(&kv.q, out.o);
    let lse = HostTensor { shape: vec![b, hq, sq], dtype: lse_dtype, data: out.lse };
    let caches = (g.new_keys > 0).then(|| [like(&kv.k_cache, out.k_cache), like(&kv.v_cache, out.v_cache)]);
    let mut tensors = vec![("o", &o), ("lse", &lse)];
    if let Some([k, v]) = &caches {
        tensors.extend([("k_cache", k), ("v_cache", v)]);
    }
    write_tensors(&args.output, &tensors)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    let form = if kv.block_table.is_some() { format!("{} pages of {}", g.num_pages, g.page_size) } else { "contiguous".into() };
    println!("wrote {} (a KV cache, {form}, {b} sequences, {} keys appended) to {}", names.join(", "), g.new_keys, args.output.display());
    Ok(true)
}

/// What the KV-cache form writes: o, lse and the caches after the append.
struct Outputs {
    o: Vec<f64>,
    lse: Vec<f64>,
    k_cache: Vec<f64>,
    v_cache: Vec<f64>,
}

/// The f64 reference: `k_new`, `v_new` into the pools at `cache_seqlens[b]..` through the
/// table, then each sequence's keys gathered and attended.
fn cpu(kv: &HostKvCache, g: &Geometry, scale: f64, mask: &RefMask) -> Result<Outputs> {
    let (table, cached) = (g.table(kv), g.cached(kv));
    let lens: Option<Vec<i32>> = kv.cache_seqlens.clone();
    let pool = if kv.block_table.is_some() { (g.page_size, g.num_pages) } else { (g.capacity(), 0) };
    flashcore::check_paged_values(kv.block_table.as_ref().map(|(t, _)| &t[..]), lens.as_deref(), pool, (g.q[0], g.capacity()), g.new_keys)?;
    let row = g.heads_kv * g.q[3];
    let (mut k_cache, mut v_cache) = (kv.k_cache.data.clone(), kv.v_cache.data.clone());
    if let (Some(k_new), Some(v_new)) = (&kv.k_new, &kv.v_new) {
        for (b, &start) in cached.iter().enumerate() {
            for j in 0..g.new_keys {
                let key = start + j;
                let at = (table[b * g.max_pages + key / g.page_size] as usize * g.page_size + key % g.page_size) * row;
                let from = (b * g.new_keys + j) * row;
                k_cache[at..at + row].copy_from_slice(&k_new.data[from..from + row]);
                v_cache[at..at + row].copy_from_slice(&v_new.data[from..from + row]);
            }
        }
    }
    let seqlens: Vec<usize> = cached.iter().map(|&c| c + g.new_keys).collect();
    let cache =
        RefPagedCache { k: &k_cache, v: &v_cache, block_table: &table, max_pages: g.max_pages, page_size: g.page_size, seqlens: &seqlens };
    let [batch, seqlen_q, heads_q, head_dim] = g.q;
    let shape = ProblemShape { batch, seqlen_q, seqlen_k: 0, heads_q, heads_kv: g.heads_kv, head_dim, head_dim_v: head_dim };
    let r = reference::attention_paged(&kv.q.data, &cache, &shape, scale, mask);
    Ok(Outputs { o: r.o, lse: r.lse, k_cache, v_cache })
}

fn gpu(args: &AttnArgs, kv: &HostKvCache, g: &Geometry, params: AttnParams) -> Result<Outputs> {
    let (ctx, dtype) = gpu_and_dtype(args, &kv.q)?;
    let up = |t: &HostTensor| upload(&ctx, t, dtype);
    let (q, k_cache, v_cache) = (up(&kv.q)?, up(&kv.k_cache)?, up(&kv.v_cache)?);
    let k_new = kv.k_new.as_ref().map(up).transpose()?;
    let v_new = kv.v_new.as_ref().map(up).transpose()?;
    let table = kv.block_table.as_ref().map(|(t, _)| ctx.stream().clone_htod(t)).transpose()?;
    let lens = kv.cache_seqlens.as_ref().map(|l| ctx.stream().clone_htod(l)).transpose()?;
    let paged = PagedKv {
        block_table: table.as_ref().map(|t| BlockTableView::of(t, g.q[0], g.max_pages)).transpose()?,
        cache_seqlens: lens.as_ref().map(SeqLensView::of),
        k_new: k_new.as_ref().map(|t| t.view()),
        v_new: v_new.as_ref().map(|t| t.view()),
        queries: None,
    };
    let inputs = FwdInputs::paged(q.view(), k_cache.view(), v_cache.view(), paged);
    ctx.check_values(&inputs)?;
    let out = ctx.attention(&inputs, &params)?;
    let wide = |t: &DeviceTensor| download(&ctx, t);
    let [b, sq, hq, _] = g.q;
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(b * hq * sq).map(f64::from).collect();
    Ok(Outputs { o: wide(&out.o)?, lse, k_cache: wide(&k_cache)?, v_cache: wide(&v_cache)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], seed: u64) -> HostTensor {
        let n = shape.iter().product::<usize>();
        // Fixed pseudo-random values in (-2, 2).
        let data = (0..n as u64).map(|i| ((i * 2654435761 + seed * 40503) % 1000) as f64 / 250.0 - 2.0).collect();
        HostTensor { shape: shape.to_vec(), dtype: FileDType::F32, data }
    }

    /// A paged cache of shuffled pages with keys appended across page boundaries: the
    /// reference's output equals attention over each sequence's keys laid out contiguously,
    /// and the pools hold the new keys where the table says, nothing else changed.
    #[test]
    fn the_reference_appends_through_the_table_and_attends_the_gathered_keys() {
        let (b, sq, hq, hkv, d, page, new) = (3, 2, 4, 2, 8, 16, 3);
        let cached = [15usize, 0, 33];
        let max_pages = 3;
        let table: Vec<i32> = vec![4, 7, -1, 2, -1, -1, 6, 0, 5];
        let num_pages = 8;
        let row = hkv * d;
        let kv = HostKvCache {
            q: tensor(&[b, sq, hq, d], 1),
            k_cache: tensor(&[num_pages, page, hkv, d], 2),
            v_cache: tensor(&[num_pages, page, hkv, d], 3),
            k_new: Some(tensor(&[b, new, hkv, d], 4)),
            v_new: Some(tensor(&[b, new, hkv, d], 5)),
            block_table: Some((table.clone(), [b, max_pages])),
            cache_seqlens: Some(cached.iter().map(|&c| c as i32).collect()),
        };
        let g = Geometry::of(&kv).unwrap();
        let mask = RefMask { causal: true, ..RefMask::default() };
        let out = cpu(&kv, &g, 0.3, &mask).unwrap();
        let key_at = |pool: &[f64], s: usize, j: usize| {
            let at = (table[s * max_pages + j / page] as usize * page + j % page) * row;
            pool[at..at + row].to_vec()
        };
        for (s, &held) in cached.iter().enumerate() {
            let n = held + new;
            let (mut k, mut v) = (Vec::new(), Vec::new());
            for j in 0..n {
                let fresh = j >= held;
                let from = (s * new + j.saturating_sub(held)) * row;
                k.extend(if fresh { kv.k_new.as_ref().unwrap().data[from..from + row].to_vec() } else { key_at(&kv.k_cache.data, s, j) });
                v.extend(if fresh { kv.v_new.as_ref().unwrap().data[from..from + row].to_vec() } else { key_at(&kv.v_cache.data, s, j) });
                assert_eq!(key_at(&out.k_cache, s, j), k[j * row..][..row], "sequence {s}, key {j} in the pool");
            }
            let shape = ProblemShape { batch: 1, seqlen_q: sq, seqlen_k: n, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d };
            let want = reference::attention_masked(&kv.q.data[s * sq * hq * d..][..sq * hq * d], &k, &v, &shape, 0.3, &mask);
            assert_eq!(out.o[s * sq * hq * d..][..sq * hq * d], want.o[..], "sequence {s}");
            assert_eq!(out.lse[s * hq * sq..][..hq * sq], want.lse[..], "sequence {s}");
        }
        let written: usize = out.k_cache.iter().zip(&kv.k_cache.data).filter(|(a, b)| a != b).count();
        assert_eq!(written, b * new * row, "only the new keys' rows change");
    }

    #[test]
    fn bad_tables_and_lengths_are_refused_by_name() {
        let kv = |table: Vec<i32>, lens: Vec<i32>| HostKvCache {
            q: tensor(&[2, 1, 2, 8], 1),
            k_cache: tensor(&[4, 16, 2, 8], 2),
            v_cache: tensor(&[4, 16, 2, 8], 3),
            k_new: None,
            v_new: None,
            block_table: Some((table, [2, 2])),
            cache_seqlens: Some(lens),
        };
        let mask = RefMask::default();
        let run = |kv: &HostKvCache| cpu(kv, &Geometry::of(kv).unwrap(), 0.5, &mask).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(run(&kv(vec![0, 1, 9, 2], vec![20, 17])).contains("block_table"), "a page out of the pool");
        assert!(run(&kv(vec![0, 1, 2, 3], vec![20, 33])).contains("cache_seqlens"), "a length over the capacity");
        assert!(run(&kv(vec![0, -1, 2, 3], vec![16, 17])).is_empty(), "an unused slot may hold anything");
        let mut odd = kv(vec![0, 1, 2, 3], vec![1, 1]);
        (odd.k_cache.shape[1], odd.v_cache.shape[1]) = (8, 8);
        assert!(Geometry::of(&odd).err().unwrap().to_string().contains("page size 8"));
    }
}
