// A second stream for the kernels of one call that may run side by side (the backward's dQ
// work next to its dK/dV work), joined back into the caller's stream before the call
// returns, so the caller sees one stream's order (and a CUDA graph captured on its stream
// forks and joins through the events).
#pragma once

#include <cuda_runtime.h>

namespace flamia {
namespace sm90 {

struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr;     // recorded on the caller's stream, waited on by `stream`
  cudaEvent_t done[2] = {};         // recorded on `stream`, waited on by the caller's stream
};

// The calling thread's side stream of the current device, created at its first use (at the
// device's greatest stream priority when `high_priority`, else at the default one). Per
// thread, because an event is recorded and then waited on by two host calls: another thread
// recording the same event in between would hand the wait the wrong work.
cudaError_t side_stream(bool high_priority, SideStream*& out);

// `to` waits for the work enqueued on `from` so far, through `event`.
inline cudaError_t stream_after(cudaStream_t to, cudaStream_t from, cudaEvent_t event) {
  cudaError_t err = cudaEventRecord(event, from);
  return err == cudaSuccess ? cudaStreamWaitEvent(to, event, 0) : err;
}

}  // namespace sm90
}  // namespace flamia
