// The CPU reference executor's kernels (see cpu_kernels.h): plain loops, CBLAS
// for matrix products, and a vectorised exp for the vocabulary-wide softmax.
//
// Philox4x32-10 follows Salmon, Moraes, Dror and Shaw, "Parallel Random
// Numbers: As Easy as 1, 2, 3" (SC'11), with the multipliers and Weyl
// constants of the Random123 distribution. AdamW follows Loshchilov and
// Hutter (decoupled weight decay) as Megatron applies it.
#include "runtime/exec/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace mt::cpu {

namespace {

// ---------------------------------------------------------------------------
// BLAS

void gemm_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
               double alpha, const float *a, blasint lda, const float *b, blasint ldb,
               double beta, float *c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb,
              static_cast<float>(beta), c, ldc);
}

void gemm_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
               double alpha, const double *a, blasint lda, const double *b, blasint ldb,
               double beta, double *c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Row-major C[m, n] = alpha * op(A) * op(B) + beta * C, op(A) being [m, k].
// Empty products are handled here because BLAS rejects leading dimensions of
// 0, and beta == 0 must ignore whatever C held (it may be uninitialised).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const T *a, int64_t lda, const T *b, int64_t ldb, double beta, T *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0 ? T(0) : static_cast<T>(beta * c[i * ldc + j]);
    return;
  }
  gemm_call(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
            static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha,
            a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
            static_cast<blasint>(ldc));
}

// ---------------------------------------------------------------------------
// Philox blocks and dropout masks

void philox_block(const RngKey &key, uint64_t block, uint32_t out[4]) {
  const uint32_t counter[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                               static_cast<uint32_t>(key.offset),
                               static_cast<uint32_t>(key.offset >> 32)};
  const uint32_t k[2] = {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.stream)};
  philox4x32_10(counter, k, out);
}

// The dropout mask of one call. u = (word >> 8) * 2^-24 >= rate holds exactly
// when (word >> 8) >= ceil(rate * 2^24), so the test is an integer compare
// (rate * 2^24 is exact in double).
struct DropoutMask {
  RngKey key;
  uint32_t threshold = 0;
  double keep_scale = 1;
  bool active = false;

  DropoutMask(double rate, const RngKey &k) : key(k) {
    if (!(rate > 0))
      return;
    active = true;
    if (rate >= 1) {
      threshold = 1u << 24; // above every 24-bit word: nothing is kept
      keep_scale = 0;
      return;
    }
    threshold = static_cast<uint32_t>(std::ceil(rate * 16777216.0));
    keep_scale = 1.0 / (1.0 - rate);
  }

  // Calls fn(j, keep) for element first + j, j in [0, len), one Philox block
  // per four elements.
  template <class Fn> void for_each(int64_t len, uint64_t first, Fn &&fn) const {
    uint32_t words[4];
    uint64_t cached = std::numeric_limits<uint64_t>::max();
    for (int64_t j = 0; j < len; ++j) {
      uint64_t index = first + static_cast<uint64_t>(j);
      if ((index >> 2) != cached) {
        cached = index >> 2;
        philox_block(key, cached, words);
      }
      fn(j, (words[index & 3] >> 8) >= threshold);
    }
  }

  // x[j] *= 1 / (1 - rate) when element first + j is kept, else x[j] = 0.
  template <class T> void apply(T *x, int64_t len, uint64_t first) const {
    for_each(len, first, [&](int64_t j, bool keep) {
      x[j] = keep ? static_cast<T>(static_cast<double>(x[j]) * keep_scale) : T(0);
    });
  }

  // The same factors (1 / (1 - rate) or 0) written out, for a mask used twice.
  void factors(double *factor, int64_t len, uint64_t first) const {
    for_each(len, first, [&](int64_t j, bool keep) { factor[j] = keep ? keep_scale : 0.0; });
  }
};

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

// ---------------------------------------------------------------------------
// Small helpers

// In-place softmax of p[0, valid); p[valid, len) is set to 0 (causal mask).
// Returns the row's log-sum-exp.
template <class T> double softmax_prefix(T *p, int64_t valid, int64_t len) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < valid; ++j)
    m = std::max(m, static_cast<double>(p[j]));
  double sum = 0;
  for (int64_t j = 0; j < valid; ++j) {
    double e = std::exp(static_cast<double>(p[j]) - m);
    p[j] = static_cast<T>(e);
    sum += e;
  }
  double inv = 1.0 / sum;
  for (int64_t j = 0; j < valid; ++j)
    p[j] = static_cast<T>(static_cast<double>(p[j]) * inv);
  for (int64_t j = valid; j < len; ++j)
    p[j] = T(0);
  return m + std::log(sum);
}

