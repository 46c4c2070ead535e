// Measures how Hopper's wgmma adds products into its FP32 accumulator, and compares every
// result bit for bit with the host model of src/reference/tensor_core.h.
//
//   flamia_wgmma_probe --save DIR     run on the GPU, write the raw results to DIR, compare
//   flamia_wgmma_probe --replay DIR   no GPU: read results saved by --save, compare again
//
// Every batch runs one instruction shape (E4M3 m64nNk32 or BF16 m64nNk16; A from shared
// memory "ss" or registers "rs"; N = 64/128/256) on many CTAs, each CTA one 64 x N x K
// problem: A [64][K], B [N][K] (both K-major, as the attention kernels store Q, K, Vᵀ),
// an optional incoming accumulator C [64][N], K/k chained steps (the first with scale-d 0
// unless C is given). Inputs are generated on the host from fixed seeds (so --replay
// regenerates them) in families aimed at the rule: uniform codes, exponent spreads,
// exact cancellations, one dominant product with small ones below it, half-ulp ties,
// subnormal products, sparse rows; C adds random, near-product, tiny/subnormal, huge and
// non-finite accumulators. Batches that share an input set are also compared with each
// other: SS vs RS, N = 64/128/256 (the same row·column), (A·Bᵀ) vs (B·Aᵀ)ᵀ, waiting
// after every step, and scale-d 0 vs scale-d 1 on a +0 accumulator.
// ptxas serializes these wgmmas (scale-d is chosen by a runtime branch): the probe measures
// arithmetic, not overlap, and does not exercise steps kept in flight.
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flamia/formats.h"
#include "reference/tensor_core.h"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace {

using flamia::ref::tc::StepRule;
namespace wg = flamia::sm90::wgmma;
namespace fmt = flamia::fmt;

// ---- device ------------------------------------------------------------------------------
struct KernelArgs {
  const uint8_t* a;  // [ctas][64][K] elements
  const uint8_t* b;  // [ctas][N][K]
  const float* c;    // [ctas][64][N] or null
  float* d;          // [ctas][64][N]
  int k;
  int first_scale_d;
  int wait_each;
};

// Rows [0, rows) of a natural K-major tile (row_bytes each) into the core-matrix layout of
// wgmma::KMajorTile<rows, ...> (chunk c of row r at c * rows * 16 + (r / 8) * 128 + (r % 8) * 16).
__device__ void load_tile(uint8_t* dst, const uint8_t* src, int rows, int row_bytes) {
  const int chunks = row_bytes / 16;
  for (int idx = threadIdx.x; idx < rows * chunks; idx += blockDim.x) {
    const int r = idx / chunks, c = idx % chunks;
    *reinterpret_cast<uint4*>(dst + c * rows * 16 + (r >> 3) * 128 + (r & 7) * 16) =
        *reinterpret_cast<const uint4*>(src + size_t(r) * row_bytes + 16 * c);
  }
}

template <bool kBf16, int NT, bool kRS>
__device__ __forceinline__ void issue(float (&d)[NT][4], const uint32_t (&af)[4], uint64_t ad, uint64_t bd, bool sd) {
  if constexpr (kBf16) {
    if constexpr (kRS) {
      if (sd) wg::mma_rs_bf16<true>(d, af, bd);
      else wg::mma_rs_bf16<false>(d, af, bd);
    } else {
      if (sd) wg::mma_ss_bf16<true>(d, ad, bd);
      else wg::mma_ss_bf16<false>(d, ad, bd);
    }
  } else {
    if constexpr (kRS) {
      if (sd) wg::mma_rs<true>(d, af, bd);
      else wg::mma_rs<false>(d, af, bd);
    } else {
      if (sd) wg::mma_ss<true>(d, ad, bd);
      else wg::mma_ss<false>(d, ad, bd);
    }
  }
}

