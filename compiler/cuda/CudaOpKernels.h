// CUDA C for the plan instructions that are neither a fused region, a GEMM,
// attention nor a collective: the loss, the optimizer, norms and their
// gradients, embeddings, and the elementwise ops that reach plans unfused.
//
// Independent of MLIR: the input is one instruction as plan.bin describes it
// (opcode, shapes and dtypes of its values, its parameters, ints, floats),
// the output the kernels to launch in order, the collectives between them,
// and the workspace the instruction needs. Sources are self-contained like
// CudaKernelGen's (its prelude: no includes, no options), specialised for the
// exact shapes, and follow runtime/exec/cpu_executor.cpp and runtime/exec/cpu_kernels.h
// (the reference) in their semantics.
//
// Launch sequence. `steps` lists, in order, kernel launches and collectives
// over f32 or f64 elements of the workspace (in place, over the plan's group
// number: 1 tp, 3 mp, or the instruction's `group` int). An executor runs a
// collective over a group of one rank as nothing. Sequences with collectives:
//   CROSS_ENTROPY, vocab_parallel = 1:
//     ce_stats, all-reduce MAX(tp, f32 max[n]), ce_rescale,
//     all-reduce SUM(tp, f32 sum[n] and target[n]: 2n elements), ce_loss
//   CROSS_ENTROPY_GRAD, vocab_parallel = 1:
//     ce_stats, all-reduce MAX(tp, max[n]), ce_rescale, all-reduce SUM(tp, sum[n]), ce_grad
//   GRAD_NORM, GROUP_GRAD_NORM:
//     norm_squares, norm_total, all-reduce SUM(mp (GRAD_NORM) or ints[0], f64 total), norm_sqrt
//   SHARDED_GRAD_NORM:
//     norm_squares, norm_total, all-reduce SUM(ints[0], f64 total),
//     all-reduce SUM(mp, f64 total), norm_sqrt
// Sequence parallelism over t = tensorParallel ranks; values [b, s, ...]
// with b > 1 are reordered through the workspace, where rank r's block of
// every sequence is contiguous ([t, b, s/t, ...]), because the collectives
// take contiguous blocks (b = 1 needs no reordering):
//   SEQ_ALL_GATHER      native all-gather (in0 -> ws), seq_unblock (ws, out0)
//                       | b = 1: native all-gather (in0 -> out0)
//   SEQ_REDUCE_SCATTER  seq_block (in0, ws), native reduce-scatter (ws -> out0)
//                       | b = 1: native reduce-scatter (in0 -> out0)
//   SEQ_SPLIT           seq_split (in0, out0) + tp_rank
//   ALL_REDUCE_TIED_GRAD  native exchange (grad0 -> the peer, the peer's -> ws),
//                       tied_add (ws, grad0)
// Every other instruction is launches only.
//
// Kernel ABI. Each kernel's `args` says what its pointer arguments are, in
// order; `CudaKernel::scalarArgs` follow them as in plan.fbs's Kernel table
// ("seed" and "rng_offset" as pointers to device u64s, "tp_rank", "dp_rank",
// "stream" with `streams` by value). Per opcode
// (in_k / out_k: the instruction's values; grad_k: parameter k's f32
// gradient; state: the rank's state buffer, whose byte offsets the kernels
// carry as constants; ws+o: workspace + o bytes):
//   POSITION_IDS        (out0)
//   EMBEDDING           (in0 table, in1 ids, out0) [+ tp_rank when vocab_parallel]
//   EMBEDDING_GRAD      emb_sort (in1 ids, ws keys) [+ tp_rank when vocab_parallel] ;
//                       emb_merge (ws keys, ws keys') per doubling of the sorted runs ;
//                       emb_accum (in0 dy, grad0, ws sorted keys)
//   LAYER_NORM          (in0 x, in1 w, in2 b, out0)      RMS_NORM (in0, in1, out0)
//   LAYER_NORM_GRAD     norm_grad (in0 dy, in1 x, in2 w, out0 dx, ws) ;
//                       col_sums (ws, grad0, grad1)
//   RMS_NORM_GRAD       norm_grad (in0, in1, in2, out0, ws) ; col_sums (ws, grad0)
//   BIAS_GRAD           bias_partials (in0 dy, ws) ; col_sums (ws, grad0)
//   BIAS_ADD, ADD, GELU, GELU_GRAD, SWIGLU, SWIGLU_GRAD, SPLIT_QKV,
//   SPLIT_QKV_GRAD, ROPE, ROPE_GRAD, SPLIT_QKV_ROPE, SPLIT_QKV_ROPE_GRAD,
//   RESHAPE: (in..., out...) in plan order
//   DROPOUT             (in0, out0) + seed, rng_offset, [tp_rank,] stream
//   CROSS_ENTROPY       ce_rows (in0 logits, in1 labels, ws) ; ce_loss (ws, out0)
//     vocab parallel:   ce_stats (in0, in1, ws max, ws sum, ws local) + tp_rank ;
//                       ce_rescale (ws max, ws local, ws sum) ; ce_loss (ws max, ws sum, out0)
//   CROSS_ENTROPY_GRAD  ce_grad (in0 logits, in1 labels, in2 dloss, out0 dlogits), with
//                       dynamic shared memory holding the row (up to 112 KiB)
//     vocab parallel:   ce_stats, ce_rescale as above ;
//                       ce_grad (in0, in1, in2, ws max, ws sum, out0) + tp_rank
//     (ws max / sum / target: f32[n] each, local: the rank's max[n] and
//     sum[n] before the all-reduces, at the offsets the Workspace args give)
//   GRAD_SEED           (out0, loss_scale: the runtime's f32 loss scale on the device)
//   LR_SCHEDULE         (in0 iteration i64, out0)
//   CLIP_COEFF          (in0 norm, in1 grad_scale, out0)
//   ADAMW, SHARDED_ADAMW (in0 lr, in1 clip_coeff, in2 step, state) [+ dp_rank: SHARDED_*]
//   SGD, SHARDED_SGD    (in0 lr, in1 clip_coeff, state) [+ dp_rank: SHARDED_*]
//   GRAD_NORM & co.     norm_squares (state, ws) [+ tp_rank when a replicated parameter
//                       counts] ; norm_total (ws) ; norm_sqrt (ws, out0)
// Mixture of experts (OpKernelsMoe.cpp; T tokens, E experts, N permuted
// rows; every row map is built on the device, so nothing waits for the host):
//   MOE_ROUTER          moe_route (in0 logits, out0 probs, out1 map, ws): a warp a
//                       token, the top-k ; [moe_capacity (out0, out1): a block an
//                       expert, when 0 < capacity < T] ; [moe_aux_columns (ws): a
//                       block per (sequence group, expert), when the load-balancing
//                       loss is on] ; moe_losses (ws, out2 aux, out3 z)
//   MOE_ROUTER_GRAD     [moe_route_aux (in1, ws) ; moe_aux_columns (ws)] ;
//                       moe_router_grad (in0 dprobs, in1 logits, in3 map, in4 scale,
//                       out0, ws)
//   MOE_PERMUTE         moe_count (in1 map, out2 tokens_per_expert) ; moe_rows (in1,
//                       out2, out1 row_ids) ; moe_gather (in0 x, out1, out0 y)
//   MOE_PERMUTE_GRAD    moe_pg_zero, moe_pg_count, moe_pg_scan, moe_pg_place (the rows
//                       grouped by token in ws) ; moe_pg_sum (in0 dy, ws, ws, out0 dx)
//   MOE_UNPERMUTE       moe_inv_clear (ws) ; moe_inv_set (in2 row_ids, in3 counts, ws:
//                       [T, E] rows) ; moe_combine (in0 y, in1 probs, ws, out0)
//   MOE_UNPERMUTE_GRAD  moe_dprobs_clear (out1) ; moe_unpermute_grad (in0..in4, out0
//                       dy, out1 dprobs)
//   GROUPED_MATMUL, GROUPED_MATMUL_INPUT_GRAD  grouped_gemm / grouped_dgrad (in0,
//                       in1, in2 tokens_per_expert, out0): one launch, grid (row tiles
//                       of every segment + the zero rows', output column tiles)
//   GROUPED_MATMUL_WEIGHT_GRAD  grouped_wgrad (in0 dy, in1 x, in2, grad0): grid
//                       (output tiles, experts), grad += in the gradient's type
// `out0` of CROSS_ENTROPY_GRAD may be in0's very bytes (in place); no other
// output overlaps an input.
//
// Numerics against the CPU (which computes in double where it matters):
//   - elementwise ops, split, embedding, position ids: fp32 math (the
//     fused kernels' helpers), rounded once to the output type; copies exact.
//   - ROPE, SPLIT_QKV_ROPE and their gradients: angles and rotation in
//     double, as the CPU (equal up to double sin/cos ulps, so equal after
//     rounding to the output type).
//   - norms and their gradients: fp32 statistics (two passes for the
//     variance); column sums of dw/db: fp32 per block of rows, then the
//     blocks summed in double. Relative error ~1e-6 of the fp32 result.
//   - cross-entropy: per-row max and sum of expf in fp32 (online), the row's
//     log-sum-exp and the mean over rows in double: loss within ~1e-6
//     relative; gradients within a few fp32 ulps before rounding.
//   - AdamW: per element in double like cpu::adamw_step (bit-equal except
//     where CUDA's double pow differs in the last ulp); SGD like
//     cpu::sgd_step, in double (equal after rounding to fp32 but where
//     double rounding or contraction lands on the other side of a tie).
//   - gradient norms: squares and sums in double, one fixed order
//     (deterministic), ~1e-15 relative to the CPU's order.
//   - EMBEDDING_GRAD: deterministic, and bit-equal to the CPU: the tokens
//     are sorted by (row, token), unique keys (emb_sort, emb_merge: O(n log
//     n)), and one thread per (row, lanes) adds the row's tokens into the
//     gradient in that order (emb_accum).
//   - MoE router: runtime/exec/cpu_kernels_moe's semantics. Scores, top-k
//     and weights in fp32 (fp64 with moe_router_dtype fp64) from the logits
//     as stored, rounded to a 16-bit logits' type where Megatron's type_as
//     rounds (moe_router_dtype unset); ties pick the lower expert; the
//     capacity keeps the largest keys (the f32 weight, or routed-or-not),
//     ties to the earlier token in Megatron's sequence-major order (a radix
//     select over the keys' bits, then a scan in that order); with padding
//     the kept set is the map. The losses sum in double in a fixed order;
//     the gradient recomputes the routing from the logits. With fp64 the
//     capacity ranks the f32-rounded weights (the CPU ranks the doubles).
//   - permute, gather copies: exact; the permute's gradient and unpermute sum
//     a token's rows in row (expert) order in fp32, rounded once;
//     dprobs is an fp32 block sum. Deterministic throughout (the only
//     atomics count, and the places they give are sorted before use).
//   - grouped GEMM: tensor cores (mma.sync m16n8k16, fp32 accumulation) for
//     bf16/f16, fp32 FMAs for f32, in k order per 32-wide slice; no atomics.
// Where the CPU stops with an error (an id or label outside the vocabulary,
// a step below 1, a negative iteration), the kernels cannot: ids give NaN
// rows, labels NaN losses, so the step's finite check catches them; AdamW
// leaves the state untouched, the schedule gives NaN.
#ifndef MT_COMPILER_CUDAOPKERNELS_H
#define MT_COMPILER_CUDAOPKERNELS_H