template <class T> struct FloatBits;
template <> struct FloatBits<float> {
  using U = uint32_t;
  static constexpr U kExponent = 0x7F800000u;
};
template <> struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kExponent = 0x7FF0000000000000ull;
};

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794; // 1 / sqrt(2 pi)
constexpr double kTwoPi = 6.28318530717958647693;

// Rows of queries per attention block: bounds the scratch to block * seq
// elements however long the sequence is.
constexpr int64_t kAttentionRows = 128;

} // namespace

// ---------------------------------------------------------------------------
// Random numbers

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

float rng_uniform(const RngKey &key, uint64_t index) {
  uint32_t words[4];
  philox_block(key, index >> 2, words);
  return static_cast<float>(words[index & 3] >> 8) * 0x1p-24f;
}

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
// Normalisation. Row statistics are taken in double, the variance in two
// passes (no E[x^2] - E[x]^2 cancellation).

template <class T>
void layer_norm_fwd(const T *x, const T *w, const T *b, int64_t n, int64_t h, double eps, T *y) {
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    T *yr = y + i * h;
    double mean = 0;
    for (int64_t j = 0; j < h; ++j)
      mean += xr[j];
    mean /= static_cast<double>(h);
    double var = 0;
    for (int64_t j = 0; j < h; ++j)
      var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / static_cast<double>(h) + eps);
    for (int64_t j = 0; j < h; ++j)
      yr[j] = static_cast<T>((xr[j] - mean) * rstd * w[j] + b[j]);
  }
}

template <class T>
void layer_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h, double eps, T *dx,
                    T *dw, T *db) {
  std::vector<double> dw_sum(h, 0.0), db_sum(h, 0.0), xhat(h);
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    const T *dyr = dy + i * h;
    double mean = 0;
    for (int64_t j = 0; j < h; ++j)
      mean += xr[j];
    mean /= static_cast<double>(h);
    double var = 0;
    for (int64_t j = 0; j < h; ++j)
      var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / static_cast<double>(h) + eps);
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (xr[j] - mean) * rstd;
      double g = static_cast<double>(dyr[j]) * w[j];
      mean_g += g;
      mean_gx += g * xhat[j];
      dw_sum[j] += dyr[j] * xhat[j];
      db_sum[j] += dyr[j];
    }
    mean_g /= static_cast<double>(h);
    mean_gx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(dyr[j]) * w[j];
      dx[i * h + j] = static_cast<T>(rstd * (g - mean_g - xhat[j] * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) {
    dw[j] = static_cast<T>(dw[j] + dw_sum[j]);
    db[j] = static_cast<T>(db[j] + db_sum[j]);
  }
}

template <class T>
void rms_norm_fwd(const T *x, const T *w, int64_t n, int64_t h, double eps, T *y) {
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    double ss = 0;
    for (int64_t j = 0; j < h; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (int64_t j = 0; j < h; ++j)
      y[i * h + j] = static_cast<T>(xr[j] * rstd * w[j]);
  }
}

template <class T>
void rms_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h, double eps, T *dx,
                  T *dw) {
  std::vector<double> dw_sum(h, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    const T *dyr = dy + i * h;
    double ss = 0;
    for (int64_t j = 0; j < h; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    // dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * w.
    double mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      mean_gx += static_cast<double>(dyr[j]) * w[j] * xr[j];
      dw_sum[j] += static_cast<double>(dyr[j]) * xr[j] * rstd;
    }
    mean_gx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(dyr[j]) * w[j];
      dx[i * h + j] = static_cast<T>(rstd * (g - xr[j] * rstd * rstd * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j)
    dw[j] = static_cast<T>(dw[j] + dw_sum[j]);
}

// ---------------------------------------------------------------------------
// Linear layers

template <class T>
void matmul_fwd(const T *x, const T *w, int64_t n, int64_t in, int64_t out, T *y) {
  gemm(false, true, n, out, in, 1.0, x, in, w, in, 0.0, y, out);
}

template <class T>
void matmul_bwd_input(const T *dy, const T *w, int64_t n, int64_t in, int64_t out, T *dx,
                      bool accumulate) {
  gemm(false, false, n, in, out, 1.0, dy, out, w, in, accumulate ? 1.0 : 0.0, dx, in);
}

template <class T>
void matmul_bwd_weight(const T *dy, const T *x, int64_t n, int64_t in, int64_t out, T *dw) {
  gemm(true, false, out, in, n, 1.0, dy, out, x, in, 1.0, dw, in);
}

template <class T> void bias_add_fwd(const T *x, const T *b, int64_t n, int64_t h, T *y) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j)
      y[i * h + j] = x[i * h + j] + b[j];
}