template <bool kBf16, int NT, bool kRS>
__global__ void __launch_bounds__(128) probe_kernel(const KernelArgs p) {
  constexpr int N = NT * 8, kEs = kBf16 ? 2 : 1, kStepK = kBf16 ? 16 : 32;
  extern __shared__ __align__(128) uint8_t smem[];
  const int rb = p.k * kEs;
  const uint8_t* A = p.a + size_t(blockIdx.x) * 64 * rb;
  const uint8_t* B = p.b + size_t(blockIdx.x) * N * rb;
  const float* C = p.c ? p.c + size_t(blockIdx.x) * 64 * N : nullptr;
  float* D = p.d + size_t(blockIdx.x) * 64 * N;
  uint8_t* sa = smem;
  uint8_t* sb = smem + 64 * rb;
  load_tile(sa, A, 64, rb);
  load_tile(sb, B, N, rb);
  wg::fence_proxy_async();
  __syncthreads();

  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
  float d[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      d[n][e] = C ? C[(16 * w + g + 8 * (e >> 1)) * N + 8 * n + 2 * q + (e & 1)] : 0.0f;

  const uint32_t a_addr = flamia::sm90::ptx::smem_addr(sa), b_addr = flamia::sm90::ptx::smem_addr(sb);
  const int steps = p.k / kStepK;
  for (int ks = 0; ks < steps; ++ks) {
    uint32_t af[4] = {0, 0, 0, 0};
    if constexpr (kRS) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * w + g + 8 * (r % 2);
        const int k0 = kBf16 ? ks * 16 + 2 * q + 8 * (r / 2) : ks * 32 + 4 * q + 16 * (r / 2);
        std::memcpy(&af[r], A + size_t(row) * rb + k0 * kEs, 4);
      }
    }
    if (ks == 0 || kRS || p.wait_each) wg::fence();
    issue<kBf16, NT, kRS>(d, af, wg::desc<wg::KMajorTile<64, 32>>(a_addr, ks),
                          wg::desc<wg::KMajorTile<N, 32>>(b_addr, ks), ks > 0 || p.first_scale_d);
    wg::commit();
    if (kRS || p.wait_each) {
      wg::wait<0>();
      wg::pin(d);
      wg::pin(af);
    }
  }
  wg::wait<0>();
  wg::pin(d);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) D[(16 * w + g + 8 * (e >> 1)) * N + 8 * n + 2 * q + (e & 1)] = d[n][e];
}