#include "compiler/cuda/CudaKernelGen.h"
#include "plan_generated.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mt {

// One value of the instruction (plan.fbs Value): shape and dtype.
struct OpTensor {
  std::vector<int64_t> shape;
  plan::DType dtype = plan::DType::F32;
  int64_t elements() const;
};

// One parameter (plan.fbs Param) as the instruction's kernels see it. Byte
// offsets into the rank's state buffer, -1 when absent; only the optimizer
// and the gradient norms use them (they address the state directly, so that
// one launch covers every parameter).
struct OpParam {
  std::vector<int64_t> shape;
  plan::DType dtype = plan::DType::F32; // the model copy's type
  plan::DType gradDtype = plan::DType::F32; // the gradient's: F32, or BF16 (--grad-reduce-in-bf16)
  bool weightDecay = true;
  bool decoupledLr = false; // SHARDED_ADAMW's in[3], SHARDED_SGD's in[2] (--decoupled-lr)
  // Counts in the gradient norm: in_grad_norm (a pipeline stage's tied copy
  // does not). A `replicated` parameter (every tensor-parallel rank holds it
  // whole) counts on tp rank 0 only, which the norm kernel reads from its
  // tp_rank argument: cpu_executor.cpp's counts_in_norm.
  bool countsInNorm = true;
  bool replicated = false;
  // A routed expert's parameter (plan.fbs Param.expert): GRAD_NORM and
  // GROUP_GRAD_NORM count it on every rank and sum its squares over group
  // 8 (tp_ep_pp), apart from the dense parameters'.
  bool expert = false;
  int64_t weightOffset = -1, gradOffset = -1, masterOffset = -1;
  int64_t expAvgOffset = -1, expAvgSqOffset = -1;
};