template <class T> void bias_grad(const T *dy, int64_t n, int64_t h, T *db) {
  std::vector<double> sum(h, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j)
      sum[j] += dy[i * h + j];
  for (int64_t j = 0; j < h; ++j)
    db[j] = static_cast<T>(db[j] + sum[j]);
}

// ---------------------------------------------------------------------------
// Elementwise

template <class T> void add(const T *a, const T *b, int64_t count, T *y) {
  for (int64_t i = 0; i < count; ++i)
    y[i] = a[i] + b[i];
}

template <class T> void accumulate(const T *src, int64_t count, T *dst) {
  for (int64_t i = 0; i < count; ++i)
    dst[i] += src[i];
}

template <class T> void scale(T *x, int64_t count, double s) {
  for (int64_t i = 0; i < count; ++i)
    x[i] = static_cast<T>(x[i] * s);
}

template <class T> void gelu_fwd(const T *x, int64_t count, bool tanh_approx, T *y) {
  for (int64_t i = 0; i < count; ++i) {
    double v = x[i];
    double cdf = tanh_approx ? 0.5 * (1.0 + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)))
                             : 0.5 * (1.0 + std::erf(v * kInvSqrt2));
    y[i] = static_cast<T>(v * cdf);
  }
}

template <class T> void gelu_bwd(const T *dy, const T *x, int64_t count, bool tanh_approx, T *dx) {
  for (int64_t i = 0; i < count; ++i) {
    double v = x[i];
    double grad;
    if (tanh_approx) {
      double t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
      grad = 0.5 * (1.0 + t) +
             0.5 * v * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * v * v);
    } else {
      grad = 0.5 * (1.0 + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v);
    }
    dx[i] = static_cast<T>(dy[i] * grad);
  }
}

template <class T> void swiglu_fwd(const T *x, int64_t n, int64_t f, T *y) {
  for (int64_t i = 0; i < n; ++i) {
    const T *a = x + i * 2 * f;
    const T *b = a + f;
    for (int64_t j = 0; j < f; ++j) {
      double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(a[j])));
      y[i * f + j] = static_cast<T>(a[j] * sig * b[j]);
    }
  }
}

template <class T> void swiglu_bwd(const T *dy, const T *x, int64_t n, int64_t f, T *dx) {
  for (int64_t i = 0; i < n; ++i) {
    const T *a = x + i * 2 * f;
    const T *b = a + f;
    T *da = dx + i * 2 * f;
    T *db = da + f;
    for (int64_t j = 0; j < f; ++j) {
      double av = a[j];
      double sig = 1.0 / (1.0 + std::exp(-av));
      double g = dy[i * f + j];
      // d silu(a) / da = sig * (1 + a * (1 - sig)).
      da[j] = static_cast<T>(g * b[j] * sig * (1.0 + av * (1.0 - sig)));
      db[j] = static_cast<T>(g * av * sig);
    }
  }
}

template <class T>
void dropout_fwd(const T *x, int64_t count, double rate, const RngKey &key, T *y) {
  if (y != x)
    std::memmove(y, x, sizeof(T) * count);
  DropoutMask mask(rate, key);
  if (mask.active)
    mask.apply(y, count, 0);
}

template <class T>
void dropout_segments(const T *x, int64_t outer, int64_t len, uint64_t stride, uint64_t first,
                      double rate, const RngKey &key, T *y) {
  if (y != x)
    std::memmove(y, x, sizeof(T) * size_t(outer * len));
  DropoutMask mask(rate, key);
  if (!mask.active)
    return;
  for (int64_t o = 0; o < outer; ++o)
    mask.apply(y + o * len, len, uint64_t(o) * stride + first);
}

