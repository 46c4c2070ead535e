// The quantizer beside the forward (quantize.cuh, fwd_producer.cuh; by default at head dim 128,
// FLAMIA_QUANT_BESIDE=0 / 1 off / on): the quantizing forward runs the quantizer on a third of the
// SMs beside the fast forward, whose producer waits for the quantizer's per-block counts instead
// of for its grid. The runner poisons qkv8 (NaN codes and scales) before every call, so a tile
// loaded before the quantizer wrote it shows as NaN in O: O and LSE must be the plain call's bits, and so must the backward that reads the qkv8 such a
// forward left (its copies are written by the same quantizer, past the forward's waits).
// Shapes: fixed length over two kv blocks of the forward's order, a pack of tiny and empty
// documents whose tiles reach into the next documents, GQA, head dims 128 and 64, non-causal.
#if defined(FLAMIA_WITH_CUDA)

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

void expect_beside_gives_the_bits(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.describe());
  const Inputs in = make_inputs(c, seed);
  FwdResult plain, beside;
  BwdResult plain_grads, beside_grads;
  {
    ScopedEnv off("FLAMIA_QUANT_BESIDE", "0");
    GpuRunner r(c);
    ASSERT_EQ(r.forward_self_quantizing(in, &plain), FLAMIA_SUCCESS) << flamia_last_error();
    ASSERT_EQ(r.backward_after_forward(&plain_grads), FLAMIA_SUCCESS) << flamia_last_error();
  }
  {
    ScopedEnv on("FLAMIA_QUANT_BESIDE", "1");
    GpuRunner r(c);
    ASSERT_EQ(r.forward_self_quantizing(in, &beside), FLAMIA_SUCCESS) << flamia_last_error();
    ASSERT_EQ(r.backward_after_forward(&beside_grads), FLAMIA_SUCCESS) << flamia_last_error();
  }
  EXPECT_EQ(beside.o, plain.o) << "O";
  EXPECT_EQ(beside.lse, plain.lse) << "LSE";
  EXPECT_EQ(beside_grads.dq, plain_grads.dq) << "dQ";
  EXPECT_EQ(beside_grads.dk, plain_grads.dk) << "dK";
  EXPECT_EQ(beside_grads.dv, plain_grads.dv) << "dV";
}

TEST(QuantBeside, TheForwardGivesThePlainCallsBits) {
  Case fixed;
  fixed.cu = cu_from_lengths({4096, 4096});
  fixed.hq = fixed.hkv = 16;  // two kv blocks of eight in the forward's order
  fixed.recipe = FLAMIA_RECIPE_FP8_MIXED;
  expect_beside_gives_the_bits(fixed, 301);

  Case pack;
  pack.cu = cu_from_lengths({1, 0, 17, 5000, 3, 0, 128, 129, 2000, 1, 1, 1});
  pack.hq = 8;
  pack.hkv = 2;
  expect_beside_gives_the_bits(pack, 302);
  pack.causal = false;
  expect_beside_gives_the_bits(pack, 303);

  Case d64;
  d64.cu = cu_from_lengths({3000, 700, 1, 64, 2500});
  d64.hq = 16;
  d64.hkv = 4;
  d64.d = 64;
  expect_beside_gives_the_bits(d64, 304);
  d64.recipe = FLAMIA_RECIPE_FP8_MIXED;
  expect_beside_gives_the_bits(d64, 305);
}

}  // namespace
}  // namespace flamia_gpu_test

#endif
