// CUDA C for flash attention (see FlashAttentionGen.h): per-config
// constants, then fixed device code shared by the tensor-core and the fp32
// variants (selected by MT_FLASH_MMA), on top of CudaKernelGen's prelude.
#include "compiler/cuda/FlashAttentionGen.h"

#include "runtime/exec/cuda/launch_limits.h"

#include <cmath>
#include <cstdio>

namespace mt {
namespace {

// Fragment-level helpers: PTX wrappers, tile loads, the three warp GEMM
// shapes the algorithm needs, stores and dropout factors.
constexpr const char *kTileCode = R"mtcuda(// ---- PTX wrappers: tensor cores, ldmatrix and cp.async on the GPU; on a
// host build (the CUDA emulation of the unit tests) the same operations
// through its hooks or plain copies.
#if MT_FLASH_MMA
// Copies 16 bytes from global to shared memory without a register round trip.
__device__ __forceinline__ void mt_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__)
  asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %0;\n cvt.u32.u64 s, a;\n"
               " cp.async.cg.shared.global [s], [%1], 16;\n}\n" ::"l"(dst), "l"(src) : "memory");
#else
  *static_cast<mt_w4 *>(dst) = *static_cast<const mt_w4 *>(src);
#endif
}
// Waits for this thread's cp.async copies (a barrier then publishes them).
__device__ __forceinline__ void mt_cp_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
  // The host copies synchronously: nothing is in flight.
#endif
}
// Four 8x8 matrices of 16-bit elements; lane i gives row i % 8 of matrix i / 8.
template <bool Trans> __device__ __forceinline__ void mt_ldsm4(unsigned (&r)[4], const void *row) {
#if defined(__CUDA_ARCH__)
  if constexpr (Trans)
    asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %4;\n cvt.u32.u64 s, a;\n"
                 " ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [s];\n}\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
  else
    asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %4;\n cvt.u32.u64 s, a;\n"
                 " ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [s];\n}\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
#else
  mt_host_ldmatrix(r, 4, Trans, row);
#endif
}
// d += A B for one m16n8k16 tile (fp32 accumulation), fragments in PTX's layout.
__device__ __forceinline__ void mt_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__)
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.@MMA_TYPE@.@MMA_TYPE@.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  const unsigned b[2] = {b0, b1};
  mt_host_mma_@MMA_TYPE@_m16n8k16(d, a, b, d);
#endif
}
// Two floats as one 32-bit pair of storage elements (lo in the low half),
// rounded half to even.
__device__ __forceinline__ unsigned mt_pack(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm("cvt.rn.@MMA_TYPE@x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return @TO_STORAGE@(lo) | (@TO_STORAGE@(hi) << 16);
#endif
}
#endif

// ---- Warp tiles. A warp's accumulator tile is 16 x 8NT floats in the
// m16n8 layout: lane 4g + c holds acc[t][0..1] at row g, columns 8t + 2c and
// 8t + 2c + 1, and acc[t][2..3] at row g + 8. Shared tiles are row-major.

// Rows r0 .. r0 + R - 1 of a tensor whose row r starts at src + r * stride,
// into shared rows of kLd elements; rows at or past kSeq become zeros.
template <int R> __device__ __forceinline__ void mt_load_tile(mt_t *dst, const mt_t *src, mt_u64 stride, long long r0) {
#if MT_FLASH_MMA
  constexpr int kChunks = kD / 8; // 16-byte pieces per row
  for (int c = threadIdx.x; c < R * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    mt_t *d = dst + r * kLd + col;
    if (r0 + r < kSeq) {
      mt_cp16(d, src + (mt_u64)(r0 + r) * stride + col);
    } else {
      const mt_w4 zero = {{0u, 0u, 0u, 0u}};
      *reinterpret_cast<mt_w4 *>(d) = zero;
    }
  }
#else
  for (int c = threadIdx.x; c < R * kD; c += kThreads) {
    const int r = c / kD, col = c % kD;
    dst[r * kLd + col] = r0 + r < kSeq ? src[(mt_u64)(r0 + r) * stride + col] : 0.0f;
  }
#endif
}

#if MT_FLASH_MMA
// The A fragment of columns k0 .. k0 + 15 of a 16-row tile.
__device__ __forceinline__ void mt_afrag(unsigned (&a)[4], const mt_t *A, int lda, int k0) {
  const int lane = threadIdx.x & 31;
  mt_ldsm4<false>(a, A + (lane & 15) * lda + k0 + ((lane >> 4) << 3));
}
#endif

// acc[16 x 8NT] += A[16 x K] B[8NT x K]^T. A is the warp's 16 rows at A, or
// (AReg, tensor cores only) its fragments already in registers.
template <int NT, int K, bool AReg>
__device__ __forceinline__ void mt_gemm_nt(float (&acc)[NT][4], const unsigned (*areg)[4], const mt_t *A, int lda,
                                           const mt_t *B, int ldb) {
  const int lane = threadIdx.x & 31;
#if MT_FLASH_MMA
  static_assert(NT % 2 == 0 && K % 16 == 0, "tiles of n16 x k16");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned a[4];
    if constexpr (AReg) {
      for (int r = 0; r < 4; ++r) a[r] = areg[kk][r];
    } else {
      mt_afrag(a, A, lda, kk * 16);
    }
#pragma unroll
    for (int t = 0; t < NT; t += 2) {
      unsigned b[4];
      mt_ldsm4<false>(b, B + (8 * t + (lane & 7) + ((lane >> 4) << 3)) * ldb + kk * 16 + (((lane >> 3) & 1) << 3));
      mt_mma(acc[t], a, b[0], b[1]);
      mt_mma(acc[t + 1], a, b[2], b[3]);
    }
  }
#else
  const int g = lane >> 2, c = lane & 3;
  const mt_t *a0 = A + g * lda, *a1 = A + (g + 8) * lda;
  for (int k = 0; k < K; ++k) {
    const float x0 = a0[k], x1 = a1[k];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float y0 = B[(8 * t + 2 * c) * ldb + k], y1 = B[(8 * t + 2 * c + 1) * ldb + k];
      acc[t][0] = fmaf(x0, y0, acc[t][0]);
      acc[t][1] = fmaf(x0, y1, acc[t][1]);
      acc[t][2] = fmaf(x1, y0, acc[t][2]);
      acc[t][3] = fmaf(x1, y1, acc[t][3]);
    }
  }
#endif
}

// acc[16 x 8NT] += A[16 x K] B[K x 8NT], A the warp's 16 rows, B row-major.
template <int NT, int K>
__device__ __forceinline__ void mt_gemm_nn(float (&acc)[NT][4], const mt_t *A, int lda, const mt_t *B, int ldb) {
  const int lane = threadIdx.x & 31;
#if MT_FLASH_MMA
  static_assert(NT % 2 == 0 && K % 16 == 0, "tiles of n16 x k16");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned a[4];
    mt_afrag(a, A, lda, kk * 16);
#pragma unroll
    for (int t = 0; t < NT; t += 2) {
      unsigned b[4];
      mt_ldsm4<true>(b, B + (kk * 16 + (lane & 15)) * ldb + 8 * t + ((lane >> 4) << 3));
      mt_mma(acc[t], a, b[0], b[1]);
      mt_mma(acc[t + 1], a, b[2], b[3]);
    }
  }
#else
  const int g = lane >> 2, c = lane & 3;
  for (int k = 0; k < K; ++k) {
    const float x0 = A[g * lda + k], x1 = A[(g + 8) * lda + k];
    const mt_t *b = B + k * ldb;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float y0 = b[8 * t + 2 * c], y1 = b[8 * t + 2 * c + 1];
      acc[t][0] = fmaf(x0, y0, acc[t][0]);
      acc[t][1] = fmaf(x0, y1, acc[t][1]);
      acc[t][2] = fmaf(x1, y0, acc[t][2]);
      acc[t][3] = fmaf(x1, y1, acc[t][3]);
    }
  }
#endif
}

