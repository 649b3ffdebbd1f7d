// The optimizer's CPU kernels: AdamW, SGD, and the gradient norm's sum of squares and finite check.
//
// AdamW follows Loshchilov and Hutter (decoupled weight decay) as Megatron applies it.
#include "runtime/exec/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mt::cpu {

namespace {

template <class T> struct FloatBits;
template <> struct FloatBits<float> {
  using U = uint32_t;
  static constexpr U kExponent = 0x7F800000u;
};
template <> struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kExponent = 0x7FF0000000000000ull;
};

} // namespace

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

template <class T> void sgd_step(T *p, const T *g, T *buf, int64_t count, const SgdParams &s) {
  for (int64_t i = 0; i < count; ++i) {
    const double d = static_cast<double>(g[i]) + s.weight_decay * p[i];
    const double b = s.momentum * buf[i] + d;
    p[i] = static_cast<T>(p[i] - s.lr * b);
    buf[i] = static_cast<T>(b);
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
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template void adamw_step<T>(T *, const T *, T *, T *, int64_t, const AdamWParams &);            \
  template void sgd_step<T>(T *, const T *, T *, int64_t, const SgdParams &);                     \
  template double sum_squares<T>(const T *, int64_t);                                             \
  template bool all_finite<T>(const T *, int64_t);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
