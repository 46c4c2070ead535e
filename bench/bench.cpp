// flamia_bench: times the training step (quantize + forward + backward) of flamia's recipes
// on the workloads of ../shared/WORKLOADS.md, as DESIGN.md §4 counts it, and writes a table
// and a JSON record.
//
//   flamia_bench [--workloads a,b] [--recipes fp8,fp8_mixed] [--iters N] [--warmup N]
//                [--quick] [--json PATH] [--seed N] [--qkv8-extra-mib N] [--settle-ms N] [--list]
//
// Method (docs/PERFORMANCE.md): BF16 N(0,1) inputs, causal; CUDA events on one stream; the
// L2 cache is flushed (a 256 MiB memset) before every timed region so that inputs come from
// HBM; warm-up iterations, then the median of N. Phases: quantize (flamia_quantize_qkv, the
// fused q/k/v pass), forward (flamia_forward with qkv8_filled = 1), the quantizing forward
// (qkv8_filled = 0: quantization and forward in the one call a training step makes), backward
// (flamia_backward, which quantizes dO itself), and the step, timed separately as one region:
// the quantizing forward and the backward back to back (what a training step pays).
//
// Without an sm_90 GPU it says so and runs the CPU numerics study (flamia_numerics --quick, built
// next to this binary) instead, so that the project's main command is useful everywhere.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <stdexcept>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "flamia/flamia.h"
#include "workloads.h"

#if defined(FLAMIA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace flamia_bench {
namespace {

struct Options {
  std::vector<std::string> workloads;  // empty: all
  std::vector<flamia_recipe> recipes = {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED};
  int iters = 20;
  int warmup = 3;
  bool quick = false;
  bool iters_given = false;
  std::string json = "bench_results.json";
  uint64_t seed = kDefaultSeed;
  int qkv8_extra_mib = 0;  // allocated past what flamia_qkv8_bytes asks, never touched
  int settle_ms = 0;       // idle time before each timed region (after its L2 flush)
  bool list = false;
};

[[maybe_unused]] const char* recipe_name(flamia_recipe r) { return r == FLAMIA_RECIPE_FP8 ? "fp8" : "fp8_mixed"; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

void usage() {
  std::printf(
      "usage: flamia_bench [--workloads a,b] [--recipes fp8,fp8_mixed] [--iters N] [--warmup N]\n"
      "                    [--quick] [--json PATH] [--seed N] [--qkv8-extra-mib N] [--settle-ms N]\n"
      "                    [--list]\n"
      "  --workloads  comma-separated names (default: all; --list shows them)\n"
      "  --iters      timed iterations per phase, median reported (default 20; --quick: 5)\n"
      "  --warmup     untimed iterations first (default 3; --quick: 1)\n"
      "  --quick      fewer iterations, and pack-128k skipped unless named\n"
      "  --json       where to write the results (default bench_results.json)\n"
      "  --seed       seed of the long-tailed document lengths (default %llu)\n"
      "  --qkv8-extra-mib  allocate the qkv8 buffer N MiB larger than needed, the extra never\n"
      "               touched: how the buffer's size moves the kernels' times (default 0)\n"
      "  --settle-ms  let the GPU idle N ms before each timed region, so that a region's clocks\n"
      "               do not depend on how much power the work before it drew (default 0)\n",
      (unsigned long long)kDefaultSeed);
}

// Returns false (after printing why) on a bad command line.
bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flamia_bench: %s needs a value\n", flag);
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--workloads") {
      const char* v = value("--workloads");
      if (!v) return false;
      o->workloads = split(v, ',');
    } else if (a == "--recipes") {
      const char* v = value("--recipes");
      if (!v) return false;
      o->recipes.clear();
      for (const auto& r : split(v, ',')) {
        if (r == "fp8") o->recipes.push_back(FLAMIA_RECIPE_FP8);
        else if (r == "fp8_mixed") o->recipes.push_back(FLAMIA_RECIPE_FP8_MIXED);
        else {
          std::fprintf(stderr, "flamia_bench: unknown recipe '%s' (fp8, fp8_mixed)\n", r.c_str());
          return false;
        }
      }
    } else if (a == "--iters") {
      const char* v = value("--iters");
      if (!v) return false;
      o->iters = std::max(1, std::atoi(v));
      o->iters_given = true;
    } else if (a == "--warmup") {
      const char* v = value("--warmup");
      if (!v) return false;
      o->warmup = std::max(0, std::atoi(v));
    } else if (a == "--quick") {
      o->quick = true;
    } else if (a == "--json") {
      const char* v = value("--json");
      if (!v) return false;
      o->json = v;
    } else if (a == "--seed") {
      const char* v = value("--seed");
      if (!v) return false;
      o->seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--qkv8-extra-mib") {
      const char* v = value("--qkv8-extra-mib");
      if (!v) return false;
      o->qkv8_extra_mib = std::max(0, std::atoi(v));
    } else if (a == "--settle-ms") {
      const char* v = value("--settle-ms");
      if (!v) return false;
      o->settle_ms = std::max(0, std::atoi(v));
    } else if (a == "--list") {
      o->list = true;
    } else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "flamia_bench: unknown argument '%s'\n", a.c_str());
      usage();
      return false;
    }
  }
  if (o->quick) {
    if (!o->iters_given) o->iters = 5;
    o->warmup = std::min(o->warmup, 1);
  }
  for (const auto& n : o->workloads) {
    bool found = false;
    for (const auto& w : all_workloads()) found |= w.name == n;
    if (!found) {
      std::fprintf(stderr, "flamia_bench: unknown workload '%s' (--list shows them)\n", n.c_str());
      return false;
    }
  }
  return true;
}