template <bool kBf16, int NT, bool kRS>
cudaError_t launch(const KernelArgs& p, int ctas) {
  const int smem = (64 + NT * 8) * p.k * (kBf16 ? 2 : 1);
  cudaError_t e = cudaFuncSetAttribute(probe_kernel<kBf16, NT, kRS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  probe_kernel<kBf16, NT, kRS><<<ctas, 128, smem>>>(p);
  return cudaGetLastError();
}

template <bool kBf16>
cudaError_t launch_any(const KernelArgs& p, int n, bool rs, int ctas) {
  if (n == 64) return rs ? launch<kBf16, 8, true>(p, ctas) : launch<kBf16, 8, false>(p, ctas);
  if (n == 128) return rs ? launch<kBf16, 16, true>(p, ctas) : launch<kBf16, 16, false>(p, ctas);
  return rs ? launch<kBf16, 32, true>(p, ctas) : launch<kBf16, 32, false>(p, ctas);
}

// ---- inputs --------------------------------------------------------------------------------
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int uni(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
  bool coin(int percent) { return int(next() % 100) < percent; }
};

constexpr int kMaxN = 256;
constexpr int kOperandFamilies = 8;
const char* const kOperandFamily[kOperandFamilies] = {"uniform", "unit", "spread", "cancel",
                                                      "dominant", "subnormal", "sparse", "ties"};
constexpr int kAccFamilies = 4;
const char* const kAccFamily[kAccFamilies] = {"zero", "random", "special", "near"};

// One element code: E4M3 (sign, 4-bit exponent field, 3-bit mantissa) or BF16 (sign,
// 8-bit exponent field, 7-bit mantissa). exp_field < 0: zero.
uint16_t make_code(bool bf16, int sign, int exp_field, int man) {
  if (exp_field < 0) return uint16_t(sign << (bf16 ? 15 : 7));
  if (bf16) return uint16_t((sign << 15) | (exp_field << 7) | (man & 127));
  if (exp_field == 15 && (man & 7) == 7) man = 6;  // S.1111.111 is NaN: never generated
  return uint16_t((sign << 7) | (exp_field << 3) | (man & 7));
}

// Exponent fields: E4M3 bias 7 (field 0 = subnormal, 1..15), BF16 bias 127 (1..254).
struct Fmt {
  bool bf16;
  int bias() const { return bf16 ? 127 : 7; }
  int max_field() const { return bf16 ? 254 : 15; }
  int man_bits() const { return bf16 ? 7 : 3; }
  int field(int unbiased) const {  // clamps into the normal range (E4M3: also subnormal 0)
    int f = unbiased + bias();
    return f < (bf16 ? 1 : 0) ? (bf16 ? 1 : 0) : (f > max_field() ? max_field() : f);
  }
};

// Generates one CTA's A [64][K], B [kMaxN][K] codes and C [64][kMaxN].
void generate(bool bf16, uint64_t seed, int cta, int K, bool with_c, std::vector<uint16_t>& A,
              std::vector<uint16_t>& B, std::vector<float>& C) {
  const Fmt f{bf16};
  const int step = bf16 ? 16 : 32;
  const int fam = cta % kOperandFamilies, cfam = (cta / kOperandFamilies) % kAccFamilies;
  Rng rng(seed * 1000003ull + uint64_t(cta));
  A.assign(size_t(64) * K, 0);
  B.assign(size_t(kMaxN) * K, 0);
  auto rand_man = [&] { return rng.uni(0, (1 << f.man_bits()) - 1); };
  auto row = [&](uint16_t* x, bool is_a) {
    switch (fam) {
      case 0:  // uniform over the finite codes (BF16: exponents of +-2^40 around 1)
        for (int k = 0; k < K; ++k)
          x[k] = make_code(bf16, rng.uni(0, 1), bf16 ? rng.uni(87, 167) : rng.uni(0, 15), rand_man());
        break;
      case 1:  // magnitudes in [0.5, 4)
        for (int k = 0; k < K; ++k) x[k] = make_code(bf16, rng.uni(0, 1), f.field(rng.uni(-1, 1)), rand_man());
        break;
      case 2: {  // a wide spread of exponents, zeros, subnormals
        const int span = bf16 ? 60 : 8;
        for (int k = 0; k < K; ++k)
          x[k] = rng.coin(10) ? make_code(bf16, rng.uni(0, 1), -1, 0)
                              : make_code(bf16, rng.uni(0, 1), f.field(rng.uni(-span, span / 2)), rand_man());
        break;
      }
      case 3:  // each step's second half cancels its first half exactly; a few entries perturbed
        for (int k = 0; k < K; ++k) {
          const int in = k % step;
          if (in < step / 2) x[k] = make_code(bf16, rng.uni(0, 1), f.field(rng.uni(-2, 4)), rand_man());
          else x[k] = is_a ? uint16_t(x[k - step / 2] ^ (bf16 ? 0x8000 : 0x80)) : x[k - step / 2];
          if (rng.coin(4)) x[k] = make_code(bf16, rng.uni(0, 1), f.field(rng.uni(bf16 ? -30 : -9, -1)), rand_man());
        }
        break;
      case 4:  // one dominant entry per step, the rest 1 .. 2^(-span) below it
        for (int k = 0; k < K; ++k) {
          const bool big = (k % step) == (is_a ? 5 : 5);
          x[k] = big ? make_code(bf16, rng.uni(0, 1), f.field(bf16 ? 20 : 6), rand_man())
                     : make_code(bf16, rng.uni(0, 1), f.field(rng.uni(bf16 ? -20 : -6, bf16 ? 10 : 3)), rand_man());
        }
        break;
      case 5:  // subnormal / tiny operands (E4M3: fields 0 and 1; BF16: near 2^-126 and below)
        for (int k = 0; k < K; ++k)
          x[k] = bf16 ? make_code(true, rng.uni(0, 1), rng.uni(0, 6), rand_man())
                      : make_code(false, rng.uni(0, 1), rng.uni(0, 1), rand_man());
        break;
      case 6:  // sparse: 85 % zeros of either sign
        for (int k = 0; k < K; ++k)
          x[k] = rng.coin(85) ? make_code(bf16, rng.uni(0, 1), -1, 0)
                              : make_code(bf16, rng.uni(0, 1), f.field(rng.uni(-4, 4)), rand_man());
        break;
      default:  // ties: +-1 at one position, +-2^-h at others (products 2^-2h straddle cut points)
        for (int k = 0; k < K; ++k) {
          const int in = k % step;
          if (in == 0) x[k] = make_code(bf16, rng.uni(0, 1), f.field(rng.uni(0, 1)), rng.coin(50) ? 0 : rand_man());
          else if (rng.coin(30)) x[k] = make_code(bf16, 0, -1, 0);
          else {
            const int h = bf16 ? rng.uni(6, 14) : rng.uni(3, 8);
            // E4M3 2^-7 and 2^-8 are subnormal codes 4 and 2 (2^-9 * m).
            if (!bf16 && h > 6) x[k] = uint16_t((rng.uni(0, 1) << 7) | (h == 7 ? 4 : 2));
            else x[k] = make_code(bf16, rng.uni(0, 1), f.field(-h), rng.coin(70) ? 0 : rand_man());
          }
        }
        break;
    }
  };
  for (int r = 0; r < 64; ++r) row(&A[size_t(r) * K], true);
  for (int r = 0; r < kMaxN; ++r) row(&B[size_t(r) * K], false);
  C.assign(size_t(64) * kMaxN, 0.0f);
  if (!with_c) return;
  for (float& c : C) {
    const uint32_t sign = uint32_t(rng.uni(0, 1)) << 31, man = uint32_t(rng.next() & 0x7fffff);
    uint32_t bits = 0;
    switch (cfam) {
      case 0: bits = 0; break;
      case 1: bits = sign | (uint32_t(rng.uni(127 - 40, 127 + 40)) << 23) | man; break;
      case 2: {
        const int kind = rng.uni(0, 99);
        if (kind < 25) bits = sign | man;                                          // subnormal
        else if (kind < 45) bits = sign | (uint32_t(rng.uni(1, 12)) << 23) | man;  // 2^-126 .. 2^-115
        else if (kind < 55) bits = sign;                                           // +-0
        else if (kind < 70) bits = sign | 0x7f7fffffu;                             // +-FLT_MAX
        else if (kind < 85) bits = sign | (uint32_t(rng.uni(200, 254)) << 23) | man;
        else if (kind < 95) bits = sign | 0x7f800000u;                             // +-Inf
        else bits = 0x7fc00000u | man;                                             // NaN
        break;
      }
      default: bits = sign | (uint32_t(rng.uni(127 - 6, 127 + 8)) << 23) | man; break;
    }
    c = fmt::bits_f32(bits);
  }
}

// ---- batches ---------------------------------------------------------------------------------
struct Batch {
  const char* name;
  bool bf16;
  int n;
  bool rs;
  int k;
  bool with_c;      // an incoming accumulator (scale-d 1 from the first step)
  bool c_zero;      // ... that is +0 everywhere (scale-d 1 on +0 vs scale-d 0)
  bool wait_each;   // wait for every step before issuing the next
  bool swap;        // A = the set's B rows 0..63, B = the set's A: computes (A·Bᵀ)ᵀ
  int ctas;
  int set;          // input set (seed); batches of one set see the same operands
  const char* vs;   // compare with this batch of the same set ("" none)
};

const Batch kBatches[] = {
    // E4M3, one k32 step: products alone, then with an incoming accumulator.
    {"e4m3_k32_ss_n256", false, 256, false, 32, false, false, false, false, 40, 1, ""},
    {"e4m3_k32_ss_n256_acc", false, 256, false, 32, true, false, false, false, 40, 2, ""},
    {"e4m3_k32_rs_n256_acc", false, 256, true, 32, true, false, false, false, 16, 2, "e4m3_k32_ss_n256_acc"},
    // E4M3, D = 128: four chained k32 steps (S = Q·Kᵀ), one input set under every variant.
    {"e4m3_k128_ss_n128", false, 128, false, 128, false, false, false, false, 24, 3, ""},
    {"e4m3_k128_rs_n128", false, 128, true, 128, false, false, false, false, 24, 3, "e4m3_k128_ss_n128"},
    {"e4m3_k128_ss_n64", false, 64, false, 128, false, false, false, false, 24, 3, "e4m3_k128_ss_n128"},
    {"e4m3_k128_ss_n256", false, 256, false, 128, false, false, false, false, 24, 3, "e4m3_k128_ss_n128"},
    {"e4m3_k128_rs_n64", false, 64, true, 128, false, false, false, false, 24, 3, "e4m3_k128_ss_n64"},
    {"e4m3_k128_rs_n256", false, 256, true, 128, false, false, false, false, 24, 3, "e4m3_k128_ss_n256"},
    {"e4m3_k128_ss_n64_swap", false, 64, false, 128, false, false, false, true, 24, 3, "e4m3_k128_ss_n64"},
    {"e4m3_k128_ss_n128_wait", false, 128, false, 128, false, false, true, false, 24, 3, "e4m3_k128_ss_n128"},
    {"e4m3_k128_ss_n128_c0", false, 128, false, 128, true, true, false, false, 24, 3, "e4m3_k128_ss_n128"},
    // E4M3, long chains with an accumulator.
    {"e4m3_k1024_ss_n64_acc", false, 64, false, 1024, true, false, false, false, 16, 4, ""},
    // BF16, the same questions (k16 steps).
    {"bf16_k16_ss_n256", true, 256, false, 16, false, false, false, false, 32, 11, ""},
    {"bf16_k16_ss_n256_acc", true, 256, false, 16, true, false, false, false, 32, 12, ""},
    {"bf16_k16_rs_n256_acc", true, 256, true, 16, true, false, false, false, 16, 12, "bf16_k16_ss_n256_acc"},
    {"bf16_k128_ss_n128", true, 128, false, 128, false, false, false, false, 16, 13, ""},
    {"bf16_k128_rs_n128", true, 128, true, 128, false, false, false, false, 16, 13, "bf16_k128_ss_n128"},
    {"bf16_k128_ss_n64", true, 64, false, 128, false, false, false, false, 16, 13, "bf16_k128_ss_n128"},
    {"bf16_k128_ss_n256", true, 256, false, 128, false, false, false, false, 16, 13, "bf16_k128_ss_n128"},
    {"bf16_k128_rs_n64", true, 64, true, 128, false, false, false, false, 16, 13, "bf16_k128_ss_n64"},
    {"bf16_k128_rs_n256", true, 256, true, 128, false, false, false, false, 16, 13, "bf16_k128_ss_n256"},
    {"bf16_k128_ss_n64_swap", true, 64, false, 128, false, false, false, true, 16, 13, "bf16_k128_ss_n64"},
    {"bf16_k128_ss_n128_wait", true, 128, false, 128, false, false, true, false, 16, 13, "bf16_k128_ss_n128"},
    {"bf16_k128_ss_n128_c0", true, 128, false, 128, true, true, false, false, 16, 13, "bf16_k128_ss_n128"},
    {"bf16_k512_ss_n64_acc", true, 64, false, 512, true, false, false, false, 8, 14, ""},
};
constexpr int kNumBatches = int(sizeof(kBatches) / sizeof(kBatches[0]));

// One batch's operands as the kernel reads them: codes, decoded values, C.
struct Operands {
  std::vector<uint16_t> a, b;   // [ctas][64][K], [ctas][N][K] codes
  std::vector<float> av, bv;    // decoded
  std::vector<float> c;         // [ctas][64][N] (empty: none)
};

float decode(bool bf16, uint16_t code) {
  return bf16 ? fmt::bf16_bits_to_f32(code) : fmt::e4m3_to_f32(uint8_t(code));
}

Operands operands(const Batch& bt) {
  Operands o;
  const int K = bt.k, N = bt.n;
  o.a.resize(size_t(bt.ctas) * 64 * K);
  o.b.resize(size_t(bt.ctas) * N * K);
  if (bt.with_c) o.c.resize(size_t(bt.ctas) * 64 * N);
  std::vector<uint16_t> A, B;
  std::vector<float> C;
  for (int cta = 0; cta < bt.ctas; ++cta) {
    generate(bt.bf16, uint64_t(bt.set), cta, K, bt.with_c && !bt.c_zero, A, B, C);
    uint16_t* a = &o.a[size_t(cta) * 64 * K];
    uint16_t* b = &o.b[size_t(cta) * N * K];
    if (bt.swap) {  // N == 64
      std::memcpy(a, B.data(), sizeof(uint16_t) * 64 * K);
      std::memcpy(b, A.data(), sizeof(uint16_t) * 64 * K);
    } else {
      std::memcpy(a, A.data(), sizeof(uint16_t) * 64 * K);
      std::memcpy(b, B.data(), sizeof(uint16_t) * N * K);
    }
    if (bt.with_c)
      for (int r = 0; r < 64; ++r)
        for (int j = 0; j < N; ++j) o.c[(size_t(cta) * 64 + r) * N + j] = C[size_t(r) * kMaxN + j];
  }
  o.av.resize(o.a.size());
  o.bv.resize(o.b.size());
  for (size_t i = 0; i < o.a.size(); ++i) o.av[i] = decode(bt.bf16, o.a[i]);
  for (size_t i = 0; i < o.b.size(); ++i) o.bv[i] = decode(bt.bf16, o.b[i]);
  return o;
}

std::vector<float> run_gpu(const Batch& bt, const Operands& o) {
  const int es = bt.bf16 ? 2 : 1;
  std::vector<uint8_t> a(o.a.size() * es), b(o.b.size() * es);
  for (size_t i = 0; i < o.a.size(); ++i) std::memcpy(&a[i * es], &o.a[i], es);  // little-endian
  for (size_t i = 0; i < o.b.size(); ++i) std::memcpy(&b[i * es], &o.b[i], es);
  const size_t nd = size_t(bt.ctas) * 64 * bt.n;
  uint8_t *da, *db;
  float *dc = nullptr, *dd;
  CUDA_CHECK(cudaMalloc(&da, a.size()));
  CUDA_CHECK(cudaMalloc(&db, b.size()));
  CUDA_CHECK(cudaMalloc(&dd, nd * 4));
  CUDA_CHECK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dd, 0xff, nd * 4));
  if (bt.with_c) {
    CUDA_CHECK(cudaMalloc(&dc, nd * 4));
    CUDA_CHECK(cudaMemcpy(dc, o.c.data(), nd * 4, cudaMemcpyHostToDevice));
  }
  const KernelArgs p{da, db, dc, dd, bt.k, bt.with_c ? 1 : 0, bt.wait_each ? 1 : 0};
  CUDA_CHECK(bt.bf16 ? launch_any<true>(p, bt.n, bt.rs, bt.ctas) : launch_any<false>(p, bt.n, bt.rs, bt.ctas));
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> d(nd);
  CUDA_CHECK(cudaMemcpy(d.data(), dd, nd * 4, cudaMemcpyDeviceToHost));
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  if (dc) cudaFree(dc);
  return d;
}

