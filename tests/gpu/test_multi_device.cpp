// Every GPU of a process gives the same bits. Per-device setup (the kernels' shared-memory
// opt-in, cudaFuncSetAttribute, is a property of a device, not of a process) must be done
// on each device: a process-wide "done" flag set on device 0 would launch device 1's
// kernels without it, which fails (the fast forward and the backward need more than the
// default 48 KiB). The test runs the training step on every device, then on device 0 again,
// and compares all outputs bitwise. Skips with one device.
#if defined(FLAMIA_WITH_CUDA)

#include <string>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

struct Step {
  FwdResult fwd;
  BwdResult bwd;
};

Step step_on(int device, const Case& c, const Inputs& in) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  GpuRunner r(c);
  Step s;
  EXPECT_EQ(r.forward_backward(in, &s.fwd, &s.bwd), FLAMIA_SUCCESS) << "device " << device << ": " << flamia_last_error();
  return s;
}

void expect_same(const Step& a, const Step& b, int device) {
  EXPECT_TRUE(a.fwd.o == b.fwd.o) << "O differs on device " << device;
  EXPECT_TRUE(a.fwd.lse == b.fwd.lse) << "LSE differs on device " << device;
  EXPECT_TRUE(a.bwd.dq == b.bwd.dq) << "dQ differs on device " << device;
  EXPECT_TRUE(a.bwd.dk == b.bwd.dk) << "dK differs on device " << device;
  EXPECT_TRUE(a.bwd.dv == b.bwd.dv) << "dV differs on device " << device;
}

TEST(MultiDevice, EveryDeviceGivesTheSameBits) {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices, found " << devices;
  for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED})
    for (int d : {64, 128}) {
      Case c;
      c.cu = cu_from_lengths({300, 1, 700, 129});
      c.recipe = recipe;
      c.d = d;
      c.hq = 4;
      c.hkv = 2;
      c.causal = true;
      SCOPED_TRACE(std::string(recipe_name(recipe)) + " D=" + std::to_string(d));
      const Inputs in = make_inputs(c, 11);
      const Step first = step_on(0, c, in);
      for (int dev = 1; dev < devices; ++dev) expect_same(first, step_on(dev, c, in), dev);
      expect_same(first, step_on(0, c, in), 0);
    }
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