[[maybe_unused]] std::vector<Workload> selected(const Options& o) {
  std::vector<Workload> out;
  for (const auto& w : all_workloads()) {
    const bool named = std::find(o.workloads.begin(), o.workloads.end(), w.name) != o.workloads.end();
    if (!o.workloads.empty() && !named) continue;
    if (o.workloads.empty() && o.quick && w.name == "pack-128k") continue;
    out.push_back(w);
  }
  return out;
}

std::string lengths_line(const Workload& w, const std::vector<int>& lengths, uint64_t seed) {
  const LengthSummary s = summarize(lengths);
  char buf[256];
  if (w.doc_len > 0) {
    std::snprintf(buf, sizeof buf, "%d x %d", s.count, w.doc_len);
  } else {
    std::snprintf(buf, sizeof buf, "long-tailed, seed %llu: %d docs, min %d, median %.1f, mean %.1f, max %d",
                  (unsigned long long)seed, s.count, s.min, s.median, s.mean, s.max);
  }
  return buf;
}

void list_workloads(const Options& o) {
  for (const auto& w : all_workloads()) {
    const auto l = doc_lengths(w, o.seed);
    std::printf("%-13s T=%-7lld Hq/Hkv=%d/%d D=%d  %s\n", w.name.c_str(), (long long)w.total_tokens, w.hq, w.hkv,
                w.head_dim, lengths_line(w, l, o.seed).c_str());
  }
}

// ---- no GPU: the CPU numerics study ----------------------------------------------------------

int run_numerics_instead(char** argv) {
  std::printf("no sm_90 GPU found: running the CPU numerics study instead, its quick form (%s; "
              "build/flamia_numerics without --quick runs the full study, ~11 minutes on two cores)\n",
              flamia_version_string());
  std::fflush(stdout);
  // flamia_numerics is built next to this binary.
  std::string self;
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    self = buf;
  } else {
    self = argv[0];
  }
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  const std::string numerics = dir + "/flamia_numerics";
  char quick[] = "--quick";
  char* args[] = {const_cast<char*>(numerics.c_str()), quick, nullptr};
  execv(numerics.c_str(), args);
  std::fprintf(stderr, "flamia_bench: could not run %s: %s\n", numerics.c_str(), std::strerror(errno));
  return 1;
}

// ---- JSON ---------------------------------------------------------------------------------

[[maybe_unused]] std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

[[maybe_unused]] std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

[[maybe_unused]] std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

#if defined(FLAMIA_WITH_CUDA)

