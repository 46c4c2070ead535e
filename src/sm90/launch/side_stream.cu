#include "sm90/launch/side_stream.h"

namespace flamia {
namespace sm90 {

namespace {
constexpr int kMaxDevices = 64;
}  // namespace

// Never destroyed: a thread's stream and events would outlive the CUDA context at process
// exit, where destroying them fails; a thread keeps one set per device it used.
cudaError_t side_stream(bool high_priority, SideStream*& out) {
  thread_local SideStream per_device[2][kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  SideStream& s = per_device[high_priority][device];
  if (s.stream == nullptr) {
    SideStream made;
    int least = 0, greatest = 0;
    err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err == cudaSuccess)
      err = cudaStreamCreateWithPriority(&made.stream, cudaStreamNonBlocking, high_priority ? greatest : least);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&made.forked, cudaEventDisableTiming);
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) err = cudaEventCreateWithFlags(&made.done[i], cudaEventDisableTiming);
    if (err != cudaSuccess) return err;
    s = made;
  }
  out = &s;
  return cudaSuccess;
}

}  // namespace sm90
}  // namespace flamia
