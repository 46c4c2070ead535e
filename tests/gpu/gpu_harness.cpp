// Implementation of the GPU test harness (see gpu_harness.h).
#if defined(FLAMIA_WITH_CUDA)

#include "gpu_harness.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "flamia/formats.h"
#include "sm90/sm90.h"

namespace flamia_gpu_test {

namespace fmt = flamia::fmt;
namespace ref = flamia::ref;

// ---------------------------------------------------------------------------------------
// Cases and host data
// ---------------------------------------------------------------------------------------

int Case::max_seqlen() const {
  int m = 0;
  for (int b = 0; b < num_docs(); ++b) m = std::max(m, doc_len(b));
  return m;
}

float Case::resolved_scale() const {
  return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(float(d));
}

std::string Case::describe() const {
  std::ostringstream s;
  s << recipe_name(recipe) << " D=" << d << " Hq=" << hq << " Hkv=" << hkv
    << (causal ? " causal" : " non-causal") << " T=" << tokens() << " docs=" << num_docs()
    << " max_len=" << max_seqlen();
  return s.str();
}

std::vector<int32_t> cu_from_lengths(const std::vector<int>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

const char* recipe_name(flamia_recipe r) {
  switch (r) {
    case FLAMIA_RECIPE_FP8: return "fp8";
    case FLAMIA_RECIPE_FP8_MIXED: return "fp8_mixed";
  }
  return "?";
}

uint16_t bf16(float x) { return fmt::f32_to_bf16_bits(x); }
float f32(uint16_t b) { return fmt::bf16_bits_to_f32(b); }

static void fill_normal(std::vector<uint16_t>& x, size_t n, std::mt19937_64& rng, float mul) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  x.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float r = nd(rng);
    if (r == 0.0f) r = 1e-3f;  // keep the "never zeros" promise even for an exact 0 draw
    x[i] = bf16(r * mul);
  }
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  const size_t T = size_t(c.tokens());
  fill_normal(in.q, T * c.hq * c.d, rng, 1.0f);
  fill_normal(in.k, T * c.hkv * c.d, rng, 1.0f);
  fill_normal(in.v, T * c.hkv * c.d, rng, 1.0f);
  fill_normal(in.dout, T * c.hq * c.d, rng, 1.0f);
  return in;
}

void perturb_rows(std::vector<uint16_t>& x, int heads, int d, int64_t t0, int64_t t1, Perturb kind,
                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Huge/Tiny multiply by factors that change every per-token scale by many binades
  // (and, in a shared-scale scheme, would change how earlier tokens are rounded).
  const float mul = kind == Perturb::Huge ? 3000.0f : kind == Perturb::Tiny ? 1e-4f : 1.0f;
  const size_t row = size_t(heads) * d;
  for (size_t i = size_t(t0) * row; i < size_t(t1) * row; ++i) {
    float r = nd(rng);
    if (r == 0.0f) r = 0.5f;
    x[i] = bf16(r * mul);
  }
}

// ---------------------------------------------------------------------------------------
// Device buffers
// ---------------------------------------------------------------------------------------

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  // Allocate at least one byte so that every view has a valid pointer (empty tensors too).
  check_cuda(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (value != nullptr) setenv(name, value, 1);
  else unsetenv(name);
}
ScopedEnv::~ScopedEnv() { unsetenv(name_.c_str()); }