template <class T>
void dropout_bwd(const T *dy, int64_t count, double rate, const RngKey &key, T *dx) {
  // y = x * factor elementwise, so dx = dy * factor with the same mask.
  dropout_fwd(dy, count, rate, key, dx);
}

// ---------------------------------------------------------------------------
// Attention inputs

template <class T>
void split_qkv_fwd(const T *qkv, int64_t n, int64_t heads, int64_t groups, int64_t d, T *q, T *k,
                   T *v) {
  const int64_t per_group = heads / groups;
  const int64_t group_width = (per_group + 2) * d;
  for (int64_t i = 0; i < n; ++i) {
    const T *row = qkv + i * groups * group_width;
    for (int64_t g = 0; g < groups; ++g) {
      const T *src = row + g * group_width;
      std::memcpy(q + (i * heads + g * per_group) * d, src, sizeof(T) * per_group * d);
      std::memcpy(k + (i * groups + g) * d, src + per_group * d, sizeof(T) * d);
      std::memcpy(v + (i * groups + g) * d, src + (per_group + 1) * d, sizeof(T) * d);
    }
  }
}

template <class T>
void split_qkv_bwd(const T *dq, const T *dk, const T *dv, int64_t n, int64_t heads,
                   int64_t groups, int64_t d, T *dqkv) {
  const int64_t per_group = heads / groups;
  const int64_t group_width = (per_group + 2) * d;
  for (int64_t i = 0; i < n; ++i) {
    T *row = dqkv + i * groups * group_width;
    for (int64_t g = 0; g < groups; ++g) {
      T *dst = row + g * group_width;
      std::memcpy(dst, dq + (i * heads + g * per_group) * d, sizeof(T) * per_group * d);
      std::memcpy(dst + per_group * d, dk + (i * groups + g) * d, sizeof(T) * d);
      std::memcpy(dst + (per_group + 1) * d, dv + (i * groups + g) * d, sizeof(T) * d);
    }
  }
}

namespace {

// cos and sin of sign * p * base^(-2j/d) for p < seq, j < d/2, in double:
// the one table every rotation below reads, so the fused split computes
// exactly what ROPE computes.
struct RopeAngles {
  int64_t half;
  std::vector<double> cos, sin;

  RopeAngles(int64_t seq, int64_t d, double base, double sign)
      : half(d / 2), cos(size_t(seq * (d / 2))), sin(size_t(seq * (d / 2))) {
    for (int64_t j = 0; j < half; ++j) {
      double inv_freq = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(d));
      for (int64_t p = 0; p < seq; ++p) {
        double angle = sign * static_cast<double>(p) * inv_freq;
        cos[size_t(p * half + j)] = std::cos(angle);
        sin[size_t(p * half + j)] = std::sin(angle);
      }
    }
  }

  // Rotates one head x[d] at position p into y[d]; an odd d's last element
  // is copied.
  template <class T>
  void rotate(const T *x, int64_t p, int64_t d, T *y) const {
    const double *c = cos.data() + p * half;
    const double *s = sin.data() + p * half;
    for (int64_t j = 0; j < half; ++j) {
      double x1 = x[j], x2 = x[j + half];
      y[j] = static_cast<T>(x1 * c[j] - x2 * s[j]);
      y[j + half] = static_cast<T>(x2 * c[j] + x1 * s[j]);
    }
    if (d % 2)
      y[d - 1] = x[d - 1];
  }
};

// Rotates every (x[j], x[j + d/2]) pair by sign * p * base^(-2j/d).
template <class T>
void rope_rotate(const T *x, int64_t batch, int64_t seq, int64_t heads, int64_t d, double base,
                 double sign, T *y) {
  const RopeAngles angles(seq, d, base, sign);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < seq; ++p)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at = ((b * seq + p) * heads + h) * d;
        angles.rotate(x + at, p, d, y + at);
      }
}

} // namespace

template <class T>
void rope_fwd(const T *x, int64_t batch, int64_t seq, int64_t heads, int64_t d, double base,
              T *y) {
  rope_rotate(x, batch, seq, heads, d, base, 1.0, y);
}

