// The backward's run-time options and its workspace plan (host code): which dQ path a call
// takes (FLAMIA_BWD_DQ, FLAMIA_BWD_DS_MIB, FLAMIA_BWD_DS_OVERLAP) and how many bytes of
// workspace the stored dS needs (stored_ds_plan). The kernels and the dispatch: kernels/backward.cu.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "quantize/layout.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {

using bwd::kStoredTileBytes;

// FLAMIA_BWD_DQ, read at every call (a getenv is negligible next to a launch), so that the
// workspace size and the backward agree within a process that does not change it in between.
namespace {
bool dq_option_is(const char* name) {
  const char* v = std::getenv("FLAMIA_BWD_DQ");
  return std::strcmp(v != nullptr ? v : "", name) == 0;
}
}  // namespace

bool backward_dq_option_valid() {
  return dq_option_is("") || dq_option_is("auto") || dq_option_is("recompute") || dq_option_is("hbm") ||
         dq_option_is("fused");
}

bool backward_dq_fused(flamia_recipe recipe, int head_dim) {
  return recipe == FLAMIA_RECIPE_FP8_MIXED && head_dim == 128 && dq_option_is("fused");
}

// auto: fp8_mixed at D = 128 only, where storing measured faster than recomputing on every
// workload (docs/PERFORMANCE.md v44-v46); fp8 and D = 64 lose, with any slab size (v44, v47).
bool backward_dq_stored(flamia_recipe recipe, int head_dim) {
  if (dq_option_is("hbm")) return true;
  return (dq_option_is("") || dq_option_is("auto")) && recipe == FLAMIA_RECIPE_FP8_MIXED && head_dim == 128;
}

bool backward_dq_stored_required() { return dq_option_is("hbm"); }

// FLAMIA_BWD_DS_OVERLAP=1: two slab buffers, each slab's dQ GEMM on a second stream beside the
// next slab's dK/dV pass (the GEMM reads HBM, the pass keeps the tensor cores busy). Off by
// default: it pays where the GEMM is a large share (llama8b-pack's GQA group: step −2.3 %),
// not at fixed length, for one slab more of workspace (docs/PERFORMANCE.md v135).
bool backward_ds_overlap() {
  const char* v = std::getenv("FLAMIA_BWD_DS_OVERLAP");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

StoredDsPlan stored_ds_plan(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                            flamia_recipe recipe, int max_seqlen, bool causal) {
  StoredDsPlan plan;
  if (!backward_dq_stored(recipe, head_dim) || total_tokens <= 0 || hkv <= 0 || hq % hkv != 0 || (head_dim != 64 && head_dim != 128))
    return plan;
  // A head's run, bounded from T, B and max_seqlen: at most N = ceil(T / 64) + B query tiles
  // over all documents, each document at most M = ceil(max_seqlen / 64) tiles, so
  // sum nt (nt + 1) / 2 <= N (M + 1) / 2 (causal) and sum nt^2 <= N M.
  const int64_t tiles = (total_tokens + kTileTokens - 1) / kTileTokens;
  const int64_t n = tiles + num_docs;
  const int64_t m = std::min<int64_t>(std::max<int64_t>(1, (int64_t(max_seqlen) + kTileTokens - 1) / kTileTokens), tiles);
  plan.head_tiles = causal ? (n * (m + 1) + 1) / 2 : n * m;
  const int group = hq / hkv;
  const bool mixed = recipe == FLAMIA_RECIPE_FP8_MIXED;
  const size_t tile_bytes = mixed ? kStoredTileBytes<true> : kStoredTileBytes<false>;
  // Sizes no allocation could hold (T near 2^31 tokens) would overflow below: the default pass.
  if (size_t(plan.head_tiles) > (size_t(1) << 48) / (tile_bytes * size_t(hq))) return StoredDsPlan{};
  const size_t head_bytes = size_t(plan.head_tiles) * tile_bytes;
  // Kv heads a slab: the fewest whose dK/dV launch holds kSlabWork CTAs' work (a CTA is a
  // work-list slot and kv head and walks the kv head's query heads; 768 is ~six waves of an
  // H200's 132 SMs), within FLAMIA_BWD_DS_MIB (default 2 GiB), at least one; then spread
  // evenly over the slabs. Both ends measured slow (docs/PERFORMANCE.md v46): large slabs (up to 17 % of
  // fixed-4k's step at 2.2 GB) and launches of about two waves (pack-32k +27 % with one head
  // of 275 CTAs a slab); every workload's fastest plan was a slab of 770-1130 CTAs' work.
  constexpr int64_t kSlabWork = 768;
  const int64_t slots = quant::Qkv8Layout::make(total_tokens, num_docs, hq, hkv, head_dim, recipe, true).fwd_work.capacity;
  const int64_t wanted = (kSlabWork + slots * group - 1) / (slots * group);
  const char* mib_env = std::getenv("FLAMIA_BWD_DS_MIB");
  const long long mib = mib_env != nullptr ? std::atoll(mib_env) : 0;
  const size_t budget = size_t(mib > 0 ? mib : 2048) << 20;
  const int most = int(std::max<size_t>(
      1, std::min<size_t>({size_t(hkv), size_t(wanted), budget / (head_bytes * group)})));
  const int slabs = (hkv + most - 1) / most;
  plan.slab = (hkv + slabs - 1) / slabs;
  plan.base_bytes = quant::round_up(num_docs * int64_t(sizeof(int64_t)), 256);
  plan.slab_bytes = size_t(plan.slab) * group * head_bytes;
  plan.buffers = backward_ds_overlap() && slabs > 1 ? 2 : 1;
  plan.bytes = plan.base_bytes + size_t(plan.buffers) * plan.slab_bytes;
  return plan;
}

size_t backward_workspace_bytes_for(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                                    flamia_recipe recipe, int max_seqlen, bool causal) {
  const StoredDsPlan plan = stored_ds_plan(total_tokens, num_docs, hq, hkv, head_dim, recipe, max_seqlen, causal);
  return quant::BwdWorkspaceLayout::make(total_tokens, num_docs, hq, hkv, head_dim, recipe,
                                         backward_dq_fused(recipe, head_dim), plan.bytes)
      .bytes;
}

}  // namespace sm90
}  // namespace flamia