// ---- GPU benchmark ------------------------------------------------------------------------

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  Buffer() = default;
  explicit Buffer(size_t n) : bytes(n) { ck(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc"); }
  ~Buffer() {
    if (p) cudaFree(p);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

flamia_tensor view3(void* p, flamia_dtype dt, int64_t a, int64_t b, int64_t c, int dev) {
  flamia_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = 3;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  t.strides[0] = b * c;
  t.strides[1] = c;
  t.strides[2] = 1;
  t.device = dev;
  return t;
}
flamia_tensor view2(void* p, flamia_dtype dt, int64_t a, int64_t b, int dev) {
  flamia_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = 2;
  t.shape[0] = a;
  t.shape[1] = b;
  t.strides[0] = b;
  t.strides[1] = 1;
  t.device = dev;
  return t;
}
flamia_tensor view1(void* p, flamia_dtype dt, int64_t a, int dev) {
  flamia_tensor t{};
  t.data = p;
  t.dtype = dt;
  t.ndim = 1;
  t.shape[0] = a;
  t.strides[0] = 1;
  t.device = dev;
  return t;
}

// Random N(0,1) BF16 values, never zero, copied into device tensors from one host pool at
// varying offsets (generating 10^9 normals on the host would take longer than the benchmark;
// the kernels' speed does not depend on which normal values they see).
class RandomFill {
 public:
  explicit RandomFill(uint64_t seed) : pool_(kPool + kSlack) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : pool_) {
      float f = nd(rng);
      if (f == 0.0f) f = 0.5f;
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
      if ((x & 0x7fffu) == 0) x = 0x3f00;                      // a normal that rounded to 0
    }
  }
  void fill(void* dst, size_t elems, cudaStream_t s) {
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t done = 0; done < elems;) {
      const size_t n = std::min(kPool, elems - done);
      const size_t off = (calls_++ * 7919u) % kSlack;
      ck(cudaMemcpyAsync(d + done, pool_.data() + off, n * 2, cudaMemcpyHostToDevice, s), "fill");
      done += n;
    }
    ck(cudaStreamSynchronize(s), "fill sync");
  }

 private:
  static constexpr size_t kPool = size_t(1) << 24, kSlack = 65521;
  std::vector<uint16_t> pool_;
  size_t calls_ = 0;
};

struct Timing {
  // median ms: quant = flamia_quantize_qkv, fwd = flamia_forward on the filled qkv8 (the
  // kernel), fwdq = flamia_forward quantizing itself (the call a training step makes),
  // step = fwdq + bwd.
  double quant = NAN, fwd = NAN, fwdq = NAN, bwd = NAN, step = NAN;
};

