// Row-major shared-memory tiles of 16-bit elements with XOR-swizzled 16-byte chunks.
//
// ldmatrix reads 8 rows at the same logical chunk; with rows a multiple of 128 bytes apart
// they would all hit the same 4 banks (8-way conflict). Permuting the chunks of row r
// within each aligned group of 8 (chunk c -> c ^ (r % 8)) puts those 8 reads in 8
// distinct 16-byte bank groups. Rows of 32 or 96 elements end in a half group of 4 chunks
// (64 bytes): two consecutive rows share a 128-byte line there, so the half group is
// permuted by (r / 2) % 4 instead, and rows r and r+1 already differ by the line half.
// The same permutation makes the cp.async writes (consecutive chunks of a row) and the
// epilogue's 4-byte accumulator writes conflict-free.
#pragma once
#include "common/types.cuh"

namespace fc {

template <int kRows, int kCols> struct SwizzledTile {
    static_assert(kCols % 32 == 0, "rows must be whole 64-byte half groups");
    static constexpr int kChunks = kCols / 8;            // 16-byte chunks per row
    static constexpr int kFullChunks = kChunks / 8 * 8;  // chunks in full groups of 8
    static constexpr int kRowBytes = kCols * 2;
    static constexpr int kBytes = kRows * kRowBytes;

    // Byte offset of logical chunk c of row r.
    __device__ static __forceinline__ u32 offset(int r, int c) {
        const int phys = c < kFullChunks ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
        return r * kRowBytes + phys * 16;
    }
};

// The address one lane gives ldmatrix for a fragment of a SwizzledTile. The lane's row is
// `lane_row` plus a multiple of 8 (the fragment's first row), so its swizzle key is fixed
// per lane. Where rows are whole 128-byte lines (or the tile is one half group, D = 32),
// the key sits pre-applied in bits 4..6 of `base` and a fragment's address is one XOR with
// a constant plus a constant offset, so nothing per fragment stays live across the loop.
// The tile must start 128-byte aligned.
template <class Tile> struct FragAddr {
    static constexpr bool kXor = Tile::kRowBytes % 128 == 0 || Tile::kChunks == 4;
    u32 base;      // the lane's row (with the key in bits 4..6 when kXor)
    int key_full;  // XOR on even chunk indices in full groups (when !kXor)
    int key_half;  // ... in the trailing half group (when !kXor)

    // `lane_chunk` (0 or 1) is the odd part of the lane's chunk: 2c + lane_chunk.
    __device__ __forceinline__ FragAddr(u32 tile, int lane_row, int lane_chunk)
        : base(tile + lane_row * Tile::kRowBytes),
          key_full(lane_chunk ^ (lane_row & 7)),
          key_half(lane_chunk ^ ((lane_row >> 1) & 3)) {
        if (kXor) base += 16 * (Tile::kChunks == 4 ? key_half : key_full);
    }

    // Rows `row0` (a multiple of 8) further down, logical chunk `chunk` (even) + lane_chunk.
    __device__ __forceinline__ u32 operator()(int row0, int chunk) const {
        if (kXor) return (base ^ (16 * (chunk % 8))) + 128 * (chunk / 8) + row0 * Tile::kRowBytes;
        const int phys = chunk < Tile::kFullChunks ? chunk ^ key_full : chunk ^ key_half;
        return base + row0 * Tile::kRowBytes + phys * 16;
    }
};

}  // namespace fc
