// Division by a divisor fixed for a whole launch as a multiply-high and a shift (Granlund and
// Montgomery's round-up method): exact for every numerator in [0, 2^31), two instructions
// instead of the twenty-odd of an integer division. Host and device code; no CUDA runtime
// (tests/cpu/test_work_order.cpp checks it).
#pragma once

#include <cstdint>

#include "flamia/formats.h"  // FLAMIA_HD

namespace flamia {

struct FastDiv {
  uint32_t d = 1, mul = 0, shift = 0;

  FastDiv() = default;
  // d >= 1. With l = ceil(log2 d) and m = ceil(2^(31 + l) / d) (< 2^32), n * m >> (31 + l) is
  // n / d for n < 2^31: the rounding error n (m d - 2^(31 + l)) / (d 2^(31 + l)) stays below 1/d.
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    mul = d == 1 ? 0u : uint32_t(((uint64_t(1) << (31 + l)) + d - 1) / d);
    shift = l == 0 ? 0u : l - 1;
  }

  FLAMIA_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * mul) >> 32);
#endif
    return d == 1 ? n : hi >> shift;
  }
};

}  // namespace flamia
