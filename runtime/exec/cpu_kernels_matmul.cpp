// The CPU kernels of linear layers: matrix products through CBLAS, and the bias.
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_internal.h"

#include <cstdint>
#include <vector>

namespace mt::cpu {

using detail::gemm;

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
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template void matmul_fwd<T>(const T *, const T *, int64_t, int64_t, int64_t, T *);              \
  template void matmul_bwd_input<T>(const T *, const T *, int64_t, int64_t, int64_t, T *, bool);  \
  template void matmul_bwd_weight<T>(const T *, const T *, int64_t, int64_t, int64_t, T *);       \
  template void bias_add_fwd<T>(const T *, const T *, int64_t, int64_t, T *);                     \
  template void bias_grad<T>(const T *, int64_t, int64_t, T *);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
