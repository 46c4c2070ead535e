// The forward and the backward captured in a CUDA graph (as torch.compile's CUDA graphs
// capture them): their launches that may overlap the one before them (programmatic dependent
// launch) become the graph's programmatic edges, and the replayed graph must give the eager
// call's bits — the forward quantizing itself and on a filled qkv8, the backward's stored dS
// slabs (fp8_mixed, D = 128, several slabs; also with FLAMIA_BWD_DS_OVERLAP=1, which a capture
// leaves in the one-buffer order) and its recomputing passes (fp8, and D = 64), with the
// overlap on and off (FLAMIA_PDL=0).
#if defined(FLAMIA_WITH_CUDA)

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

// The captured graph's programmatic edges: some with the overlap on, none with it off.
void expect_programmatic_edges(cudaGraph_t graph, bool overlap_on, const char* what) {
  size_t edges = 0;
  ASSERT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  ASSERT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges), cudaSuccess);
  int programmatic = 0;
  for (const cudaGraphEdgeData& e : data) programmatic += e.type == cudaGraphDependencyTypeProgrammatic;
  if (overlap_on) EXPECT_GT(programmatic, 0) << "no programmatic edge in the captured " << what;
  else EXPECT_EQ(programmatic, 0) << "programmatic edges with FLAMIA_PDL=0 in the captured " << what;
}

// qkv8_filled: the captured call reads the qkv8 the eager call's quantizer filled (the check
// of a filled qkv8 before the forward), else it quantizes (the quantizer before it).
void expect_forward_graph_replay_bitwise(const Case& c, uint64_t seed, bool qkv8_filled, bool overlap_on) {
  SCOPED_TRACE(qkv8_filled ? "qkv8 filled" : "quantizing");
  const Inputs in = make_inputs(c, seed);
  GpuRunner r(c);
  FwdResult eager, replayed;
  ASSERT_EQ(r.forward(in, &eager), FLAMIA_SUCCESS) << flamia_last_error();

  const flamia_attention_args a = r.args();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(r.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const flamia_status st =
      flamia_forward(&a, r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), qkv8_filled ? 1 : 0);
  ASSERT_EQ(cudaStreamEndCapture(r.stream(), &graph), cudaSuccess);
  ASSERT_EQ(st, FLAMIA_SUCCESS) << flamia_last_error();
  expect_programmatic_edges(graph, overlap_on, "forward");
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Two replays, each on poisoned outputs.
  for (int replay = 0; replay < 2; ++replay) {
    const flamia_tensor o = r.out_view(), lse = r.lse_view();
    ASSERT_EQ(cudaMemsetAsync(o.data, 0xFF, size_t(o.shape[0]) * o.shape[1] * o.shape[2] * 2, r.stream()),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(lse.data, 0xFF, size_t(lse.shape[0]) * lse.shape[1] * 4, r.stream()), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, r.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
    r.download_fwd(&replayed);
    EXPECT_EQ(replayed.o, eager.o) << "O, replay " << replay;
    EXPECT_EQ(replayed.lse, eager.lse) << "LSE, replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// stored: the call takes the stored dS (its tiles lie past the plain workspace); overlap_on:
// FLAMIA_PDL is not 0.
void expect_graph_replay_bitwise(const Case& c, uint64_t seed, bool stored, bool overlap_on) {
  const Inputs in = make_inputs(c, seed);
  GpuRunner r(c);
  FwdResult f;
  BwdResult eager, replayed;
  ASSERT_EQ(r.forward(in, &f), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(r.backward_after_forward(&eager), FLAMIA_SUCCESS) << flamia_last_error();

  const flamia_attention_args a = r.args();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(r.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const flamia_status st = flamia_backward(&a, r.dout_view(), r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(),
                                           r.workspace(), r.workspace_bytes(), r.dq_view(), r.dk_view(),
                                           r.dv_view());
  ASSERT_EQ(cudaStreamEndCapture(r.stream(), &graph), cudaSuccess);
  ASSERT_EQ(st, FLAMIA_SUCCESS) << flamia_last_error();
  expect_programmatic_edges(graph, overlap_on, "backward");
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Two replays, each on poisoned gradients and workspace.
  for (int replay = 0; replay < 2; ++replay) {
    for (const flamia_tensor& t : {r.dq_view(), r.dk_view(), r.dv_view()})
      ASSERT_EQ(cudaMemsetAsync(t.data, 0xFF, size_t(t.shape[0]) * t.shape[1] * t.shape[2] * 2, r.stream()),
                cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(r.workspace(), 0xFF, r.workspace_bytes(), r.stream()), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, r.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
    r.download_bwd(&replayed);
    EXPECT_EQ(replayed.dq, eager.dq) << "dQ, replay " << replay;
    EXPECT_EQ(replayed.dk, eager.dk) << "dK, replay " << replay;
    EXPECT_EQ(replayed.dv, eager.dv) << "dV, replay " << replay;
    const size_t plain = flamia_backward_workspace_bytes(c.tokens(), c.num_docs(), c.hq, c.hkv, c.d, c.recipe);
    EXPECT_EQ(r.workspace_bytes_written_from(plain) > 0, stored) << "the stored dS ran (or not), replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

Case make(flamia_recipe recipe, int d) {
  Case c;
  c.cu = cu_from_lengths({1100, 300, 640, 77});
  c.recipe = recipe;
  c.d = d;
  c.hq = 8;
  c.hkv = 4;
  return c;
}

TEST(GraphCapture, ReplayedForwardGivesTheEagerBits) {
  for (const char* pdl : {static_cast<const char*>(nullptr), "0"}) {
    ScopedEnv overlap("FLAMIA_PDL", pdl);
    SCOPED_TRACE(std::string("FLAMIA_PDL=") + (pdl != nullptr ? pdl : "(unset)"));
    for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED})
      for (const int d : {128, 64})
        for (const bool filled : {false, true})
          expect_forward_graph_replay_bitwise(make(recipe, d), 64 + d, filled, pdl == nullptr);
  }
}

TEST(GraphCapture, ReplayedBackwardGivesTheEagerBits) {
  for (const char* pdl : {static_cast<const char*>(nullptr), "0"}) {
    ScopedEnv overlap("FLAMIA_PDL", pdl);
    SCOPED_TRACE(std::string("FLAMIA_PDL=") + (pdl != nullptr ? pdl : "(unset)"));
    for (const char* beside : {static_cast<const char*>(nullptr), "1"}) {
      // The stored dS in slabs of one kv head (four slabs of GEMM and dK/dV launches); with
      // FLAMIA_BWD_DS_OVERLAP=1 a captured call keeps the one-buffer order in its own stream.
      ScopedEnv budget("FLAMIA_BWD_DS_MIB", "1");
      ScopedEnv two_buffers("FLAMIA_BWD_DS_OVERLAP", beside);
      expect_graph_replay_bitwise(make(FLAMIA_RECIPE_FP8_MIXED, 128), 61, true, pdl == nullptr);
    }
    expect_graph_replay_bitwise(make(FLAMIA_RECIPE_FP8, 128), 62, false, pdl == nullptr);
    expect_graph_replay_bitwise(make(FLAMIA_RECIPE_FP8_MIXED, 64), 63, false, pdl == nullptr);
  }
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
