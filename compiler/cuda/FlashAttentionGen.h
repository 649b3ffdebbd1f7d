// Generated flash attention for the CUDA backend: forward and backward
// kernels specialised for one attention's exact shapes, dtype and dropout,
// with the numerics of runtime/exec/cpu_kernels.h's attention_fwd/attention_bwd.
//
// The algorithm is FlashAttention-2 (Dao, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", 2023): the
// forward walks key/value blocks with an online softmax and never holds a
// seq x seq matrix; it also writes each row's log-sum-exp, from which the
// backward recomputes the probabilities.
//
// Kernel ABI. Pointers first (`T` is float, or 16-bit storage for bf16 and
// f16 as in CudaKernelGen), then one `unsigned long long` per scalarArgs
// entry. Tensors are row-major and dense:
//   q, out, dout, dq   [batch, seq, heads, headDim]     T
//   k, v, dk, dv       [batch, seq, groups, headDim]    T
//   lse                [batch, heads, seq]               float, natural log:
//                      lse = log(sum_j exp(scale * q_i . k_j)) over unmasked j
//   dq_accum           [batch, seq, heads, headDim]     float (workspace)
//   delta              [batch, heads, seq]               float (workspace)
// Forward, one kernel:   (q, k, v, out, lse, scalars...)
// Backward, three kernels launched in order on one stream with the same
// arguments: (dout, q, k, v, out, lse, dq, dk, dv, dq_accum, delta,
// scalars...):
//   1. `dot`:  delta = rowsum(dout * out), and dq_accum = 0;
//   2. `main`: dk, dv (overwritten) and dq_accum += dS k per key block;
//   3. `dq`:   dq = scale * dq_accum in T (overwritten).
// Scalars exist only with dropout (rate > 0): "seed", "rng_offset", then
// "tp_rank" when tensorParallel > 1, then "stream" (its value in `streams`),
// as CudaKernelGen names them (seed and rng_offset are pointers to device
// u64s, read once at entry, so a captured CUDA graph sees each step's). The mask is the CPU's bit for bit: element
// ((b * heads * tensorParallel + tp_rank * heads + h) * seq + i) * seq + j
// of Philox4x32-10 with key {seed, stream} and counter {index / 8, rng_offset},
// taking the 16-bit half index % 2 of word (index / 2) % 4 (AttentionDropoutMask:
// eight draws a Philox call, half the calls of the activations' dropout).
// No launch of the forward or of the kv64 backward needs more than 48 KiB
// of shared memory; kv128's main kernel needs up to 77 KiB, within the
// 99 KiB every GPU mt runs on allows (runtime/exec/cuda/launch_limits.h), and
// its launchers opt in (prepare_launch).
//
// Blocking. Warps own 16-row slabs in the m16n8 accumulator layout of
// mma.sync. bf16/f16 use tensor cores (mma.sync m16n8k16 with fp32
// accumulation, ldmatrix, cp.async; sm_80 and later); f32 runs the same
// algorithm with fp32 FMAs (no TF32), so an f32 model's attention matches the
// CPU to fp32 rounding. The probabilities' 2^x is one ex2.approx.ftz (what
// exp2f runs, less its rescaling of results below 2^-126, which flush to 0).
//   forward, 16-bit: 4 warps, each with two 16-row slabs of query rows at
//                    head dim 64 (128 rows a CTA; every K and V fragment
//                    read from shared memory serves both slabs' products)
//                    and one at head dim 128 (64 rows: two would not fit
//                    255 registers); key/value tiles of 64 rows, Q in
//                    registers, K and V tiles in shared memory with V's
//                    copy overlapping Q K^T.
//   Masking (causal, past seq) is computed only in the tiles that a
//   warp's rows cross the diagonal or the end of seq in; the others skip it.
//   backward, 16-bit: 4 warps x 16 key rows (dK, dV in registers for all
//                    query blocks and all heads of a GQA group, so no atomics
//                    on them), query tiles of 64 (d 64) or 32 (d 128) rows;
//                    dQ through an fp32 workspace with atomic adds (pairs
//                    of floats in one red.global.add.v2.f32 on sm_90).
//   f32: the same with fewer warps and smaller tiles to stay within 48 KiB.
//   backward, kv128 (FlashBackward::Kv128, `mtc compile --flash-backward=
//                    kv128`; kv64 above is the default): 8 warps x 16 key
//                    rows (128 a CTA, as FlashAttention-2's backward), query
//                    tiles of 64 (d 64) or 32 (d 128) rows double-buffered
//                    with cp.async (the next tile's copy overlaps this
//                    one's products), K's A fragments in registers at d 64,
//                    and warps whose keys a whole tile masks skip it; half
//                    kv64's dQ atomic adds and Q/dO tile copies per key.
//                    f32: 4 (d 64) or 2 (d 128) warps, double-buffered.
// A seq that no tile size divides is handled by masking: rows and columns
// past seq read zeros and are never stored.
//
// What would make it faster on H100: wgmma with TMA loads and a
// producer/consumer warp split (FlashAttention-3) on sm_90; kv128's larger
// tiles and double-buffering for the default once a GPU has timed it
// (mt-flash-bench times both); double-buffered K/V tiles in the forward;
// swizzled instead of padded shared memory; stores through shared memory
// for coalescing.
#ifndef MT_COMPILER_FLASHATTENTIONGEN_H
#define MT_COMPILER_FLASHATTENTIONGEN_H

