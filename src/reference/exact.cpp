// Exact attention in float64: the yardstick every quantized result is measured against.
// Plain softmax attention per (document, query head), with GQA (query head h reads kv head
// h / (Hq/Hkv)) and dK/dV summed over the query heads of a group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/reference.h"

namespace flamia {
namespace ref {
namespace {

struct Layout {
  int64_t T;
  int hq, hkv, D;
  size_t q(int64_t t, int h) const { return (size_t(t) * hq + h) * D; }
  size_t kv(int64_t t, int h) const { return (size_t(t) * hkv + h) * D; }
};

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

int visible_end(int i, int L, bool causal) { return causal ? i + 1 : L; }

// Softmax probabilities of query row i (token base + i, head h) over its visible keys;
// returns the log-sum-exp of the scaled logits.
double softmax_row(const Problem& p, const Layout& lay, const double* q, const double* k,
                   int64_t base, int L, int i, int h, int kvh, std::vector<double>& prob) {
  const int jend = visible_end(i, L, p.causal);
  const double scale = double(p.softmax_scale);
  double m = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < jend; ++j) {
    prob[j] = scale * dot(q + lay.q(base + i, h), k + lay.kv(base + j, kvh), lay.D);
    m = std::max(m, prob[j]);
  }
  double l = 0.0;
  for (int j = 0; j < jend; ++j) {
    prob[j] = std::exp(prob[j] - m);
    l += prob[j];
  }
  for (int j = 0; j < jend; ++j) prob[j] /= l;
  return m + std::log(l);
}

}  // namespace

namespace {

void forward(const Problem& p, const double* q, const double* k, const double* v,
             const std::vector<char>* rows, double* out, double* lse) {
  const Layout lay{p.total_tokens, p.hq, p.hkv, p.head_dim};
  const int D = p.head_dim, group = p.hq / p.hkv;
  for (int b = 0; b < p.num_docs(); ++b) {
    const int64_t base = p.cu_seqlens[b];
    const int L = int(p.cu_seqlens[b + 1] - base);
    std::vector<double> prob(std::max(L, 1));
    for (int h = 0; h < p.hq; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < L; ++i) {
        if (rows && !(*rows)[size_t(base + i)]) continue;
        std::fill(out + lay.q(base + i, h), out + lay.q(base + i, h) + D, 0.0);
        lse[size_t(h) * p.total_tokens + base + i] =
            softmax_row(p, lay, q, k, base, L, i, h, kvh, prob);
        double* o = out + lay.q(base + i, h);
        for (int j = 0; j < visible_end(i, L, p.causal); ++j) {
          const double* vj = v + lay.kv(base + j, kvh);
          for (int d = 0; d < D; ++d) o[d] += prob[j] * vj[d];
        }
      }
    }
  }
}

}  // namespace

void exact_forward(const Problem& p, const double* q, const double* k, const double* v,
                   double* out, double* lse) {
  std::fill(out, out + size_t(p.total_tokens) * p.hq * p.head_dim, 0.0);
  std::fill(lse, lse + size_t(p.total_tokens) * p.hq, 0.0);
  forward(p, q, k, v, nullptr, out, lse);
}

void exact_forward_rows(const Problem& p, const double* q, const double* k, const double* v,
                        const std::vector<char>& rows, double* out, double* lse) {
  forward(p, q, k, v, &rows, out, lse);
}

// Gradients of sum(out * dout): with P the softmax, dV = P^T dO, dP = dO V^T,
// dS = P o (dP - rowsum(P o dP)), dQ = scale * dS K, dK = scale * dS^T Q.
void exact_backward(const Problem& p, const double* q, const double* k, const double* v,
                    const double* dout, double* dq, double* dk, double* dv) {
  const Layout lay{p.total_tokens, p.hq, p.hkv, p.head_dim};
  const int D = p.head_dim, group = p.hq / p.hkv;
  const double scale = double(p.softmax_scale);
  std::fill(dq, dq + size_t(p.total_tokens) * p.hq * D, 0.0);
  std::fill(dk, dk + size_t(p.total_tokens) * p.hkv * D, 0.0);
  std::fill(dv, dv + size_t(p.total_tokens) * p.hkv * D, 0.0);
  for (int b = 0; b < p.num_docs(); ++b) {
    const int64_t base = p.cu_seqlens[b];
    const int L = int(p.cu_seqlens[b + 1] - base);
    std::vector<double> prob(std::max(L, 1)), dp(std::max(L, 1));
    for (int h = 0; h < p.hq; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < L; ++i) {
        softmax_row(p, lay, q, k, base, L, i, h, kvh, prob);
        const int jend = visible_end(i, L, p.causal);
        const double* doi = dout + lay.q(base + i, h);
        double Di = 0.0;
        for (int j = 0; j < jend; ++j) {
          dp[j] = dot(doi, v + lay.kv(base + j, kvh), D);
          Di += prob[j] * dp[j];
        }
        const double* qi = q + lay.q(base + i, h);
        double* dqi = dq + lay.q(base + i, h);
        for (int j = 0; j < jend; ++j) {
          const double ds = prob[j] * (dp[j] - Di);
          const double* kj = k + lay.kv(base + j, kvh);
          double* dkj = dk + lay.kv(base + j, kvh);
          double* dvj = dv + lay.kv(base + j, kvh);
          for (int d = 0; d < D; ++d) {
            dqi[d] += scale * ds * kj[d];
            dkj[d] += scale * ds * qi[d];
            dvj[d] += prob[j] * doi[d];
          }
        }
      }
    }
  }
}

}  // namespace ref
}  // namespace flamia