struct Record {
  Workload w;
  std::vector<int> lengths;
  flamia_recipe recipe;
  std::string error;  // empty on success
  Timing t;
  double fwd_flops = 0;
  size_t quant_bytes = 0;
  size_t qkv8_bytes = 0, bwd_workspace_bytes = 0;  // what flamia asked for (the stored dS's slab included)
  bool finite = true;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class Bench {
 public:
  Bench(const Options& o) : o_(o), fill_(o.seed ^ 0x5eedull) {
    ck(cudaGetDevice(&dev_), "cudaGetDevice");
    ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    flush_ = std::make_unique<Buffer>(size_t(256) << 20);  // > 5x the H200's 50 MB L2
    for (auto& e : ev_) ck(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Bench() {
    for (auto& e : ev_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  // Device-to-device copy bandwidth: bytes read + bytes written per second (GB/s = 1e9).
  double copy_bandwidth() {
    const size_t bytes = size_t(1) << 30;
    Buffer a(bytes), b(bytes);
    ck(cudaMemsetAsync(a.p, 1, bytes, stream_), "memset");
    std::vector<double> ms;
    for (int i = 0; i < 12; ++i) {
      ck(cudaEventRecord(ev_[0], stream_), "event");
      ck(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
      ck(cudaEventRecord(ev_[1], stream_), "event");
      ck(cudaEventSynchronize(ev_[1]), "sync");
      float t = 0;
      ck(cudaEventElapsedTime(&t, ev_[0], ev_[1]), "elapsed");
      if (i >= 2) ms.push_back(t);
    }
    return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
  }

  std::vector<Record> run(const Workload& w) {
    const auto lengths = doc_lengths(w, o_.seed);
    const int64_t T = w.total_tokens;
    std::vector<int32_t> cu(1, 0);
    for (int l : lengths) cu.push_back(cu.back() + l);
    const int max_len = *std::max_element(lengths.begin(), lengths.end());
    const int B = int(lengths.size());

    const size_t q_elems = size_t(T) * w.hq * w.head_dim, kv_elems = size_t(T) * w.hkv * w.head_dim;
    Buffer q(q_elems * 2), k(kv_elems * 2), v(kv_elems * 2), dout(q_elems * 2), out(q_elems * 2),
        lse(size_t(T) * w.hq * 4), dq(q_elems * 2), dk(kv_elems * 2), dv(kv_elems * 2), cu_d(cu.size() * 4);
    fill_.fill(q.p, q_elems, stream_);
    fill_.fill(k.p, kv_elems, stream_);
    fill_.fill(v.p, kv_elems, stream_);
    fill_.fill(dout.p, q_elems, stream_);
    ck(cudaMemcpy(cu_d.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), "cu_seqlens");

    std::vector<Record> records;
    for (flamia_recipe recipe : o_.recipes) {
      Record r{w, lengths, recipe, "", {}, forward_flops(lengths, w.hq, w.head_dim, w.causal), 0, true};
      const size_t qkv8_bytes = flamia_qkv8_bytes(T, B, w.hq, w.hkv, w.head_dim, recipe, 1);
      if (qkv8_bytes == 0) {
        r.error = std::string("flamia_qkv8_bytes: ") + flamia_last_error();
        records.push_back(r);
        continue;
      }
      // Bytes the quantizer moves at least once: BF16 q, k, v read, and the qkv8 buffer it
      // fills (every FP8 layout the kernels read, plus the per-token scales).
      r.quant_bytes = 2 * (q_elems + 2 * kv_elems) + qkv8_bytes;
      r.qkv8_bytes = qkv8_bytes;
      // The call is told the exact size; the allocation may be larger (--qkv8-extra-mib).
      Buffer qkv8_alloc(qkv8_bytes + (size_t(o_.qkv8_extra_mib) << 20));
      struct {
        void* p;
        size_t bytes;
      } qkv8{qkv8_alloc.p, qkv8_bytes};

      flamia_attention_args a{};
      a.q = view3(q.p, FLAMIA_DTYPE_BF16, T, w.hq, w.head_dim, dev_);
      a.k = view3(k.p, FLAMIA_DTYPE_BF16, T, w.hkv, w.head_dim, dev_);
      a.v = view3(v.p, FLAMIA_DTYPE_BF16, T, w.hkv, w.head_dim, dev_);
      a.cu_seqlens = view1(cu_d.p, FLAMIA_DTYPE_INT32, int64_t(cu.size()), dev_);
      a.max_seqlen = max_len;
      a.causal = w.causal ? 1 : 0;
      a.softmax_scale = 0.0f;
      a.recipe = recipe;
      a.stream = stream_;
      // Sized for the call: FLAMIA_BWD_DQ=hbm's stored dS depends on max_seqlen and causal.
      Buffer ws(flamia_backward_workspace_bytes_for(&a));
      r.bwd_workspace_bytes = ws.bytes;
      const flamia_tensor t_out = view3(out.p, FLAMIA_DTYPE_BF16, T, w.hq, w.head_dim, dev_);
      const flamia_tensor t_lse = view2(lse.p, FLAMIA_DTYPE_FP32, w.hq, T, dev_);
      const flamia_tensor t_dout = view3(dout.p, FLAMIA_DTYPE_BF16, T, w.hq, w.head_dim, dev_);
      const flamia_tensor t_dq = view3(dq.p, FLAMIA_DTYPE_BF16, T, w.hq, w.head_dim, dev_);
      const flamia_tensor t_dk = view3(dk.p, FLAMIA_DTYPE_BF16, T, w.hkv, w.head_dim, dev_);
      const flamia_tensor t_dv = view3(dv.p, FLAMIA_DTYPE_BF16, T, w.hkv, w.head_dim, dev_);

      auto quant = [&] { return flamia_quantize_qkv(&a, qkv8.p, qkv8.bytes, 1); };
      auto fwd = [&] { return flamia_forward(&a, t_out, t_lse, qkv8.p, qkv8.bytes, 1); };
      auto fwdq = [&] { return flamia_forward(&a, t_out, t_lse, qkv8.p, qkv8.bytes, 0); };
      auto bwd = [&] {
        return flamia_backward(&a, t_dout, t_out, t_lse, qkv8.p, qkv8.bytes, ws.p, ws.bytes, t_dq, t_dk, t_dv);
      };
      auto call = [&](flamia_status st, const char* what) {
        if (st != FLAMIA_SUCCESS && r.error.empty()) r.error = std::string(what) + ": " + flamia_last_error();
        return st == FLAMIA_SUCCESS;
      };

      std::vector<double> tq, tf, tfq, tb, ts;
      for (int it = 0; it < o_.warmup + o_.iters && r.error.empty(); ++it) {
        // Phases one by one, each starting with a cold L2 ...
        flush();
        rec(0);
        if (!call(quant(), "flamia_quantize_qkv")) break;
        rec(1);
        flush();
        rec(2);
        if (!call(fwd(), "flamia_forward")) break;
        rec(3);
        flush();
        rec(4);
        if (!call(bwd(), "flamia_backward")) break;
        rec(5);
        flush();
        rec(8);
        if (!call(fwdq(), "flamia_forward (quantizing)")) break;
        rec(9);
        // ... and the step as one region.
        flush();
        rec(6);
        if (!call(fwdq(), "flamia_forward (quantizing)") || !call(bwd(), "flamia_backward")) break;
        rec(7);
        ck(cudaEventSynchronize(ev_[7]), "cudaEventSynchronize");
        if (it >= o_.warmup) {
          tq.push_back(elapsed(0, 1));
          tf.push_back(elapsed(2, 3));
          tfq.push_back(elapsed(8, 9));
          tb.push_back(elapsed(4, 5));
          ts.push_back(elapsed(6, 7));
        }
      }
      ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      if (r.error.empty()) {
        r.t = {median(tq), median(tf), median(tfq), median(tb), median(ts)};
        r.finite = all_finite(out.p, q_elems) && all_finite(dq.p, q_elems) && all_finite(dk.p, kv_elems) &&
                   all_finite(dv.p, kv_elems);
      }
      records.push_back(r);
    }
    return records;
  }

 private:
  void flush() {
    // A different byte each time, so no layer can skip the write as redundant.
    ck(cudaMemsetAsync(flush_->p, int(flushes_++ & 0xff), flush_->bytes, stream_), "L2 flush");
    if (o_.settle_ms > 0) {
      ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.settle_ms));
    }
  }
  void rec(int i) { ck(cudaEventRecord(ev_[i], stream_), "cudaEventRecord"); }
  double elapsed(int a, int b) {
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, ev_[a], ev_[b]), "cudaEventElapsedTime");
    return ms;
  }
  // Sanity check of the last step's outputs (random inputs give finite outputs).
  bool all_finite(const void* p, size_t elems) {
    std::vector<uint16_t> h(elems);
    ck(cudaMemcpy(h.data(), p, elems * 2, cudaMemcpyDeviceToHost), "download");
    for (uint16_t b : h)
      if ((b & 0x7f80u) == 0x7f80u) return false;
    return true;
  }

  const Options& o_;
  RandomFill fill_;
  int dev_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Buffer> flush_;
  cudaEvent_t ev_[10] = {};
  size_t flushes_ = 0;
};

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

void print_table(const std::vector<Record>& rs, double copy_gbs) {
  std::printf("\n%-13s %-9s %5s %7s | %8s %8s %8s %8s | %7s %7s %7s %7s | %8s\n", "workload", "recipe", "docs",
              "T", "quant", "fwd", "bwd", "step", "fwd", "bwd", "f+b", "step", "quant");
  std::printf("%-13s %-9s %5s %7s | %8s %8s %8s %8s | %7s %7s %7s %7s | %8s\n", "", "", "", "", "ms", "ms", "ms",
              "ms", "TFLOPS", "TFLOPS", "TFLOPS", "TFLOPS", "GB/s");
  std::printf("%s\n", std::string(131, '-').c_str());
  for (const auto& r : rs) {
    if (!r.error.empty()) {
      std::printf("%-13s %-9s %5zu %7lld | ERROR: %s\n", r.w.name.c_str(), recipe_name(r.recipe), r.lengths.size(),
                  (long long)r.w.total_tokens, r.error.c_str());
      continue;
    }
    const double F = r.fwd_flops;
    std::printf("%-13s %-9s %5zu %7lld | %8.3f %8.3f %8.3f %8.3f | %7.1f %7.1f %7.1f %7.1f | %8.0f%s\n",
                r.w.name.c_str(), recipe_name(r.recipe), r.lengths.size(), (long long)r.w.total_tokens, r.t.quant,
                r.t.fwd, r.t.bwd, r.t.step, tflops(F, r.t.fwd), tflops(2.5 * F, r.t.bwd),
                tflops(3.5 * F, r.t.fwd + r.t.bwd), tflops(3.5 * F, r.t.step),
                double(r.quant_bytes) / (r.t.quant * 1e-3) / 1e9, r.finite ? "" : "  NON-FINITE OUTPUT");
  }
  std::printf(
      "\nFLOPs (DESIGN §4): fwd = 4*D*Hq*sum L(L+1)/2 (causal), bwd = 2.5x fwd; f+b = fwd and bwd times only;\n"
      "step = quantizing fwd + bwd timed as one region (the headline). quant GB/s counts BF16 q,k,v read once\n"
      "plus the qkv8 buffer (flamia_qkv8_bytes, for_backward=1) written once; device copy (D2D, read+write): "
      "%.0f GB/s.\n",
      copy_gbs);
}

bool write_json(const std::string& path, const Options& o, const std::vector<Record>& rs, double copy_gbs) {
  cudaDeviceProp prop{};
  int dev = 0, rt = 0, drv = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::ostringstream j;
  j << "{\n";
  j << "  \"tool\": \"flamia_bench\",\n";
  j << "  \"flamia\": " << json_str(flamia_version_string()) << ",\n";
  j << "  \"date\": " << json_str(utc_now()) << ",\n";
  j << "  \"device\": " << json_str(prop.name) << ",\n";
  j << "  \"sm_count\": " << prop.multiProcessorCount << ",\n";
  j << "  \"cuda_runtime\": " << json_str(std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10))
    << ",\n";
  j << "  \"cuda_driver\": " << json_str(std::to_string(drv / 1000) + "." + std::to_string((drv % 1000) / 10))
    << ",\n";
  j << "  \"method\": {\"iters\": " << o.iters << ", \"warmup\": " << o.warmup
    << ", \"statistic\": \"median\", \"l2_flush_bytes\": " << (256 << 20)
    << ", \"inputs\": \"bf16 N(0,1)\", \"flops\": \"fwd = 4*D*Hq*sum L(L+1)/2 causal; bwd = 2.5*fwd\""
    << ", \"qkv8_extra_mib\": " << o.qkv8_extra_mib << ", \"settle_ms\": " << o.settle_ms << "},\n";
  j << "  \"length_seed\": " << o.seed << ",\n";
  j << "  \"device_copy_gbs\": " << json_num(copy_gbs) << ",\n";
  j << "  \"records\": [";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Record& r = rs[i];
    const LengthSummary s = summarize(r.lengths);
    const double F = r.fwd_flops;
    j << (i ? ",\n" : "\n") << "    {";
    j << "\"workload\": " << json_str(r.w.name) << ", \"recipe\": " << json_str(recipe_name(r.recipe));
    j << ", \"total_tokens\": " << r.w.total_tokens << ", \"hq\": " << r.w.hq << ", \"hkv\": " << r.w.hkv
      << ", \"head_dim\": " << r.w.head_dim << ", \"causal\": " << (r.w.causal ? "true" : "false");
    j << ", \"docs\": " << s.count << ", \"len_min\": " << s.min << ", \"len_median\": " << json_num(s.median)
      << ", \"len_max\": " << s.max << ", \"seed\": " << (r.w.doc_len > 0 ? std::string("null") : std::to_string(o.seed));
    j << ", \"fwd_flops\": " << json_num(F);
    if (!r.error.empty()) {
      j << ", \"error\": " << json_str(r.error) << "}";
      continue;
    }
    j << ", \"ms\": {\"quant\": " << json_num(r.t.quant) << ", \"fwd\": " << json_num(r.t.fwd)
      << ", \"fwdq\": " << json_num(r.t.fwdq)
      << ", \"bwd\": " << json_num(r.t.bwd) << ", \"step\": " << json_num(r.t.step) << "}";
    j << ", \"tflops\": {\"fwd\": " << json_num(tflops(F, r.t.fwd)) << ", \"bwd\": " << json_num(tflops(2.5 * F, r.t.bwd))
      << ", \"fwd_bwd\": " << json_num(tflops(3.5 * F, r.t.fwd + r.t.bwd))
      << ", \"step\": " << json_num(tflops(3.5 * F, r.t.step)) << "}";
    j << ", \"quant_bytes\": " << r.quant_bytes
      << ", \"quant_gbs\": " << json_num(double(r.quant_bytes) / (r.t.quant * 1e-3) / 1e9);
    j << ", \"qkv8_bytes\": " << r.qkv8_bytes << ", \"bwd_workspace_bytes\": " << r.bwd_workspace_bytes;
    j << ", \"outputs_finite\": " << (r.finite ? "true" : "false") << "}";
  }
  j << "\n  ]\n}\n";
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "flamia_bench: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  const std::string s = j.str();
  std::fwrite(s.data(), 1, s.size(), f);
  std::fclose(f);
  std::printf("results written to %s\n", path.c_str());
  return true;
}

