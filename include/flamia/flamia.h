/* flamia C ABI: FP8 attention for training, with one scale per (token, head).
 *
 * Stable, plain-C surface meant to be bound from other languages (the Python package uses
 * it through ctypes). Tensors are passed as views (pointer, dtype, shape, strides in
 * elements, device). A call whose tensors all live on the host runs the CPU specification
 * (the exact emulation of the quantized algorithm); a call whose tensors live on one CUDA
 * device runs the GPU kernels on the given stream. Mixing host and device tensors is an
 * error.
 *
 * Every function returns a status; on failure flamia_last_error() gives a message naming
 * the offending argument and what was expected. The message is per thread.
 *
 * Validation: shapes, dtypes, layouts, devices, alignment (16 bytes for device tensors and
 * buffers) and buffer sizes are always checked. The values of a host cu_seqlens are always
 * checked too. Checking mode (environment variable FLAMIA_CHECK=1, read at each call) also
 * verifies that device pointers belong to the declared device and reports NaN/Inf in q, k,
 * v and dout as FLAMIA_ERROR_NONFINITE; it synchronises the stream and is meant for
 * debugging. Without it NaN/Inf propagate to the affected outputs and no call synchronises
 * the device. A rejected call writes nothing. T = 0 is a valid, empty call. Strides of
 * size-1 dimensions are ignored.
 *
 * Device cu_seqlens and max_seqlen (hostile input). The invariants are
 *   cu[0] = 0,  cu[b] <= cu[b + 1],  cu[B] = T,  cu[b + 1] - cu[b] <= max_seqlen;
 * equal consecutive entries (zero-length documents) are valid. No value of cu_seqlens or
 * max_seqlen causes an out-of-bounds access: every kernel clamps what it reads and writes to
 * the tensors' extents. Whether the values are valid is checked
 *   - in checking mode on the host before anything is launched: the call fails with
 *     FLAMIA_ERROR_INVALID_ARGUMENT and a message naming cu_seqlens (or max_seqlen) and the
 *     broken invariant, e.g. "cu_seqlens: must be non-decreasing, got cu_seqlens[2] = 100 <
 *     cu_seqlens[1] = 400";
 *   - otherwise on the device, by the call's first kernel, without a host synchronisation:
 *     the call returns FLAMIA_SUCCESS, computes nothing, fills its outputs (out and lse;
 *     dq, dk and dv) with NaN, and records the fault in a sticky per-device record that
 *     flamia_check_errors reports. Outputs are never finite numbers computed from an invalid
 *     cu_seqlens.
 * The same holds for qkv8_filled: flamia_quantize_qkv (and a self-quantizing forward) store
 * a fingerprint of (cu_seqlens, T, B, heads, head dim, recipe) in qkv8; a forward with
 * qkv8_filled or a backward whose arguments do not match it is rejected that way (message
 * naming qkv8), and a rejected qkv8 stays rejected until it is quantized again. */
#ifndef FLAMIA_FLAMIA_H
#define FLAMIA_FLAMIA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLAMIA_VERSION_MAJOR 0
#define FLAMIA_VERSION_MINOR 1
#define FLAMIA_VERSION_PATCH 0

typedef enum flamia_status {
  FLAMIA_SUCCESS = 0,
  FLAMIA_ERROR_INVALID_ARGUMENT = 1, /* shape, dtype, layout, cu_seqlens, ... */
  FLAMIA_ERROR_UNSUPPORTED = 2,      /* valid request this build or device cannot run */
  FLAMIA_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  FLAMIA_ERROR_NONFINITE = 4         /* checking mode found NaN/Inf in an input */
} flamia_status;

typedef enum flamia_dtype {
  FLAMIA_DTYPE_BF16 = 0,
  FLAMIA_DTYPE_FP32 = 1,
  FLAMIA_DTYPE_INT32 = 2,
  FLAMIA_DTYPE_UINT8 = 3
} flamia_dtype;

typedef enum flamia_recipe {
  /* Every attention matmul in FP8 E4M3 (QK^T, PV, dO V^T, P^T dO, dS^T Q, dS K). */
  FLAMIA_RECIPE_FP8 = 0,
  /* Forward, dO V^T and P^T dO in FP8; the two matmuls with dS (dS^T Q, dS K) in BF16. */
  FLAMIA_RECIPE_FP8_MIXED = 1
} flamia_recipe;

#define FLAMIA_MAX_DIMS 4
#define FLAMIA_DEVICE_HOST (-1)

typedef struct flamia_tensor {
  void* data;
  flamia_dtype dtype;
  int32_t ndim;
  int64_t shape[FLAMIA_MAX_DIMS];
  int64_t strides[FLAMIA_MAX_DIMS]; /* in elements */
  int32_t device;                   /* FLAMIA_DEVICE_HOST or a CUDA device ordinal */
} flamia_tensor;