flamia_tensor view(void* data, flamia_dtype dt, std::vector<int64_t> shape, int32_t device) {
  flamia_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.ndim = int32_t(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  t.device = device;
  return t;
}

// ---------------------------------------------------------------------------------------
// GPU runner
// ---------------------------------------------------------------------------------------

GpuRunner::GpuRunner(const Case& c) : c_(c) {
  check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
  // A non-blocking stream of our own: if the library enqueued work on the legacy default
  // stream instead of args.stream, the downloads below would race with it and the bitwise
  // tests would notice.
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t T = size_t(c.tokens());
  q_ = DeviceBuffer(T * c.hq * c.d * 2);
  k_ = DeviceBuffer(T * c.hkv * c.d * 2);
  v_ = DeviceBuffer(T * c.hkv * c.d * 2);
  dout_ = DeviceBuffer(T * c.hq * c.d * 2);
  cu_ = DeviceBuffer(c.cu.size() * 4);
  out_ = DeviceBuffer(T * c.hq * c.d * 2);
  lse_ = DeviceBuffer(T * c.hq * 4);
  dq_ = DeviceBuffer(T * c.hq * c.d * 2);
  dk_ = DeviceBuffer(T * c.hkv * c.d * 2);
  dv_ = DeviceBuffer(T * c.hkv * c.d * 2);
  const size_t qb = flamia_qkv8_bytes(c.tokens(), c.num_docs(), c.hq, c.hkv, c.d, c.recipe, 1);
  if (qb == 0) throw std::runtime_error("flamia_qkv8_bytes returned 0 for " + c.describe());
  qkv8_ = DeviceBuffer(qb);
  check_cuda(cudaMemcpy(cu_.get(), c.cu.data(), c.cu.size() * 4, cudaMemcpyHostToDevice), "upload cu");
  if (!c.q_start.empty()) {
    q_start_ = DeviceBuffer(c.q_start.size() * 4);
    check_cuda(cudaMemcpy(q_start_.get(), c.q_start.data(), c.q_start.size() * 4, cudaMemcpyHostToDevice),
               "upload q_start");
  }
  // Sized for the call (the options read at run time included, FLAMIA_BWD_DQ=hbm's stored dS);
  // a case whose arguments are invalid on purpose gets the size without them (0 here).
  const flamia_attention_args a = args();
  size_t wb = flamia_backward_workspace_bytes_for(&a);
  if (wb == 0) wb = flamia_backward_workspace_bytes(c.tokens(), c.num_docs(), c.hq, c.hkv, c.d, c.recipe);
  ws_ = DeviceBuffer(wb);
}

GpuRunner::~GpuRunner() {
  if (stream_) cudaStreamDestroy(stream_);
}

flamia_attention_args GpuRunner::args() const {
  flamia_attention_args a{};
  const int64_t T = c_.tokens();
  a.q = view(q_.get(), FLAMIA_DTYPE_BF16, {T, c_.hq, c_.d}, device_);
  a.k = view(k_.get(), FLAMIA_DTYPE_BF16, {T, c_.hkv, c_.d}, device_);
  a.v = view(v_.get(), FLAMIA_DTYPE_BF16, {T, c_.hkv, c_.d}, device_);
  a.cu_seqlens = view(cu_.get(), FLAMIA_DTYPE_INT32, {int64_t(c_.cu.size())}, device_);
  if (!c_.q_start.empty()) a.q_start = view(q_start_.get(), FLAMIA_DTYPE_INT32, {int64_t(c_.q_start.size())}, device_);
  a.max_seqlen = c_.max_seqlen();
  a.causal = c_.causal ? 1 : 0;
  a.softmax_scale = c_.resolved_scale();
  a.recipe = c_.recipe;
  a.stream = stream_;
  return a;
}

flamia_tensor GpuRunner::out_view() const {
  return view(out_.get(), FLAMIA_DTYPE_BF16, {c_.tokens(), c_.hq, c_.d}, device_);
}
flamia_tensor GpuRunner::lse_view() const {
  return view(lse_.get(), FLAMIA_DTYPE_FP32, {c_.hq, c_.tokens()}, device_);
}
flamia_tensor GpuRunner::dout_view() const {
  return view(dout_.get(), FLAMIA_DTYPE_BF16, {c_.tokens(), c_.hq, c_.d}, device_);
}
flamia_tensor GpuRunner::dq_view() const {
  return view(dq_.get(), FLAMIA_DTYPE_BF16, {c_.tokens(), c_.hq, c_.d}, device_);
}
flamia_tensor GpuRunner::dk_view() const {
  return view(dk_.get(), FLAMIA_DTYPE_BF16, {c_.tokens(), c_.hkv, c_.d}, device_);
}
flamia_tensor GpuRunner::dv_view() const {
  return view(dv_.get(), FLAMIA_DTYPE_BF16, {c_.tokens(), c_.hkv, c_.d}, device_);
}

static void h2d(const DeviceBuffer& dst, const std::vector<uint16_t>& src, cudaStream_t s) {
  check_cuda(cudaMemcpyAsync(dst.get(), src.data(), src.size() * 2, cudaMemcpyHostToDevice, s), "upload");
}

void GpuRunner::upload(const Inputs& in) {
  h2d(q_, in.q, stream_);
  h2d(k_, in.k, stream_);
  h2d(v_, in.v, stream_);
  h2d(dout_, in.dout, stream_);
  sync();  // the host vectors may go away right after
}

void GpuRunner::poison() {
  for (const DeviceBuffer* b : {&out_, &lse_, &qkv8_, &ws_}) {
    check_cuda(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), stream_), "poison");
  }
  poison_gradients();
}