// ---- model and comparisons ---------------------------------------------------------------------
uint32_t bits(float x) { return fmt::f32_bits(x); }
bool same(float x, float y) { return bits(x) == bits(y); }

// The model's result for D[cta][r][j] of a batch: the chain of steps of the instruction.
float model(const StepRule& rule, const Batch& bt, const Operands& o, int cta, int r, int j) {
  const int K = bt.k, N = bt.n;
  const float* a = &o.av[(size_t(cta) * 64 + r) * K];
  const float* b = &o.bv[(size_t(cta) * N + j) * K];
  float acc = bt.with_c ? o.c[(size_t(cta) * 64 + r) * N + j] : 0.0f;
  for (int k0 = 0; k0 < K; k0 += rule.k) acc = flamia::ref::tc::mma_step(rule, acc, bt.with_c || k0 > 0, a + k0, b + k0);
  return acc;
}

// The exact dot product (+ C), rounded once to FP32: what an exact-FP32 specification gets
// up to its own roundings.
double exact_dot(const Batch& bt, const Operands& o, int cta, int r, int j) {
  const int K = bt.k, N = bt.n;
  const float* a = &o.av[(size_t(cta) * 64 + r) * K];
  const float* b = &o.bv[(size_t(cta) * N + j) * K];
  long double s = bt.with_c ? o.c[(size_t(cta) * 64 + r) * N + j] : 0.0f;
  for (int k = 0; k < K; ++k) s += (long double)a[k] * b[k];
  return double(s);
}