template <class T>
void rope_bwd(const T *dy, int64_t batch, int64_t seq, int64_t heads, int64_t d, double base,
              T *dx) {
  // The rotation is orthogonal: its transpose is the opposite rotation.
  rope_rotate(dy, batch, seq, heads, d, base, -1.0, dx);
}

template <class T>
void split_qkv_rope_fwd(const T *qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                        int64_t d, double base, T *q, T *k, T *v) {
  const RopeAngles angles(seq, d, base, 1.0);
  const int64_t per_group = heads / groups;
  const int64_t group_width = (per_group + 2) * d;
  for (int64_t i = 0; i < batch * seq; ++i) {
    const int64_t p = i % seq;
    const T *row = qkv + i * groups * group_width;
    for (int64_t g = 0; g < groups; ++g) {
      const T *src = row + g * group_width;
      for (int64_t h = 0; h < per_group; ++h)
        angles.rotate(src + h * d, p, d, q + (i * heads + g * per_group + h) * d);
      angles.rotate(src + per_group * d, p, d, k + (i * groups + g) * d);
      std::memcpy(v + (i * groups + g) * d, src + (per_group + 1) * d, sizeof(T) * d);
    }
  }
}

template <class T>
void split_qkv_rope_bwd(const T *dq, const T *dk, const T *dv, int64_t batch, int64_t seq,
                        int64_t heads, int64_t groups, int64_t d, double base, T *dqkv) {
  const RopeAngles angles(seq, d, base, -1.0);
  const int64_t per_group = heads / groups;
  const int64_t group_width = (per_group + 2) * d;
  for (int64_t i = 0; i < batch * seq; ++i) {
    const int64_t p = i % seq;
    T *row = dqkv + i * groups * group_width;
    for (int64_t g = 0; g < groups; ++g) {
      T *dst = row + g * group_width;
      for (int64_t h = 0; h < per_group; ++h)
        angles.rotate(dq + (i * heads + g * per_group + h) * d, p, d, dst + h * d);
      angles.rotate(dk + (i * groups + g) * d, p, d, dst + per_group * d);
      std::memcpy(dst + (per_group + 1) * d, dv + (i * groups + g) * d, sizeof(T) * d);
    }
  }
}

// ---------------------------------------------------------------------------
// Attention. For each (batch, head) and block of query rows: scores by one
// GEMM over strided q/k rows, softmax per row (the backward: exp(scores -
// lse)), then GEMMs with v; nothing of size seq x seq outlives the block.

namespace {

// Scaled scores for rows [i0, i0 + rows) of (b, h): p[rows, cols] = scale
// q k^T with cols = i0 + rows when causal (later columns are all masked),
// else seq. Returns cols.
template <class T>
int64_t attention_scores(const T *q, const T *k, const AttentionShape &s, int64_t b, int64_t h,
                         int64_t i0, int64_t rows, T *p) {
  const int64_t per_group = s.heads / s.groups;
  const int64_t g = h / per_group;
  const int64_t q_stride = s.heads * s.d, k_stride = s.groups * s.d;
  const int64_t cols = s.causal ? i0 + rows : s.seq;
  const T *qb = q + (b * s.seq + i0) * q_stride + h * s.d;
  const T *kb = k + b * s.seq * k_stride + g * s.d;
  gemm(false, true, rows, cols, s.d, s.scale, qb, q_stride, kb, k_stride, 0.0, p, cols);
  return cols;
}

// Dropout element index of (b, h, i, 0) in the whole model's [b, heads, s, s].
uint64_t attention_mask_index(const AttentionShape &s, int64_t b, int64_t h, int64_t i) {
  const int64_t total = s.total_heads > 0 ? s.total_heads : s.heads;
  return static_cast<uint64_t>(((b * total + s.head_offset + h) * s.seq + i) * s.seq);
}

} // namespace