// acc[16 x 8NT] += P[16 x 8KP] B[8KP x 8NT]: P an accumulator tile in
// registers (the probabilities), B row-major in shared memory.
template <int NT, int KP>
__device__ __forceinline__ void mt_gemm_rn(float (&acc)[NT][4], const float (&p)[KP][4], const mt_t *B, int ldb) {
  const int lane = threadIdx.x & 31;
#if MT_FLASH_MMA
  static_assert(NT % 2 == 0 && KP % 2 == 0, "tiles of n16 x k16");
  // Two accumulator tiles side by side are one A fragment (k16).
#pragma unroll
  for (int kk = 0; kk < KP / 2; ++kk) {
    const unsigned a[4] = {mt_pack(p[2 * kk][0], p[2 * kk][1]), mt_pack(p[2 * kk][2], p[2 * kk][3]),
                           mt_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), mt_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int t = 0; t < NT; t += 2) {
      unsigned b[4];
      mt_ldsm4<true>(b, B + (kk * 16 + (lane & 15)) * ldb + 8 * t + ((lane >> 4) << 3));
      mt_mma(acc[t], a, b[0], b[1]);
      mt_mma(acc[t + 1], a, b[2], b[3]);
    }
  }
#else
  // A row of P is spread over the four lanes of a quad: take each lane's
  // part in turn.
  const int c = lane & 3;
#pragma unroll
  for (int kt = 0; kt < KP; ++kt) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float p00 = __shfl_xor_sync(0xFFFFFFFFu, p[kt][0], m), p01 = __shfl_xor_sync(0xFFFFFFFFu, p[kt][1], m);
      const float p10 = __shfl_xor_sync(0xFFFFFFFFu, p[kt][2], m), p11 = __shfl_xor_sync(0xFFFFFFFFu, p[kt][3], m);
      const mt_t *b0 = B + (8 * kt + 2 * (c ^ m)) * ldb, *b1 = b0 + ldb;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float y00 = b0[8 * t + 2 * c], y01 = b0[8 * t + 2 * c + 1];
        const float y10 = b1[8 * t + 2 * c], y11 = b1[8 * t + 2 * c + 1];
        acc[t][0] = fmaf(p01, y10, fmaf(p00, y00, acc[t][0]));
        acc[t][1] = fmaf(p01, y11, fmaf(p00, y01, acc[t][1]));
        acc[t][2] = fmaf(p11, y10, fmaf(p10, y00, acc[t][2]));
        acc[t][3] = fmaf(p11, y11, fmaf(p10, y01, acc[t][3]));
      }
    }
  }
#endif
}

// Two consecutive elements of an output row, rounded to the storage type.
__device__ __forceinline__ void mt_store2(float *p, float a, float b) { p[0] = a; p[1] = b; }
__device__ __forceinline__ void mt_store2(mt_bf16 *p, float a, float b) {
  *reinterpret_cast<unsigned *>(p) = mt_to_bf16(a) | (mt_to_bf16(b) << 16);
}
__device__ __forceinline__ void mt_store2(mt_f16 *p, float a, float b) {
  *reinterpret_cast<unsigned *>(p) = mt_to_f16(a) | (mt_to_f16(b) << 16);
}
__device__ __forceinline__ void mt_store1(float *p, float a) { *p = a; }
__device__ __forceinline__ void mt_store1(mt_bf16 *p, float a) { p->bits = (unsigned short)mt_to_bf16(a); }
__device__ __forceinline__ void mt_store1(mt_f16 *p, float a) { p->bits = (unsigned short)mt_to_f16(a); }

// p[0] += a and p[1] += b atomically (p 8-byte aligned): one vector
// reduction on sm_90 (half the L2 atomic requests of two), two before.
__device__ __forceinline__ void mt_red2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// 2^x for the softmax: on the GPU one MUFU.EX2 (ex2.approx.ftz, the
// instruction exp2f runs, without exp2f's rescaling around it for results
// below 2^-126, which this flushes to 0: three instructions and a predicate
// less per probability); the host's exp2f in the emulation.
__device__ __forceinline__ float mt_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Attention's dropout mask (runtime/exec/cpu_kernels_internal.h's
// AttentionDropoutMask): element e draws the 16-bit half e % 2 of word
// (e / 2) % 4 of Philox block e / 8 and is kept when that half >= kThreshold.
__device__ __forceinline__ unsigned mt_word(const unsigned (&w)[4], mt_u64 k) {
  return (k & 3) == 0 ? w[0] : (k & 3) == 1 ? w[1] : (k & 3) == 2 ? w[2] : w[3];
}
// Half k (0 .. 7) of a block's words.
__device__ __forceinline__ unsigned mt_half(const unsigned (&w)[4], unsigned k) {
  return (mt_word(w, k >> 1) >> (16 * (k & 1))) & 0xFFFFu;
}
__device__ __forceinline__ float mt_keep1(mt_u64 e, mt_u64 seed, mt_u64 stream, mt_u64 offset) {
  unsigned w[4];
  mt_philox(e >> 3, seed, stream, offset, w);
  return mt_half(w, (unsigned)(e & 7)) >= kThreshold ? kKeepScale : 0.0f;
}
// Elements e and e + 1: one Philox block unless they straddle two.
__device__ __forceinline__ void mt_keep2(mt_u64 e, mt_u64 seed, mt_u64 stream, mt_u64 offset, float &f0, float &f1) {
  unsigned w[4];
  mt_philox(e >> 3, seed, stream, offset, w);
  f0 = mt_half(w, (unsigned)(e & 7)) >= kThreshold ? kKeepScale : 0.0f;
  if (((e + 1) & 7) == 0) mt_philox((e >> 3) + 1, seed, stream, offset, w);
  f1 = mt_half(w, (unsigned)((e + 1) & 7)) >= kThreshold ? kKeepScale : 0.0f;
}

// The keep bits of a forward lane's elements in two key columns of 8 (t =
// 2p and 2p + 1) of its slab, rows rw and rw + 8, with seq a multiple of 8:
// each Philox block is one row's eight columns of one t, held as four pairs
// by the quad's lanes c = 0 .. 3. Lane c draws the block of row rw + 8 (c & 1)
// at t = 2p + (c >> 1), and the quad transposes the 4 x 4 words with
// shuffles: one call per eight elements, every draw used. Bit 4 (t & 1) +
// 2 r + k is element (row rw + 8 r, column 8 t + 2 c + k).
__device__ __forceinline__ unsigned mt_fwd_keep_bits(mt_u64 maskRow, long long col, int c, mt_u64 seed,
                                                     mt_u64 stream, mt_u64 offset) {
  // maskRow: the mask index of (rw, 0); col: the first column of t = 2p.
  unsigned w[4];
  mt_philox((maskRow + (mt_u64)(c & 1) * 8 * (mt_u64)kSeq + (mt_u64)(col + 8 * (c >> 1))) >> 3, seed, stream,
            offset, w);
  unsigned bits = 0;
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    // From lane c ^ x: word c of its block (it sends word (its c) ^ x).
    const unsigned mine = mt_word(w, (mt_u64)(c ^ x));
    const unsigned got = x == 0 ? mine : __shfl_xor_sync(0xFFFFFFFFu, mine, x);
    const unsigned from = (unsigned)(c ^ x);
    const unsigned keep = ((got & 0xFFFFu) >= kThreshold ? 1u : 0u) | ((got >> 16) >= kThreshold ? 2u : 0u);
    bits |= keep << (2 * from);
  }
  return bits;
}

// The keep bits of a backward lane's 4 TT elements in TT query columns of
// 8 (t = TT G .. TT G + TT - 1; TT is 4, or 2 for a query tile of 16), its
// keys j0 and j0 + 8 (jw: the warp's first key, j0 = jw + g), with seq a
// multiple of 8: each Philox block is eight keys (jw .. jw + 7 or jw + 8 ..
// jw + 15) of one query, one key a lane of the eight lanes g = 0 .. 7 that
// share c. Each of them draws TT / 2 of the 4 TT blocks (slot e = g & 3 of
// t = TT G + (g >> 2), and with TT 4 also of t + 2) and the eight trade
// halves in seven shuffles. Bit 4 (t % TT) + e is the element in slot e of
// t (query 8 t + 2 c + (e & 1), key j0 + 8 (e >> 1)).
template <int TT>
__device__ __forceinline__ unsigned mt_bwd_keep_bits(mt_u64 maskHead, long long m0, long long jw, int G, int g,
                                                     int c, mt_u64 seed, mt_u64 stream, mt_u64 offset) {
  static_assert(TT == 2 || TT == 4, "two or four query columns of 8");
  const int e = g & 3;
  const long long i = m0 + 8 * (TT * G + (g >> 2)) + 2 * c + (e & 1), key = jw + 8 * (e >> 1);
  unsigned a[4], b[4] = {0u, 0u, 0u, 0u};
  mt_philox(((maskHead + (mt_u64)i) * kSeq + (mt_u64)key) >> 3, seed, stream, offset, a);
  if constexpr (TT == 4) mt_philox(((maskHead + (mt_u64)(i + 16)) * kSeq + (mt_u64)key) >> 3, seed, stream, offset, b);
  unsigned bits = 0;
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    // From lane g ^ x: half g of its blocks (it sends half (its g) ^ x).
    const unsigned k = (unsigned)(g ^ x);
    const unsigned mine = mt_half(a, k) | (TT == 4 ? mt_half(b, k) << 16 : 0u);
    const unsigned got = x == 0 ? mine : __shfl_xor_sync(0xFFFFFFFFu, mine, 4 * x);
    unsigned keep = (got & 0xFFFFu) >= kThreshold ? 1u : 0u;
    if constexpr (TT == 4) keep |= (got >> 16) >= kThreshold ? 0x100u : 0u;
    bits |= keep << k;
  }
  return bits;
}
)mtcuda";