/* Arguments common to the forward and the backward call. */
typedef struct flamia_attention_args {
  flamia_tensor q;          /* [T, Hq, D]  bf16, last dim contiguous */
  flamia_tensor k;          /* [T, Hkv, D] bf16, last dim contiguous */
  flamia_tensor v;          /* [T, Hkv, D] bf16, last dim contiguous */
  flamia_tensor cu_seqlens; /* [B + 1] int32, 0 = cu[0] <= cu[1] <= ... <= cu[B] = T */
  int32_t max_seqlen;       /* >= the longest document (an upper bound is fine) */
  int32_t causal;           /* nonzero: token t attends to tokens <= t of its document */
  float softmax_scale;      /* 0 selects 1/sqrt(D) */
  flamia_recipe recipe;
  void* stream;             /* cudaStream_t for device calls; ignored on the host */
  /* Optional (data = NULL: absent, every query row computed). [B] int32 on q's device:
   * document b's queries start at position q_start[b]; the rows before it are keys only.
   * Each value is a multiple of FLAMIA_QUERY_TILE in [0, L_b] (L_b = cu[b + 1] - cu[b]).
   * The forward writes out and lse only for rows at or after q_start[b]; the backward writes
   * dq only for those rows and sums dk, dv over them alone. Every computed row is bitwise the
   * row the call without q_start computes (rows are independent in the forward and dQ; dK/dV
   * lose only the rows left out). Context parallelism uses it: a rank holding the queries
   * [cC, (c + 1)C) of a cut document runs the local document [0, (c + 1)C) with q_start = cC.
   * Host values are always checked; device values as cu_seqlens' are (on the device, or in
   * checking mode on the host). */
  flamia_tensor q_start;
} flamia_attention_args;

/* q_start values are multiples of this (the query tiles of the kernels). */
#define FLAMIA_QUERY_TILE 128

/* Bytes of the quantized-operand buffer ("qkv8") that the forward fills and the backward
 * reads, so that q, k and v are quantized once per training step. for_backward = 0 sizes
 * a forward-only buffer (inference), 1 one that also holds the layouts the backward reads.
 * Returns 0 on invalid sizes (flamia_last_error() says why) and in a build without CUDA.
 * Device calls only; host calls need no buffer. */
size_t flamia_qkv8_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv, int32_t head_dim,
                         flamia_recipe recipe, int32_t for_backward);

/* Bytes of scratch the backward needs (quantized dO and its transpose, D = rowsum(dO8*O); with
 * recipe fp8 also the transposed FP8 q and k, which qkv8 does not keep). Enough for every
 * call, but without room for the stored dS that makes fp8_mixed's backward at head dim 128
 * faster (then it recomputes dS for dQ): flamia_backward_workspace_bytes_for sizes that.
 * Not enough with FLAMIA_BWD_DQ=hbm, which requires the stored dS. Returns 0 on invalid
 * sizes, when FLAMIA_BWD_DQ holds a value that is no option (flamia_last_error() says why),
 * and in a build without CUDA. */
size_t flamia_backward_workspace_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv,
                                       int32_t head_dim, flamia_recipe recipe);

/* Bytes of scratch for the fastest backward of a call with these arguments:
 * flamia_backward_workspace_bytes plus, where the stored dS is on (fp8_mixed at head dim 128
 * by default; every call with FLAMIA_BWD_DQ=hbm; none with FLAMIA_BWD_DQ=recompute), room
 * for dQ's operand of every tile pair: 2 bytes per score with fp8_mixed, ~1.06 with fp8, in
 * slabs of kv heads (the fewest that give the dK/dV pass ~six waves of CTAs, at most
 * FLAMIA_BWD_DS_MIB MiB, default 2048, at least one kv head; two slabs' room with
 * FLAMIA_BWD_DS_OVERLAP=1 where there are two slabs or more), bounded from max_seqlen and causal. The backward uses the stored dS when the workspace it
 * is given is at least this size; the gradients are bitwise the same either way. Validates
 * args as flamia_backward does; 0 for host calls (no workspace), for invalid args or a
 * FLAMIA_BWD_DQ that is no option (flamia_last_error() says why) and in a build without
 * CUDA. */
size_t flamia_backward_workspace_bytes_for(const flamia_attention_args* args);

