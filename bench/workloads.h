// The benchmark workloads (../shared/WORKLOADS.md): packs of documents, heads, head dim.
//
// Long-tailed packs draw L = clamp(round(exp(N(6.8, 1.1^2))), 64, 16384) until the pack is
// full, the last document taking what is left. The draws reproduce Python's
// random.Random(seed).gauss exactly (MT19937 seeded by init_by_array, 53-bit random(),
// CPython's Box-Muller with its cached second value), so this benchmark and
// python/flamia/workloads.py build the same packs from the same seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace flamia_bench {

constexpr uint64_t kDefaultSeed = 20261130;  // = python/flamia/workloads.py DEFAULT_SEED

struct Workload {
  std::string name;
  int64_t total_tokens;
  int hq, hkv, head_dim;
  int doc_len;  // fixed-length pack; 0 = long-tailed lengths
  bool causal = true;
};

inline const std::vector<Workload>& all_workloads() {
  static const std::vector<Workload> w = {
      {"fixed-4k", 32768, 16, 16, 128, 4096},     {"fixed-8k", 32768, 16, 16, 128, 8192},
      {"fixed-16k", 32768, 16, 16, 128, 16384},   {"fixed-32k", 32768, 16, 16, 128, 32768},
      {"pack-32k", 32768, 16, 16, 128, 0},        {"pack-128k", 131072, 16, 16, 128, 0},
      {"llama8b-pack", 65536, 32, 8, 128, 0},     {"llama1b-pack", 65536, 32, 8, 64, 0},
  };
  return w;
}

// CPython's random.Random for an integer seed: MT19937 with init_by_array over the seed's
// 32-bit words, random() = 53-bit float from two draws, gauss() with a cached pair.
class PyRandom {
 public:
  explicit PyRandom(uint64_t seed) {
    std::vector<uint32_t> key;
    do {
      key.push_back(uint32_t(seed & 0xffffffffu));
      seed >>= 32;
    } while (seed != 0);
    init_by_array(key);
  }

  uint32_t next_u32() {
    if (mti_ >= kN) twist();
    uint32_t y = mt_[mti_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  double random() {
    const uint32_t a = next_u32() >> 5, b = next_u32() >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
  }

  double gauss(double mu, double sigma) {
    double z;
    if (has_next_) {
      z = next_;
      has_next_ = false;
    } else {
      const double x2pi = random() * 6.283185307179586;  // 2 pi, as CPython's TWOPI
      const double g2rad = std::sqrt(-2.0 * std::log(1.0 - random()));
      z = std::cos(x2pi) * g2rad;
      next_ = std::sin(x2pi) * g2rad;
      has_next_ = true;
    }
    return mu + z * sigma;
  }

 private:
  static constexpr int kN = 624, kM = 397;

  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + uint32_t(i);
    mti_ = kN;
  }

  void init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218u);
    int i = 1;
    size_t j = 0;
    for (int k = std::max<int>(kN, int(key.size())); k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
      ++i;
      ++j;
      if (i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
      if (j >= key.size()) j = 0;
    }
    for (int k = kN - 1; k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
      ++i;
      if (i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
    }
    mt_[0] = 0x80000000u;
    mti_ = kN;
  }

  void twist() {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % kN] & 0x7fffffffu);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    mti_ = 0;
  }

  uint32_t mt_[kN];
  int mti_ = kN + 1;
  bool has_next_ = false;
  double next_ = 0.0;
};

inline std::vector<int> long_tailed_lengths(int64_t total_tokens, uint64_t seed, double mu = 6.8,
                                            double sigma = 1.1, int lo = 64, int hi = 16384) {
  PyRandom rng(seed);
  std::vector<int> out;
  int64_t left = total_tokens;
  while (left > 0) {
    // std::nearbyint rounds half to even, as Python's round().
    const double drawn = std::nearbyint(std::exp(rng.gauss(mu, sigma)));
    int64_t n = std::min<int64_t>(std::max<int64_t>(int64_t(std::min(drawn, 1e18)), lo), hi);
    n = std::min(n, left);  // the last document takes what is left
    out.push_back(int(n));
    left -= n;
  }
  return out;
}

inline std::vector<int> doc_lengths(const Workload& w, uint64_t seed) {
  if (w.doc_len > 0) return std::vector<int>(size_t(w.total_tokens / w.doc_len), w.doc_len);
  return long_tailed_lengths(w.total_tokens, seed);
}

struct LengthSummary {
  int count = 0, min = 0, max = 0;
  double median = 0, mean = 0;
};

inline LengthSummary summarize(std::vector<int> lengths) {
  LengthSummary s;
  if (lengths.empty()) return s;
  std::sort(lengths.begin(), lengths.end());
  const size_t n = lengths.size();
  s.count = int(n);
  s.min = lengths.front();
  s.max = lengths.back();
  s.median = n % 2 ? lengths[n / 2] : 0.5 * (lengths[n / 2 - 1] + lengths[n / 2]);
  double sum = 0;
  for (int l : lengths) sum += l;
  s.mean = sum / double(n);
  return s;
}

// DESIGN §4: causal forward = 4 * D * Hq * sum L(L+1)/2 (non-causal: sum L^2); bwd = 2.5x.
inline double forward_flops(const std::vector<int>& lengths, int hq, int head_dim, bool causal) {
  double pairs = 0;
  for (int l : lengths) pairs += causal ? double(l) * (l + 1) / 2.0 : double(l) * l;
  return 4.0 * head_dim * hq * pairs;
}

}  // namespace flamia_bench