#include "compiler/cuda/CudaKernelGen.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mt {

// Which main kernel the backward runs (see Blocking above): kv64, 64 key
// rows a CTA, the default; kv128, 128 key rows a CTA with double-buffered
// query tiles. Both compute the same values (dQ's atomic adds are summed in
// another order).
enum class FlashBackward { Kv64, Kv128 };

// "kv64" or "kv128", as mtc's --flash-backward and mt-flash-bench name them.
const char *flashBackwardName(FlashBackward b);
// The variant of that name, or nothing.
std::optional<FlashBackward> parseFlashBackward(const std::string &name);

struct FlashAttentionConfig {
  enum class DType { F32, BF16, F16 };
  int64_t batch = 1, seq = 1;
  int64_t heads = 1;  // query heads of this (tensor-parallel) shard
  int64_t groups = 1; // key/value heads; heads % groups == 0 (GQA; groups == heads is MHA)
  int64_t headDim = 64; // 64 or 128
  bool causal = true;
  double scale = 0.125;      // applied to q . k before the softmax
  double dropoutRate = 0.0;  // on the probabilities; 0 draws no random numbers
  uint64_t stream = 0;       // the instruction's dropout stream
  DType dtype = DType::BF16;
  int64_t tensorParallel = 1; // the model has heads * tensorParallel heads
  FlashBackward backward = FlashBackward::Kv64; // the backward's main kernel (the forward ignores it)
};

struct FlashAttentionForward {
  CudaKernel kernel;
  uint64_t lseBytes = 0; // the lse output, float [batch, heads, seq]
};

struct FlashAttentionBackward {
  CudaKernel dot, main, dq; // launched in this order, one shared source
  uint64_t dqAccumBytes = 0; // workspace dq_accum, float [batch, seq, heads, headDim]
  uint64_t deltaBytes = 0;   // workspace delta, float [batch, heads, seq]
  uint64_t workspaceBytes = 0; // dqAccumBytes + deltaBytes
};

// The kernels for `config`, or nothing with `error` saying which field the
// generator cannot take and what it accepts.
std::optional<FlashAttentionForward> generateFlashAttentionForward(const FlashAttentionConfig &config,
                                                                   std::string *error);
std::optional<FlashAttentionBackward>
generateFlashAttentionBackward(const FlashAttentionConfig &config, std::string *error);

} // namespace mt

#endif // MT_COMPILER_FLASHATTENTIONGEN_H