template <class T>
void attention_fwd(const T *q, const T *k, const T *v, const AttentionShape &s, const RngKey &key,
                   T *out, T *lse) {
  if (s.batch == 0 || s.seq == 0 || s.heads == 0)
    return;
  const int64_t per_group = s.heads / s.groups;
  const int64_t q_stride = s.heads * s.d, k_stride = s.groups * s.d;
  const int64_t block = std::min(s.seq, kAttentionRows);
  const DropoutMask mask(s.dropout_rate, key);
  std::vector<T> p(block * s.seq);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const T *vb = v + b * s.seq * k_stride + (h / per_group) * s.d;
      T *lse_bh = lse + (b * s.heads + h) * s.seq;
      for (int64_t i0 = 0; i0 < s.seq; i0 += block) {
        const int64_t rows = std::min(block, s.seq - i0);
        const int64_t cols = attention_scores(q, k, s, b, h, i0, rows, p.data());
        for (int64_t r = 0; r < rows; ++r)
          lse_bh[i0 + r] = static_cast<T>(
              softmax_prefix(p.data() + r * cols, s.causal ? i0 + r + 1 : cols, cols));
        // Causally masked columns are 0 already and need no random numbers.
        if (mask.active)
          for (int64_t r = 0; r < rows; ++r)
            mask.apply(p.data() + r * cols, s.causal ? i0 + r + 1 : cols,
                       attention_mask_index(s, b, h, i0 + r));
        T *ob = out + (b * s.seq + i0) * q_stride + h * s.d;
        gemm(false, false, rows, s.d, cols, 1.0, p.data(), cols, vb, k_stride, 0.0, ob, q_stride);
      }
    }
}

template <class T>
void attention_bwd(const T *dout, const T *q, const T *k, const T *v, const T *out, const T *lse,
                   const AttentionShape &s, const RngKey &key, T *dq, T *dk, T *dv) {
  const int64_t kv_count = s.batch * s.seq * s.groups * s.d;
  std::fill(dk, dk + kv_count, T(0));
  std::fill(dv, dv + kv_count, T(0));
  if (s.batch == 0 || s.seq == 0 || s.heads == 0)
    return;
  const int64_t per_group = s.heads / s.groups;
  const int64_t q_stride = s.heads * s.d, k_stride = s.groups * s.d;
  const int64_t block = std::min(s.seq, kAttentionRows);
  const DropoutMask mask(s.dropout_rate, key);
  std::vector<T> p(block * s.seq), dp(block * s.seq);
  // With dropout, the block's mask is drawn once and used for pd and dp.
  std::vector<T> p_dropped(mask.active ? block * s.seq : 0);
  std::vector<double> factor(mask.active ? block * s.seq : 0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv_at = b * s.seq * k_stride + (h / per_group) * s.d;
      const T *kb = k + kv_at, *vb = v + kv_at;
      T *dkb = dk + kv_at, *dvb = dv + kv_at;
      const T *lse_bh = lse + (b * s.heads + h) * s.seq;
      for (int64_t i0 = 0; i0 < s.seq; i0 += block) {
        const int64_t rows = std::min(block, s.seq - i0);
        const int64_t q_at = (b * s.seq + i0) * q_stride + h * s.d;
        const T *qb = q + q_at, *dob = dout + q_at, *ob = out + q_at;
        // p = exp(scores - lse): the forward's probabilities, from its
        // log-sum-exp.
        const int64_t cols = attention_scores(q, k, s, b, h, i0, rows, p.data());
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t valid = s.causal ? i0 + r + 1 : cols;
          const double l = static_cast<double>(lse_bh[i0 + r]);
          T *pr = p.data() + r * cols;
          for (int64_t j = 0; j < valid; ++j)
            pr[j] = static_cast<T>(std::exp(static_cast<double>(pr[j]) - l));
          std::fill(pr + valid, pr + cols, T(0));
        }
        // out = pd v with pd = dropout(p): dv += pd^T dout, dpd = dout v^T.
        const T *pd = p.data();
        if (mask.active) {
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t valid = s.causal ? i0 + r + 1 : cols;
            mask.factors(factor.data() + r * cols, valid, attention_mask_index(s, b, h, i0 + r));
            std::fill(factor.begin() + r * cols + valid, factor.begin() + (r + 1) * cols, 0.0);
          }
          for (int64_t e = 0; e < rows * cols; ++e)
            p_dropped[e] = static_cast<T>(static_cast<double>(p[e]) * factor[e]);
          pd = p_dropped.data();
        }
        gemm(true, false, cols, s.d, rows, 1.0, pd, cols, dob, q_stride, 1.0, dvb, k_stride);
        gemm(false, true, rows, cols, s.d, 1.0, dob, q_stride, vb, k_stride, 0.0, dp.data(), cols);
        // dp = dropout_bwd(dpd); softmax: ds = p * (dp - sum_j dp_j p_j),
        // where sum_j dp_j p_j = sum_j dpd_j pd_j = dout_i . out_i.
        for (int64_t r = 0; r < rows; ++r) {
          T *dpr = dp.data() + r * cols;
          const T *pr = p.data() + r * cols;
          if (mask.active)
            for (int64_t j = 0; j < cols; ++j)
              dpr[j] = static_cast<T>(static_cast<double>(dpr[j]) * factor[r * cols + j]);
          const T *dor = dob + r * q_stride, *orow = ob + r * q_stride;
          double dot = 0;
          for (int64_t e = 0; e < s.d; ++e)
            dot += static_cast<double>(dor[e]) * static_cast<double>(orow[e]);
          for (int64_t j = 0; j < cols; ++j)
            dpr[j] = static_cast<T>(pr[j] * (dpr[j] - dot));
        }
        // scores = scale q k^T: dq = scale ds k, dk += scale ds^T q.
        gemm(false, false, rows, s.d, cols, s.scale, dp.data(), cols, kb, k_stride, 0.0, dq + q_at,
             q_stride);
        gemm(true, false, cols, s.d, rows, s.scale, dp.data(), cols, qb, q_stride, 1.0, dkb,
             k_stride);
      }
    }
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
// Optimizer and reductions

