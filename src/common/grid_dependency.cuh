// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
// serialization (common/overlap.h) may start while the kernel before it in the stream still
// runs, once every CTA of that one has allowed it (allow_dependents) or exited. PTX ISA
// "griddepcontrol". The quantizer's and the attention kernels' launches use it so that a
// launch's CTAs take the SMs its predecessor's last wave leaves idle, and run their prologue
// (barriers, the rows that do not depend on the predecessor) there.
//
// The rules every kernel that can be launched so keeps:
//  - before wait_for_prior_grids(), no global access that conflicts with the kernel launched
//    just before it (reading what it writes, writing what it reads or writes): that one may
//    still run; every kernel before it has completed (next rule);
//  - allow_dependents() only after wait_for_prior_grids() (in a kernel launched in plain
//    stream order, anywhere), so that at most one predecessor runs beside a CTA before its
//    wait;
//  - every CTA calls wait_for_prior_grids() before it exits, on every path, so that a kernel
//    completes only after the one before it (stream order holds for whatever follows).
// wait_for_prior_grids() is a no-op in a kernel launched without the attribute;
// allow_dependents() matters wherever the next launch has it, whatever this one's launch.
#pragma once

namespace flamia {
namespace grid {

// Blocks until every grid this one depends on has completed and its memory operations are
// visible to this grid.
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// This CTA no longer holds back the launch of the grid that depends on this one.
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace grid
}  // namespace flamia
