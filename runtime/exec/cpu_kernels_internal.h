// Helpers shared by the CPU kernel files (GEMM through CBLAS, Philox blocks, dropout masks);
// internal to runtime/exec.
#ifndef MT_RUNTIME_CPU_KERNELS_INTERNAL_H
#define MT_RUNTIME_CPU_KERNELS_INTERNAL_H

#include "runtime/exec/cpu_kernels.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace mt::cpu::detail {

// ---------------------------------------------------------------------------
// BLAS

inline void gemm_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
                      double alpha, const float *a, blasint lda, const float *b, blasint ldb,
                      double beta, float *c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb,
              static_cast<float>(beta), c, ldc);
}

inline void gemm_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
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

inline void philox_block(const RngKey &key, uint64_t block, uint32_t out[4]) {
  const uint32_t counter[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                               static_cast<uint32_t>(key.offset),
                               static_cast<uint32_t>(key.offset >> 32)};
  const uint32_t k[2] = {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.stream)};
  philox4x32_10(counter, k, out);
}

// The dropout mask of one call, drawn from Philox blocks of four 32-bit
// words. Two kinds (PerBlock):
// - 4, the activations' dropout: one element a word, u = (word >> 8) * 2^-24;
// - 8, attention's dropout (the flash kernels'): two elements a word,
//   element e taking half e % 2 (the low half first), u = half * 2^-16. Half
//   the Philox blocks of the first kind, for a rate rounded up to a multiple
//   of 2^-16 (0.1 draws 0.1000061).
// u >= rate holds exactly when the draw >= ceil(rate * 2^bits), so the test
// is an integer compare (rate * 2^bits is exact in double).
template <int PerBlock> struct DropoutMaskOf {
  static_assert(PerBlock == 4 || PerBlock == 8, "four 24-bit or eight 16-bit draws a block");
  static constexpr int kBits = PerBlock == 4 ? 24 : 16;
  RngKey key;
  uint32_t threshold = 0;
  double keep_scale = 1;
  bool active = false;

  DropoutMaskOf(double rate, const RngKey &k) : key(k) {
    if (!(rate > 0))
      return;
    active = true;
    if (rate >= 1) {
      threshold = 1u << kBits; // above every draw: nothing is kept
      keep_scale = 0;
      return;
    }
    threshold = static_cast<uint32_t>(std::ceil(std::ldexp(rate, kBits)));
    keep_scale = 1.0 / (1.0 - rate);
  }

  // The draw of element `index` from its block's words.
  static uint32_t draw(const uint32_t words[4], uint64_t index) {
    if constexpr (PerBlock == 4)
      return words[index & 3] >> 8;
    else
      return (words[(index >> 1) & 3] >> (16 * (index & 1))) & 0xFFFFu;
  }

  // Calls fn(j, keep) for element first + j, j in [0, len), one Philox block
  // per PerBlock elements.
  template <class Fn> void for_each(int64_t len, uint64_t first, Fn &&fn) const {
    uint32_t words[4];
    uint64_t cached = std::numeric_limits<uint64_t>::max();
    for (int64_t j = 0; j < len; ++j) {
      uint64_t index = first + static_cast<uint64_t>(j);
      if (index / PerBlock != cached) {
        cached = index / PerBlock;
        philox_block(key, cached, words);
      }
      fn(j, draw(words, index) >= threshold);
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

using DropoutMask = DropoutMaskOf<4>;          // activations
using AttentionDropoutMask = DropoutMaskOf<8>; // attention probabilities

} // namespace mt::cpu::detail

#endif // MT_RUNTIME_CPU_KERNELS_INTERNAL_H