// The forward kernel.
constexpr const char *kForwardCode = R"mtcuda(// ---- Forward: one CTA per (query block, head, batch); each warp owns
// kSlabs slabs of 16 query rows (slab sl of warp w: rows (sl * kW + w) * 16
// of the block) and walks the key/value tiles with an online softmax in
// log2 units (x = scale * log2(e) * q . k). With two slabs every K and V
// fragment read from shared memory serves two tensor-core products.

#if MT_FLASH_MMA
// acc[sl] += A_sl B^T for the warp's slabs, A's fragments in registers.
template <int S, int NT, int K>
__device__ __forceinline__ void mt_gemm_nt_slabs(float (&acc)[S][NT][4], const unsigned (&areg)[S][K / 16][4],
                                                 const mt_t *B, int ldb) {
  const int lane = threadIdx.x & 31;
  static_assert(NT % 2 == 0 && K % 16 == 0, "tiles of n16 x k16");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int t = 0; t < NT; t += 2) {
      unsigned b[4];
      mt_ldsm4<false>(b, B + (8 * t + (lane & 7) + ((lane >> 4) << 3)) * ldb + kk * 16 + (((lane >> 3) & 1) << 3));
#pragma unroll
      for (int sl = 0; sl < S; ++sl) {
        mt_mma(acc[sl][t], areg[sl][kk], b[0], b[1]);
        mt_mma(acc[sl][t + 1], areg[sl][kk], b[2], b[3]);
      }
    }
}

// acc[sl] += P_sl B for the warp's slabs: P accumulator tiles in registers,
// B row-major in shared memory.
template <int S, int NT, int KP>
__device__ __forceinline__ void mt_gemm_rn_slabs(float (&acc)[S][NT][4], const float (&p)[S][KP][4], const mt_t *B,
                                                 int ldb) {
  const int lane = threadIdx.x & 31;
  static_assert(NT % 2 == 0 && KP % 2 == 0, "tiles of n16 x k16");
#pragma unroll
  for (int kk = 0; kk < KP / 2; ++kk) {
    unsigned a[S][4];
#pragma unroll
    for (int sl = 0; sl < S; ++sl) {
      a[sl][0] = mt_pack(p[sl][2 * kk][0], p[sl][2 * kk][1]);
      a[sl][1] = mt_pack(p[sl][2 * kk][2], p[sl][2 * kk][3]);
      a[sl][2] = mt_pack(p[sl][2 * kk + 1][0], p[sl][2 * kk + 1][1]);
      a[sl][3] = mt_pack(p[sl][2 * kk + 1][2], p[sl][2 * kk + 1][3]);
    }
#pragma unroll
    for (int t = 0; t < NT; t += 2) {
      unsigned b[4];
      mt_ldsm4<true>(b, B + (kk * 16 + (lane & 15)) * ldb + 8 * t + ((lane >> 4) << 3));
#pragma unroll
      for (int sl = 0; sl < S; ++sl) {
        mt_mma(acc[sl][t], a[sl], b[0], b[1]);
        mt_mma(acc[sl][t + 1], a[sl], b[2], b[3]);
      }
    }
  }
}
#endif

__device__ __forceinline__ void mt_flash_fwd(const mt_t *q, const mt_t *k, const mt_t *v, mt_t *out, float *lse,
                                             mt_u64 seed, mt_u64 offset, mt_u64 stream, mt_u64 head0, mt_t *smem) {
  const float inf = __uint_as_float(0x7F800000u);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const long long m0 = (long long)blockIdx.x * kBr;
  const int h = blockIdx.y;
  const mt_u64 b = blockIdx.z;
  const mt_t *qb = q + (b * kSeq * kHeads + h) * kD;
  const mt_u64 kvOff = (b * kSeq * kGroups + h / kHeadsPerGroup) * kD;
  const mt_t *kb = k + kvOff, *vb = v + kvOff;
  mt_t *sK = smem, *sV = smem + kBc * kLd;
#if MT_FLASH_MMA
  static_assert(kBr <= 2 * kBc, "Q's staging fits the K and V tiles");
  mt_t *sQ = smem; // staged through the K/V buffers, then held as A fragments
#else
  static_assert(kSlabs == 1, "the fp32 kernel has one slab a warp");
  mt_t *sQ = smem + 2 * kBc * kLd;
#endif
  mt_load_tile<kBr>(sQ, qb, kQStride, m0);
#if MT_FLASH_MMA
  mt_cp_wait();
  __syncthreads();
  unsigned qa[kSlabs][kD / 16][4];
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl)
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) mt_afrag(qa[sl][kk], sQ + (sl * kW + warp) * 16 * kLd, kLd, kk * 16);
  __syncthreads(); // every warp has its Q before K overwrites the staging
#endif
  const long long nEnd = kCausal && m0 + kBr < kSeq ? m0 + kBr : kSeq;
  const int nTiles = (int)((nEnd + kBc - 1) / kBc);
  mt_load_tile<kBc>(sK, kb, kKStride, 0);

  float o[kSlabs][kD / 8][4];
  float s[kSlabs][kBc / 8][4];
  float mx[kSlabs][2], l[kSlabs][2];
  long long first[kSlabs], row0[kSlabs]; // a slab's first row; this lane's rows: row0, row0 + 8
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl) {
#pragma unroll
    for (int t = 0; t < kD / 8; ++t) o[sl][t][0] = o[sl][t][1] = o[sl][t][2] = o[sl][t][3] = 0.0f;
    mx[sl][0] = mx[sl][1] = -inf;
    l[sl][0] = l[sl][1] = 0.0f;
    first[sl] = m0 + (sl * kW + warp) * 16;
    row0[sl] = first[sl] + g;
  }
  const mt_u64 maskHead = (b * kTotalHeads + head0 + h) * kSeq;
  for (int tile = 0; tile < nTiles; ++tile) {
    const long long n0 = (long long)tile * kBc;
#if MT_FLASH_MMA
    mt_cp_wait();
#endif
    __syncthreads(); // K tile `tile` is in; every warp is done with the last V tile
    mt_load_tile<kBc>(sV, vb, kKStride, n0);
#pragma unroll
    for (int sl = 0; sl < kSlabs; ++sl)
#pragma unroll
      for (int t = 0; t < kBc / 8; ++t) s[sl][t][0] = s[sl][t][1] = s[sl][t][2] = s[sl][t][3] = 0.0f;
#if MT_FLASH_MMA
    mt_gemm_nt_slabs<kSlabs, kBc / 8, kD>(s, qa, sK, kLd);
#else
    mt_gemm_nt<kBc / 8, kD, false>(s[0], nullptr, sQ + warp * 16 * kLd, kLd, sK, kLd);
#endif

#pragma unroll
    for (int sl = 0; sl < kSlabs; ++sl) {
      // Scale; mask (causal and past seq) only in a tile that reaches past
      // the slab's first row or the end of seq: the same for the whole warp.
      const bool edge = n0 + kBc > kSeq || (kCausal && n0 + kBc - 1 > first[sl]);
      float tmax[2] = {-inf, -inf};
#pragma unroll
      for (int t = 0; t < kBc / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[sl][t][e] * kScaleLog2;
          if (edge) {
            // Positions in 32 bits (seq < 2^30): one compare each.
            const int i = (int)row0[sl] + 8 * (e >> 1), j = (int)n0 + 8 * t + 2 * c + (e & 1);
            if (j >= (int)kSeq || (kCausal && j > i)) x = -inf;
          }
          s[sl][t][e] = x;
          tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
        }
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xFFFFFFFFu, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xFFFFFFFFu, tmax[r], 2));
        const float mnew = fmaxf(mx[sl][r], tmax[r]);
        base[r] = mnew == -inf ? 0.0f : mnew; // a row with nothing unmasked yet stays at 0
        const float alpha = mt_exp2(mx[sl][r] - base[r]);
        mx[sl][r] = mnew;
        l[sl][r] *= alpha;
