// Tile schedulers: which query tile (m block, head, batch) a CTA works on next. They share
// one interface, so a persistent grid and one CTA per tile are a swap of types:
//   for (WorkTile w = sched.initial_work(); w.valid; w = sched.next_work(w)) { ... }
// Neither uses atomics: the order is a pure function of the CTA index, so runs are
// deterministic and there is no counter to reset between launches.
#pragma once

namespace fc {

struct WorkTile {
    int m_block, head, batch;
    int round;  // how many tiles this CTA had before this one
    bool valid;
};

// Linear tile index -> tile. Longest first (causal): heads (x batch) in sections of
// `section` heads, and within a section m blocks outermost, last (longest) first, so tiles
// handed out together have about the same length while the CTAs running together still
// share few enough heads that their K and V stay in L2. Otherwise m blocks innermost, so
// the CTAs running together read the same head's K and V.
template <bool kLongestFirst> struct TileOrder {
    int m_blocks, heads, batch;
    int section;  // heads per section, >= 1 (longest first only)

    __device__ __forceinline__ int total() const { return m_blocks * heads * batch; }

    // Unsigned division: fewer instructions and registers than signed (the producer runs
    // this within a 24-32 register budget).
    __device__ __forceinline__ WorkTile at(int index, int round) const {
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
        w.round = round;
        w.valid = index < total();
        return w;
    }
};

// One CTA per tile: grid = total tiles.
template <bool kLongestFirst> struct SingleTileScheduler {
    TileOrder<kLongestFirst> order;

    __device__ __forceinline__ WorkTile initial_work() const { return order.at(blockIdx.x, 0); }
    __device__ __forceinline__ WorkTile next_work(const WorkTile& w) const {
        WorkTile next = w;
        next.valid = false;
        return next;
    }
};

// Persistent: grid = min(total tiles, SMs); CTA c takes one tile of every round of gridDim.x
// tiles, position c in even rounds and gridDim.x - 1 - c in odd ones. The snake evens out
// the work when tiles come longest first: the CTA that took the longest tile of one round
// takes the shortest of the next.
template <bool kLongestFirst> struct PersistentScheduler {
    TileOrder<kLongestFirst> order;

    __device__ __forceinline__ WorkTile initial_work() const { return tile(0); }
    __device__ __forceinline__ WorkTile next_work(const WorkTile& w) const { return tile(w.round + 1); }

  private:
    __device__ __forceinline__ WorkTile tile(int round) const {
        const int pos = round % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
        return order.at(round * gridDim.x + pos, round);
    }
};

}  // namespace fc
