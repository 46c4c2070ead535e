// Entry point of flamia_gpu_tests.
//
// Exits 77 (ctest's SKIP_RETURN_CODE for this suite) when there is no usable sm_90 GPU, so a
// CPU-only machine reports the suite as skipped rather than failed.
//
// FLAMIA_GPU_TESTS_SMALL=1 selects the small cases (test names containing "Small"), for runs
// under compute-sanitizer where every kernel is 10-100x slower. An explicit --gtest_filter
// on the command line wins.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "flamia/flamia.h"

int main(int argc, char** argv) {
  bool list_only = false;  // listing the tests needs no GPU
  for (int i = 1; i < argc; ++i) list_only |= std::strcmp(argv[i], "--gtest_list_tests") == 0;
  if (flamia_gpu_available() == 0 && !list_only) {
    std::printf("no usable sm_90 GPU: GPU tests skipped (%s)\n", flamia_version_string());
    return 77;
  }
  // Look for an explicit filter before InitGoogleTest consumes the gtest flags.
  bool filter_given = false;
  for (int i = 1; i < argc; ++i) filter_given |= std::strncmp(argv[i], "--gtest_filter", 14) == 0;
  ::testing::InitGoogleTest(&argc, argv);
  const char* small = std::getenv("FLAMIA_GPU_TESTS_SMALL");
  if (std::getenv("GTEST_FILTER") != nullptr) filter_given = true;
  if (small != nullptr && std::string(small) == "1" && !filter_given) {
    ::testing::GTEST_FLAG(filter) = "*Small*";
    std::printf("FLAMIA_GPU_TESTS_SMALL=1: running only tests matching *Small*\n");
  }
  std::printf("%s\n", flamia_version_string());
  return RUN_ALL_TESTS();
}