void print_case(const Batch& bt, const Operands& o, const std::vector<float>& d, const StepRule& rule, int cta, int r,
                int j) {
  const int K = bt.k, N = bt.n;
  const size_t at = (size_t(cta) * 64 + r) * N + j;
  std::printf("    case cta %d (operands %s, acc %s) row %d col %d:", cta, kOperandFamily[cta % kOperandFamilies],
              bt.with_c ? (bt.c_zero ? "+0" : kAccFamily[(cta / kOperandFamilies) % kAccFamilies]) : "none", r, j);
  if (bt.with_c) std::printf(" C=%a (0x%08x)", o.c[at], bits(o.c[at]));
  std::printf("\n      GPU 0x%08x %a   model 0x%08x %a   exact %.17g\n", bits(d[at]), d[at],
              bits(model(rule, bt, o, cta, r, j)), model(rule, bt, o, cta, r, j), exact_dot(bt, o, cta, r, j));
  if (K > 128) return;
  for (int k0 = 0; k0 < K; k0 += rule.k) {
    std::printf("      step %d a·b codes:", k0 / rule.k);
    for (int k = k0; k < k0 + rule.k; ++k)
      std::printf(bt.bf16 ? " %04x*%04x" : " %02x*%02x", o.a[(size_t(cta) * 64 + r) * K + k],
                  o.b[(size_t(cta) * N + j) * K + k]);
    std::printf("\n");
  }
}

