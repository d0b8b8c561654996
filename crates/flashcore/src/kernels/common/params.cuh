// The forward-attention launch ABI shared by every kernel family.
// Mirrored field for field by `FwdParams` in crates/flashcore/src/pack.rs: change both
// together. The groups every pass shares are common/attn_fields.cuh's.
#pragma once
#include "common/attn_fields.cuh"

struct FwdParams {
    // Tensors are BSHD with the last dim contiguous; strides are in elements.
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;  // [B, Hq, Sq] contiguous; may be null (not requested)

    long long q_stride_b, q_stride_s, q_stride_h;
    long long k_stride_b, k_stride_s, k_stride_h;
    long long v_stride_b, v_stride_s, v_stride_h;
    long long o_stride_b, o_stride_s, o_stride_h;

    FC_PROBLEM_FIELDS
    int tile_section;          // heads per longest-first section (fwd_sm80 causal; TileOrder)

    // Split-KV (fwd_sm80 built with FC_SPLIT_KV=1; ignored elsewhere). With num_splits > 1,
    // split s of a query tile visits key tiles [s * split_tiles, (s + 1) * split_tiles) and
    // writes its normalised partial O and its LSE, f32, to o_accum [num_splits, B, Hq, Sq, D]
    // and lse_accum [num_splits, B, Hq, Sq]; fc_split_combine then writes o and lse. With
    // num_splits == 1 the kernel writes o and lse itself. The paged split tiles instead share
    // out the key tiles of all query tiles of a head by B * M * num_splits equal chunks (M query
    // blocks; fwd_sm80.cu, start_chunk): partials [chunks, 2, Hq, min(BLOCK_M, Sq), D] and their
    // LSEs, and fc_split_combine runs at every num_splits.
    float* o_accum;
    float* lse_accum;
    int num_splits;
    int split_tiles;

    FC_SCORE_MOD_FIELDS
    FC_VARLEN_FIELDS
    // Varlen decode with GQA packed (fwd_sm80's varlen forms, max_seqlen_q 1; the host's
    // Plan::packed_gqa): each sequence's query token is seqlen_q (= Hq / Hkv) rows of each of
    // heads_q (= Hkv) KV heads, row r of KV head h being query head h * seqlen_q + r, so that
    // K and V are read once for all of a KV head's query heads. q and o rows then step by
    // *_stride_s (one query head) and heads by *_stride_h (a group of them), and lse rows by
    // total_q. 0: not packed.
    int gqa_packed;
    // Varlen: the tokens' stride in q and o, by which sequence b's first row lies
    // cu_seqlens_q[b] tokens in (*_stride_s when not packed). Set for every packed batch.
    long long q_stride_token, o_stride_token;

    // Paged KV cache (fwd_sm80 built with FC_PAGED=1; see common/paged.cuh). k and v are the
    // caches: with block_table set, pools of pages [num_pages, page_size, Hkv, D] (every
    // *_stride_b 0), key j of sequence b in page block_table[b * block_table_stride + j /
    // page_size], row j % page_size; with block_table null, contiguous caches [B, seqlen_k,
    // Hkv, D]. Sequence b has min(seqused_k[b] + new_keys, seqlen_k) keys (seqused_k is
    // flash_attn's cache_seqlens; null: seqlen_k keys), seqlen_k being the capacity
    // (max_pages * page_size, or the contiguous cache's length); q, o, lse are dense. k_new,
    // v_new [B, new_keys, Hkv, D] (may be null; new_keys 0 then) are written by
    // fc_paged_append at positions seqused_k[b] ... before the attention kernel runs.
    // page_rows: pool rows from one page to the next (page stride / row stride, the same for
    // k and v). Table entries and cache lengths are clamped: bad values give wrong output,
    // never an access outside the pools.
    const int* block_table;
    const void* k_new;
    const void* v_new;
    long long knew_stride_b, knew_stride_s, knew_stride_h;
    long long vnew_stride_b, vnew_stride_s, vnew_stride_h;
    long long block_table_stride;
    int page_size;
    int num_pages;
    int max_pages;
    int page_rows;
    int new_keys;
    // fwd_sm90 with a block table: rows of one K/V TMA box, gcd(page_size, kBlockN) (its
    // tensor maps' box; see fwd_sm90.cu). Unused elsewhere.
    int page_box_rows;

    // Dropout's probabilities (fwd_sm80 FC_DROPOUT; may be null): [B, Hq, probs_rows,
    // probs_cols] in q's dtype, flash_attn's S_dmask (see fwd_sm80.cu).
    void* dropout_probs;
    int probs_rows;
    int probs_cols;

    // e4m3 inputs (fwd_sm90 FC_FP8; see common/fp8.cuh): q, k and v are e4m3, o 16-bit. The
    // descales are FlashAttention-3's, [B, Hkv] f32 (null: 1): scores are scale·(q·k)·q_descale·
    // k_descale, O is (P·V)·v_descale. fc_fp8_transpose_v writes v_transposed, [B, Hkv, Dv,
    // vt_keys] e4m3 (vt_keys: seqlen_k rounded up to 32, the keys past seqlen_k 0), each 32-key
    // group in P's operand order, before the main kernel reads it in place of v.
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    void* v_transposed;
    int vt_keys;
    int fp8_pad;
};
static_assert(sizeof(FwdParams) == 496, "out of step with pack.rs's FwdParams");