// A part of one parameter in a data-parallel bucket's owned shard (the CPU
// executor's FlatSegment): elements [paramBegin, paramBegin + count) of
// parameter `param`, whose optimizer state is at element `stateIndex` of the
// rank's shard arrays.
struct OpSegment {
  uint32_t param = 0;
  int64_t paramBegin = 0, stateIndex = 0, count = 0;
};

struct OpInstruction {
  plan::Opcode op = plan::Opcode::POSITION_IDS;
  std::vector<OpTensor> in, out;
  // The parameters of `params` in order. GRAD_NORM, GROUP_GRAD_NORM and the
  // SHARDED_* opcodes take every parameter of the rank (segments index them).
  std::vector<OpParam> params;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  int64_t tensorParallel = 1;
  // RESHAPE: the output is the input's bytes (nothing to launch).
  bool outAliasesIn0 = false;
  // SHARDED_ADAMW and SHARDED_GRAD_NORM: the segments each data-parallel
  // rank owns ([dp rank][...]: of the instruction's bucket, or of every
  // bucket for the norm), and the byte offsets of the shard state arrays
  // (-1: none; no master for f32 models). One kernel serves every rank: it
  // takes "dp_rank" and keeps every rank's table.
  std::vector<std::vector<OpSegment>> rankSegments;
  int64_t shardMasterOffset = -1, shardExpAvgOffset = -1, shardExpAvgSqOffset = -1;
  // Expert buckets (plan.fbs Bucket.group 6) are sharded over expt_dp:
  // their segments by expt_dp rank, read by (tp_rank + tp dp_rank) /
  // expertParallel (etp x ep, the expert ranks of a stage). SHARDED_ADAMW / _SGD of an expert bucket: rankSegments are
  // by expt_dp rank (expertRanks); SHARDED_GRAD_NORM: the expert buckets'
  // segments in expertRankSegments, their squares summed over expt_dp then
  // tp_ep_pp (groups 6, 8).
  bool expertRanks = false;
  std::vector<std::vector<OpSegment>> expertRankSegments;
  int64_t expertParallel = 1;
};