struct Tally {
  long long total = 0, match = 0, nan_both = 0, exact_fp32 = 0;
};

// Rules tried next to the published one on the single-step batches, so that one GPU run
// also says how far each neighbour is from the hardware.
std::vector<StepRule> neighbours(bool bf16) {
  const int k = bf16 ? 16 : 32;
  const int emin = bf16 ? -126 : -6;
  std::vector<StepRule> r;
  const std::vector<int> terms = bf16 ? std::vector<int>{13, 23, 24, 25, 26, 27} : std::vector<int>{12, 13, 14, 15, 23};
  const std::vector<int> sums = bf16 ? std::vector<int>{13, 23, 24} : std::vector<int>{13, 14, 23};
  for (int t : terms)
    for (int s : sums) r.push_back({k, t, s, emin});
  return r;
}

Tally compare(const Batch& bt, const Operands& o, const std::vector<float>& d, const StepRule& rule, int show) {
  Tally t;
  const int N = bt.n;
  const long long total = (long long)bt.ctas * 64 * N;
  std::vector<uint8_t> ok(static_cast<size_t>(total)), nan2(ok), ex(ok);
#pragma omp parallel for schedule(dynamic, 1024)
  for (long long i = 0; i < total; ++i) {
    const int cta = int(i / (64 * N)), r = int(i / N % 64), j = int(i % N);
    const float m = model(rule, bt, o, cta, r, j);
    ok[i] = same(m, d[i]);
    nan2[i] = std::isnan(m) && std::isnan(d[i]);
    ex[i] = same(float(exact_dot(bt, o, cta, r, j)), d[i]);
  }
  for (long long i = 0; i < total; ++i) {
    ++t.total;
    t.match += ok[i];
    t.nan_both += nan2[i] && !ok[i];
    t.exact_fp32 += ex[i];
    if (!ok[i] && !nan2[i] && show > 0) {
      --show;
      print_case(bt, o, d, rule, int(i / (64 * N)), int(i / N % 64), int(i % N));
    }
  }
  return t;
}

