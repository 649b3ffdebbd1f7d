// The CPU kernels of attention: the QKV split, RoPE (alone and fused with the split), and
// exact attention with dropout, forward and backward.
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace mt::cpu {

using detail::AttentionDropoutMask;
using detail::gemm;

namespace {

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

// Rows of queries per attention block: bounds the scratch to block * seq
// elements however long the sequence is.
constexpr int64_t kAttentionRows = 128;

} // namespace

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

double rope_inv_freq(int64_t j, int64_t d, double base, double scaling) {
  const double f = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(d));
  if (scaling <= 0.0)
    return f;
  // Llama 3.1 (Megatron's RotaryEmbedding._apply_scaling defaults).
  constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOriginalPositions = 8192.0;
  const double low_wavelen = kOriginalPositions / kLowFreqFactor;
  const double high_wavelen = kOriginalPositions / kHighFreqFactor;
  const double wavelen = 2.0 * M_PI / f;
  if (wavelen < high_wavelen)
    return f;
  if (wavelen > low_wavelen)
    return f / scaling;
  const double smooth =
      (kOriginalPositions / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
  return (1.0 - smooth) * f / scaling + smooth * f;
}

namespace {

// cos and sin of sign * p * rope_inv_freq(j) for p < seq, j < d/2, in double:
// the one table every rotation below reads, so the fused split computes
// exactly what ROPE computes.
struct RopeAngles {
  int64_t half;
  std::vector<double> cos, sin;

  RopeAngles(int64_t seq, int64_t d, double base, double scaling, double sign)
      : half(d / 2), cos(size_t(seq * (d / 2))), sin(size_t(seq * (d / 2))) {
    for (int64_t j = 0; j < half; ++j) {
      double inv_freq = rope_inv_freq(j, d, base, scaling);
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
                 double scaling, double sign, T *y) {
  const RopeAngles angles(seq, d, base, scaling, sign);
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
              T *y, double scaling) {
  rope_rotate(x, batch, seq, heads, d, base, scaling, 1.0, y);
}

template <class T>
void rope_bwd(const T *dy, int64_t batch, int64_t seq, int64_t heads, int64_t d, double base,
              T *dx, double scaling) {
  // The rotation is orthogonal: its transpose is the opposite rotation.
  rope_rotate(dy, batch, seq, heads, d, base, scaling, -1.0, dx);
}

template <class T>
void split_qkv_rope_fwd(const T *qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                        int64_t d, double base, T *q, T *k, T *v, double scaling) {
  const RopeAngles angles(seq, d, base, scaling, 1.0);
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
                        int64_t heads, int64_t groups, int64_t d, double base, T *dqkv,
                        double scaling) {
  const RopeAngles angles(seq, d, base, scaling, -1.0);
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
  const AttentionDropoutMask mask(s.dropout_rate, key);
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
  const AttentionDropoutMask mask(s.dropout_rate, key);
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
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template void split_qkv_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, T *, T *, T *);   \
  template void split_qkv_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, int64_t,      \
                                 int64_t, T *);                                                    \
  template void rope_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, double, T *, double); \
  template void rope_bwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, double, T *, double); \
  template void split_qkv_rope_fwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                      double, T *, T *, T *, double);                            \
  template void split_qkv_rope_bwd<T>(const T *, const T *, const T *, int64_t, int64_t,          \
                                      int64_t, int64_t, int64_t, double, T *, double);           \
  template void attention_fwd<T>(const T *, const T *, const T *, const AttentionShape &,         \
                                 const RngKey &, T *, T *);                                        \
  template void attention_bwd<T>(const T *, const T *, const T *, const T *, const T *, const T *, \
                                 const AttentionShape &, const RngKey &, T *, T *, T *);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
