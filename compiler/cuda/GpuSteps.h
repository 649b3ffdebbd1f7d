// How the CUDA executor runs each plan instruction: its GPU steps
// (runtime/plan/plan.fbs, GpuStep). The plan writer describes an instruction in
// plain data and gets back the steps, plus any kernels they launch, so the
// runtime makes no choice the compiler could have made.
//
// GEMMs. Tensors are row-major; cuBLASLt is column-major, where a row-major
// [r, c] matrix reads as its transpose [c, r] with leading dimension c.
// With n tokens (the product of every dimension but the last):
//   MATMUL       y[n, out] = x[n, in] W[out, in]^T
//                D = y^T (m = out, n), A = W (stored [in, out], transposed),
//                B = x^T (stored [in, n]), k = in
//   MATMUL_INPUT_GRAD  dx[n, in] = dy[n, out] W[out, in]
//                D = dx^T (m = in, n), A = W^T (stored [in, out]),
//                B = dy^T (stored [out, n]), k = out
//   MATMUL_WEIGHT_GRAD grad W[out, in] += dy[n, out]^T x[n, in]
//                D = grad^T (m = in, n = out, f32, accumulate),
//                A = x^T (stored [in, n]), B = dy (stored [out, n], transposed),
//                k = n
// A gemm kernel (mt.fused gemm: matmul, bias add, optionally tanh GeLU) is
// MATMUL's mapping with cuBLASLt's bias epilogue (one bias per row of D,
// that is per output feature) and GELU_AUX when the pre-activation is also
// a result.
// A gemm_grad kernel is one of:
//   - MATMUL_INPUT_GRAD's mapping with DGELU (aux = the pre-activation, laid
//     out as D = dx^T) and, with the bias gradient, DGELU_BGRAD: one sum per
//     row of D (per input feature of the layer, which is the bias's) over
//     its n tokens;
//   - MATMUL_WEIGHT_GRAD's mapping with BGRADB: one sum per column of D (per
//     output feature) over k, the tokens, of op(B) = dy.
// The bias gradient goes to the kernel workspace (f32, D's type in both
// forms), then a kernel adds it into the f32 gradient: cuBLASLt overwrites
// its bias output, and gradients accumulate over micro-batches.
#ifndef MT_COMPILER_GPUSTEPS_H
#define MT_COMPILER_GPUSTEPS_H

#include "compiler/cuda/CudaKernelGen.h"
#include "compiler/cuda/CudaOpKernels.h"
#include "compiler/cuda/FlashAttentionGen.h"
#include "plan_generated.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct GpuValueInfo {
  std::vector<int64_t> shape;
  plan::DType dtype = plan::DType::F32;
  uint64_t offset = 0; // arena offset (RESHAPE: whether bytes move)
  plan::Region region = plan::Region::ARENA;
};

// A parameter as the generated kernels see it (compiler/cuda/CudaOpKernels.h).
using GpuParamInfo = OpParam;

// One plan instruction, as the writer built it.
struct GpuInstruction {
  plan::Opcode op = plan::Opcode::POSITION_IDS;
  std::vector<uint32_t> in, out, params;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct GpuArgSpec {
  plan::GpuArgKind kind;
  uint64_t index;
};

// plan.fbs's Gemm, field for field.
struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  plan::DType aType = plan::DType::F32, bType = plan::DType::F32, dType = plan::DType::F32;
  bool accumulate = false;
  plan::GemmEpilogue epilogue = plan::GemmEpilogue::NONE;
  plan::DType biasType = plan::DType::F32;
  int64_t batch = 1, strideA = 0, strideB = 0, strideD = 0;
};

struct GpuStepSpec {
  plan::GpuStepKind kind = plan::GpuStepKind::NOTHING;
  // KERNEL: >= 0 an index into the plan's kernel table; < 0 the kernel
  // GpuLowering::kernels[-kernel - 1], which the writer appends to it.
  int64_t kernel = -1;
  std::vector<GpuArgSpec> args;
  GemmSpec gemm;
  uint64_t count = 0;
  plan::ReduceElement element = plan::ReduceElement::F32;
  int32_t group = 0, reduce = 0;
};

struct GpuLowering {
  std::vector<GpuStepSpec> steps; // empty: no GPU form (see `missing`)
  std::vector<CudaKernel> kernels; // new kernels the steps launch
  uint64_t workspaceBytes = 0;     // WORKSPACE bytes the steps use
  std::string missing;             // why there are no steps
};

// The gemm kernel of an mt.fused gemm region: inputs x, w, b; outputs the
// pre-activation (only with `auxOut`) and the result.
struct GemmKernelShape {
  bool gelu = false;
  bool auxOut = false;
};