void GpuRunner::poison_gradients() {
  for (const DeviceBuffer* b : {&dq_, &dk_, &dv_}) {
    check_cuda(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), stream_), "poison gradients");
  }
}

size_t GpuRunner::workspace_bytes_written_from(size_t offset) {
  if (offset >= ws_.bytes()) return 0;
  std::vector<uint8_t> tail(ws_.bytes() - offset);
  check_cuda(cudaMemcpyAsync(tail.data(), static_cast<const uint8_t*>(ws_.get()) + offset, tail.size(),
                             cudaMemcpyDeviceToHost, stream_),
             "download workspace");
  sync();
  return size_t(std::count_if(tail.begin(), tail.end(), [](uint8_t b) { return b != 0xFF; }));
}

void GpuRunner::sync() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

void GpuRunner::download_fwd(FwdResult* r) {
  const size_t T = size_t(c_.tokens());
  r->o.resize(T * c_.hq * c_.d);
  r->lse.resize(T * c_.hq);
  check_cuda(cudaMemcpyAsync(r->o.data(), out_.get(), r->o.size() * 2, cudaMemcpyDeviceToHost, stream_), "download o");
  check_cuda(cudaMemcpyAsync(r->lse.data(), lse_.get(), r->lse.size() * 4, cudaMemcpyDeviceToHost, stream_),
             "download lse");
  sync();
}

void GpuRunner::download_bwd(BwdResult* r) {
  const size_t T = size_t(c_.tokens());
  r->dq.resize(T * c_.hq * c_.d);
  r->dk.resize(T * c_.hkv * c_.d);
  r->dv.resize(T * c_.hkv * c_.d);
  check_cuda(cudaMemcpyAsync(r->dq.data(), dq_.get(), r->dq.size() * 2, cudaMemcpyDeviceToHost, stream_), "dq");
  check_cuda(cudaMemcpyAsync(r->dk.data(), dk_.get(), r->dk.size() * 2, cudaMemcpyDeviceToHost, stream_), "dk");
  check_cuda(cudaMemcpyAsync(r->dv.data(), dv_.get(), r->dv.size() * 2, cudaMemcpyDeviceToHost, stream_), "dv");
  sync();
}

flamia_status GpuRunner::step(const flamia_attention_args& a, const flamia_tensor& dout, bool backward,
                              FwdResult* fwd, BwdResult* bwd) {
  poison();
  flamia_status st = flamia_quantize_qkv(&a, qkv8_.get(), qkv8_.bytes(), 1);
  if (st == FLAMIA_SUCCESS) st = flamia_forward(&a, out_view(), lse_view(), qkv8_.get(), qkv8_.bytes(), 1);
  if (st == FLAMIA_SUCCESS && backward) {
    st = flamia_backward(&a, dout, out_view(), lse_view(), qkv8_.get(), qkv8_.bytes(), ws_.get(), ws_.bytes(),
                         dq_view(), dk_view(), dv_view());
  }
  check_cuda(cudaStreamSynchronize(stream_), "quantize/forward/backward");
  check_cuda(cudaGetLastError(), "quantize/forward/backward (last error)");
  if (st != FLAMIA_SUCCESS) return st;
  download_fwd(fwd);
  if (backward) download_bwd(bwd);
  return st;
}