/* How the device backward of a call with this recipe and head dim forms dQ, as the run-time
 * switch FLAMIA_BWD_DQ selects it (read at every call, like the backward itself does):
 *  FLAMIA_DQ_RECOMPUTE        a deterministic pass recomputes dS for dQ;
 *  FLAMIA_DQ_STORED           the stored dS (deterministic, the same bits), where the workspace
 *                             holds it (flamia_backward_workspace_bytes_for), else recompute:
 *                             the default for fp8_mixed at head dim 128;
 *  FLAMIA_DQ_STORED_REQUIRED  the stored dS, and a smaller workspace is refused (=hbm);
 *  FLAMIA_DQ_FUSED            FP32 reductions inside the dK/dV pass: NOT deterministic
 *                             (=fused, fp8_mixed at head dim 128 only; a call with q_start
 *                             recomputes instead).
 * Returns FLAMIA_ERROR_INVALID_ARGUMENT naming FLAMIA_BWD_DQ when it holds a value that is
 * no option, or naming head_dim / recipe when they are unsupported. A build without CUDA has
 * no device backward: FLAMIA_DQ_RECOMPUTE. */
typedef enum {
  FLAMIA_DQ_RECOMPUTE = 0,
  FLAMIA_DQ_STORED = 1,
  FLAMIA_DQ_STORED_REQUIRED = 2,
  FLAMIA_DQ_FUSED = 3
} flamia_dq_path;
flamia_status flamia_backward_dq_path(flamia_recipe recipe, int32_t head_dim, flamia_dq_path* path);

/* Quantize q, k, v into qkv8 (one fused pass). Lets a caller quantize once and reuse.
 * With host tensors this only validates the arguments (host calls quantize internally). */
flamia_status flamia_quantize_qkv(const flamia_attention_args* args, void* qkv8, size_t qkv8_bytes,
                                  int32_t for_backward);

/* out [T, Hq, D] bf16; lse [Hq, T] fp32 (natural log). qkv8: see flamia_qkv8_bytes.
 * qkv8_filled != 0 means qkv8 already holds q, k, v quantized by flamia_quantize_qkv with
 * the same arguments, and the forward skips quantization. qkv8_bytes must be at least
 * flamia_qkv8_bytes(..., for_backward = 0); a buffer of at least the for_backward = 1 size
 * also receives the layouts the backward reads. With qkv8_filled the quantized values are
 * only read, but the call writes qkv8's small bookkeeping (its status word and the forward's
 * work counter), so two forwards on one qkv8 must not run concurrently on different streams.
 * Host calls ignore qkv8 (may be NULL). */
flamia_status flamia_forward(const flamia_attention_args* args, flamia_tensor out, flamia_tensor lse,
                             void* qkv8, size_t qkv8_bytes, int32_t qkv8_filled);

/* dout, out [T, Hq, D] bf16; lse [Hq, T] fp32 from the forward; qkv8 as filled by the
 * forward with for_backward = 1. Writes dq [T, Hq, D], dk and dv [T, Hkv, D] (bf16).
 * dout may be strided (last dim contiguous); out, lse, dq, dk, dv are dense. Host calls
 * ignore qkv8 and workspace (may be NULL). On the device, args->v (and with recipe fp8 also
 * args->q, k) may have data = NULL (shape, dtype, device and strides still describe the
 * problem): the backward reads them from qkv8, so a caller need not keep them from the
 * forward to the backward. Recipe fp8_mixed's backward reads the BF16 q and k themselves (its
 * dS products take their values), so they must be the forward's, unchanged. Host calls
 * (which quantize q, k, v themselves) need their data. */
flamia_status flamia_backward(const flamia_attention_args* args, flamia_tensor dout, flamia_tensor out,
                              flamia_tensor lse, const void* qkv8, size_t qkv8_bytes, void* workspace,
                              size_t workspace_bytes, flamia_tensor dq, flamia_tensor dk, flamia_tensor dv);

/* Errors that the device recorded without a host synchronisation (invalid device
 * cu_seqlens / max_seqlen, a qkv8 that does not match the call; see the top of this file):
 * reads and clears the sticky record of `device` (a CUDA ordinal), or with device = -1 of
 * every device this process has run calls on. Returns FLAMIA_SUCCESS when nothing was
 * recorded, else FLAMIA_ERROR_INVALID_ARGUMENT with flamia_last_error() naming the device,
 * the argument, the broken invariant and the call; only the first fault since the last
 * check is kept. Synchronises the device(s): meant to be called every N training steps. */
flamia_status flamia_check_errors(int32_t device);

/* Message of the last failed call on this thread ("" if none). A successful call leaves it
 * unchanged. */
const char* flamia_last_error(void);

/* 1 if this build has GPU kernels and a supported (sm_90) device is present, else 0. */
int32_t flamia_gpu_available(void);

/* Short version/build description, e.g. "flamia 0.1.0 (sm90a)". */
const char* flamia_version_string(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLAMIA_FLAMIA_H */