// Bitwise comparison with the batch `ref` of the same set: same operands (prefix columns for
// smaller N; transposed for swap).
void cross_check(const Batch& bt, const std::vector<float>& d, const Batch& ref, const std::vector<float>& dref) {
  long long total = 0, equal = 0;
  for (int cta = 0; cta < bt.ctas; ++cta)
    for (int r = 0; r < 64; ++r)
      for (int j = 0; j < std::min(bt.n, ref.n); ++j) {
        const float x = d[(size_t(cta) * 64 + r) * bt.n + j];
        const float y = bt.swap ? dref[(size_t(cta) * 64 + j) * ref.n + r] : dref[(size_t(cta) * 64 + r) * ref.n + j];
        ++total;
        equal += same(x, y) || (std::isnan(x) && std::isnan(y));
      }
  std::printf("  GPU vs GPU %-24s %lld / %lld bitwise equal%s\n", ref.name, equal, total,
              bt.swap ? "  [(A·Bᵀ) vs (B·Aᵀ)ᵀ]" : "");
}

void save(const std::string& dir, const Batch& bt, const std::vector<float>& d) {
  const std::string path = dir + "/" + bt.name + ".f32";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(d.data(), 4, d.size(), f) != d.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

std::vector<float> load(const std::string& dir, const Batch& bt) {
  const std::string path = dir + "/" + bt.name + ".f32";
  std::vector<float> d(size_t(bt.ctas) * 64 * bt.n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(d.data(), 4, d.size(), f) != d.size()) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "--save") != 0 && std::strcmp(argv[1], "--replay") != 0)) {
    std::fprintf(stderr, "usage: %s --save DIR | --replay DIR\n", argv[0]);
    return 2;
  }
  const bool replay = std::strcmp(argv[1], "--replay") == 0;
  const std::string dir = argv[2];
  if (!replay) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  }
  std::vector<std::vector<float>> results(kNumBatches);
  long long grand_total = 0, grand_match[2] = {0, 0}, grand_count[2] = {0, 0};
  for (int i = 0; i < kNumBatches; ++i) {
    const Batch& bt = kBatches[i];
    const Operands o = operands(bt);
    results[i] = replay ? load(dir, bt) : run_gpu(bt, o);
    if (!replay) save(dir, bt, results[i]);
    const StepRule& rule = bt.bf16 ? flamia::ref::tc::kHopperBF16 : flamia::ref::tc::kHopperE4M3;
    std::printf("%s: %s %s N=%d K=%d (%d steps), %s, %d CTAs\n", bt.name, bt.bf16 ? "bf16" : "e4m3",
                bt.rs ? "RS" : "SS", bt.n, bt.k, bt.k / rule.k,
                bt.with_c ? (bt.c_zero ? "scale-d 1 on C = +0" : "scale-d 1 on C") : "scale-d 0 first", bt.ctas);
    const Tally t = compare(bt, o, results[i], rule, 3);
    std::printf("  model {k %d, term %d, sum %d, operand emin %d}: %lld / %lld bitwise (%.6f%%)  [+%lld NaN with other "
                "bits]  GPU == exact sum rounded to FP32: %lld\n",
                rule.k, rule.term_frac_bits, rule.sum_frac_bits, rule.operand_min_exp, t.match, t.total,
                100.0 * double(t.match) / double(t.total), t.nan_both, t.exact_fp32);
    grand_total += t.total;
    grand_match[bt.bf16] += t.match;
    grand_count[bt.bf16] += t.total;
    if (bt.vs[0])
      for (int j = 0; j < i; ++j)
        if (std::strcmp(kBatches[j].name, bt.vs) == 0) cross_check(bt, results[i], kBatches[j], results[j]);
    if (bt.k == rule.k) {  // single step: how far are the neighbouring rules?
      std::printf("  neighbouring rules (term, sum fraction bits): matches\n   ");
      for (const StepRule& nr : neighbours(bt.bf16)) {
        const Tally tn = compare(bt, o, results[i], nr, 0);
        std::printf(" (%d,%d):%lld", nr.term_frac_bits, nr.sum_frac_bits, tn.match);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::printf("SUMMARY: e4m3 model matches %lld / %lld, bf16 model matches %lld / %lld dot products (%lld in all)\n",
              grand_match[0], grand_count[0], grand_match[1], grand_count[1], grand_total);
  return 0;
}