#pragma unroll
        for (int t = 0; t < kD / 8; ++t) {
          o[sl][t][2 * r] *= alpha;
          o[sl][t][2 * r + 1] *= alpha;
        }
      }
      // The softmax's sums take the probabilities before dropout.
#pragma unroll
      for (int t = 0; t < kBc / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = mt_exp2(s[sl][t][e] - base[e >> 1]);
          l[sl][e >> 1] += p;
          s[sl][t][e] = p;
        }
      const long long rw = row0[sl];
      if constexpr (kDropout && kSeq % 8 == 0) {
        // Eight columns of one row a Philox block, the quad's lanes trading
        // words (mt_fwd_keep_bits): one call per eight elements.
#pragma unroll
        for (int p = 0; p < kBc / 16; ++p) {
          static_assert(kBc % 16 == 0, "key tiles of whole pairs of 8 columns");
          const unsigned bits =
              mt_fwd_keep_bits((maskHead + (mt_u64)rw) * kSeq, n0 + 16 * p, c, seed, stream, offset);
          // No guards: a column past seq holds 0 already, and a row past
          // seq is never stored.
#pragma unroll
          for (int tt = 0; tt < 2; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[sl][2 * p + tt][e] *= (bits >> (4 * tt + e)) & 1u ? kKeepScale : 0.0f;
        }
      } else if constexpr (kDropout) { // rows not 8-aligned in the mask: a block may straddle two
#pragma unroll
        for (int t = 0; t < kBc / 8; ++t)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const long long i = rw + 8 * r, j = n0 + 8 * t + 2 * c;
            if (i < kSeq && j < kSeq) {
              float f0, f1;
              mt_keep2((maskHead + (mt_u64)i) * kSeq + (mt_u64)j, seed, stream, offset, f0, f1);
              s[sl][t][2 * r] *= f0;
              s[sl][t][2 * r + 1] *= f1;
            }
          }
      }
    }
#if MT_FLASH_MMA
    mt_cp_wait();
#endif
    __syncthreads(); // V tile `tile` is in; every warp is done with this K tile
    if (tile + 1 < nTiles) mt_load_tile<kBc>(sK, kb, kKStride, n0 + kBc);
#if MT_FLASH_MMA
    mt_gemm_rn_slabs<kSlabs, kD / 8, kBc / 8>(o, s, sV, kLd);
#else
    mt_gemm_rn<kD / 8, kBc / 8>(o[0], s[0], sV, kLd);
#endif
  }

  // out = o / l; lse in natural log.
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[sl][r] += __shfl_xor_sync(0xFFFFFFFFu, l[sl][r], 1);
      l[sl][r] += __shfl_xor_sync(0xFFFFFFFFu, l[sl][r], 2);
      const long long i = row0[sl] + 8 * r;
      if (i < kSeq) {
        const float inv = 1.0f / l[sl][r];
        mt_t *orow = out + (b * kSeq + (mt_u64)i) * kQStride + h * kD + 2 * c;
#pragma unroll
        for (int t = 0; t < kD / 8; ++t) mt_store2(orow + 8 * t, o[sl][t][2 * r] * inv, o[sl][t][2 * r + 1] * inv);
        if (c == 0) lse[(b * kHeads + h) * kSeq + (mt_u64)i] = (mx[sl][r] + log2f(l[sl][r])) * kLn2;
      }
    }
}

extern "C" __global__ void __launch_bounds__(kThreads)
@ENTRY_FWD@(const mt_t *q, const mt_t *k, const mt_t *v, mt_t *out, float *lse@SCALARS@) {
  extern __shared__ mt_w4 mt_smem[];
  mt_flash_fwd(q, k, v, out, lse, @RNG@, reinterpret_cast<mt_t *>(mt_smem));
}
)mtcuda";

// The backward: its first kernel (delta), the kv64 main kernel and the last
// kernel (dq), kept as three pieces so that the kv128 variant shares the
// first and the last; the kv64 source is the three in this order.
constexpr const char *kBackwardDotCode = R"mtcuda(// ---- Backward, 1: delta = rowsum(dout * out) per (b, i, h), one warp a
// row, and dq_accum's row cleared.
extern "C" __global__ void __launch_bounds__(128)
@ENTRY_DOT@(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, const mt_t *out, const float *lse,
            mt_t *dq, mt_t *dk, mt_t *dv, float *dq_accum, float *delta@SCALARS@) {
  const mt_u64 row = (mt_u64)blockIdx.x * 4 + (threadIdx.x >> 5); // (b * seq + i) * heads + h
  if (row >= kBatch * kSeq * kHeads) return;
  const int lane = threadIdx.x & 31;
  constexpr int V = kD / 32;
  float x[V], y[V], zero[V];
  mt_load<V>(dout, row * kD + lane * V, x);
  mt_load<V>(out, row * kD + lane * V, y);
  float sum = 0.0f;
#pragma unroll
  for (int l = 0; l < V; ++l) {
    sum = fmaf(x[l], y[l], sum);
    zero[l] = 0.0f;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  mt_store<V>(dq_accum, row * kD + lane * V, zero);
  if (lane == 0) {
    const mt_u64 h = row % kHeads, bi = row / kHeads;
    delta[(bi / kSeq * kHeads + h) * kSeq + bi % kSeq] = sum;
  }
}

)mtcuda";