template <class T>
void adamw_step(T *p, const T *g, T *m, T *v, int64_t count, const AdamWParams &a) {
  const double step = static_cast<double>(a.step);
  const double correction1 = 1.0 - std::pow(a.beta1, step);
  const double correction2 = 1.0 - std::pow(a.beta2, step);
  const double decay = 1.0 - a.lr * a.weight_decay;
  for (int64_t i = 0; i < count; ++i) {
    double gi = g[i];
    double mi = a.beta1 * m[i] + (1.0 - a.beta1) * gi;
    double vi = a.beta2 * v[i] + (1.0 - a.beta2) * gi * gi;
    double update = (mi / correction1) / (std::sqrt(vi / correction2) + a.eps);
    p[i] = static_cast<T>(p[i] * decay - a.lr * update);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}

template <class T> double sum_squares(const T *x, int64_t count) {
  // Four partial sums: independent chains instead of one serial dependency.
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= count; i += 4)
    for (int l = 0; l < 4; ++l)
      s[l] += static_cast<double>(x[i + l]) * x[i + l];
  for (; i < count; ++i)
    s[0] += static_cast<double>(x[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class T> bool all_finite(const T *x, int64_t count) {
  // Exponent all ones is Inf or NaN; an OR over integers vectorises where a
  // floating-point test with an early exit would not.
  using U = typename FloatBits<T>::U;
  U bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    U u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= static_cast<U>((u & FloatBits<T>::kExponent) == FloatBits<T>::kExponent);
  }
  return bad == 0;
}

// ---------------------------------------------------------------------------
// Reduced precision

void round_to_bf16(float *x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u = bits_of(x[i]);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
      // NaN: keep it NaN once the low mantissa bits are gone (quiet bit set).
      x[i] = float_of((u | 0x00400000u) & 0xFFFF0000u);
      continue;
    }
    // Round half to even on the 16 dropped bits; a carry into the exponent is
    // the correct result, up to Inf.
    u += 0x7FFFu + ((u >> 16) & 1u);
    x[i] = float_of(u & 0xFFFF0000u);
  }
}

void round_to_fp16(float *x, int64_t count) {
  const float max_half = 65504.0f;
  const float min_normal = 0x1p-14f;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u = bits_of(x[i]);
    const uint32_t sign = u & 0x80000000u;
    const uint32_t mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) {
      x[i] = float_of((u | 0x00400000u) & 0xFFFFE000u);
      continue;
    }
    float a = float_of(mag);
    float r;
    if (a >= min_normal) {
      // Normal half: 10 of float's 23 mantissa bits survive.
      uint32_t m = mag + 0x0FFFu + ((mag >> 13) & 1u);
      r = float_of(m & 0xFFFFE000u);
      if (r > max_half)
        r = std::numeric_limits<float>::infinity();
    } else {
      // Subnormal half: multiples of 2^-24. Scaling by 2^24 is exact, and
      // nearbyint rounds half to even in the default rounding mode.
      r = std::nearbyint(a * 0x1p24f) * 0x1p-24f;
    }
    x[i] = float_of(bits_of(r) | sign);
  }
}