flamia_status GpuRunner::backward_after_forward(BwdResult* bwd) {
  poison_gradients();
  check_cuda(cudaMemsetAsync(ws_.get(), 0xFF, ws_.bytes(), stream_), "poison workspace");
  const flamia_attention_args a = args();
  const flamia_status st = flamia_backward(&a, dout_view(), out_view(), lse_view(), qkv8_.get(), qkv8_.bytes(),
                                           ws_.get(), ws_.bytes(), dq_view(), dk_view(), dv_view());
  check_cuda(cudaStreamSynchronize(stream_), "backward");
  check_cuda(cudaGetLastError(), "backward (last error)");
  if (st == FLAMIA_SUCCESS) download_bwd(bwd);
  return st;
}

flamia_status GpuRunner::forward(const Inputs& in, FwdResult* out) {
  upload(in);
  return step(args(), dout_view(), false, out, nullptr);
}

flamia_status GpuRunner::forward_self_quantizing(const Inputs& in, FwdResult* out) {
  upload(in);
  poison();
  const flamia_attention_args a = args();
  const flamia_status st = flamia_forward(&a, out_view(), lse_view(), qkv8_.get(), qkv8_.bytes(), 0);
  check_cuda(cudaStreamSynchronize(stream_), "forward");
  check_cuda(cudaGetLastError(), "forward (last error)");
  if (st == FLAMIA_SUCCESS) download_fwd(out);
  return st;
}

flamia_status GpuRunner::forward_backward(const Inputs& in, FwdResult* fwd, BwdResult* bwd) {
  upload(in);
  return step(args(), dout_view(), true, fwd, bwd);
}

// ---------------------------------------------------------------------------------------
// CPU references
// ---------------------------------------------------------------------------------------

ref::Problem to_problem(const Case& c) {
  ref::Problem p;
  p.total_tokens = c.tokens();
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.head_dim = c.d;
  p.cu_seqlens = c.cu;
  p.q_start = c.q_start;
  p.causal = c.causal;
  p.softmax_scale = c.resolved_scale();
  return p;
}

ref::EmulationConfig spec_config(const Case& c) {
  ref::EmulationConfig cfg;
  cfg.recipe = c.recipe;
  cfg.scheme = ref::Scheme::PerToken;
  // The forward kernel selected for this process: its key tiles and its arithmetic.
  cfg.tiling.fwd_block_n = flamia::sm90::forward_block_n();
  const auto acc = flamia::sm90::forward_is_wgmma() ? ref::Accumulation::Wgmma : ref::Accumulation::Fp32;
  cfg.arith.s = acc;
  cfg.arith.pv = acc;
  // The fast forward takes P against the lazy reference and its scale from the keys' V
  // scales (§2); the reference kernels against the running maximum, and P's scale from the
  // maximum of p * sv (ALGORITHM.md §7: PRef::Running, TileMax).
  if (!flamia::sm90::forward_p_scale_from_keys()) {
    cfg.fwd.p_ref = ref::PRef::Running;
    cfg.fwd.p_scale = ref::PScale::TileMax;
  }
  return cfg;
}

