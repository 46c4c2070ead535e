// Validation of cu_seqlens and the fingerprint of a quantized-operand buffer, shared by the
// host (the API layer's checks and messages) and the device (block 0 of the quantizers and
// the qkv8 check kernel, quantize.cu), so that both sides agree on what is invalid.
//
// Why on the device at all: reading a device cu_seqlens on the host costs a stream
// synchronisation. Without checking mode the first kernel of each call validates it instead,
// records a fault in a per-call status word (in qkv8 or the backward workspace) and in a
// per-device sticky record (flamia_check_errors), turns the call's work into a no-op and
// lets a last kernel fill the call's outputs with NaN. A fault is a (code, index) pair; the
// smallest in that order is reported, on the host and on the device alike.
#pragma once

#include <cstdint>

#include "common/tiles.h"
#include "flamia/formats.h"  // FLAMIA_HD

namespace flamia {
namespace guard {

enum Fault : int32_t {
  kNone = 0,
  kCuFirstNotZero = 1,     // cu[0] != 0                         index 0
  kCuDecreasing = 2,       // cu[i] < cu[i - 1]                   index i
  kCuLastNotT = 3,         // cu[B] != T                          index B
  kCuLongerThanMax = 4,    // cu[b + 1] - cu[b] > max_seqlen      index b (document)
  kWorkListOverflow = 5,   // more work items than the buffer holds (implied by the above)
  kQkv8Mismatch = 6,       // qkv8 quantized for another cu_seqlens / shape
  kQStartInvalid = 7,      // q_start[b] not a multiple of 128 in [0, L_b]  index b
};

// Whether q_start[b] is valid for a document of length len (cu_seqlens already valid).
FLAMIA_HD bool q_start_valid(int32_t qs, int64_t len) {
  return qs >= 0 && qs <= len && qs % tiles::kQueryTile == 0;
}

// Which call recorded a fault.
enum Stage : int32_t { kStageQuantize = 1, kStageForward = 2, kStageBackward = 3 };

// Per-call status word and per-device sticky record. a, b: the values the message shows.
struct DeviceError {
  int32_t fault;
  int32_t stage;
  int64_t index;
  int64_t a, b;
};
static_assert(sizeof(DeviceError) == 32, "DeviceError is read and written as 32 bytes");

// The fault found at entry i (0 <= i <= B) of cu_seqlens, the lowest code if several.
// Document lengths are formed in 64 bits: int32 entries may differ by more than 2^31.
FLAMIA_HD int32_t entry_fault(const int32_t* cu, int64_t i, int64_t num_docs, int64_t total_tokens,
                              int64_t max_seqlen) {
  if (i == 0) return cu[0] != 0 ? kCuFirstNotZero : kNone;
  const int64_t len = int64_t(cu[i]) - int64_t(cu[i - 1]);
  if (len < 0) return kCuDecreasing;
  if (i == num_docs && cu[i] != total_tokens) return kCuLastNotT;
  if (len > max_seqlen) return kCuLongerThanMax;
  return kNone;
}

// Ordering key of a fault (smaller = reported first) and back.
FLAMIA_HD uint64_t fault_key(int32_t fault, int64_t i) { return (uint64_t(fault) << 40) | uint64_t(i); }
FLAMIA_HD int32_t key_fault(uint64_t key) { return int32_t(key >> 40); }
FLAMIA_HD int64_t key_index(uint64_t key) { return int64_t(key & ((uint64_t(1) << 40) - 1)); }
constexpr uint64_t kNoFaultKey = ~uint64_t(0);

// The record of fault at entry i, with the values its message quotes.
FLAMIA_HD DeviceError make_error(int32_t fault, int64_t i, const int32_t* cu, int64_t total_tokens,
                                 int64_t max_seqlen, int32_t stage, const int32_t* q_start = nullptr) {
  DeviceError e{fault, stage, i, 0, 0};
  switch (fault) {
    case kQStartInvalid: e.a = q_start[i]; e.b = int64_t(cu[i + 1]) - cu[i]; break;
    case kCuFirstNotZero: e.a = cu[0]; break;
    case kCuDecreasing: e.a = cu[i]; e.b = cu[i - 1]; break;
    case kCuLastNotT: e.a = cu[i]; e.b = total_tokens; break;
    case kCuLongerThanMax: e.index = i - 1; e.a = int64_t(cu[i]) - cu[i - 1]; e.b = max_seqlen; break;
    default: break;
  }
  return e;
}

// ---- fingerprint of (cu_seqlens, T, B, heads, D, recipe) ---------------------------------
// A sum of independently mixed terms: order-free, so a block can add its threads' parts in
// any order. 0 is reserved for "no valid contents" (never filled, or rejected once).

FLAMIA_HD uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

FLAMIA_HD uint64_t shape_fingerprint(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                                     int recipe) {
  uint64_t h = mix64(uint64_t(total_tokens) + 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ uint64_t(num_docs));
  h = mix64(h ^ (uint64_t(uint32_t(hq)) << 32 | uint32_t(hkv)));
  return mix64(h ^ (uint64_t(uint32_t(head_dim)) << 32 | uint32_t(recipe)));
}

FLAMIA_HD uint64_t entry_fingerprint(int64_t i, int32_t value) {
  return mix64((uint64_t(i) << 32 | uint32_t(value)) ^ 0xd6e8feb86659fd93ull);
}

FLAMIA_HD uint64_t finish_fingerprint(uint64_t sum) { return sum == 0 ? 1 : sum; }

// Host version of what the device computes (checking mode and tests).
inline uint64_t fingerprint(const int32_t* cu, int64_t num_docs, uint64_t shape) {
  uint64_t s = shape;
  for (int64_t i = 0; i <= num_docs; ++i) s += entry_fingerprint(i, cu[i]);
  return finish_fingerprint(s);
}

}  // namespace guard
}  // namespace flamia