int run_gpu(const Options& o) {
  cudaDeviceProp prop{};
  int dev = 0, rt = 0, drv = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::printf("%s on %s (%d SMs, %.0f GiB), CUDA runtime %d.%d, driver %d.%d; %s\n", flamia_version_string(),
              prop.name, prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30), rt / 1000,
              (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10, utc_now().c_str());
  std::printf("iterations: %d timed (median) after %d warm-up; L2 flushed before each timed region\n", o.iters,
              o.warmup);

  Bench bench(o);
  const double copy_gbs = bench.copy_bandwidth();
  std::printf("device copy bandwidth (cudaMemcpyAsync D2D, 1 GiB, read + write): %.0f GB/s\n", copy_gbs);

  std::vector<Record> all;
  bool failed = false;
  for (const auto& w : selected(o)) {
    const auto lengths = doc_lengths(w, o.seed);
    std::printf("\n%s: T=%lld, Hq/Hkv=%d/%d, D=%d, %s, %s\n", w.name.c_str(), (long long)w.total_tokens, w.hq,
                w.hkv, w.head_dim, w.causal ? "causal" : "non-causal", lengths_line(w, lengths, o.seed).c_str());
    std::fflush(stdout);
    std::vector<Record> rs;
    try {
      rs = bench.run(w);
    } catch (const CudaError& e) {
      // A CUDA failure may leave the context unusable: report and stop.
      std::fprintf(stderr, "flamia_bench: %s: %s\n", w.name.c_str(), e.what());
      failed = true;
      break;
    }
    for (const auto& r : rs) {
      if (!r.error.empty()) {
        std::printf("  %-9s ERROR: %s\n", recipe_name(r.recipe), r.error.c_str());
        failed = true;
      } else {
        std::printf("  %-9s quant %.3f ms, fwd %.3f ms (%.1f TFLOPS), quantizing fwd %.3f ms, bwd %.3f ms "
                    "(%.1f TFLOPS), step %.3f ms (%.1f TFLOPS)%s\n",
                    recipe_name(r.recipe), r.t.quant, r.t.fwd, tflops(r.fwd_flops, r.t.fwd), r.t.fwdq, r.t.bwd,
                    tflops(2.5 * r.fwd_flops, r.t.bwd), r.t.step, tflops(3.5 * r.fwd_flops, r.t.step),
                    r.finite ? "" : "  NON-FINITE OUTPUT");
        failed |= !r.finite;
      }
      std::fflush(stdout);
      all.push_back(r);
    }
  }
  print_table(all, copy_gbs);
  if (!write_json(o.json, o, all, copy_gbs)) failed = true;
  return failed ? 1 : 0;
}

#endif  // FLAMIA_WITH_CUDA

}  // namespace
}  // namespace flamia_bench

int main(int argc, char** argv) {
  using namespace flamia_bench;
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.list) {
    list_workloads(o);
    return 0;
  }
  if (flamia_gpu_available() == 0) return run_numerics_instead(argv);
#if defined(FLAMIA_WITH_CUDA)
  try {
    return run_gpu(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flamia_bench: %s\n", e.what());
    return 1;
  }
#else
  return run_numerics_instead(argv);
#endif
}