namespace {

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads.
void parallel_for(int n, const std::function<void(int)>& fn) {
  const int workers = std::max(1, std::min<int>(n, int(std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

// One independent piece of a packed problem: document b, kv head g with its query heads.
// Longest documents first so that the threads finish together.
struct Piece {
  int doc, kv_head;
};
std::vector<Piece> pieces(const Case& c) {
  std::vector<Piece> out;
  for (int b = 0; b < c.num_docs(); ++b) {
    if (c.doc_len(b) == 0) continue;
    for (int g = 0; g < c.hkv; ++g) out.push_back({b, g});
  }
  std::stable_sort(out.begin(), out.end(),
                   [&](const Piece& a, const Piece& b) { return c.doc_len(a.doc) > c.doc_len(b.doc); });
  return out;
}

// Copy rows [t0, t0 + L) and heads [h0, h0 + nh) of x [T, H, D] into a dense [L, nh, D].
template <class T>
std::vector<T> gather(const std::vector<T>& x, int H, int D, int64_t t0, int64_t L, int h0, int nh) {
  std::vector<T> out(size_t(L) * nh * D);
  for (int64_t t = 0; t < L; ++t)
    for (int h = 0; h < nh; ++h)
      std::memcpy(&out[(size_t(t) * nh + h) * D], &x[(size_t(t0 + t) * H + h0 + h) * D], sizeof(T) * D);
  return out;
}
template <class T>
void scatter(const std::vector<T>& src, std::vector<T>& x, int H, int D, int64_t t0, int64_t L, int h0,
             int nh) {
  for (int64_t t = 0; t < L; ++t)
    for (int h = 0; h < nh; ++h)
      std::memcpy(&x[(size_t(t0 + t) * H + h0 + h) * D], &src[(size_t(t) * nh + h) * D], sizeof(T) * D);
}
// lse [H, T]: rows of heads [h0, h0 + nh), tokens [t0, t0 + L) <-> dense [nh, L].
template <class T>
std::vector<T> gather_lse(const std::vector<T>& x, int64_t Ttot, int64_t t0, int64_t L, int h0, int nh) {
  std::vector<T> out(size_t(L) * nh);
  for (int h = 0; h < nh; ++h)
    for (int64_t t = 0; t < L; ++t) out[size_t(h) * L + t] = x[size_t(h0 + h) * Ttot + t0 + t];
  return out;
}
template <class T>
void scatter_lse(const std::vector<T>& src, std::vector<T>& x, int64_t Ttot, int64_t t0, int64_t L, int h0,
                 int nh) {
  for (int h = 0; h < nh; ++h)
    for (int64_t t = 0; t < L; ++t) x[size_t(h0 + h) * Ttot + t0 + t] = src[size_t(h) * L + t];
}

// Document b alone, one kv head group.
ref::Problem sub_problem(const Case& c, int b) {
  ref::Problem p = to_problem(c);
  const int64_t L = c.doc_len(b);
  p.total_tokens = L;
  p.hq = c.hq / c.hkv;
  p.hkv = 1;
  p.cu_seqlens = {0, int32_t(L)};
  if (!c.q_start.empty()) p.q_start = {c.q_start[size_t(b)]};
  return p;
}

std::vector<double> to_double(const std::vector<uint16_t>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = double(f32(x[i]));
  return out;
}

}  // namespace

void spec_forward(const Case& c, const Inputs& in, FwdResult* out) {
  const int64_t T = c.tokens();
  const int G = c.hq / c.hkv, D = c.d;
  out->o.assign(size_t(T) * c.hq * D, 0);
  out->lse.assign(size_t(T) * c.hq, 0.0f);
  const auto cfg = spec_config(c);
  const auto work = pieces(c);
  parallel_for(int(work.size()), [&](int i) {
    const int b = work[i].doc, g = work[i].kv_head;
    const int64_t t0 = c.cu[b], L = c.doc_len(b);
    const auto p = sub_problem(c, b);
    const auto q = gather(in.q, c.hq, D, t0, L, g * G, G);
    const auto k = gather(in.k, c.hkv, D, t0, L, g, 1);
    const auto v = gather(in.v, c.hkv, D, t0, L, g, 1);
    std::vector<uint16_t> o(q.size());
    std::vector<float> lse(size_t(L) * G);
    ref::emulate_forward(p, cfg, q.data(), k.data(), v.data(), o.data(), lse.data());
    scatter(o, out->o, c.hq, D, t0, L, g * G, G);
    scatter_lse(lse, out->lse, T, t0, L, g * G, G);
  });
}

void spec_backward(const Case& c, const Inputs& in, const FwdResult& fwd, BwdResult* out) {
  const int64_t T = c.tokens();
  const int G = c.hq / c.hkv, D = c.d;
  out->dq.assign(size_t(T) * c.hq * D, 0);
  out->dk.assign(size_t(T) * c.hkv * D, 0);
  out->dv.assign(size_t(T) * c.hkv * D, 0);
  const auto cfg = spec_config(c);
  const auto work = pieces(c);
  parallel_for(int(work.size()), [&](int i) {
    const int b = work[i].doc, g = work[i].kv_head;
    const int64_t t0 = c.cu[b], L = c.doc_len(b);
    const auto p = sub_problem(c, b);
    const auto q = gather(in.q, c.hq, D, t0, L, g * G, G);
    const auto k = gather(in.k, c.hkv, D, t0, L, g, 1);
    const auto v = gather(in.v, c.hkv, D, t0, L, g, 1);
    const auto dout = gather(in.dout, c.hq, D, t0, L, g * G, G);
    const auto o = gather(fwd.o, c.hq, D, t0, L, g * G, G);
    const auto lse = gather_lse(fwd.lse, T, t0, L, g * G, G);
    std::vector<uint16_t> dq(q.size()), dk(k.size()), dv(v.size());
    ref::emulate_backward(p, cfg, q.data(), k.data(), v.data(), dout.data(), o.data(), lse.data(), dq.data(),
                          dk.data(), dv.data());
    scatter(dq, out->dq, c.hq, D, t0, L, g * G, G);
    scatter(dk, out->dk, c.hkv, D, t0, L, g, 1);
    scatter(dv, out->dv, c.hkv, D, t0, L, g, 1);
  });
}

void exact_forward_backward(const Case& c, const Inputs& in, ExactResult* out) {
  const int64_t T = c.tokens();
  const int G = c.hq / c.hkv, D = c.d;
  const auto q = to_double(in.q), k = to_double(in.k), v = to_double(in.v), dout = to_double(in.dout);
  out->o.assign(size_t(T) * c.hq * D, 0.0);
  out->lse.assign(size_t(T) * c.hq, 0.0);
  out->dq.assign(size_t(T) * c.hq * D, 0.0);
  out->dk.assign(size_t(T) * c.hkv * D, 0.0);
  out->dv.assign(size_t(T) * c.hkv * D, 0.0);
  const auto work = pieces(c);
  parallel_for(int(work.size()), [&](int i) {
    const int b = work[i].doc, g = work[i].kv_head;
    const int64_t t0 = c.cu[b], L = c.doc_len(b);
    const auto p = sub_problem(c, b);
    const auto qs = gather(q, c.hq, D, t0, L, g * G, G);
    const auto ks = gather(k, c.hkv, D, t0, L, g, 1);
    const auto vs = gather(v, c.hkv, D, t0, L, g, 1);
    const auto dos = gather(dout, c.hq, D, t0, L, g * G, G);
    std::vector<double> o(qs.size()), lse(size_t(L) * G), dq(qs.size()), dk(ks.size()), dv(vs.size());
    ref::exact_forward(p, qs.data(), ks.data(), vs.data(), o.data(), lse.data());
    ref::exact_backward(p, qs.data(), ks.data(), vs.data(), dos.data(), dq.data(), dk.data(), dv.data());
    scatter(o, out->o, c.hq, D, t0, L, g * G, G);
    scatter_lse(lse, out->lse, T, t0, L, g * G, G);
    scatter(dq, out->dq, c.hq, D, t0, L, g * G, G);
    scatter(dk, out->dk, c.hkv, D, t0, L, g, 1);
    scatter(dv, out->dv, c.hkv, D, t0, L, g, 1);
  });
}

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

template <class A, class B, class FA, class FB>
static double rel_l2_impl(const std::vector<A>& got, const std::vector<B>& want, FA fa, FB fb) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = fa(got[i]), w = fb(want[i]);
    num += (g - w) * (g - w);
    den += w * w;
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double rel_l2(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  auto cv = [](uint16_t b) { return double(f32(b)); };
  return rel_l2_impl(got, want, cv, cv);
}
double rel_l2(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  return rel_l2_impl(got, want, [](uint16_t b) { return double(f32(b)); }, [](double x) { return x; });
}
double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  return rel_l2_impl(got, want, [](float x) { return double(x); }, [](double x) { return x; });
}

std::string RowStats::summary() const {
  std::ostringstream o;
  o << "relL2 " << rel_l2 << ", rows over soft " << rows_over_soft << "/" << rows << ", worst hard ratio "
    << worst_row_ratio << ", bitwise-equal " << (elems ? 100.0 * double(elems_bitwise_equal) / double(elems) : 100.0)
    << "%";
  if (!worst_where.empty()) o << " [worst: " << worst_where << "]";
  return o.str();
}

RowStats compare_rows(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int heads,
                      int d, const std::vector<int32_t>& cu, const RowTol& tol,
                      const std::vector<double>* extra) {
  RowStats s;
  s.rel_l2 = rel_l2(got, want);
  if (got.size() != want.size()) {
    s.worst_row_ratio = INFINITY;
    s.worst_where = "size mismatch";
    return s;
  }
  const size_t nrows = want.size() / size_t(d);
  // The absolute terms scale with the tensor's RMS: they cover rows whose reference is near
  // zero (gradient rows where dP - D cancels), where FP32-order noise is large relative to
  // the row itself.
  double ss = 0;
  for (uint16_t w : want) ss += double(f32(w)) * f32(w);
  const double rms = want.empty() ? 0 : std::sqrt(ss / double(want.size()));
  s.rows = int64_t(nrows);
  for (size_t r = 0; r < nrows; ++r) {
    double err = 0, mx = 0;
    for (int i = 0; i < d; ++i) {
      const size_t e = r * d + i;
      const double g = f32(got[e]), w = f32(want[e]);
      if (std::isnan(g) != std::isnan(w)) err = INFINITY;
      else if (!std::isnan(g)) err = std::max(err, std::fabs(g - w));
      mx = std::max(mx, std::fabs(w));
      s.elems_bitwise_equal += got[e] == want[e];
      ++s.elems;
    }
    if (err > tol.rtol_soft * mx + tol.atol_soft * rms) ++s.rows_over_soft;
    const double allow = tol.rtol_hard * mx + tol.atol_hard * rms + (extra ? (*extra)[r] : 0.0) + 1e-30;
    const double ratio = err / allow;
    if (ratio > s.worst_row_ratio) {
      s.worst_row_ratio = ratio;
      const int64_t t = int64_t(r / size_t(heads));
      const int h = int(r % size_t(heads));
      const auto it = std::upper_bound(cu.begin(), cu.end(), int32_t(t));
      const int doc = int(it - cu.begin()) - 1;
      std::ostringstream w;
      w << "token " << t << " (doc " << doc << ", pos " << (t - cu[doc]) << ") head " << h << ": max|err| "
        << err << ", max|ref| " << mx << ", allowed " << allow;
      s.worst_where = w.str();
    }
  }
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

int64_t count_nonfinite(const std::vector<uint16_t>& x) {
  int64_t n = 0;
  for (uint16_t b : x) n += (b & 0x7f80u) == 0x7f80u;
  return n;
}
int64_t count_nonfinite(const std::vector<float>& x) {
  int64_t n = 0;
  for (float f : x) n += !std::isfinite(f);
  return n;
}
int64_t count_nonfinite_rows(const std::vector<uint16_t>& x, int heads, int d, int64_t t0, int64_t t1) {
  int64_t n = 0;
  const size_t row = size_t(heads) * d;
  for (size_t i = size_t(t0) * row; i < size_t(t1) * row; ++i) n += (x[i] & 0x7f80u) == 0x7f80u;
  return n;
}
int64_t count_nonfinite_lse(const std::vector<float>& lse, int64_t T, int hq, int64_t t0, int64_t t1) {
  int64_t n = 0;
  for (int h = 0; h < hq; ++h)
    for (int64_t t = t0; t < t1; ++t) n += !std::isfinite(lse[size_t(h) * T + t]);
  return n;
}

bool rows_equal(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int heads, int d, int64_t t0,
                int64_t t1) {
  if (a.size() != b.size() || t1 <= t0) return a.size() == b.size();
  const size_t row = size_t(heads) * d;
  return std::memcmp(a.data() + size_t(t0) * row, b.data() + size_t(t0) * row, size_t(t1 - t0) * row * 2) == 0;
}

bool lse_rows_equal(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int hq, int64_t t0,
                    int64_t t1) {
  if (a.size() != b.size() || t1 <= t0) return a.size() == b.size();
  for (int h = 0; h < hq; ++h) {
    if (std::memcmp(a.data() + size_t(h) * T + t0, b.data() + size_t(h) * T + t0, size_t(t1 - t0) * 4) != 0)
      return false;
  }
  return true;
}

}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