void init_normal(float *x, int64_t count, double std, uint64_t seed, uint64_t stream) {
  const RngKey key{seed, stream, 0};
  uint32_t words[4];
  for (int64_t i = 0; i < count; i += 4) {
    philox_block(key, static_cast<uint64_t>(i) >> 2, words);
    for (int pair = 0; pair < 4 && i + pair < count; pair += 2) {
      double u1 = static_cast<double>(words[pair] >> 8) * 0x1p-24;
      double u2 = static_cast<double>(words[pair + 1] >> 8) * 0x1p-24;
      double radius = std * std::sqrt(-2.0 * std::log(1.0 - u1)); // 1 - u1 is in (0, 1]
      x[i + pair] = static_cast<float>(radius * std::cos(kTwoPi * u2));
      if (i + pair + 1 < count)
        x[i + pair + 1] = static_cast<float>(radius * std::sin(kTwoPi * u2));
    }
  }
}

// ---------------------------------------------------------------------------
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template bool embedding_fwd<T>(const T *, int64_t, int64_t, const int32_t *, int64_t, T *);     \
  template void embedding_bwd<T>(const T *, const int32_t *, int64_t, int64_t, T *);              \
  template void layer_norm_fwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *); \
  template void layer_norm_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *, \
                                  T *, T *);                                                       \
  template void rms_norm_fwd<T>(const T *, const T *, int64_t, int64_t, double, T *);             \
  template void rms_norm_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *,   \
                                T *);                                                              \
  template void matmul_fwd<T>(const T *, const T *, int64_t, int64_t, int64_t, T *);              \
  template void matmul_bwd_input<T>(const T *, const T *, int64_t, int64_t, int64_t, T *, bool);  \
  template void matmul_bwd_weight<T>(const T *, const T *, int64_t, int64_t, int64_t, T *);       \
  template void bias_add_fwd<T>(const T *, const T *, int64_t, int64_t, T *);                     \
  template void bias_grad<T>(const T *, int64_t, int64_t, T *);                                   \
  template void add<T>(const T *, const T *, int64_t, T *);                                       \
  template void accumulate<T>(const T *, int64_t, T *);                                           \
  template void scale<T>(T *, int64_t, double);                                                   \
  template void gelu_fwd<T>(const T *, int64_t, bool, T *);                                       \
  template void gelu_bwd<T>(const T *, const T *, int64_t, bool, T *);                            \
  template void swiglu_fwd<T>(const T *, int64_t, int64_t, T *);                                  \
  template void swiglu_bwd<T>(const T *, const T *, int64_t, int64_t, T *);                       \
  template void dropout_fwd<T>(const T *, int64_t, double, const RngKey &, T *);                  \
  template void dropout_bwd<T>(const T *, int64_t, double, const RngKey &, T *);                  \
  template void dropout_segments<T>(const T *, int64_t, int64_t, uint64_t, uint64_t, double,        \
                                    const RngKey &, T *);                                          \
  template void split_qkv_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, T *, T *, T *);   \
  template void split_qkv_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, int64_t,      \
                                 int64_t, T *);                                                    \
  template void rope_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, double, T *);          \
  template void rope_bwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, double, T *);          \
  template void split_qkv_rope_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                      double, T *, T *, T *);                                    \
  template void split_qkv_rope_bwd<T>(const T *, const T *, const T *, int64_t, int64_t,          \
                                      int64_t, int64_t, int64_t, double, T *);                   \
  template void attention_fwd<T>(const T *, const T *, const T *, const AttentionShape &,         \
                                 const RngKey &, T *, T *);                                        \
  template void attention_bwd<T>(const T *, const T *, const T *, const T *, const T *, const T *, \
                                 const AttentionShape &, const RngKey &, T *, T *, T *);           \
  template bool cross_entropy_fwd<T>(const T *, const int32_t *, const float *, int64_t, int64_t, \
                                     double *);                                                    \
  template void cross_entropy_bwd<T>(const T *, const int32_t *, const float *, int64_t, int64_t, \
                                     double, T *);                                                 \
  template void adamw_step<T>(T *, const T *, T *, T *, int64_t, const AdamWParams &);            \
  template double sum_squares<T>(const T *, int64_t);                                             \
  template bool all_finite<T>(const T *, int64_t);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
