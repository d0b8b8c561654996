// Tile scheduling: which query tile (m block, head, batch) a CTA works on next.
//
// TileOrder maps a linear tile index to a tile. TileCounter hands the indices out: CTA c
// starts with tile c, and from then on each CTA takes the next unclaimed index from a global
// counter when it is ready for more work, so a persistent grid (one CTA per SM) balances
// unequal tiles (causal) and unequal SMs as the hardware block scheduler would, while
// keeping the overlap of one tile's epilogue with the next tile's loads. Which CTA runs a
// tile does not change its arithmetic, so results stay bitwise deterministic.
#pragma once
#include "common/types.cuh"
#include "ptx/atomic.cuh"

namespace fc {

struct WorkTile {
    int m_block, head, batch;
    bool valid;
};

// Longest first (causal): heads (x batch) in sections of `section` heads, and within a
// section m blocks outermost, last (longest) first, so tiles handed out together have about
// the same length while the CTAs running together share few enough heads that their K and V
// stay in L2. Otherwise m blocks innermost, so the CTAs running together read the same
// head's K and V.
template <bool kLongestFirst> struct TileOrder {
    int m_blocks, heads, batch;
    int section;  // heads per section, >= 1 (longest first only)

    __device__ __forceinline__ int total() const { return m_blocks * heads * batch; }

    // Unsigned division: fewer instructions and registers than signed (the producer runs
    // this within a 24-32 register budget).
    __device__ __forceinline__ WorkTile at(int index) const {
        const unsigned i = index, heads_batch = heads * batch;
        WorkTile w;
        unsigned hb;
        if (kLongestFirst) {
            const unsigned section_tiles = section * m_blocks, first = i / section_tiles * section;
            const unsigned within = i % section_tiles, width = min(static_cast<unsigned>(section), heads_batch - first);
            w.m_block = m_blocks - 1 - static_cast<int>(within / width);
            hb = first + within % width;
        } else {
            w.m_block = i % static_cast<unsigned>(m_blocks);
            hb = i / static_cast<unsigned>(m_blocks);
        }
        w.head = hb % static_cast<unsigned>(heads);
        w.batch = hb / static_cast<unsigned>(heads);
        w.valid = index < total();
        return w;
    }
};

// What the host passes the scheduler (a kernel parameter of its own, by value):
//   counter  two u32, zero before the first launch (see TileCounter)
//   section  heads per longest-first section, >= 1: as many as have K and V within a share
//            of L2 (the host knows the L2 size)
struct TileSchedule {
    u32* counter;
    int section;
    int _pad;
};

// The global counter behind the dynamic hand-out: state[0] counts indices claimed past the
// first gridDim.x, state[1] counts CTAs that have stopped claiming. Both are zero at every
// launch: the host zeroes them once, and the last CTA to stop zeroes them again, so no memset
// is needed between launches (and a CUDA graph of launches replays correctly). Launches that
// share a counter must be ordered (one stream). Only one thread per CTA may call these.
struct TileCounter {
    u32* state;

    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int claim() const { return gridDim.x + atomic::add(state, 1u); }
    // After this CTA's last claim.
    __device__ __forceinline__ void retire() const {
        atomic::fence_gpu();  // this CTA's claims are ordered before its retirement
        if (atomic::add(state + 1, 1u) == gridDim.x - 1) {
            state[0] = 0;
            state[1] = 0;
        }
    }
};

}  // namespace fc
