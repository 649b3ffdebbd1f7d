// The CPU kernels at the vocabulary's two ends: the embedding lookup and cross-entropy, whose
// vocabulary-wide softmax rows go through a vectorised exp.
#include "runtime/exec/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mt::cpu {

namespace {

// ---------------------------------------------------------------------------
// Vocabulary-wide softmax rows. The logits row is the one place where exp runs
// over tens of millions of elements per step, and glibc's scalar exp costs
// ~6 ns each, so rows go through a lane-wise exp written with GCC vector
// extensions, compiled for the baseline and, on x86-64, for AVX2+FMA (four
// lanes) and AVX-512 (eight lanes), picked once per process.

typedef double vd2 __attribute__((vector_size(16)));
typedef double vd4 __attribute__((vector_size(32)));
typedef int64_t vi4 __attribute__((vector_size(32)));
typedef uint64_t vu4 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int64_t vi8 __attribute__((vector_size(64)));
typedef uint64_t vu8 __attribute__((vector_size(64)));

template <class V> struct Lanes;
template <> struct Lanes<vd4> {
  static constexpr int kCount = 4;
  using Int = vi4;
  using Uint = vu4;
};
template <> struct Lanes<vd8> {
  static constexpr int kCount = 8;
  using Int = vi8;
  using Uint = vu8;
};

// Vectors are passed by reference throughout: passing or returning them by
// value changes the ABI between targets (GCC's -Wpsabi).
template <class T>
inline __attribute__((always_inline)) void load_shifted(const T *x, double shift, vd4 &out) {
  out = vd4{static_cast<double>(x[0]), static_cast<double>(x[1]), static_cast<double>(x[2]),
            static_cast<double>(x[3])} -
        shift;
}
template <class T>
inline __attribute__((always_inline)) void load_shifted(const T *x, double shift, vd8 &out) {
  out = vd8{static_cast<double>(x[0]), static_cast<double>(x[1]), static_cast<double>(x[2]),
            static_cast<double>(x[3]), static_cast<double>(x[4]), static_cast<double>(x[5]),
            static_cast<double>(x[6]), static_cast<double>(x[7])} -
        shift;
}

// x = exp(x) lane-wise for x <= 0, relative error ~2e-16: x = k ln2 + r with
// |r| <= ln2/2 (Cody-Waite split of ln2), exp(r) by its degree-13 Taylor
// polynomial, 2^k assembled in the exponent bits. Inputs below -700 are
// clamped (their exp, < 1e-304, cannot change a sum that includes exp(0) = 1);
// NaN propagates.
template <class V> inline __attribute__((always_inline)) void exp_nonpositive(V &x) {
  using Int = typename Lanes<V>::Int;
  using Uint = typename Lanes<V>::Uint;
  const double log2e = 1.4426950408889634;
  const double ln2_hi = 0.6931471803691238; // low 32 bits zero: k * ln2_hi is exact
  const double ln2_lo = 1.9082149292705877e-10;
  const double shifter = 0x1.8p52; // adding it rounds to an integer kept in the low bits
  const V lo = V{} - 700.0;
  Int below = x < lo;
  V xc = (V)(((Int)lo & below) | ((Int)x & ~below));
  V t = xc * log2e + shifter;
  V kd = t - shifter;
  V r = xc - kd * ln2_hi - kd * ln2_lo;
  V p = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  Uint two_k = ((Uint)t + 1023) << 52;
  x = p * (V)two_k;
}

// Largest element (NaN is skipped here; it still reaches the sum through
// exp). Two-lane vectors: SSE2 selects them natively, where GCC 12 lowers a
// four-lane select element by element (and fails on its bitwise form).
template <class T> double row_max_impl(const T *x, int64_t n) {
  const double ninf = -std::numeric_limits<double>::infinity();
  vd2 m0 = {ninf, ninf}, m1 = {ninf, ninf};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vd2 a = {static_cast<double>(x[i]), static_cast<double>(x[i + 1])};
    vd2 b = {static_cast<double>(x[i + 2]), static_cast<double>(x[i + 3])};
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  double best = std::max(std::max(m0[0], m0[1]), std::max(m1[0], m1[1]));
  for (; i < n; ++i)
    best = static_cast<double>(x[i]) > best ? static_cast<double>(x[i]) : best;
  return best;
}

// sum_j exp(x[j] - m); writes the terms to y (converted to T) when y is set.
template <class V, class T>
inline __attribute__((always_inline)) double row_exp_impl(const T *x, int64_t n, double m, T *y) {
  constexpr int kLanes = Lanes<V>::kCount;
  V acc = V{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V a;
    load_shifted(x + i, m, a);
    exp_nonpositive(a);
    acc += a;
    if (y)
      for (int l = 0; l < kLanes; ++l)
        y[i + l] = static_cast<T>(a[l]);
  }
  double sum = 0;
  for (int l = 0; l < kLanes; ++l)
    sum += acc[l];
  for (; i < n; ++i) {
    V a = V{};
    a[0] = static_cast<double>(x[i]) - m;
    exp_nonpositive(a);
    sum += a[0];
    if (y)
      y[i] = static_cast<T>(a[0]);
  }
  return sum;
}

template <class T> double row_exp_base(const T *x, int64_t n, double m, T *y) {
  return row_exp_impl<vd4>(x, n, m, y);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MT_ROW_VARIANTS 1
template <class T>
__attribute__((target("arch=x86-64-v3"))) double row_exp_avx2(const T *x, int64_t n, double m,
                                                              T *y) {
  return row_exp_impl<vd4>(x, n, m, y);
}
template <class T>
__attribute__((target("arch=x86-64-v4"))) double row_exp_avx512(const T *x, int64_t n, double m,
                                                                T *y) {
  return row_exp_impl<vd8>(x, n, m, y);
}
#endif

enum class RowIsa { Base, Avx2, Avx512 };

RowIsa row_isa() {
#ifdef MT_ROW_VARIANTS
  static const RowIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
      return RowIsa::Avx512;
    return __builtin_cpu_supports("x86-64-v3") ? RowIsa::Avx2 : RowIsa::Base;
  }();
  return isa;
#else
  return RowIsa::Base;
#endif
}

// Bound by memory, not compares: one variant serves every target.
template <class T> double row_max(const T *x, int64_t n) { return row_max_impl(x, n); }

template <class T> double row_exp(const T *x, int64_t n, double m, T *y) {
#ifdef MT_ROW_VARIANTS
  switch (row_isa()) {
  case RowIsa::Avx512: return row_exp_avx512(x, n, m, y);
  case RowIsa::Avx2: return row_exp_avx2(x, n, m, y);
  case RowIsa::Base: break;
  }
#endif
  return row_exp_base(x, n, m, y);
}

} // namespace