// The distributed optimizer's layout of a stage (mt-plan-memory; plan.fbs
// Bucket): the flat buffers' buckets' ranges, each parameter's flat element
// offset (-1: none),
// and the byte offsets of the shard state arrays (-1: none).
struct GpuShardLayout {
  struct Bucket {
    int64_t begin = 0, end = 0;
    // An expert bucket (plan.fbs Bucket.group 6): sharded over expt_dp
    // (expertDataParallel ranks, indexed by (tp_rank + tp dp_rank) /
    // expertParallel).
    bool expert = false;
    int64_t shardOffset = -1; // element of the shard state; -1: begin / group size
  };
  int64_t dataParallel = 1;
  // expertParallel: the expert ranks of a stage, expert_tensor_parallel x
  // expert_model_parallel (parallel_groups.h numbers a stage's ranks etp
  // first, then ep, then expt_dp).
  int64_t expertDataParallel = 1, tensorParallel = 1, expertParallel = 1;
  std::vector<Bucket> buckets;
  std::vector<int64_t> flatOffset; // by parameter
  int64_t master = -1, expAvg = -1, expAvgSq = -1;
};

// What REDUCE_GRADS's lowering reads of a stage: the size of each
// data-parallel group (plan group 0 dp, 6 expt_dp), each bucket's flat
// element range (plan.fbs Bucket) and each parameter's flat element offset
// (-1: none). A bucket over a group of one rank (an expert bucket at
// expert_data_parallel 1 with dp > 1) has no collective to carry its scale
// 1/dp: its REDUCE_GRADS becomes one kernel per parameter of the bucket
// multiplying its gradient by the scale (generateGradScale); over more
// ranks it is the executor's own collective (NATIVE).
struct GpuReduceLayout {
  int64_t dataParallel = 1, expertDataParallel = 1;
  struct Range {
    int64_t begin = 0, end = 0;
  };
  std::vector<Range> buckets;
  std::vector<int64_t> flatOffset; // by parameter
};

// The gemm_grad kernel of an mt.fused gemm_grad region, by program value
// and parameter numbers.
struct GemmGradKernelShape {
  bool weightGrad = false; // BGRADB on MATMUL_WEIGHT_GRAD; else DGELU on MATMUL_INPUT_GRAD
  bool biasGrad = false;   // the input-gradient form also sums the bias gradient
  uint32_t dy = 0;         // the output gradient both forms read
  uint32_t operand = 0;    // the weight (input gradient) or the layer's input x (weight gradient)
  uint32_t pre = 0;        // input gradient: the GeLU's pre-activation (aux)
  uint32_t out = 0;        // input gradient: the GeLU's input gradient (D)
  uint32_t weightParam = 0, biasParam = 0;
  // The parameters' gradients (bf16 with --grad-reduce-in-bf16): the weight
  // gradient GEMM's D and the bias gradient's accumulation.
  plan::DType gradDtype = plan::DType::F32;
};

// The choices among generated kernels that the spec leaves open (mtc
// compile's options; docs/architecture.md).
struct GpuKernelOptions {
  FlashBackward flashBackward = FlashBackward::Kv64; // ATTENTION_GRAD's main kernel (--flash-backward)
};

// The steps of an instruction that is not FUSED. `values` and `params` are
// the program's values and the rank's parameters, indexed as in plan.bin;
// `shards` the layout SHARDED_* instructions need (null without the
// distributed optimizer); `reduce` the one REDUCE_GRADS needs (null: every
// REDUCE_GRADS is NATIVE; the plan writer always gives it).
GpuLowering lowerInstruction(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values,
                             const std::vector<GpuParamInfo> &params, int64_t tensorParallel,
                             const GpuShardLayout *shards = nullptr, const GpuKernelOptions &options = {},
                             const GpuReduceLayout *reduce = nullptr);

// One launch for a run of consecutive ADAMW (or SGD) instructions that read
// the same lr, clipping coefficient and step (compiler/cuda/CudaOpKernels.h).
GpuLowering lowerOptimizerGroup(const std::vector<GpuInstruction> &group,
                                const std::vector<GpuValueInfo> &values,
                                const std::vector<GpuParamInfo> &params);

// The steps of a FUSED instruction of kind elementwise or row_reduction:
// launch plan kernel `kernelIndex` with the instruction's inputs, outputs
// and the scalar arguments `kernel` asks for.
GpuLowering lowerFusedKernel(const GpuInstruction &inst, int64_t kernelIndex,
                             const CudaKernel &kernel);

// The steps of a FUSED instruction of kind gemm: one cuBLASLt call.
GpuLowering lowerGemmKernel(const GpuInstruction &inst, const GemmKernelShape &shape,
                            const std::vector<GpuValueInfo> &values);

// The steps of a FUSED instruction of kind gemm_grad: one cuBLASLt call, and
// with a bias gradient the kernel that adds it into the gradient.
GpuLowering lowerGemmGradKernel(const GemmGradKernelShape &shape,
                                const std::vector<GpuValueInfo> &values);

} // namespace mt

#endif // MT_COMPILER_GPUSTEPS_H
