// The CPU kernels of the normalisation layers: LayerNorm and RMSNorm, forward and backward.
#include "runtime/exec/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace mt::cpu {

// ---------------------------------------------------------------------------
// Normalisation. Row statistics are taken in double, the variance in two
// passes (no E[x^2] - E[x]^2 cancellation).

template <class T>
void layer_norm_fwd(const T *x, const T *w, const T *b, int64_t n, int64_t h, double eps, T *y,
                    double w_offset) {
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
      yr[j] = static_cast<T>((xr[j] - mean) * rstd * (w[j] + w_offset) + b[j]);
  }
}

template <class T>
void layer_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h, double eps, T *dx,
                    T *dw, T *db, double w_offset) {
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
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * (w + w_offset).
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (xr[j] - mean) * rstd;
      double g = static_cast<double>(dyr[j]) * (w[j] + w_offset);
      mean_g += g;
      mean_gx += g * xhat[j];
      dw_sum[j] += dyr[j] * xhat[j];
      db_sum[j] += dyr[j];
    }
    mean_g /= static_cast<double>(h);
    mean_gx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(dyr[j]) * (w[j] + w_offset);
      dx[i * h + j] = static_cast<T>(rstd * (g - mean_g - xhat[j] * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) {
    dw[j] = static_cast<T>(dw[j] + dw_sum[j]);
    db[j] = static_cast<T>(db[j] + db_sum[j]);
  }
}

template <class T>
void rms_norm_fwd(const T *x, const T *w, int64_t n, int64_t h, double eps, T *y,
                  double w_offset) {
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    double ss = 0;
    for (int64_t j = 0; j < h; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (int64_t j = 0; j < h; ++j)
      y[i * h + j] = static_cast<T>(xr[j] * rstd * (w[j] + w_offset));
  }
}

template <class T>
void rms_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h, double eps, T *dx,
                  T *dw, double w_offset) {
  std::vector<double> dw_sum(h, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const T *xr = x + i * h;
    const T *dyr = dy + i * h;
    double ss = 0;
    for (int64_t j = 0; j < h; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    // dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * (w + w_offset).
    double mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      mean_gx += static_cast<double>(dyr[j]) * (w[j] + w_offset) * xr[j];
      dw_sum[j] += static_cast<double>(dyr[j]) * xr[j] * rstd;
    }
    mean_gx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(dyr[j]) * (w[j] + w_offset);
      dx[i * h + j] = static_cast<T>(rstd * (g - xr[j] * rstd * rstd * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j)
    dw[j] = static_cast<T>(dw[j] + dw_sum[j]);
}

// ---------------------------------------------------------------------------
// The executor uses float, the gradient tests double.

#define MT_INSTANTIATE(T)                                                                          \
  template void layer_norm_fwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *, \
                                  double);                                                         \
  template void layer_norm_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *, \
                                  T *, T *, double);                                               \
  template void rms_norm_fwd<T>(const T *, const T *, int64_t, int64_t, double, T *, double);     \
  template void rms_norm_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, double, T *,   \
                                T *, double);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
