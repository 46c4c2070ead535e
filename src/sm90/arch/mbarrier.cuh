// mbarrier (shared-memory transaction barriers, sm_90): the handshake between the TMA
// producer and the consumer warpgroups. PTX ISA "Parallel Synchronization and Communication
// Instructions: mbarrier". A phase completes when its expected arrivals have arrived and
// its transaction count (bytes announced by expect_tx, decremented by TMA) is back to zero.
#pragma once

#include <cstdint>

namespace flamia {
namespace sm90 {
namespace mbar {

__device__ __forceinline__ void init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialisations visible to the async proxy (TMA) before the CTA barrier that
// publishes them to the other threads.
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic for the current phase.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One plain arrival (release: this thread's earlier shared-memory writes are visible to
// whoever completes a wait on this phase).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival, triggered once every cp.async this thread issued before has completed
// (.noinc: the arrival counts toward the phase's expected arrivals).
__device__ __forceinline__ void arrive_when_copies_land(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Blocks until the phase with the given parity has completed. A fresh barrier is in
// phase 0, so waiting for parity 1 returns at once (the producer's "stages start empty").
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace mbar
}  // namespace sm90
}  // namespace flamia
