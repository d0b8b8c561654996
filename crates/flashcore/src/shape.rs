//! The shape of one attention problem, the lowest layer: every other module may use it.

/// The shape of one attention problem: `q [B, Sq, Hq, D]`, `k [B, Sk, Hkv, D]`,
/// `v [B, Sk, Hkv, Dv]` and the output `[B, Sq, Hq, Dv]`. `Dv` is `D` but where V has a head
/// dim of its own (DeepSeek's 192 / 128); which calls take that, see `dispatch::value_head_dim_form`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProblemShape {
    /// Batch size `B`.
    pub batch: usize,
    /// Query sequence length `Sq`.
    pub seqlen_q: usize,
    /// Key/value sequence length `Sk`.
    pub seqlen_k: usize,
    /// Query heads `Hq`.
    pub heads_q: usize,
    /// Key/value heads `Hkv`; `Hq % Hkv == 0` (GQA/MQA).
    pub heads_kv: usize,
    /// Head dimension `D` of q and k.
    pub head_dim: usize,
    /// Head dimension `Dv` of v and the output.
    pub head_dim_v: usize,
}

impl ProblemShape {
    /// Whether no (query, key) pair exists: no sequences, no queries or no keys. Such a call
    /// computes nothing and writes what attention over no keys is, wherever its outputs have
    /// elements: `o = 0` and `lse = -inf` (FlashAttention-4's convention; flash-attn 2 and 3
    /// write `+inf`), with learnable sinks each row's head's sink, gradients 0. Every entry
    /// point and every binding gets this answer from here (docs/design.md, "Calls with
    /// nothing to compute").
    pub fn has_no_pairs(&self) -> bool {
        self.batch == 0 || self.seqlen_q == 0 || self.seqlen_k == 0
    }

    /// The fewest bytes a forward pass moves: q, k, v read once, o written once
    /// (`elem_bytes` per element), and the f32 log-sum-exp.
    pub fn min_bytes(&self, elem_bytes: usize) -> f64 {
        let rows_q = self.batch * self.seqlen_q * self.heads_q;
        let q_and_o = rows_q * (self.head_dim + self.head_dim_v);
        ((q_and_o + self.kv_elements()) * elem_bytes + 4 * rows_q) as f64
    }

    /// Bytes of K and V, the traffic that bounds decode.
    pub fn kv_bytes(&self, elem_bytes: usize) -> f64 {
        (self.kv_elements() * elem_bytes) as f64
    }

    /// Elements of K and V together.
    fn kv_elements(&self) -> usize {
        self.batch * self.seqlen_k * self.heads_kv * (self.head_dim + self.head_dim_v)
    }
}
