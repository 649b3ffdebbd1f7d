// The CPU reference executor's kernels (see cpu_kernels.h) that are not an op family's own:
// Philox, elementwise ops and activations, dropout, bf16/fp16 rounding, initialisation. The
// families sit beside it in cpu_kernels_<family>.cpp, their shared helpers in
// cpu_kernels_internal.h.
//
// Philox4x32-10 follows Salmon, Moraes, Dror and Shaw, "Parallel Random
// Numbers: As Easy as 1, 2, 3" (SC'11), with the multipliers and Weyl
// constants of the Random123 distribution.
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_internal.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mt::cpu {

using detail::DropoutMask;
using detail::philox_block;

namespace {

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
                                    const RngKey &, T *);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