// A pointer argument of a generated kernel.
struct OpArg {
  enum Kind { In, Out, ParamGrad, State, Workspace, LossScale };
  Kind kind;
  uint64_t index = 0; // In/Out: value position; ParamGrad: parameter position; Workspace: byte offset
};

struct OpLaunch {
  CudaKernel kernel;
  std::vector<OpArg> args;
};

struct OpStep {
  // Native: the executor runs the opcode's own communication here (plan.fbs
  // NATIVE), between the buffers `args` names.
  enum Kind { Launch, AllReduceSum, AllReduceMax, Native };
  enum Type { F32, F64 };
  Kind kind = Launch;
  size_t launch = 0;     // Launch: index into OpKernels::launches
  int64_t group = 0;     // collectives: plan.fbs group number
  uint64_t offset = 0;   // collectives: workspace byte offset of the elements
  uint64_t count = 0;    // collectives: elements
  Type type = F32;
  std::vector<OpArg> args; // Native: source, destination
};

struct OpKernels {
  std::vector<OpLaunch> launches;
  std::vector<OpStep> steps;    // launches and collectives, in order
  uint64_t workspaceBytes = 0;  // 256-byte aligned, what the steps may use
};

// The kernels of one instruction, or nothing with `error` saying what cannot
// be generated (an opcode this file does not cover, or operands that do not
// match the opcode's signature).
std::optional<OpKernels> generateOpKernels(const OpInstruction &ins, std::string *error);

// grad[j] += ws[j] for the first `count` f32 values of the workspace, into
// the gradient of parameter 0 (OpArg::ParamGrad 0): cuBLASLt's bias-gradient
// epilogues overwrite their output, while gradients accumulate over
// micro-batches, so they write the workspace and this adds it in.
// `grad`: the gradient's type (bf16 with --grad-reduce-in-bf16).
std::optional<OpKernels> generateGradAccumulate(int64_t count, plan::DType grad,
                                                std::string *error);

// grad[j] = grad[j] * scale over every element of each of `counts.size()`
// gradients (OpArg::ParamGrad k, one launch each), the product in f32 and,
// for bf16 gradients (--grad-reduce-in-bf16), rounded once to nearest even:
// REDUCE_GRADS over a group of one rank (an expert bucket at
// expert_data_parallel 1 with dp > 1), whose scale has no collective to ride
// on. The CPU executor's reduce_grads scales alike.
std::optional<OpKernels> generateGradScale(const std::vector<int64_t> &counts, plan::DType grad,
                                           double scale, std::string *error);

// Multi-tensor AdamW: one launch for consecutive ADAMW instructions that
// share their lr, clip_coeff and step values, beta1, beta2 and eps (the caller
// checks); each keeps its own weight decay (floats[3]).
// A constant table in the source maps each block to a parameter and a chunk
// of it, so the whole optimizer step is one kernel reading lr, clipping
// coefficient and step from the device (capturable in a CUDA graph).
std::optional<OpKernels> generateAdamWGroup(const std::vector<OpInstruction> &group,
                                            std::string *error);
// The same for consecutive SGD instructions of one lr, clip_coeff and
// momentum; each keeps its own weight decay (floats[1]).
std::optional<OpKernels> generateSgdGroup(const std::vector<OpInstruction> &group,
                                          std::string *error);

} // namespace mt

#endif // MT_COMPILER_CUDAOPKERNELS_H
