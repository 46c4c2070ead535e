// Device side of guard.h: one block validates cu_seqlens, computes or compares the qkv8
// fingerprint and records the outcome, before anything trusts cu_seqlens (the work list).
// Included by quantize.cu only: the per-device sticky record is a __device__ variable of
// that translation unit.
#pragma once

#include <cstdint>

#include "quantize/guard.h"

namespace flamia {
namespace guard {

// The first fault recorded on this device since the last flamia_check_errors (code 0:
// none). One per device: a module's __device__ variables exist once per device context.
// Defined here (the library is built without separable compilation): a second translation
// unit including this header would fail to link rather than get a copy of its own.
__device__ DeviceError g_sticky;

enum class FingerprintMode {
  kRecord,           // quantize_qkv: store the fingerprint of this call (0 on a fault)
  kCompareAndReject, // forward on a filled qkv8: compare; on a fault also zero the stored
                     // fingerprint and the work-list count, so the buffer stays rejected
  kCompare           // backward: compare only (qkv8 is read-only there)
};

struct GuardArgs {
  const int32_t* cu = nullptr;
  const int32_t* q_start = nullptr;  // optional [B] (flamia.h); checked after cu_seqlens
  int num_docs = 0;
  int64_t total_tokens = 0;
  int max_seqlen = 0;
  uint64_t shape = 0;              // shape_fingerprint of the call
  FingerprintMode mode = FingerprintMode::kRecord;
  uint64_t* fingerprint = nullptr; // in qkv8
  DeviceError* status = nullptr;   // the call's status word
  int* counts[3] = {nullptr, nullptr, nullptr};  // work-list counts to zero on a fault (null: none)
  int* next_item = nullptr;             // the fast forward's work counter, zeroed (null: none)
  int32_t stage = 0;
};

__device__ __forceinline__ void record(const GuardArgs& g, const DeviceError& e) {
  *g.status = e;
  if (e.fault == kNone) return;
  for (int* c : g.counts)
    if (c) *c = 0;
  if (g.mode != FingerprintMode::kCompare) *g.fingerprint = 0;
  // First fault wins; the winner fills the rest (read back only after a device sync).
  if (atomicCAS(reinterpret_cast<int*>(&g_sticky.fault), 0, e.fault) == 0) {
    g_sticky.stage = e.stage;
    g_sticky.index = e.index;
    g_sticky.a = e.a;
    g_sticky.b = e.b;
  }
}

// Called by every thread of one block; returns true (uniformly) when the call may proceed.
// Reads each cu_seqlens entry three times at most; no entry outside [0, num_docs] is touched
// (nor of q_start outside [0, num_docs)).
template <int kThreads>
__device__ bool guard_block(const GuardArgs& g) {
  __shared__ unsigned long long s_key, s_sum;
  __shared__ int s_ok;
  if (threadIdx.x == 0) {
    s_key = kNoFaultKey;
    s_sum = 0;
    // Every forward's first kernel runs this block, so the forward's counter starts at 0.
    if (g.next_item) *g.next_item = 0;
  }
  __syncthreads();
  uint64_t key = kNoFaultKey, sum = 0;
  for (int64_t i = threadIdx.x; i <= g.num_docs; i += kThreads) {
    const int32_t f = entry_fault(g.cu, i, g.num_docs, g.total_tokens, g.max_seqlen);
    if (f != kNone && fault_key(f, i) < key) key = fault_key(f, i);
    // A cu_seqlens fault has the smaller code, so q_start is judged on valid lengths only.
    if (g.q_start && i < g.num_docs &&
        !q_start_valid(g.q_start[i], int64_t(g.cu[i + 1]) - int64_t(g.cu[i])) &&
        fault_key(kQStartInvalid, i) < key)
      key = fault_key(kQStartInvalid, i);
    sum += entry_fingerprint(i, g.cu[i]);
  }
  if (key != kNoFaultKey) atomicMin(&s_key, (unsigned long long)key);
  atomicAdd(&s_sum, (unsigned long long)sum);
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t fp = finish_fingerprint(g.shape + s_sum);
    DeviceError e{kNone, g.stage, 0, 0, 0};
    if (s_key != kNoFaultKey) {
      e = make_error(key_fault(s_key), key_index(s_key), g.cu, g.total_tokens, g.max_seqlen, g.stage, g.q_start);
    } else if (g.mode != FingerprintMode::kRecord && *g.fingerprint != fp) {
      e.fault = kQkv8Mismatch;
    }
    record(g, e);
    if (e.fault == kNone && g.mode == FingerprintMode::kRecord) *g.fingerprint = fp;
    s_ok = e.fault == kNone;
  }
  __syncthreads();
  return s_ok != 0;
}

}  // namespace guard
}  // namespace flamia