// ---------------------------------------------------------------------------
// Embedding

template <class T>
bool embedding_fwd(const T *table, int64_t vocab, int64_t h, const int32_t *ids, int64_t n,
                   T *out) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return false;
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * h, table + static_cast<int64_t>(ids[i]) * h, sizeof(T) * h);
  return true;
}

template <class T>
void embedding_bwd(const T *dout, const int32_t *ids, int64_t n, int64_t h, T *dtable) {
  for (int64_t i = 0; i < n; ++i) {
    T *row = dtable + static_cast<int64_t>(ids[i]) * h;
    const T *d = dout + i * h;
    for (int64_t j = 0; j < h; ++j)
      row[j] += d[j];
  }
}

void position_ids(int64_t batch, int64_t seq, int32_t *out) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s)
      out[b * seq + s] = static_cast<int32_t>(s);
}

// ---------------------------------------------------------------------------
// Cross-entropy

template <class T>
bool cross_entropy_fwd(const T *logits, const int32_t *labels, const float *loss_mask, int64_t n,
                       int64_t vocab, double *loss) {
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= vocab)
      return false;
  double total = 0, mask_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    double weight = loss_mask ? loss_mask[i] : 1.0;
    if (weight == 0)
      continue;
    const T *row = logits + i * vocab;
    double m = row_max(row, vocab);
    double lse = m + std::log(row_exp(row, vocab, m, static_cast<T *>(nullptr)));
    total += weight * (lse - static_cast<double>(row[labels[i]]));
    mask_sum += weight;
  }
  *loss = mask_sum != 0 ? total / mask_sum : 0.0;
  return true;
}

template <class T>
void cross_entropy_bwd(const T *logits, const int32_t *labels, const float *loss_mask, int64_t n,
                       int64_t vocab, double dloss, T *dlogits) {
  double mask_sum = 0;
  for (int64_t i = 0; i < n; ++i)
    mask_sum += loss_mask ? loss_mask[i] : 1.0;
  const double per_weight = mask_sum != 0 ? dloss / mask_sum : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const T *row = logits + i * vocab;
    T *out = dlogits + i * vocab;
    const double c = per_weight * (loss_mask ? loss_mask[i] : 1.0);
    if (c == 0) {
      std::fill(out, out + vocab, T(0));
      continue;
    }
    // out = c * softmax(row) - c * onehot: exp terms first, then one scale.
    // `out` may be `row` (the plan overwrites the logits with their
    // gradient), so the label's logit is read before anything is written.
    const int32_t label = labels[i];
    const bool has_label = label >= 0 && label < vocab;
    const double label_logit = has_label ? static_cast<double>(row[label]) : 0.0;
    double m = row_max(row, vocab);
    double f = c / row_exp(row, vocab, m, out);
    for (int64_t j = 0; j < vocab; ++j)
      out[j] = static_cast<T>(out[j] * f);
    if (has_label)
      out[label] = static_cast<T>(std::exp(label_logit - m) * f - c);
  }
}

// ---------------------------------------------------------------------------
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template bool embedding_fwd<T>(const T *, int64_t, int64_t, const int32_t *, int64_t, T *);     \
  template void embedding_bwd<T>(const T *, const int32_t *, int64_t, int64_t, T *);              \
  template bool cross_entropy_fwd<T>(const T *, const int32_t *, const float *, int64_t, int64_t, \
                                     double *);                                                    \
  template void cross_entropy_bwd<T>(const T *, const int32_t *, const float *, int64_t, int64_t, \
                                     double, T *);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
