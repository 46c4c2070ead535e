// Tile sizes that change results. The CPU specification (docs/ALGORITHM.md) takes them as
// parameters and the GPU kernels report the ones they run with, so both sides read them
// from here. Host and device code; no CUDA runtime.
#pragma once

namespace flamia {
namespace tiles {

// Forward, sm_90a warp-specialized kernel: a work item is 128 query rows (two consumer
// warpgroups of 64 rows), and keys are visited in tiles of 128 (the online-softmax step and
// the span of P's per-row scale sigma).
constexpr int kFwdBlockM = 128;
constexpr int kFwdBlockN = 128;
// At D = 64 a work item is 192 rows: three consumer warpgroups of 64. A row's result does not
// depend on the rows it shares an item with, so this one changes no result; it lives here
// beside kFwdBlockM because the quantizer builds a work list of it.
constexpr int kFwdBlockM64 = 192;
// A row's P is taken against a reference that moves only when the row's maximum passes it
// by more than 2^kFwdRescaleLog2 in p (ALGORITHM.md §2 steps 2-3): p <= 8, P's scale leaves
// it that headroom. The fast forward computes a tile's p before its maximum is known.
constexpr int kFwdRescaleLog2 = 3;

// Reference GPU forward (mma.sync) and the backward kernels: 64-token tiles.
constexpr int kRefFwdBlockN = 64;
constexpr int kBwdBlockM = 64;
constexpr int kBwdBlockN = 64;

// A document's first query (q_start, flamia.h) is a multiple of this, so that every query
// tile of every kernel above lies wholly before it or wholly after it.
constexpr int kQueryTile = 128;
static_assert(kQueryTile % kFwdBlockM == 0 && kQueryTile % kBwdBlockM == 0,
              "q_start must fall on query-tile boundaries (the reference forwards' tiles are kBwdBlockM's 64)");

}  // namespace tiles
}  // namespace flamia