// The backward's main kernel, kv64 (the default).
constexpr const char *kBackwardMainCode = R"mtcuda(// ---- Backward, 2: one CTA per (key block, group, batch); each warp owns 16
// key rows and keeps their dK and dV in registers over every query block of
// every head of the group. P is recomputed from q, k and lse (log2 units);
// dS goes through shared memory for dQ = dS K, added to dq_accum.
__device__ __forceinline__ void mt_flash_bwd(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v,
                                             const float *lse, mt_t *dk, mt_t *dv, float *dq_accum,
                                             const float *delta, mt_u64 seed, mt_u64 offset, mt_u64 stream,
                                             mt_u64 head0, mt_t *smem) {
  const float inf = __uint_as_float(0x7F800000u);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const long long n0 = (long long)blockIdx.x * kBc;
  const int grp = blockIdx.y;
  const mt_u64 b = blockIdx.z;
  const mt_u64 kvOff = (b * kSeq * kGroups + grp) * kD;
  mt_t *sK = smem;
#if MT_FLASH_MMA
  mt_t *sQ = sK + kBc * kLd;
#else
  mt_t *sV = sK + kBc * kLd;
  mt_t *sQ = sV + kBc * kLd;
#endif
  mt_t *sdO = sQ + kBr * kLd;
  mt_t *sdS = sdO + kBr * kLd; // [query][key]
  float *sLse = reinterpret_cast<float *>(sdS + kBr * kLdS), *sDelta = sLse + kBr;

#if MT_FLASH_MMA
  // V's 16 rows of this warp as A fragments for dP^T = V dO^T, staged
  // through the Q/dO buffers (the first iteration's barrier guards them).
  static_assert(kBc <= 2 * kBr, "V's staging fits the Q and dO tiles");
  mt_load_tile<kBc>(sQ, v + kvOff, kKStride, n0);
  mt_cp_wait();
  __syncthreads();
  unsigned va[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) mt_afrag(va[kk], sQ + warp * 16 * kLd, kLd, kk * 16);
  const mt_t *sVw = nullptr;
#else
  mt_load_tile<kBc>(sV, v + kvOff, kKStride, n0);
  const unsigned (*va)[4] = nullptr;
  const mt_t *sVw = sV + warp * 16 * kLd;
#endif
  mt_load_tile<kBc>(sK, k + kvOff, kKStride, n0);

  float dK[kD / 8][4], dV[kD / 8][4];
#pragma unroll
  for (int t = 0; t < kD / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[t][e] = dV[t][e] = 0.0f;
  float s[kBr / 8][4], pd[kBr / 8][4], dp[kBr / 8][4];
  const long long j0 = n0 + warp * 16 + g; // this lane's key rows: j0, j0 + 8
  const long long mStart = kCausal ? n0 / kBr * kBr : 0;
  constexpr int kDqSlabs = kBr / 16, kChunk = kD / (kW / kDqSlabs); // dQ: 16-row slab x kChunk columns a warp
  static_assert(kW % kDqSlabs == 0, "warps split dQ's rows evenly");
  const int slab = warp % kDqSlabs, chunk = warp / kDqSlabs;
  for (int hh = 0; hh < kHeadsPerGroup; ++hh) {
    const mt_u64 h = (mt_u64)grp * kHeadsPerGroup + hh;
    const mt_u64 qOff = (b * kSeq * kHeads + h) * kD;
    const mt_u64 rowOff = (b * kHeads + h) * kSeq; // lse, delta
    const mt_u64 maskHead = (b * kTotalHeads + head0 + h) * kSeq;
    for (long long m0 = mStart; m0 < kSeq; m0 += kBr) {
      __syncthreads(); // every warp is done with the last Q, dO and dS tiles
      mt_load_tile<kBr>(sQ, q + qOff, kQStride, m0);
      mt_load_tile<kBr>(sdO, dout + qOff, kQStride, m0);
      for (int r = threadIdx.x; r < kBr; r += kThreads) {
        const long long i = m0 + r;
        sLse[r] = i < kSeq ? lse[rowOff + (mt_u64)i] * kLog2e : inf;
        sDelta[r] = i < kSeq ? delta[rowOff + (mt_u64)i] : 0.0f;
      }
#if MT_FLASH_MMA
      mt_cp_wait();
#endif
      __syncthreads();

      // Only a block that reaches past seq or, causal, has a query before
      // one of this warp's keys masks anything: the same for the whole warp.
      const bool edge = m0 + kBr > kSeq || n0 + warp * 16 + 16 > kSeq || (kCausal && n0 + warp * 16 + 15 > m0);
      // S^T = K Q^T: rows are this warp's keys, columns the block's queries.
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = dp[t][e] = 0.0f;
      mt_gemm_nt<kBr / 8, kD, false>(s, nullptr, sK + warp * 16 * kLd, kLd, sQ, kLd);
      // The dropout keep bits of this lane's elements (mt_bwd_keep_bits):
      // with rows 8-aligned in the mask, one Philox call per eight elements.
      constexpr int kTT = kBr % 32 == 0 ? 4 : 2;
      static_assert(kBr % (8 * kTT) == 0, "query tiles of whole groups of column blocks");
      unsigned keep[kBr / (8 * kTT)];
      if constexpr (kDropout && kSeq % 8 == 0) {
#pragma unroll
        for (int G = 0; G < kBr / (8 * kTT); ++G)
          keep[G] = mt_bwd_keep_bits<kTT>(maskHead, m0, n0 + warp * 16, G, g, c, seed, stream, offset);
      }
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int il = 8 * t + 2 * c + (e & 1);
          const int i = (int)m0 + il, j = (int)j0 + 8 * (e >> 1); // 32 bits: seq < 2^30
          const bool valid = !edge || (i < (int)kSeq && j < (int)kSeq && (!kCausal || j <= i));
          const float p = valid ? mt_exp2(s[t][e] * kScaleLog2 - sLse[il]) : 0.0f;
          s[t][e] = p;
          pd[t][e] = p;
          if constexpr (kDropout && kSeq % 8 == 0) {
            pd[t][e] = (keep[t / kTT] >> (4 * (t % kTT) + e)) & 1u ? p * kKeepScale : 0.0f;
          } else if constexpr (kDropout) {
            if (valid) pd[t][e] = p * mt_keep1((maskHead + (mt_u64)i) * kSeq + (mt_u64)j, seed, stream, offset);
          }
        }
      }
      // dV += Pd^T dO (Pd: the probabilities after dropout).
      mt_gemm_rn<kD / 8, kBr / 8>(dV, pd, sdO, kLd);
      // dPd^T = V dO^T; dS = P * (dPd * mask - delta), where P * mask = Pd.
      mt_gemm_nt<kBr / 8, kD, kMMA>(dp, va, sVw, kLd, sdO, kLd);
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = sDelta[8 * t + 2 * c + (e & 1)];
          if constexpr (kDropout)
            s[t][e] = pd[t][e] * dp[t][e] - s[t][e] * d;
          else
            s[t][e] = s[t][e] * (dp[t][e] - d);
        }
      // dK += dS^T Q (times scale at the end).
      mt_gemm_rn<kD / 8, kBr / 8>(dK, s, sQ, kLd);
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          mt_store1(sdS + (8 * t + 2 * c + (e & 1)) * kLdS + warp * 16 + g + 8 * (e >> 1), s[t][e]);
      __syncthreads();
      // dQ += dS K over this key block: each warp one slab x chunk of it.
      float dqa[kChunk / 8][4];
#pragma unroll
      for (int t = 0; t < kChunk / 8; ++t) dqa[t][0] = dqa[t][1] = dqa[t][2] = dqa[t][3] = 0.0f;
      mt_gemm_nn<kChunk / 8, kBc>(dqa, sdS + slab * 16 * kLdS, kLdS, sK + chunk * kChunk, kLd);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const long long i = m0 + slab * 16 + g + 8 * r;
        if (i < kSeq) {
          float *row = dq_accum + qOff + (mt_u64)i * kQStride + chunk * kChunk + 2 * c;
#pragma unroll
          for (int t = 0; t < kChunk / 8; ++t) mt_red2(row + 8 * t, dqa[t][2 * r], dqa[t][2 * r + 1]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long j = j0 + 8 * r;
    if (j < kSeq) {
      const mt_u64 at = kvOff + (mt_u64)j * kKStride + 2 * c;
#pragma unroll
      for (int t = 0; t < kD / 8; ++t) {
        mt_store2(dk + at + 8 * t, dK[t][2 * r] * kScale, dK[t][2 * r + 1] * kScale);
        mt_store2(dv + at + 8 * t, dV[t][2 * r], dV[t][2 * r + 1]);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads)
@ENTRY_MAIN@(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, const mt_t *out, const float *lse,
             mt_t *dq, mt_t *dk, mt_t *dv, float *dq_accum, float *delta@SCALARS@) {
  extern __shared__ mt_w4 mt_smem[];
  mt_flash_bwd(dout, q, k, v, lse, dk, dv, dq_accum, delta, @RNG@, reinterpret_cast<mt_t *>(mt_smem));
}

)mtcuda";

// The backward's last kernel.
constexpr const char *kBackwardDqCode = R"mtcuda(// ---- Backward, 3: dq = scale * dq_accum in the storage type.
extern "C" __global__ void __launch_bounds__(256)
@ENTRY_DQ@(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, const mt_t *out, const float *lse,
           mt_t *dq, mt_t *dk, mt_t *dv, float *dq_accum, float *delta@SCALARS@) {
  const mt_u64 i = ((mt_u64)blockIdx.x * 256 + threadIdx.x) * 4;
  if (i >= kBatch * kSeq * kHeads * kD) return;
  float x[4];
  mt_load<4>(dq_accum, i, x);
#pragma unroll
  for (int l = 0; l < 4; ++l) x[l] *= kScale;
  mt_store<4>(dq, i, x);
}
)mtcuda";

// The backward's main kernel, kv128: twice kv64's key rows a CTA and the
// next query tile copied while this one is computed.
constexpr const char *kBackwardMainKv128Code = R"mtcuda(// ---- Backward, 2 (kv128): one CTA per (key block, group, batch), each
// warp with 16 key rows whose dK and dV stay in registers over every query
// tile of every head of the group, as kv64, but with kBc = 16 kW = 128 key
// rows a CTA in 16 bits (8 warps): each Q and dO tile taken into shared
// memory serves twice the keys, and dq_accum gets half the atomic adds.
// The query tiles (Q, dO, lse, delta) are double-buffered: tile it + 1 is
// copied (cp.async) into the other stage while tile it is computed, so the
// copies overlap the products (two stages are over 48 KiB of shared memory:
// the launch opts in). K stays in shared memory for dQ = dS K and, at head
// dim 64, also as this warp's A fragments for S^T = K Q^T. A warp whose keys
// all follow every query of a tile (causal) or lie past seq skips the
// tile's products: its P and dS are zero, and so are its columns of dS.

// A float copied into shared memory: cp.async on the GPU (waited for with
// the tiles), a plain copy on the host and in the fp32 kernel.
__device__ __forceinline__ void mt_cp4(float *dst, const float *src) {
#if MT_FLASH_MMA && defined(__CUDA_ARCH__)
  asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %0;\n cvt.u32.u64 s, a;\n"
               " cp.async.ca.shared.global [s], [%1], 4;\n}\n" ::"l"(dst), "l"(src) : "memory");
#else
  *dst = *src;
#endif
}

__device__ __forceinline__ void mt_flash_bwd(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v,
                                             const float *lse, mt_t *dk, mt_t *dv, float *dq_accum,
                                             const float *delta, mt_u64 seed, mt_u64 offset, mt_u64 stream,
                                             mt_u64 head0, mt_t *smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const long long n0 = (long long)blockIdx.x * kBc;
  const int grp = blockIdx.y;
  const mt_u64 b = blockIdx.z;
  const mt_u64 kvOff = (b * kSeq * kGroups + grp) * kD;
  // Shared: K; (fp32: V); two stages of [Q; dO]; dS [query][key]; two
  // stages of [lse; delta] (lse in natural log, as the forward wrote it).
  mt_t *sK = smem;
#if MT_FLASH_MMA
  mt_t *sStage = sK + kBc * kLd;
#else
  mt_t *sV = sK + kBc * kLd;
  mt_t *sStage = sV + kBc * kLd;
#endif
  mt_t *sdS = sStage + 4 * kBr * kLd;
  float *sRows = reinterpret_cast<float *>(sdS + kBr * kLdS);

  const long long kw = n0 + warp * 16; // this warp's first key
  const long long j0 = kw + g;         // this lane's key rows: j0, j0 + 8
  const long long mStart = kCausal ? n0 / kBr * kBr : 0;
  const int nTiles = (int)((kSeq - mStart + kBr - 1) / kBr); // query tiles a head
  const int total = (int)kHeadsPerGroup * nTiles;

#if MT_FLASH_MMA
  // V's 16 rows of this warp (and K's at head dim 64) as A fragments, V
  // staged through the two stages before the first query tile is copied.
  static_assert(kBc <= 4 * kBr, "V's staging fits the two stages");
  constexpr bool kKReg = kD == 64;
  mt_load_tile<kBc>(sStage, v + kvOff, kKStride, n0);
  mt_load_tile<kBc>(sK, k + kvOff, kKStride, n0);
  mt_cp_wait();
  __syncthreads();
  unsigned va[kD / 16][4], ka[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    mt_afrag(va[kk], sStage + warp * 16 * kLd, kLd, kk * 16);
    if constexpr (kKReg) mt_afrag(ka[kk], sK + warp * 16 * kLd, kLd, kk * 16);
  }
  const mt_t *sVw = nullptr;
  __syncthreads(); // every warp has its V before the stages take query tiles
#else
  constexpr bool kKReg = false;
  mt_load_tile<kBc>(sV, v + kvOff, kKStride, n0);
  mt_load_tile<kBc>(sK, k + kvOff, kKStride, n0);
  const unsigned (*va)[4] = nullptr, (*ka)[4] = nullptr;
  const mt_t *sVw = sV + warp * 16 * kLd;
#endif

  // Query tile `it` (head it / nTiles of the group) into stage it % 2.
  auto fetch = [&](int it) {
    const int hh = it / nTiles;
    const long long m0 = mStart + (long long)(it - hh * nTiles) * kBr;
    const mt_u64 h = (mt_u64)grp * kHeadsPerGroup + hh;
    const mt_u64 qOff = (b * kSeq * kHeads + h) * kD, rowOff = (b * kHeads + h) * kSeq;
    mt_t *st = sStage + (it & 1) * 2 * kBr * kLd;
    mt_load_tile<kBr>(st, q + qOff, kQStride, m0);
    mt_load_tile<kBr>(st + kBr * kLd, dout + qOff, kQStride, m0);
    float *rows = sRows + (it & 1) * 2 * kBr;
    for (int r = threadIdx.x; r < kBr; r += kThreads) {
      const long long i = m0 + r;
      if (i < kSeq) {
        mt_cp4(rows + r, lse + rowOff + (mt_u64)i);
        mt_cp4(rows + kBr + r, delta + rowOff + (mt_u64)i);
      } else { // never used unmasked; finite, so that 0 * delta stays 0
        rows[r] = 0.0f;
        rows[kBr + r] = 0.0f;
      }
    }
  };

  float dK[kD / 8][4], dV[kD / 8][4];
#pragma unroll
  for (int t = 0; t < kD / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[t][e] = dV[t][e] = 0.0f;
  float s[kBr / 8][4], pd[kBr / 8][4], dp[kBr / 8][4];
  constexpr int kDqSlabs = kBr / 16, kChunk = kD / (kW / kDqSlabs); // dQ: 16-row slab x kChunk columns a warp
  static_assert(kW % kDqSlabs == 0, "warps split dQ's rows evenly");
  const int slab = warp % kDqSlabs, chunk = warp / kDqSlabs;
  fetch(0);
  for (int it = 0; it < total; ++it) {
    const int hh = it / nTiles;
    const long long m0 = mStart + (long long)(it - hh * nTiles) * kBr;
    const mt_u64 h = (mt_u64)grp * kHeadsPerGroup + hh;
    const mt_u64 qOff = (b * kSeq * kHeads + h) * kD;
    const mt_u64 maskHead = (b * kTotalHeads + head0 + h) * kSeq;
#if MT_FLASH_MMA
    mt_cp_wait();
#endif
    __syncthreads(); // tile `it` is in; every warp is done with the last tile's stage and dS
    if (it + 1 < total) fetch(it + 1);
    const mt_t *sQ = sStage + (it & 1) * 2 * kBr * kLd, *sdO = sQ + kBr * kLd;
    const float *sLse = sRows + (it & 1) * 2 * kBr, *sDelta = sLse + kBr;

    if (kw >= kSeq || (kCausal && m0 + kBr - 1 < kw)) {
      // Every (query, key) of this warp is masked: dS's columns are zeros.
      for (int e = lane; e < kBr * 16; e += 32) mt_store1(sdS + (e >> 4) * kLdS + warp * 16 + (e & 15), 0.0f);
    } else {
      // Only a tile that reaches past seq or, causal, has a query before one
      // of this warp's keys masks anything: the same for the whole warp.
      const bool edge = m0 + kBr > kSeq || kw + 16 > kSeq || (kCausal && kw + 15 > m0);
      // S^T = K Q^T: rows are this warp's keys, columns the tile's queries.
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = dp[t][e] = 0.0f;
      mt_gemm_nt<kBr / 8, kD, kKReg>(s, ka, sK + warp * 16 * kLd, kLd, sQ, kLd);
      // The dropout keep bits, drawn as kv64 draws them (mt_bwd_keep_bits).
      constexpr int kTT = kBr % 32 == 0 ? 4 : 2;
      static_assert(kBr % (8 * kTT) == 0, "query tiles of whole groups of column blocks");
      unsigned keep[kBr / (8 * kTT)];
      if constexpr (kDropout && kSeq % 8 == 0) {
#pragma unroll
        for (int G = 0; G < kBr / (8 * kTT); ++G)
          keep[G] = mt_bwd_keep_bits<kTT>(maskHead, m0, kw, G, g, c, seed, stream, offset);
      }
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int il = 8 * t + 2 * c + (e & 1);
          const int i = (int)m0 + il, j = (int)j0 + 8 * (e >> 1); // 32 bits: seq < 2^30
          const bool valid = !edge || (i < (int)kSeq && j < (int)kSeq && (!kCausal || j <= i));
          const float p = valid ? mt_exp2(s[t][e] * kScaleLog2 - sLse[il] * kLog2e) : 0.0f;
          s[t][e] = p;
          pd[t][e] = p;
          if constexpr (kDropout && kSeq % 8 == 0) {
            pd[t][e] = (keep[t / kTT] >> (4 * (t % kTT) + e)) & 1u ? p * kKeepScale : 0.0f;
          } else if constexpr (kDropout) {
            if (valid) pd[t][e] = p * mt_keep1((maskHead + (mt_u64)i) * kSeq + (mt_u64)j, seed, stream, offset);
          }
        }
      }
      // dV += Pd^T dO (Pd: the probabilities after dropout).
      mt_gemm_rn<kD / 8, kBr / 8>(dV, pd, sdO, kLd);
      // dPd^T = V dO^T; dS = P * (dPd * mask - delta), where P * mask = Pd.
      mt_gemm_nt<kBr / 8, kD, kMMA>(dp, va, sVw, kLd, sdO, kLd);
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = sDelta[8 * t + 2 * c + (e & 1)];
          if constexpr (kDropout)
            s[t][e] = pd[t][e] * dp[t][e] - s[t][e] * d;
          else
            s[t][e] = s[t][e] * (dp[t][e] - d);
        }
      // dK += dS^T Q (times scale at the end).
      mt_gemm_rn<kD / 8, kBr / 8>(dK, s, sQ, kLd);
#pragma unroll
      for (int t = 0; t < kBr / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          mt_store1(sdS + (8 * t + 2 * c + (e & 1)) * kLdS + warp * 16 + g + 8 * (e >> 1), s[t][e]);
    }
    __syncthreads(); // dS is whole
    // dQ += dS K over this key block: each warp one slab x chunk of it.
    float dqa[kChunk / 8][4];
#pragma unroll
    for (int t = 0; t < kChunk / 8; ++t) dqa[t][0] = dqa[t][1] = dqa[t][2] = dqa[t][3] = 0.0f;
    mt_gemm_nn<kChunk / 8, kBc>(dqa, sdS + slab * 16 * kLdS, kLdS, sK + chunk * kChunk, kLd);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const long long i = m0 + slab * 16 + g + 8 * r;
      if (i < kSeq) {
        float *row = dq_accum + qOff + (mt_u64)i * kQStride + chunk * kChunk + 2 * c;
#pragma unroll
        for (int t = 0; t < kChunk / 8; ++t) mt_red2(row + 8 * t, dqa[t][2 * r], dqa[t][2 * r + 1]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long j = j0 + 8 * r;
    if (j < kSeq) {
      const mt_u64 at = kvOff + (mt_u64)j * kKStride + 2 * c;
#pragma unroll
      for (int t = 0; t < kD / 8; ++t) {
        mt_store2(dk + at + 8 * t, dK[t][2 * r] * kScale, dK[t][2 * r + 1] * kScale);
        mt_store2(dv + at + 8 * t, dV[t][2 * r], dV[t][2 * r + 1]);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads)
@ENTRY_MAIN@(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, const mt_t *out, const float *lse,
             mt_t *dq, mt_t *dk, mt_t *dv, float *dq_accum, float *delta@SCALARS@) {
  extern __shared__ mt_w4 mt_smem[];
  mt_flash_bwd(dout, q, k, v, lse, dk, dv, dq_accum, delta, @RNG@, reinterpret_cast<mt_t *>(mt_smem));
}

)mtcuda";

using DType = FlashAttentionConfig::DType;

// Tile sizes of one kernel: warps own 16-row slabs, so the slab dimension is
// 16 * warps (query rows forward, key rows backward).
struct Tiles {
  bool mma = false;
  int warps = 4;
  int slabs = 1;        // 16-row slabs a warp owns (forward)
  int br = 64, bc = 64; // query rows, key rows per tile
  int ld = 0, lds = 0;  // shared row strides in elements: Q/K/V/dO tiles, dS
  uint32_t sharedBytes = 0;
};

// The most shared memory a generated kernel may use: what every GPU mt runs
// on lets a block opt in to (over 48 KiB the launchers set the attribute).
// kv64's and the forward's tiles stay within the default 48 KiB; kv128's
// two stages need more.
constexpr uint32_t kMaxShared = cu::kPortableMaxDynamicSharedBytes;

// 16-bit tiles are padded by 16 bytes a row, so ldmatrix's eight row
// addresses fall in distinct bank groups; fp32 tiles by one float, so the
// FMA loops' column reads do.
Tiles forwardTiles(const FlashAttentionConfig &c) {
  Tiles t;
  const int d = int(c.headDim);
  if (c.dtype != DType::F32) {
    t.mma = true;
    // Head dim 64: two slabs a warp, 128 query rows a CTA (each K and V
    // fragment serves two products). Head dim 128 keeps one: two would need
    // more than 255 registers for the output and Q fragments.
    t.warps = 4, t.slabs = d == 64 ? 2 : 1, t.br = 16 * t.warps * t.slabs, t.bc = 64, t.ld = d + 8;
    t.sharedBytes = uint32_t(2 * t.bc * t.ld * 2); // K and V; Q is staged in them
  } else {
    t.warps = d == 64 ? 4 : 2;
    t.br = 16 * t.warps, t.bc = d == 64 ? 32 : 16, t.ld = d + 1;
    t.sharedBytes = uint32_t((t.br + 2 * t.bc) * t.ld * 4);
  }
  return t;
}

Tiles backwardTiles(const FlashAttentionConfig &c) {
  Tiles t;
  const int d = int(c.headDim);
  if (c.dtype != DType::F32) {
    t.mma = true;
    t.warps = 4, t.bc = 64, t.br = d == 64 ? 64 : 32, t.ld = d + 8, t.lds = t.bc + 8;
    // K; Q and dO (V staged in them); dS; lse and delta.
    t.sharedBytes = uint32_t((t.bc * t.ld + 2 * t.br * t.ld + t.br * t.lds) * 2 + 2 * t.br * 4);
  } else {
    t.warps = d == 64 ? 2 : 1;
    t.bc = 16 * t.warps, t.br = t.bc, t.ld = d + 1, t.lds = t.bc + 1;
    t.sharedBytes = uint32_t((2 * t.bc * t.ld + 2 * t.br * t.ld + t.br * t.lds) * 4 + 2 * t.br * 4);
  }
  return t;
}

// kv128: 128 key rows a CTA in 8 warps (16 bits), query tiles of 64 rows at
// head dim 64 and 32 at 128, and two stages of Q, dO, lse and delta. fp32,
// whose tiles take twice the bytes, doubles kv64's warps and halves the
// query tile instead (64 x 32 at head dim 64, 32 x 16 at 128).
Tiles backwardTilesKv128(const FlashAttentionConfig &c) {
  Tiles t;
  const int d = int(c.headDim);
  if (c.dtype != DType::F32) {
    t.mma = true;
    t.warps = 8, t.bc = 128, t.br = d == 64 ? 64 : 32, t.ld = d + 8, t.lds = t.bc + 8;
    // K; two stages of Q and dO (V staged in them); dS; two of lse and delta.
    t.sharedBytes = uint32_t((t.bc * t.ld + 4 * t.br * t.ld + t.br * t.lds) * 2 + 4 * t.br * 4);
  } else {
    t.warps = d == 64 ? 4 : 2;
    t.bc = 16 * t.warps, t.br = t.bc / 2, t.ld = d + 1, t.lds = t.bc + 1;
    t.sharedBytes = uint32_t((2 * t.bc * t.ld + 4 * t.br * t.ld + t.br * t.lds) * 4 + 4 * t.br * 4);
  }
  return t;
}

// "" when the generator takes `c`, else what to change.
std::string checkConfig(const FlashAttentionConfig &c) {
  auto bad = [](const std::string &what) { return "cannot generate flash attention: " + what; };
  if (c.batch < 1 || c.seq < 1 || c.heads < 1 || c.groups < 1 || c.tensorParallel < 1)
    return bad("batch, seq, heads, groups and tensorParallel must be at least 1");
  if (c.heads % c.groups != 0)
    return bad("heads (" + std::to_string(c.heads) + ") must be a multiple of groups (" +
               std::to_string(c.groups) + ")");
  if (c.headDim != 64 && c.headDim != 128)
    return bad("head dimension " + std::to_string(c.headDim) + " is not supported; use 64 or 128");
  if (!std::isfinite(c.scale))
    return bad("the softmax scale must be finite");
  if (!(c.dropoutRate >= 0 && c.dropoutRate <= 1))
    return bad("the dropout rate must be in [0, 1]");
  if (c.heads > 65535 || c.groups > 65535 || c.batch > 65535)
    return bad("heads, groups and batch must be at most 65535 (grid y and z)");
  if (c.seq > (int64_t(1) << 30))
    return bad("seq " + std::to_string(c.seq) + " is above 2^30 (the kernels' positions are 32-bit)");
  if ((c.seq + 15) / 16 > 0x7FFFFFFF || c.batch * c.seq * c.heads / 4 > 0x7FFFFFFF)
    return bad("batch * seq * heads is too large for one grid");
  return "";
}

std::string replaceAll(std::string s, const std::string &from, const std::string &to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string ll(int64_t v) { return std::to_string(v) + "ll"; }

const char *dtypeName(DType d) { return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "f16"; }

// The per-config constants the fixed code reads, after the prelude.
std::string constants(const FlashAttentionConfig &c, const Tiles &t) {
  const double rate = c.dropoutRate;
  const bool dropout = rate > 0;
  // runtime/exec/cpu_kernels_internal.h's AttentionDropoutMask: kept when the 16-bit draw >= ceil(rate * 2^16).
  const uint32_t threshold = !dropout ? 0u : rate >= 1 ? (1u << 16) : uint32_t(std::ceil(rate * 65536.0));
  const double keep = !dropout ? 1.0 : rate >= 1 ? 0.0 : 1.0 / (1.0 - rate);
  std::string s;
  s += "\n// Flash attention: batch " + std::to_string(c.batch) + ", seq " + std::to_string(c.seq) +
       ", heads " + std::to_string(c.heads) + " in " + std::to_string(c.groups) + " groups, head dim " +
       std::to_string(c.headDim) + (c.causal ? ", causal" : "") + ", dropout " + cudaFloatLiteral(rate) +
       ", " + dtypeName(c.dtype) + (c.tensorParallel > 1 ? ", shard of " + std::to_string(c.tensorParallel) : "") +
       "; " + std::to_string(t.warps) + " warps, tiles " + std::to_string(t.br) + " x " + std::to_string(t.bc) + ".\n";
  s += std::string("#define MT_FLASH_MMA ") + (t.mma ? "1" : "0") + "\n";
  s += std::string("typedef ") + (c.dtype == DType::F32 ? "float" : c.dtype == DType::BF16 ? "mt_bf16" : "mt_f16") +
       " mt_t;\n";
  s += std::string("constexpr bool kMMA = ") + (t.mma ? "true" : "false") + ";\n";
  s += "constexpr int kD = " + std::to_string(c.headDim) + ", kW = " + std::to_string(t.warps) +
       ", kThreads = " + std::to_string(32 * t.warps) + ", kBr = " + std::to_string(t.br) +
       ", kBc = " + std::to_string(t.bc) + ", kLd = " + std::to_string(t.ld) +
       ", kLdS = " + std::to_string(t.lds) + ", kSlabs = " + std::to_string(t.slabs) + ";\n";
  s += "constexpr long long kBatch = " + ll(c.batch) + ", kSeq = " + ll(c.seq) + ", kHeads = " + ll(c.heads) +
       ", kGroups = " + ll(c.groups) + ", kHeadsPerGroup = " + ll(c.heads / c.groups) +
       ", kTotalHeads = " + ll(c.heads * c.tensorParallel) + ";\n";
  s += "constexpr mt_u64 kQStride = " + ll(c.heads * c.headDim) + ", kKStride = " + ll(c.groups * c.headDim) +
       "; // elements between rows of q and of k\n";
  s += std::string("constexpr bool kCausal = ") + (c.causal ? "true" : "false") +
       ", kDropout = " + (dropout ? "true" : "false") + ";\n";
  s += "constexpr unsigned kThreshold = " + std::to_string(threshold) + "u;\n";
  s += "constexpr float kKeepScale = " + cudaFloatLiteral(keep) + ", kScale = " + cudaFloatLiteral(c.scale) +
       ", kScaleLog2 = " + cudaFloatLiteral(c.scale * 1.4426950408889634) + ";\n";
  s += "constexpr float kLog2e = 1.44269504f, kLn2 = 0.693147181f;\n\n";
  return s;
}

// The device code with the storage type's names filled in.
std::string tileCode(const FlashAttentionConfig &c) {
  std::string s = kTileCode;
  s = replaceAll(s, "@MMA_TYPE@", c.dtype == DType::F16 ? "f16" : "bf16");
  return replaceAll(s, "@TO_STORAGE@", c.dtype == DType::F16 ? "mt_to_f16" : "mt_to_bf16");
}

// The scalar parameters (dropout only) and the RNG arguments of the body.
void scalars(const FlashAttentionConfig &c, std::string &source, CudaKernel &k) {
  std::string params, rng = "0, 0, 0, 0";
  if (c.dropoutRate > 0) {
    k.scalarArgs = {"seed", "rng_offset"};
    params = ", const mt_u64 *seed, const mt_u64 *rng_offset"; // device scalars (plan.fbs Kernel)
    if (c.tensorParallel > 1) {
      k.scalarArgs.push_back("tp_rank");
      params += ", mt_u64 tp_rank";
    }
    k.scalarArgs.push_back("stream");
    k.streams = {c.stream};
    params += ", mt_u64 stream";
    rng = std::string("*seed, *rng_offset, stream, ") + (c.tensorParallel > 1 ? "tp_rank * kHeads" : "0");
  }
  source = replaceAll(replaceAll(source, "@SCALARS@", params), "@RNG@", rng);
}

std::string hashName(const std::string &source) {
  char hash[16];
  snprintf(hash, sizeof hash, "%08x", cudaSourceHash(source));
  return hash;
}

uint32_t blocks(int64_t n, int64_t per) { return uint32_t((n + per - 1) / per); }

} // namespace

const char *flashBackwardName(FlashBackward b) { return b == FlashBackward::Kv128 ? "kv128" : "kv64"; }

std::optional<FlashBackward> parseFlashBackward(const std::string &name) {
  if (name == "kv64")
    return FlashBackward::Kv64;
  if (name == "kv128")
    return FlashBackward::Kv128;
  return std::nullopt;
}

std::optional<FlashAttentionForward> generateFlashAttentionForward(const FlashAttentionConfig &c,
                                                                   std::string *error) {
  if (std::string e = checkConfig(c); !e.empty()) {
    *error = e;
    return std::nullopt;
  }
  const Tiles t = forwardTiles(c);
  if (t.sharedBytes > kMaxShared) {
    *error = "cannot generate flash attention: the forward's tiles need " + std::to_string(t.sharedBytes) +
             " bytes of shared memory";
    return std::nullopt;
  }
  FlashAttentionForward f;
  CudaKernel &k = f.kernel;
  std::string src = std::string(cudaKernelPrelude()) + constants(c, t) + tileCode(c) + kForwardCode;
  scalars(c, src, k);
  k.entry = "mt_flash_fwd_" + hashName(src);
  k.source = replaceAll(src, "@ENTRY_FWD@", k.entry);
  k.grid[0] = blocks(c.seq, t.br);
  k.grid[1] = uint32_t(c.heads);
  k.grid[2] = uint32_t(c.batch);
  k.block[0] = uint32_t(32 * t.warps);
  k.sharedBytes = t.sharedBytes;
  k.vectorWidth = 2;
  f.lseBytes = uint64_t(c.batch * c.heads * c.seq) * 4;
  return f;
}

std::optional<FlashAttentionBackward> generateFlashAttentionBackward(const FlashAttentionConfig &c,
                                                                     std::string *error) {
  if (std::string e = checkConfig(c); !e.empty()) {
    *error = e;
    return std::nullopt;
  }
  const bool kv128 = c.backward == FlashBackward::Kv128;
  const Tiles t = kv128 ? backwardTilesKv128(c) : backwardTiles(c);
  if (t.sharedBytes > kMaxShared) {
    *error = "cannot generate flash attention: the backward's tiles need " + std::to_string(t.sharedBytes) +
             " bytes of shared memory";
    return std::nullopt;
  }
  FlashAttentionBackward bw;
  CudaKernel base;
  std::string src = std::string(cudaKernelPrelude()) + constants(c, t) + tileCode(c) + kBackwardDotCode +
                    (kv128 ? kBackwardMainKv128Code : kBackwardMainCode) + kBackwardDqCode;
  scalars(c, src, base);
  const std::string hash = hashName(src);
  bw.dot = bw.main = bw.dq = base;
  bw.dot.entry = "mt_flash_bwd_dot_" + hash;
  bw.main.entry = "mt_flash_bwd_" + hash;
  bw.dq.entry = "mt_flash_bwd_dq_" + hash;
  src = replaceAll(src, "@ENTRY_DOT@", bw.dot.entry);
  src = replaceAll(src, "@ENTRY_MAIN@", bw.main.entry);
  src = replaceAll(src, "@ENTRY_DQ@", bw.dq.entry);
  bw.dot.source = bw.main.source = bw.dq.source = src;

  const int64_t rows = c.batch * c.seq * c.heads;
  bw.dot.grid[0] = blocks(rows, 4); // a warp a row
  bw.dot.block[0] = 128;
  bw.dot.vectorWidth = int(c.headDim / 32);
  bw.main.grid[0] = blocks(c.seq, t.bc);
  bw.main.grid[1] = uint32_t(c.groups);
  bw.main.grid[2] = uint32_t(c.batch);
  bw.main.block[0] = uint32_t(32 * t.warps);
  bw.main.sharedBytes = t.sharedBytes;
  bw.main.vectorWidth = 2;
  bw.dq.grid[0] = blocks(rows * c.headDim / 4, 256);
  bw.dq.block[0] = 256;
  bw.dq.vectorWidth = 4;
  bw.dqAccumBytes = uint64_t(rows * c.headDim) * 4;
  bw.deltaBytes = uint64_t(rows) * 4;
  bw.workspaceBytes = bw.dqAccumBytes + bw.deltaBytes;
  return bw;
}

} // namespace mt
