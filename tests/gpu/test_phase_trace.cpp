// FLAMIA_FWD_TRACE=FILE (kit/phase_trace.cuh): the forward runs the traced kernel, which must
// give the production kernel's bits, and writes its consumer warps' phase clocks — a header
// naming the shape, then per warp marks whose clocks do not go back, whose events are the
// consumer's (every tile's stage wait, S, softmax with its two inner marks, P·V and fold
// marked once), as tools/fwd_trace_summary.py reads them.
#if defined(FLAMIA_WITH_CUDA)

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

struct Trace {
  int64_t version = 0, d = 0, ctas = 0, warps = 0, cap = 0, khz = 0;
  std::vector<uint64_t> marks;
};

bool read_trace(const std::string& path, Trace* t) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[8];
  int64_t head[7];
  bool ok = std::fread(magic, 8, 1, f) == 1 && std::memcmp(magic, "FLMTRACE", 8) == 0 &&
            std::fread(head, sizeof(head), 1, f) == 1;
  if (ok) {
    t->version = head[0], t->d = head[1], t->ctas = head[2], t->warps = head[3], t->cap = head[4], t->khz = head[5];
    t->marks.resize(size_t(t->ctas * t->warps * t->cap));
    ok = std::fread(t->marks.data(), sizeof(uint64_t), t->marks.size(), f) == t->marks.size();
  }
  std::fclose(f);
  return ok;
}

void expect_traced_forward(const Case& c, uint64_t seed) {
  const Inputs in = make_inputs(c, seed);
  FwdResult plain, traced;
  {
    GpuRunner r(c);
    ASSERT_EQ(r.forward(in, &plain), FLAMIA_SUCCESS) << flamia_last_error();
  }
  const std::string path = "flamia_phase_trace_" + std::to_string(getpid()) + ".bin";
  {
    ScopedEnv on("FLAMIA_FWD_TRACE", path.c_str());
    GpuRunner r(c);
    ASSERT_EQ(r.forward(in, &traced), FLAMIA_SUCCESS) << flamia_last_error();
  }
  EXPECT_EQ(traced.o, plain.o) << "O";
  EXPECT_EQ(traced.lse, plain.lse) << "LSE";
  Trace t;
  ASSERT_TRUE(read_trace(path, &t)) << path;
  std::remove(path.c_str());
  EXPECT_EQ(t.version, 1);
  EXPECT_EQ(t.d, c.d);
  EXPECT_EQ(t.warps, c.d == 64 ? 12 : 8) << "the consumer warps of a CTA";
  int64_t tiles = 0;
  for (int64_t w = 0; w < t.ctas * t.warps; ++w) {
    int64_t count[10] = {};
    uint64_t last = 0;
    for (int64_t i = 0; i < t.cap; ++i) {
      const uint64_t x = t.marks[size_t(w * t.cap + i)];
      if (x == ~uint64_t(0)) break;
      const uint64_t e = x >> 56, clock = x & ((uint64_t(1) << 56) - 1);
      ASSERT_LT(e, 10u) << "warp " << w << " mark " << i;
      EXPECT_GE(clock, last) << "warp " << w << " mark " << i << ": the clock went back";
      last = clock;
      ++count[e];
    }
    // Every computed tile: its stage, S, softmax (its maxima and exps inside), P·V and fold
    // once; every item started is ended.
    EXPECT_EQ(count[9], count[1]) << "warp " << w << ": the stage wait's mark";
    EXPECT_EQ(count[1], count[2]) << "warp " << w;
    EXPECT_EQ(count[2], count[3]) << "warp " << w;
    EXPECT_EQ(count[3], count[4]) << "warp " << w;
    EXPECT_EQ(count[4], count[5]) << "warp " << w;
    EXPECT_EQ(count[0], count[6]) << "warp " << w;
    EXPECT_EQ(count[7], count[3]) << "warp " << w << ": the maxima's mark";
    EXPECT_EQ(count[8], count[3]) << "warp " << w << ": the exps' mark";
    tiles += count[3];
  }
  EXPECT_GT(tiles, 0) << "no warp recorded a tile";
}

TEST(PhaseTrace, TracedForwardGivesTheBitsAndWellFormedClocks) {
  Case c;
  c.cu = cu_from_lengths({1100, 300, 640, 77});
  c.hq = 8;
  c.hkv = 4;
  for (const int d : {128, 64}) {
    c.d = d;
    expect_traced_forward(c, 71 + uint64_t(d));
  }
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
