// Host entry points of the sm_90a GPU path. The API layer validates arguments and calls
// these; nothing here checks user input again. All work is enqueued on p.stream; no
// function synchronises the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/device_call.h"
#include "flamia/flamia.h"

namespace flamia {
namespace sm90 {

// The call as the kernels receive it (common/device_call.h).
using Params = DeviceCall;

// Key-tile size of the forward kernel this process runs (FLAMIA_FORWARD_KERNEL selects it;
// common/tiles.h): the specification must use the same to be compared bit for bit.
int forward_block_n();
// Whether that forward issues S and P·V as wgmma (false: the mma.sync reference forward,
// which sums in FP32).
bool forward_is_wgmma();
// Whether the selected forward takes P's scale from the keys' V scales (ALGORITHM.md §2, the
// fast kernel) rather than from the maximum of p * sv (§7 TileMax, the reference kernels).
bool forward_p_scale_from_keys();

size_t qkv8_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                  flamia_recipe recipe, bool for_backward);
size_t backward_workspace_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv,
                                int head_dim, flamia_recipe recipe);
// The workspace of a backward call: backward_workspace_bytes, plus the stored dS's part where
// it is on (stored_ds_plan), which depends on max_seqlen and causal.
size_t backward_workspace_bytes_for(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                                    flamia_recipe recipe, int max_seqlen, bool causal);

// out: dense bf16 [T, Hq, D]; lse: fp32 [Hq, T]. qkv8 is read, but for the fast forward's
// work counter (fwd_plan.cuh), which the call's first kernel zeroed.
cudaError_t forward(const Params& p, void* qkv8, void* out, float* lse);
// FLAMIA_FWD_TRACE (diagnosis): the file the fast forward writes its consumer warps' phase
// clocks to, running its traced kernel (kit/phase_trace.cuh); nullptr when unset or empty.
const char* forward_trace_path();
// quantize_qkv beside the forward (DeviceCall::quantize_beside): at head dim 128 unless
// FLAMIA_QUANT_BESIDE says otherwise (0 or 1), where the fast forward runs the call.
bool forward_quantize_beside(int head_dim);

// What the calling thread's last failed backward was doing (a tensor map, an alignment
// check, quantize_dout, the launches), for the error message; "" after a success.
const char* backward_failed_step();
// Whether the backward forms dQ inside the dK/dV pass (environment FLAMIA_BWD_DQ=fused;
// fp8_mixed at D = 128, calls without q_start): one pass fewer, dQ not deterministic, its
// FP32 accumulator in the workspace. Default: the deterministic dQ pass.
bool backward_dq_fused(flamia_recipe recipe, int head_dim);
// Whether the dK/dV pass stores dQ's operand of every tile pair and a GEMM over it forms dQ:
// the same bits as the dQ pass, the stored tiles in the workspace, in slabs of kv heads of at
// most FLAMIA_BWD_DS_MIB MiB (default 2048; at least one kv head; the fewest that give the
// dK/dV launch ~six waves of CTAs). FLAMIA_BWD_DQ unset or
// `auto`: fp8_mixed at D = 128, when the workspace passed holds the tiles (otherwise the dQ
// pass); `hbm`: every call, and the workspace must hold them; `recompute`: never.
bool backward_dq_stored(flamia_recipe recipe, int head_dim);
bool backward_dq_stored_required();
// Whether FLAMIA_BWD_DQ is unset or one of auto, recompute, hbm, fused.
bool backward_dq_option_valid();
struct StoredDsPlan {
  int64_t head_tiles = 0;  // tiles a query head's run holds (a bound over every document)
  int slab = 0;            // kv heads a slab (0: the mode is off)
  size_t base_bytes = 0;   // the documents' first tiles (int64 each), before the runs
  size_t slab_bytes = 0;   // one slab's runs
  int buffers = 1;         // slabs' buffers: 2 where a slab's dQ GEMM runs beside the next slab's dK/dV
  size_t bytes = 0;        // the workspace part: base_bytes + buffers slabs' runs
};
StoredDsPlan stored_ds_plan(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                            flamia_recipe recipe, int max_seqlen, bool causal);
// dout, out: bf16 [T, Hq, D] with the given token/head strides; dq dense [T, Hq, D];
// dk, dv dense [T, Hkv, D].
cudaError_t backward(const Params& p, const void* dout, int64_t dout_stride_t, int64_t dout_stride_h,
                     const void* out, const float* lse, const void* qkv8, void* workspace,
                     size_t workspace_bytes, void* dq, void* dk, void* dv);

// True when a device of compute capability 9.0 is present and usable.
bool device_supported();

}  // namespace sm90
}  // namespace flamia
